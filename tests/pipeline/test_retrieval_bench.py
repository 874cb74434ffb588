"""The retrieval benchmark's scoring: it must tell a real retriever from a stub."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import retrieval_quality as rq  # noqa: E402
from processors.embedders import HashingEmbedder  # noqa: E402
from processors.retrieval import recall  # noqa: E402


def test_evidence_recall_counts_what_k_could_hold():
    assert rq.evidence_recall(["a", "x", "b"], {"a", "b"}, 5) == 1.0
    assert rq.evidence_recall(["x", "a"], {"a"}, 1) == 0.0
    assert rq.evidence_recall(["a", "b", "c"], {"a", "b", "c", "d", "e", "f"}, 2) == 1.0  # 2 of at best 2


def test_the_questions_are_about_the_history_and_carry_their_evidence():
    hist = rq.history()
    qs = rq.questions(hist)
    ids = {e.episode_id for e in hist.episodes}
    assert sum(q["type"] == "instance" for q in qs) >= 80 and sum(q["type"] == "pattern" for q in qs) == 12
    assert all(q["evidence"] and q["evidence"] <= ids for q in qs)
    texts = {e.episode_id: e.text for e in hist.episodes}
    # A question is not its episode's text again (else any retriever finds it).
    assert all(q["q"] not in texts[next(iter(q["evidence"]))] for q in qs if q["type"] == "instance")


def test_a_real_retriever_scores_far_above_a_stub(tmp_path):
    hist, embedder = rq.history(episodes=400), HashingEmbedder()
    qs = [q for q in rq.questions(hist) if q["type"] == "instance"][:40]
    view = rq.build(tmp_path / "view", embedder, hist, beliefs=False)
    try:
        real = [rq.ids(recall(view, embedder, hist.user_id, q["q"], mode="instance", k=10, now=rq.NOW)["results"])
                for q in qs]
    finally:
        view.close()
    rng, everyone = random.Random(1), [e.episode_id for e in hist.episodes]
    stub = [rng.sample(everyone, 10) for _ in qs]
    table = rq.score({"real": real, "stub": stub}, qs)
    assert table["stub"]["instance"]["r@10"] < 0.1 < 0.5 < table["real"]["instance"]["r@10"]
