"""The demo's score reads what a belief says: a stub that cites what it was
shown under one fixed sentence must not pass, and a belief must be about its
pattern, with precise citations, to count. The loop runs without a broker
(tests/support/sample_loop.py) over a real Qdrant Edge view and the MiniLM embedder."""

from __future__ import annotations

import pytest

from processors.ports import Usage
from processors.reasoners import OfflineReasoner
from processors.reflection import Insight
from streams.cli.sample import history
from streams.cli.score import score
from support.sample_loop import live_beliefs

minilm = pytest.importorskip("streams.adapters.minilm").MiniLMEmbedder
H = history(episodes=700)  # a third of the demo's history: enough cycles, a quarter of the time


@pytest.fixture(scope="module")
def embedder():
    return minilm()


def belief(rid: str, text: str, evidence, depth: int = 1) -> dict:
    return {"reflection_id": rid, "text": text, "evidence_ids": list(evidence), "depth": depth}


def test_a_belief_counts_when_it_cites_the_pattern_precisely_and_says_it(embedder):
    logs = next(p for p in H.patterns if p.name == "logs-before-retry")
    background = [e.episode_id for e in H.episodes if e.pattern is None]
    says = "The user wants the worker logs read before a failed job is rerun (4 times, Jun–Aug)."
    beliefs = [belief("said", says, logs.episode_ids[:4]),
               belief("keywords", "Often together: logs, retry, failed, job.", logs.episode_ids[4:8]),
               belief("diluted", says.replace("worker", "build"), [*logs.episode_ids[8:10], *background[:2]]),
               belief("copy", says, logs.episode_ids[10:12]),
               belief("routine", "Recurring: CI finished green.", background[2:6])]
    result = score(H, beliefs, embedder)
    [found] = [p for p in result["patterns"] if p["found"]]
    assert found["pattern"] == "logs-before-retry" and found["belief"] == "said"
    assert (found["cited"], found["precision"]) == (4, 1.0) and found["about"] >= 0.45
    assert result["found"] == 1 and result["of"] == 4 and result["beliefs"] == 5
    assert result["noise"] == 1  # the routine one; the diluted one rests half on the pattern
    assert result["duplicates"] == 2  # the copy, and the diluted one says the same


def test_a_belief_over_beliefs_is_scored_on_the_episodes_beneath_it(embedder):
    friday = next(p for p in H.patterns if p.name == "no-friday-deploys")
    says = "The user will not deploy on a Friday and postpones it to Monday."
    beliefs = [belief("a", says, friday.episode_ids[:2]), belief("b", says, friday.episode_ids[2:4]),
               belief("top", says, ["a", "b"], depth=2)]
    top = next(p for p in score(H, beliefs, embedder)["patterns"] if p["pattern"] == "no-friday-deploys")
    assert top["found"] and top["cited"] == 4 and top["belief"] == "top"


class Stub(OfflineReasoner):
    """What the old score could not tell from a reasoner: one fixed sentence
    citing the first eight statements retrieved. Its questions are the planted
    patterns themselves, so what it is shown is as good as evidence gets."""

    name, prompt_version, dated = "stub", "stub", False

    def questions(self, statements, n=3, importance=None):
        return [p.description for p in H.patterns][:n], Usage()

    def insights(self, question, statements, n=5):
        return [Insight("The user keeps a steady working routine with the agent.",
                        tuple(range(1, min(8, len(statements)) + 1)))], Usage()


def test_a_stub_citing_what_it_was_shown_scores_at_most_one_pattern(embedder, tmp_path):
    result = score(H, live_beliefs(H, tmp_path, embedder, Stub(embedder)), embedder)
    cites = {p["pattern"] for p in result["patterns"] if p["cited"] >= 2}  # what the old score called found
    print(f"\nstub: found {result['found']}/{result['of']}, cites ≥ 2 episodes of {sorted(cites)}")
    assert result["found"] <= 1
    assert cites - {p["pattern"] for p in result["patterns"] if p["found"]}, \
        "the stub cited no pattern: the test would prove nothing"


@pytest.mark.parametrize("seed", [8])  # seed 7, the demo's, is held to the same bar in tests/integration/test_demo.py
def test_the_offline_reasoner_finds_every_planted_pattern(embedder, tmp_path, seed):
    hist = history(seed=seed)
    result = score(hist, live_beliefs(hist, tmp_path, embedder, OfflineReasoner(embedder)), embedder)
    print(f"\nseed {seed}: {result['beliefs']} beliefs, {result['noise']} noise; "
          + ", ".join(f"{p['pattern']} {p['found']} {p['cited']} {p['precision']}" for p in result["patterns"]))
    assert result["found"] == result["of"] == 4
    assert all(p["precision"] >= 0.8 for p in result["patterns"])
    # Most beliefs rest on the patterns: v2 had 25 of 42 (seed 7) and 39 of 61 (seed 8) resting mostly on
    # background, glued by a subsystem's name; v3 reads place words as gaps (5 of 17, 11 of 25).
    assert result["noise"] * 2 < result["beliefs"], result
