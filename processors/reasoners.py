"""The offline reasoner (steps 2 and 4 of the loop): deterministic, behind the port in processors/ports.py.

A reasoner sees statements as numbered data and answers with questions, or
with insights that cite statement numbers; `reflection.judge` then decides
what survives. The offline reasoner needs no network and no key: it is an
extractive pattern finder that groups statements by meaning and restates each
recurring group's most representative statement, citing exactly that group.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from processors.embedders import HashingEmbedder
from processors.extractive import (MEMBER_MARGIN, PLACE_DF, THEME_CUT, asked, belief_text, beliefs_text, core_of,
                                   generalized, is_belief, place_words, question_about, routine, salient, shared_parts,
                                   themes, without)
from processors.ports import Embedder, Reasoner, Usage
from processors.reflection import Insight

if TYPE_CHECKING:
    from processors.challenge import Answer


class OfflineReasoner:
    """An extractive pattern finder, not a language model: it groups
    statements by meaning (the worker's embedder), asks about what recurs in
    different words, and states the evidence that says what the question says
    as its most representative statement, citing exactly those episodes. It
    cannot cite what it was not shown, and text inside a statement is only
    ever quoted."""

    name = "offline-extractive"
    prompt_version = "extractive-v3"
    batched = False  # it makes no calls, so there is nothing to save
    dated = True  # the reflector passes when each statement occurred: a belief says over what period

    def __init__(self, embedder: Embedder | None = None, cut: float | None = None) -> None:
        self.embedder = embedder or HashingEmbedder()
        self.cut = cut if cut is not None else THEME_CUT.get(self.embedder.name, 0.45)
        self.member_cut = self.cut + MEMBER_MARGIN.get(self.embedder.name, 0.0)
        self.place_df = PLACE_DF.get(self.embedder.name)  # None: this embedder reads no place words
        self._known: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def _vectors(self, statements: Sequence[str], places: frozenset[str] = frozenset()) -> np.ndarray:
        """Remembered, and the ones not yet known embedded in one call: a
        text's vector must not depend on the batch it came in, or the grouping
        would differ between processes and replays. MiniLM's does not (its
        groups are padded with masked tokens: the same bits alone or in any
        batch, tests/unit/test_minilm.py), and the call costs a third of
        one text at a time (issue 34); an embedder whose vectors do depend on
        the batch (`batch_exact` false) is still asked one text at a time.
        Place words are read as gaps (extractive.place_words)."""
        return self._texts_vectors([without(places, core_of(s)) for s in statements])

    def _texts_vectors(self, cores: Sequence[str]) -> np.ndarray:
        with self._lock:
            held = {t: self._known[t] for t in dict.fromkeys(cores) if t in self._known}
            missing = [t for t in dict.fromkeys(cores) if t not in held]
            if getattr(self.embedder, "batch_exact", False):
                held.update(zip(missing, self.embedder.embed(missing)) if missing else ())
            else:
                held.update((t, self.embedder.embed([t])[0]) for t in missing)
            for text in missing:  # held keeps this call's vectors: an eviction cannot take one it needs
                if len(self._known) >= MEMORY:
                    self._known.pop(next(iter(self._known)))  # the oldest: a FIFO bound
                self._known[text] = held[text]
            return np.array([held[c] for c in cores], dtype=np.float32).reshape(len(cores), self.embedder.dim)

    def _places(self, statements: Sequence[str]) -> frozenset[str]:
        return place_words(statements, self._vectors, self.cut, self.place_df) if self.place_df else frozenset()

    def questions(self, statements: Sequence[str], n: int = 3,
                  importance: Sequence[float] | None = None) -> tuple[list[str], Usage]:
        vectors = self._vectors(statements, self._places(statements))
        picked = salient(statements, vectors @ vectors.T, self.cut, importance or [0.0] * len(statements), n)
        return [question_about(statements[said] if said is not None else generalized(statements[i]), usual)
                for i, usual, said in picked], Usage()

    def insights(self, question: str, statements: Sequence[str], n: int = 5,
                 dates: Sequence[str] | None = None) -> tuple[list[Insight], Usage]:
        """One insight per coherent group of the evidence that answers the
        question (its members as close to the question, on average, as to
        each other): the members that say what the group's representative
        says, cited exactly. Routine is stated only when asked about. An
        earlier belief in the group is repeated verbatim, citing the group's
        episodes and never itself, so the reflector reinforces it instead of
        keeping a near-copy; two or more earlier beliefs in one group make a
        belief about them, citing them (one level up)."""
        places, question_ = self._places(statements), asked(question)
        vectors, target = self._vectors(statements, places), self._vectors([question_.about], places)[0]
        out = []
        for theme in themes(statements, vectors, self.cut):
            if float(np.mean(vectors[list(theme.members)] @ target)) < self.cut:
                continue
            members = [m for m in theme.members if float(vectors[m] @ vectors[theme.first]) >= self.member_cut]
            held = [m for m in members if is_belief(statements[m])]
            if len(held) >= 2:  # earlier beliefs from different evidence agree: a belief about them
                out.append(Insight(beliefs_text(len(held), core_of(statements[theme.first])),
                                   tuple(m + 1 for m in held)))
                continue
            cited = tuple(m + 1 for m in members if not is_belief(statements[m]))
            if len(cited) < 2 or (not question_.usual and routine([statements[c - 1] for c in cited])):
                continue
            # An earlier belief this group repeats is said verbatim: the
            # reflector then reinforces it instead of keeping a near-copy.
            said = statements[held[0]] if held else question_.belief
            when = [dates[c - 1] for c in cited] if dates else ()
            shared = shared_parts([core_of(statements[c - 1]) for c in cited])
            out.append(Insight(said or belief_text(len(cited), generalized(statements[theme.first], shared), when),
                               cited))
        return out[:n], Usage()

    def verdict(self, belief: str, evidence: Sequence[str], challengers: Sequence[str]) -> tuple["Answer", Usage]:
        from processors.challenge import offline_verdict  # its own module: the heuristic, labeled as such

        return offline_verdict(belief, evidence, challengers), Usage()


MEMORY = 8192  # statement vectors the offline reasoner keeps


class Remembered:
    """A reasoner that keeps its answers, for one cycle: a cycle tried again
    after a transient fault of the view or the broker (the error policy
    retries it from its start) asks nothing it was answered already, and
    pays for nothing twice. Only answers are kept: a failure is asked again.
    Everything else (name, prompt_version, batched, ...) is the reasoner's."""

    ASKING = frozenset({"questions", "insights", "insights_for", "verdict"})

    def __init__(self, reasoner: Reasoner) -> None:
        self._reasoner, self._answers = reasoner, dict[Any, Any]()

    def __getattr__(self, name: str):
        attribute = getattr(self._reasoner, name)
        if name not in self.ASKING:
            return attribute

        def ask(*args, **kwargs):
            key = (name, _frozen(args), _frozen(kwargs))
            if key not in self._answers:
                self._answers[key] = attribute(*args, **kwargs)
            return copy.deepcopy(self._answers[key])  # the caller may change what it is given
        return ask


def _frozen(value):
    """Call arguments as a key: sequences and mappings of plain values."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value
