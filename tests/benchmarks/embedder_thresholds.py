"""Per-embedder thresholds, carried over from MiniLM's by rank on the demo history.

    python tests/benchmarks/embedder_thresholds.py [--embedder e5-small]

MiniLM's three thresholds were set on MiniLM cosines; another model's cosines
live in another band (e5-small: unrelated texts ≈ 0.7), so a value is carried
over by rank: the other embedder's threshold is the value that the same share
of the same pairs reach as reach MiniLM's. Pairs, from `reflect demo`'s
history (streams/cli/sample.py) and the retrieval benchmark's questions:
* grounding (processors/reflector.py GROUNDING_COSINE, MiniLM 0.35): each
  planted pattern's description against every episode; its own episodes are
  the support (printed: the share of support and of the rest that pass);
* duplicate (DUPLICATE_COSINE, MiniLM 0.92): every pair of 600 episodes,
  templated texts, so near-duplicates are many;
* recall floor (processors/embedders.py RECALL_MIN_SCORE, MiniLM 0.3, on the
  engine's hybrid score): every question against every planted belief, in a
  real Qdrant Edge view of the history (printed: pattern questions whose own
  belief passes, instance questions with some belief passing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

from streams.adapters.factory import make_embedder  # noqa: E402
from processors.retrieval import recall_scoring  # noqa: E402
from retrieval_quality import NOW, build, questions  # noqa: E402
from streams.cli.sample import history  # noqa: E402

MINILM = {"grounding": 0.35, "duplicate": 0.92, "recall floor": 0.3}


def pairs(embedder_name: str) -> dict[str, dict]:
    """{threshold: {"values": all pair values, "good": mask of the pairs that should pass}}."""
    hist, embedder = history(), make_embedder(embedder_name)
    episodes = embedder.embed([e.text for e in hist.episodes])
    index = {e.episode_id: i for i, e in enumerate(hist.episodes)}
    described = embedder.embed([p.description for p in hist.patterns])
    ground, own = [], []
    for p, v in zip(hist.patterns, described):
        ground.append(episodes @ v)
        mask = np.zeros(len(episodes), dtype=bool)
        mask[[index[i] for i in p.episode_ids]] = True
        own.append(mask)
    sample = episodes[np.random.default_rng(7).choice(len(episodes), 600, replace=False)]
    sims = sample @ sample.T
    upper = sims[np.triu_indices(len(sample), 1)]
    qs = questions(hist)
    scores, right = [], []
    with tempfile.TemporaryDirectory() as tmp:
        view = build(Path(tmp) / "view", embedder, hist, beliefs=True)
        vectors = embedder.embed([q["q"] for q in qs])
        found = view.search_hybrid(hist.user_id, vectors, [q["q"] for q in qs], len(hist.patterns),
                                   scoring=recall_scoring(NOW), kind="reflection", status="live")
        view.close()
    truth = {p.name: f"belief-{p.name}" for p in hist.patterns}
    for q, hits in zip(qs, found):
        mine = {truth[p.name] for p in hist.patterns if q["type"] == "pattern" and set(p.episode_ids) == q["evidence"]}
        for h in hits:
            scores.append(h.score)
            right.append(h.payload["reflection_id"] in mine)
    return {"grounding": {"values": np.concatenate(ground), "good": np.concatenate(own)},
            "duplicate": {"values": upper, "good": None},
            "recall floor": {"values": np.array(scores), "good": np.array(right)}}


def carried(base: np.ndarray, other: np.ndarray, threshold: float) -> float:
    """The value `other` reaches on the same share of pairs as `base` reaches `threshold`."""
    share = float((base >= threshold).mean())
    return float(np.quantile(other, 1 - share)) if share > 0 else float(other.max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedder", default="e5-small")
    args = parser.parse_args()
    base, other = pairs("minilm"), pairs(args.embedder)
    for name, t in MINILM.items():
        b, o = base[name], other[name]
        t2 = carried(b["values"], o["values"], t)
        line = (f"{name:<13} minilm {t:.3f} → {args.embedder} {t2:.3f}   share passing "
                f"{(b['values'] >= t).mean():.4f} / {(o['values'] >= t2).mean():.4f}")
        if b["good"] is not None:
            for label, data, at in (("minilm", b, t), (args.embedder, o, t2)):
                good, rest = data["values"][data["good"]], data["values"][~data["good"]]
                line += f"; {label}: should pass {(good >= at).mean():.2f}, the rest {(rest >= at).mean():.3f}"
        print(line)


if __name__ == "__main__":
    main()
