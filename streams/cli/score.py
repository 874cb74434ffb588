"""The demo's score: do the live beliefs say what was planted, citing it?

A planted pattern is found when one live belief (1) cites at least
`MIN_CITED` of the pattern's episodes, (2) with citation precision at least
`MIN_PRECISION` (the share of the episodes behind it that are the pattern's),
and (3) says it: its text is about the pattern by meaning — cosine to the
pattern's description at least `ABOUT` under the MiniLM embedder. Citing alone
is not enough: a stub that cites whatever was retrieved under one fixed
sentence cites plenty of pattern episodes and says nothing.

`ABOUT` was set on the bundled history (seeds 7 and 8): background episodes
reach at most ~0.53 to a description (p99 0.30–0.46), the pattern episodes
0.45–0.67 on average. A belief that restates its pattern clears it; a keyword
list or an unrelated sentence does not. With the hashing embedder (no
`minilm` extra) the bands are lower: `ABOUT_HASHING`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from processors.ports import Embedder
from streams.cli.sample import History

MIN_CITED = 2
MIN_PRECISION = 0.8
ABOUT = 0.45
ABOUT_HASHING = 0.3
DUPLICATE = 0.85  # cosine at which two live beliefs say the same thing


def about_cut(embedder: Embedder) -> float:
    return ABOUT if embedder.name == "minilm" else ABOUT_HASHING


def episodes_behind(belief: dict[str, Any], beliefs: dict[str, dict[str, Any]]) -> set[str]:
    """The episodes a belief rests on, through the beliefs it cites."""
    out: set[str] = set()
    for cited in belief["evidence_ids"]:
        out |= episodes_behind(beliefs[cited], beliefs) if cited in beliefs else {cited}
    return out


def vectors_of(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    return embedder.embed(list(texts)) if texts else np.zeros((0, embedder.dim), dtype=np.float32)


def duplicates(similarity: np.ndarray) -> int:
    """Beliefs that say what a belief listed before them says."""
    return sum(bool((similarity[i, :i] >= DUPLICATE).any()) for i in range(len(similarity)))


def match(pattern_episodes: set[str], behind: set[str], about: float, cut: float) -> dict[str, Any]:
    cited = len(pattern_episodes & behind)
    precision = round(cited / len(behind), 3) if behind else 0.0
    return {"cited": cited, "precision": precision, "about": round(about, 3),
            "found": cited >= MIN_CITED and precision >= MIN_PRECISION and about >= cut}


def score(hist: History, beliefs: Sequence[dict[str, Any]], embedder: Embedder) -> dict[str, Any]:
    """Per pattern its best belief; noise (beliefs resting mostly on background
    episodes) and duplicates; numbers only."""
    by_id = {b["reflection_id"]: b for b in beliefs}
    behind = [episodes_behind(b, by_id) for b in beliefs]
    said = vectors_of(embedder, [b["text"] for b in beliefs])  # embedded once: for the patterns and each other
    about = said @ vectors_of(embedder, [p.description for p in hist.patterns]).T
    cut = about_cut(embedder)
    planted = {e.episode_id for e in hist.episodes if e.pattern}
    patterns = []
    for k, pattern in enumerate(hist.patterns):
        members = set(pattern.episode_ids)
        matches = [(match(members, behind[i], float(about[i, k]), cut), i) for i in range(len(beliefs))]
        best, i = max(matches, key=lambda m: (m[0]["found"], m[0]["cited"], m[0]["precision"], -m[1]),
                      default=(match(members, set(), 0.0, cut), None))
        patterns.append({"pattern": pattern.name, "description": pattern.description,
                         "episodes": len(members), **best,
                         "belief": beliefs[i]["reflection_id"] if i is not None and best["cited"] else None})
    noise = sum(len(b - planted) > len(b) / 2 for b in behind)
    return {"found": sum(p["found"] for p in patterns), "of": len(patterns), "beliefs": len(beliefs),
            "noise": noise, "duplicates": duplicates(said @ said.T), "patterns": patterns}
