"""The reflection loop's pure steps 3–5: rerank evidence, remap citations, build beliefs.

No I/O here: the reflector agent fetches candidates from the view and hands
them in; everything that decides what gets persisted is a plain function.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

from processors.injection import instruction_cue
from schemas import parse_time

BELIEFS = uuid.UUID("0b6f1c2e-7d1a-4a7e-9a51-2f3d8c4e5b60")  # namespace of reflection ids


@dataclass(frozen=True)
class Candidate:
    """A record of the user's store that may serve as evidence."""
    id: str
    kind: str  # "episode" | "reflection"
    text: str
    importance: float
    occurred_at: str
    depth: int
    similarity: float  # cosine to the question, from the view


@dataclass(frozen=True)
class Weights:
    recency: float = 1.0
    importance: float = 1.0
    similarity: float = 1.0
    decay_per_hour: float = 0.995  # Generative Agents' recency decay


@dataclass(frozen=True)
class Insight:
    text: str
    citations: tuple[int, ...]  # the reasoner's local numbers, 1..N


def _hours(later: datetime, earlier: str) -> float:
    then = parse_time(earlier)
    return max(0.0, (later - then).total_seconds() / 3600)


def _normalized(values: list[float]) -> list[float]:
    low, high = min(values), max(values)
    return [1.0] * len(values) if high == low else [(v - low) / (high - low) for v in values]


def rerank(candidates: Sequence[Candidate], now: datetime, k: int, weights: Weights = Weights()) -> list[Candidate]:
    """Top k by recency × importance × similarity, each min-max normalized over the candidates
    (weighted sum, as in the paper); ties broken by id so the order is deterministic."""
    if not candidates:
        return []
    recency = _normalized([weights.decay_per_hour ** _hours(now, c.occurred_at) for c in candidates])
    importance = _normalized([c.importance for c in candidates])
    similarity = _normalized([c.similarity for c in candidates])
    scored = [(weights.recency * r + weights.importance * i + weights.similarity * s, c)
              for r, i, s, c in zip(recency, importance, similarity, candidates)]
    scored.sort(key=lambda pair: (-pair[0], pair[1].id))
    return [c for _, c in scored[:k]]


@dataclass(frozen=True)
class Belief:
    reflection_id: str
    text: str
    evidence: tuple[Candidate, ...]
    depth: int
    importance: float


@dataclass(frozen=True)
class Verdict:
    kept: tuple[Belief, ...]
    dropped: tuple[tuple[str, str], ...]  # (insight text, why)


def reflection_id(user_id: str, cycle_id: str, evidence_ids: Sequence[str]) -> str:
    """Same user, cycle and evidence → same id: a redelivered request cannot add a copy."""
    return str(uuid.uuid5(BELIEFS, f"{user_id}|{cycle_id}|{'|'.join(sorted(evidence_ids))}"))


def judge(user_id: str, cycle_id: str, insights: Sequence[Insight], evidence: Sequence[Candidate],
          citation_floor: int = 2, max_depth: int = 2) -> Verdict:
    """Step 4–5: remap local numbers 1..N to real ids, ignore numbers outside
    1..N (never guessed), drop what cites fewer than `citation_floor` valid items
    or would be deeper than `max_depth`."""
    kept: list[Belief] = []
    dropped: list[tuple[str, str]] = []
    for insight in insights:
        cited = tuple(dict.fromkeys(evidence[n - 1] for n in insight.citations
                                    if isinstance(n, int) and 1 <= n <= len(evidence)))
        text = insight.text.strip()
        if not text:
            dropped.append((insight.text, "empty"))
            continue
        if len(cited) < citation_floor:
            dropped.append((text, f"cites {len(cited)} valid item(s), floor is {citation_floor}"))
            continue
        depth = 1 + max(c.depth for c in cited)
        if depth > max_depth:
            dropped.append((text, f"depth {depth} exceeds max_depth {max_depth}"))
            continue
        rid = reflection_id(user_id, cycle_id, [c.id for c in cited])
        if any(b.reflection_id == rid for b in kept):
            dropped.append((text, "same evidence as a belief of this cycle"))
            continue
        importance = max(c.importance for c in cited)
        kept.append(Belief(rid, text, cited, depth, importance))
    return Verdict(tuple(kept), tuple(dropped))


def ungrounded(text: str, vector, cited: Sequence[tuple[str, Any]], hostile: Sequence[tuple[str, Any]],
               min_cosine: float | None, floor: int) -> str | None:
    """Why a belief may not be persisted, or None. `cited` are its evidence and
    `hostile` the instruction-shaped texts its reasoner was shown, each as
    (text, unit vector). A belief is refused when

    - its own text is instruction-shaped (a model can copy an order from an episode);
    - it reads more like an instruction-shaped text it was shown than like its
      best clean evidence (an order reworded, or its words listed);
    - with `min_cosine` set, fewer than `floor` of its clean cited items support
      it by meaning (cosine ≥ min_cosine): an injected order is no evidence of
      what the user is like, and a belief its evidence does not say is made up."""
    cue = instruction_cue(text)
    if cue:
        return f"instruction-shaped text ({cue})"
    if not hostile and min_cosine is None:
        return None
    usable = [(t, v) for t, v in cited if not instruction_cue(t)]
    support = sorted((float(vector @ v) for _, v in usable), reverse=True)
    if hostile:
        closest = max(float(vector @ v) for _, v in hostile)
        if not support or closest >= support[0]:
            return (f"reads like instruction-shaped text shown to the reasoner (cosine {closest:.2f}, "
                    f"best clean evidence {support[0] if support else 0:.2f})")
    if min_cosine is not None and (len(support) < floor or support[floor - 1] < min_cosine):
        best = ", ".join(f"{c:.2f}" for c in support[:floor]) or "none"
        return (f"not grounded: fewer than {floor} of its {len(cited)} cited items support it by meaning "
                f"(cosine ≥ {min_cosine}; best {best}; {len(cited) - len(usable)} instruction-shaped)")
    return None
