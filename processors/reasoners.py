"""Reasoner port (steps 2 and 4 of the loop) and the offline deterministic reasoner.

A reasoner sees statements as numbered data and answers with questions, or
with insights that cite statement numbers; `reflection.judge` then decides
what survives. The offline reasoner needs no network and no key: it finds
terms shared by several statements and states them as a recurring theme,
citing exactly the statements that contain the term — it cannot cite what it
was not shown, and it never follows text inside a statement.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

from processors.reflection import Insight

if TYPE_CHECKING:
    from processors.challenge import Answer


@dataclass(frozen=True)
class Usage:
    """What a cycle spent: calls and tokens as the API bills them (input_tokens
    excludes the cached prefix, read or written), and their estimated cost."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # cache reads
    cache_write_tokens: int = 0
    cost_usd: float | None = 0.0  # None: no price known for the model

    def __add__(self, other: "Usage") -> "Usage":
        cost = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        return Usage(self.calls + other.calls, self.input_tokens + other.input_tokens,
                     self.output_tokens + other.output_tokens, self.cached_tokens + other.cached_tokens,
                     self.cache_write_tokens + other.cache_write_tokens, cost)

    def to_dict(self) -> dict:
        return {"calls": self.calls, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_tokens": self.cached_tokens, "cache_write_tokens": self.cache_write_tokens,
                "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6)}


class Reasoner(Protocol):
    """`batched` reasoners also answer `insights_for`: all questions of a cycle in
    one call, over the union of their evidence, each insight tagged with the
    0-based index of its question."""

    name: str
    prompt_version: str
    batched: bool

    def questions(self, statements: Sequence[str], n: int = 3,
                  importance: Sequence[float] | None = None) -> tuple[list[str], Usage]: ...

    def insights(self, question: str, statements: Sequence[str], n: int = 5) -> tuple[list[Insight], Usage]: ...

    def verdict(self, belief: str, evidence: Sequence[str],
                challengers: Sequence[str]) -> tuple["Answer", Usage]:
        """Does `belief` (resting on `evidence`) still hold given the new
        `challengers`? Citations number the challengers (processors/challenge.py)."""
        ...


_WORD = re.compile(r"[a-z][a-z0-9_-]{3,}")
_STOP = frozenset("""
about after again also always another because been before being between both could does doing
done during each every from further have having here into itself just like made make many more
most much must never only other over same should some such than that their them then there
these they this those through under until very want wants wanted were what when where which
while will with would your user users agent episode said says asked asks today yesterday
often together
""".split())  # the last line: words of the offline reasoner's own insights


def _terms(text: str) -> list[str]:
    """Sorted: a set's order follows the process's string hashing, and ties
    below are broken in this order, so the same statements give the same
    insight in every process."""
    return sorted({w for w in _WORD.findall(text.lower()) if w not in _STOP})


def _shared_terms(statements: Sequence[str]) -> list[tuple[str, list[int]]]:
    """Terms found in ≥ 2 statements, most widespread first: (term, 1-based numbers)."""
    where: dict[str, list[int]] = {}
    for number, text in enumerate(statements, start=1):
        for term in _terms(text):
            where.setdefault(term, []).append(number)
    shared = [(t, ns) for t, ns in where.items() if len(ns) >= 2]
    shared.sort(key=lambda item: (-len(item[1]), item[0]))
    return shared


class OfflineReasoner:
    name = "offline"
    prompt_version = "offline-v1"
    batched = False  # it makes no calls, so there is nothing to save

    def questions(self, statements: Sequence[str], n: int = 3,
                  importance: Sequence[float] | None = None) -> tuple[list[str], Usage]:
        # Salient = recurring in what mattered: terms of ≥ 2 statements, ranked by
        # the mean importance of the statements that hold them, then by count.
        weights = importance or [1.0] * len(statements)
        held: dict[str, list[float]] = {}
        for text, weight in zip(statements, weights):
            for term in _terms(text):
                held.setdefault(term, []).append(weight)
        ranked = sorted((t for t, ws in held.items() if len(ws) >= 2),
                        key=lambda t: (-sum(held[t]) / len(held[t]), -len(held[t]), t))
        return [f"What recurs in the user's records about {t}?" for t in ranked[:n]], Usage()

    def insights(self, question: str, statements: Sequence[str], n: int = 5) -> tuple[list[Insight], Usage]:
        asked = _terms(question)
        shared = _shared_terms(statements)
        shared.sort(key=lambda item: item[0] not in asked)  # the asked-about term first (stable)
        out: list[Insight] = []
        seen: set[tuple[int, ...]] = set()
        for term, numbers in shared:
            cited = tuple(numbers[:8])
            if cited in seen:
                continue
            seen.add(cited)
            companions = Counter(t for i in cited for t in _terms(statements[i - 1]) if t != term)
            also = [t for t, c in sorted(companions.items(), key=lambda tc: (-tc[1], tc[0]))[:3] if c >= 2]
            out.append(Insight(f"Often together: {', '.join([term, *also])}.", cited))
            if len(out) == n:
                break
        return out, Usage()

    def verdict(self, belief: str, evidence: Sequence[str], challengers: Sequence[str]) -> tuple["Answer", Usage]:
        from processors.challenge import offline_verdict  # its own module: the heuristic, labeled as such

        return offline_verdict(belief, evidence, challengers), Usage()


def make_reasoner(settings) -> Reasoner:
    if settings.reasoner == "offline":
        return OfflineReasoner()
    from processors.anthropic_reasoner import AnthropicReasoner

    return AnthropicReasoner.from_settings(settings)
