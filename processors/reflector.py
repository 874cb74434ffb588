"""Reflector: one reflection cycle (steps 2–5) for one ReflectionRequested.

`run_cycle` reads only through the view port and the reasoner port and returns
the events to publish; the agent publishes them. Every cycle ends with a
ReflectionCycleCompleted, failed ones included; its outcome is ok, empty (no
belief survived), failed (an answer could not be used), unavailable (the
reasoner's API did not answer) or refused (budget spent, breaker open).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence, cast

from processors.injection import instruction_cue
from processors.ports import GONE, Embedder, Hit, Reasoner, Usage, VectorStore
from processors.projector import latest, point_id, support_of
from processors.reflection import Candidate, Weights, judge, rerank, ungrounded
from processors.staleness import held, refreshed
from schemas import (Event, ReflectionCreated, ReflectionCycleCompleted, ReflectionReinforced,
                     ReflectionRequested, parse_time)


@dataclass(frozen=True)
class CycleConfig:
    top_k: int = 8
    citation_floor: int = 2
    max_depth: int = 2
    questions: int = 3
    insights: int = 5
    duplicate_cosine: float = 0.92
    max_evidence: int = 32  # evidence ids a belief keeps (the schema allows 256): see kept_evidence
    weights: Weights = Weights()
    grounding_cosine: float | None = None  # None: only the instruction screen (see reflection.ungrounded)
    stale_after_days: float = 0.0  # 0: beliefs never go stale (processors/staleness.py)

    @classmethod
    def from_settings(cls, settings) -> "CycleConfig":
        grounding = settings.grounding_min_cosine
        return cls(top_k=settings.top_k, citation_floor=settings.citation_floor, max_depth=settings.max_depth,
                   grounding_cosine=GROUNDING_COSINE.get(settings.embedder) if grounding is None else grounding,
                   duplicate_cosine=DUPLICATE_COSINE.get(settings.embedder, cls.duplicate_cosine),
                   stale_after_days=settings.stale_after_days)


# Cosine a cited item needs to support a belief, per embedder (REFLECT_GROUNDING_MIN_COSINE
# overrides). MiniLM: paraphrases 0.55–0.9, unrelated texts below 0.2 (measured). Feature
# hashing only sees shared words: its check is word overlap, not meaning.
# e5-small's cosines sit in a narrow band (unrelated ≈ 0.7): its values are MiniLM's
# carried over by rank (tests/benchmarks/embedder_thresholds.py), as is the
# duplicate cosine (a new belief this close to a live one reinforces it).
GROUNDING_COSINE = {"minilm": 0.35, "hashing": 0.05, "e5-small": 0.85}
DUPLICATE_COSINE = {"minilm": 0.92, "hashing": 0.92, "e5-small": 0.98}


TIE_MARGIN = 2  # over-fetch: the engine orders equal scores by storage, which batches change
POOL = 2  # the evidence step reranks the dense top POOL × k of each question by the hybrid score


def top(hits: Sequence[Hit], k: int) -> list[Hit]:
    """The k best by score, equal scores by id: the same k whatever the
    view's segment layout (near-identical texts score exactly alike)."""
    return sorted(hits, key=lambda h: (-h.score, h.id))[:k]


def _candidates(view: VectorStore, user_id: str, questions: Sequence[str], vectors, k: int, max_depth: int,
                at: str, cycle_id: str, upto: int | None = None) -> list[list[Candidate]]:
    """Per question: episodes and live beliefs of this user near it that
    occurred by the cycle's time `at` and, for episodes, were logged at or
    before its request's position `upto` (however late an episode came, and
    however far the projector has read since, the cycle sees the same ones:
    processors/ports.py, POSITION); a belief already at max_depth is left
    out, as nothing citing it could be kept. Two batched searches per kind:
    the exact dense top POOL × k of each question, cut by (score, id), then
    the engine's hybrid score (dense + BM25 fused, as recall reads) of that
    pool, every point of it scored exactly (IDF over the user's whole store),
    cut by (score, id) again: the same evidence whatever the view's storage
    layout, at the cost of a search over the pool rather than the store (a
    hybrid query prefetching the whole store took 290 ms a cycle at 10k
    episodes, against 14 ms for the dense search). What BM25 adds here is the
    order within the pool: a point the dense search ranks below the pool is
    not found by its terms alone.

    Beliefs of this very cycle are left out too: they occur at `at`, so a
    redelivered request (at-least-once: a worker killed after publishing,
    before committing) would otherwise cite its own first run's beliefs and
    add depth-2 beliefs that a run without the crash never makes. The search
    asks for as many more as the view holds of them, so what is left is the
    same top k the first run saw."""
    own = view.count(user_id, kind="reflection", cycle_id=cycle_id)

    def search(n: int, **match: Any) -> list[list[Hit]]:
        near = view.search_many(user_id, vectors, TIE_MARGIN * POOL * n, before=at, upto=upto, **match)
        pool = sorted({h.id for hits in near for h in top(hits, POOL * n)})
        if not pool:
            return [[] for _ in questions]
        return view.search_hybrid(user_id, vectors, questions, len(pool), before=at, ids=pool,
                                  prefetch=len(pool), upto=upto, **match)
    # As of `upto`, an episode retracted later still counts (what is erased has no vector left).
    episodes = search(k, kind="episode", **({"status": "recorded"} if upto is None else {}))
    beliefs = search(k + own, kind="reflection", status="live")
    episodes = [top(e, k) for e in episodes]
    beliefs = [top([h for h in b if h.payload.get("cycle_id") != cycle_id], k) for b in beliefs]
    return [[Candidate(p.get("episode_id") or p["reflection_id"], p["kind"], p.get("text", ""),
                       float(p.get("importance", 0.0)), p["occurred_at"], int(p.get("depth", 0)), h.score)
             for h in e + b for p in [h.payload]
             if p.get("user_id") == user_id and int(p.get("depth", 0)) < max_depth]
            for e, b in zip(episodes, beliefs)]


SERVED = {"episode": "recorded", "reflection": "live"}
WINDOW = 100  # the records step 2 reads: the user's newest, episodes and beliefs


def window_refs(request: ReflectionRequested, recent: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(kind, id) of the records a cycle names: the window the accumulator saw
    when it fired, or — for a manual request, which carries none — the current one."""
    if request.window_episode_ids is None and request.window_reflection_ids is None:
        return [(r["kind"], r["id"]) for r in recent]
    return [("episode", i) for i in request.window_episode_ids or ()] + \
           [("reflection", i) for i in request.window_reflection_ids or ()]


def window_records(view: VectorStore, user_id: str, refs: Sequence[tuple[str, str]],
                   upto: int | None = None) -> list[dict[str, Any]]:
    """The (kind, id) records of a window as the view holds them now, oldest
    first; what was invalidated since, erased, or retracted at or before
    position `upto` (any retraction, without one) is left out."""
    pids = {point_id(kind, user_id, rid): (kind, rid) for kind, rid in refs}
    found = view.get(list(pids))
    return sorted((_record(kind, rid, p) for pid, (kind, rid) in pids.items() for p in [found.get(pid)]
                   if p and p.get("user_id") == user_id and p.get("text") and readable(kind, p, upto)),
                  key=lambda r: (r["occurred_at"], r["id"]))


def readable(kind: str, payload: dict[str, Any], upto: int | None) -> bool:
    if payload.get("status") == SERVED[kind]:
        return True
    gone = payload.get(GONE)
    return kind == "episode" and upto is not None and gone is not None and gone > upto


def _record(kind: str, rid: str, p: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "kind": kind, "text": p["text"], "importance": float(p.get("importance", 0.0)),
            "occurred_at": p["occurred_at"], "depth": int(p.get("depth", 0))}


def earlier_beliefs(view: VectorStore, request: ReflectionRequested) -> list[dict[str, Any]]:
    """The user's live beliefs of earlier cycles, as of the request's time,
    oldest first. Every writer of a belief puts it in the view before the
    user's next request runs (the reflector its own, once published; the
    walk its decisions), and one user's requests run in log order: so this
    set is a function of the log."""
    user, at = request.user_id, parse_time(request.occurred_at)
    held = [_record("reflection", p["reflection_id"], p)
            for _, p in view.scroll(user, kind="reflection", status="live")
            if p.get("user_id") == user and p.get("cycle_id") != request.cycle_id and p.get("text")
            and parse_time(p["occurred_at"]) <= at]
    return sorted(held, key=lambda r: (r["occurred_at"], r["id"]))[-WINDOW:]


def cycle_window(view: VectorStore, request: ReflectionRequested,
                 recent: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What step 2 reads: the records the request names, and for a threshold or
    manual cycle the user's earlier beliefs too; the newest WINDOW, oldest first."""
    named = window_records(view, request.user_id, window_refs(request, recent), request.position)
    if request.why == "revalidation":  # it names exactly the evidence that survived
        return named
    merged = {r["id"]: r for r in (*named, *earlier_beliefs(view, request))}.values()
    return sorted(merged, key=lambda r: (r["occurred_at"], r["id"]))[-WINDOW:]


def run_cycle(request: ReflectionRequested, window: Sequence[dict[str, Any]], view: VectorStore,
              embedder: Embedder, reasoner: Reasoner, config: CycleConfig) -> list[Event]:
    """A cycle runs at its request's valid time (the record that fired it):
    evidence is what occurred by then, recency counts back from then, and its
    beliefs occur then. The stream may be far ahead when the cycle runs, or be
    replayed; the cycle still sees the same history and decides the same."""
    started = time.perf_counter()
    at = request.occurred_at
    cycle_time = parse_time(at)
    user, cycle = request.user_id, request.cycle_id
    usage, questions, out, asked = Usage(), [], [], []
    kept = reinforced = 0
    drops: list[tuple[str, str]] = []  # (insight text, why): the audit event says why each was dropped
    made: list[tuple[str, Any]] = []  # (reflection id, text vector) emitted in this cycle
    try:
        questions, used = _asked(reasoner.questions, [r["text"] for r in window], config.questions,
                                 importance=[float(r.get("importance", 0.0)) for r in window])
        usage += used
        found = _candidates(view, user, questions, embedder.embed(questions), config.top_k * 4, config.max_depth,
                            at, cycle, request.position) \
            if questions else []
        asked = [(q, rerank(c, cycle_time, config.top_k, config.weights)) for q, c in zip(questions, found)]
        answers, used = _asked(_insights, reasoner, asked, config.insights)
        usage += used
        for question, evidence, insights in answers:
            verdict = judge(user, cycle, insights, evidence, config.citation_floor, config.max_depth)
            drops += verdict.dropped
            for belief in verdict.kept:
                vector = embedder.embed([belief.text])[0]
                why = _screened(belief, vector, [question, *(c.text for c in evidence)], embedder, config)
                if why:
                    drops.append((belief.text, why))
                    continue
                # Several questions can reach the same evidence: one belief per cycle.
                if any(rid == belief.reflection_id or float(vector @ v) >= config.duplicate_cosine
                       for rid, v in made):
                    drops.append((belief.text, "same as another belief of this cycle"))
                    continue
                made.append((belief.reflection_id, vector))
                event = _belief_event(request, belief, vector, question, view, reasoner, config)
                if event is None:
                    drops.append((belief.text, "a live belief already rests on this evidence"))
                    continue
                kept += isinstance(event, ReflectionCreated)
                reinforced += isinstance(event, ReflectionReinforced)
                out.append(event)
                if config.stale_after_days and isinstance(event, ReflectionReinforced):
                    out += refreshed(held(view, event), event, config.stale_after_days, request.cycle_id)
        outcome, error = ("ok" if out else "empty"), None
    except Exception as exc:
        if not getattr(exc, "from_reasoner", False):
            raise  # the view's or a bug's, not the reasoner's: the pipeline's error policy decides
        # The reasoner's failure is reported in the audit event, never retried in a loop.
        usage += getattr(exc, "spent", Usage())
        outcome = "unavailable" if getattr(exc, "unavailable", False) else "failed"
        error, out = f"{type(exc).__name__}: {exc}"[:2000], []
    read = [r["id"] for r in window] + [c.id for _, evidence in asked for c in evidence]
    out.append(_completed(request, reasoner, outcome, error, usage, started, questions=questions,
                          kept=kept, reinforced=reinforced, drops=drops, read=read))
    return out


def _screened(belief, vector, shown: Sequence[str], embedder: Embedder, config: CycleConfig) -> str | None:
    """Why a kept insight may still not be persisted (reflection.ungrounded).
    `shown`: what the reasoner read to write it (its question and evidence);
    texts are embedded only when a check needs them (usually none is hostile)."""
    hostile = list(dict.fromkeys(t for t in shown if instruction_cue(t)))
    cited = [c.text for c in belief.evidence]
    needed = config.grounding_cosine is not None or bool(hostile)
    vectors = list(embedder.embed(cited + hostile)) if needed else [None] * len(cited)
    return ungrounded(belief.text, vector, list(zip(cited, vectors)), list(zip(hostile, vectors[len(cited):])),
                      config.grounding_cosine, config.citation_floor)


def refused(request: ReflectionRequested, reasoner: Reasoner, reason: str) -> ReflectionCycleCompleted:
    """The audit event of a cycle that did not call the reasoner at all."""
    return _completed(request, reasoner, "refused", reason, Usage(), time.perf_counter())


MAX_DROPS = 64  # reasons an audit event lists (its `dropped` counts them all)
MAX_READ = 4096  # records an audit event names as read (a window and each question's evidence: far fewer)


def _completed(request, reasoner, outcome, error, usage, started, questions=(), kept=0, reinforced=0,
               drops=(), read=()) -> ReflectionCycleCompleted:
    return ReflectionCycleCompleted(
        event_id=f"cycle:{request.cycle_id}", user_id=request.user_id, cycle_id=request.cycle_id,
        why=request.why, questions=tuple(q[:2000] for q in questions), kept=kept, reinforced=reinforced,
        dropped=len(drops),
        drops=tuple({"reason": why[:500], "text": text[:500]}
                    for text, why in drops[:MAX_DROPS]),
        duration_ms=round((time.perf_counter() - started) * 1000, 3), outcome=outcome,
        reasoner=reasoner.name, error=error, usage=usage.to_dict(),
        read_ids=tuple(dict.fromkeys(read))[:MAX_READ] or None,  # what an erasure of any of them reaches
        occurred_at=request.occurred_at)  # the cycle's valid time, as its beliefs


def _asked(call, *args, **kwargs):
    """A reasoner call; what it raises is marked as the reasoner's failure
    (reported in the cycle's audit event, never retried as a view fault)."""
    try:
        return call(*args, **kwargs)
    except Exception as exc:
        setattr(exc, "from_reasoner", True)  # read by the cycle's error report
        raise


def _insights(reasoner: Reasoner, asked, n: int):
    """(question, evidence, insights) per question, and the usage: one call for
    all questions when the reasoner batches — over the union of their evidence,
    so citations number one list — else one call per question."""
    if getattr(reasoner, "batched", False) and asked:
        pool = list({c.id: c for _, evidence in asked for c in evidence}.values())
        number = {c.id: k for k, c in enumerate(pool, start=1)}
        batching = cast(Any, reasoner)  # a reasoner that batches has insights_for (the port does not ask it)
        tagged, usage = batching.insights_for([q for q, _ in asked], [c.text for c in pool], n,
                                              found=[[number[c.id] for c in evidence] for _, evidence in asked],
                                              **_dated(reasoner, pool))
        return [(q, pool, [i for k, i in tagged if k == index]) for index, (q, _) in enumerate(asked)], usage
    answers, usage = [], Usage()
    for question, evidence in asked:
        try:
            insights, used = reasoner.insights(question, [c.text for c in evidence], n, **_dated(reasoner, evidence))
        except Exception as exc:
            setattr(exc, "spent", usage)  # the calls before this one were billed: the budget counts them
            raise
        answers.append((question, evidence, insights))
        usage += used
    return answers, usage


def _dated(reasoner: Reasoner, evidence) -> dict:
    """When each statement occurred, for a reasoner that says over what period
    a pattern recurs (`dated`); the others are asked exactly as before."""
    return {"dates": [c.occurred_at for c in evidence]} if getattr(reasoner, "dated", False) else {}


# Support at which a belief's confidence is one half: a belief at the citation
# floor (two pieces of evidence) starts there, as it did before support was counted.
CONFIDENCE_HALF = 2


def confidence(support: int) -> float:
    """How sure a belief resting on `support` distinct pieces of evidence is:
    support / (support + CONFIDENCE_HALF). It rises with every new piece, by
    less each time, and never reaches 1.0 — no number of agreeing cycles makes
    a belief certain, and a well-supported one still has room to show more
    support than a barely supported one. Floored (not rounded) to 6 decimals
    so it stays below 1.0 however large the support."""
    return math.floor(support / (support + CONFIDENCE_HALF) * 1e6) / 1e6


def kept_evidence(cited: Sequence[str], limit: int) -> tuple[str, ...]:
    """The evidence a belief keeps citing, at most `limit`, in citation order:
    the most recently cited. That is what the next cycles recall (the rerank
    favours recent records), so a re-citation is recognised as a repeat rather
    than counted as new support. Older support stays counted in `support`,
    and in the belief's lineage (the creation's `lineage_ids`, each
    reinforcement's added ids), which a retraction's walk follows."""
    return tuple(cited[-limit:])


def _belief_event(request, belief, vector, question, view, reasoner, config) -> Event | None:
    """A new belief, a reinforcement of a live near-duplicate of the same user,
    or None when that near-duplicate already cites all this evidence."""
    user, cycle = request.user_id, request.cycle_id
    evidence_ids = tuple(c.id for c in belief.evidence)
    # Only a belief of the same depth can be reinforced: merging evidence across
    # levels would make a belief cite itself or misstate its depth.
    # A stale belief said again on fresh evidence is reinforced too, and so comes back (refreshed).
    held = view.search(user, vector, 5 * TIE_MARGIN, kind="reflection", status="live")
    if config.stale_after_days:
        held += view.search(user, vector, 5 * TIE_MARGIN, kind="reflection", status="stale")
    near = [h for h in top(held, 5)
            if h.score >= config.duplicate_cosine and h.payload.get("user_id") == user
            and int(h.payload.get("depth", 1)) == belief.depth]
    if near:
        old = near[0].payload
        previous = old.get("evidence_ids", [])
        added = tuple(e for e in evidence_ids if e not in previous)
        if not added:  # the belief already rests on this evidence: a repeat, not support
            return None
        support = support_of(old.get("support"), previous) + len(added)
        # Evidence lost to retractions stays counted in support but backs the belief no more.
        standing = support - len(old.get("lost_evidence_ids", ()))
        return ReflectionReinforced(
            event_id=f"reinforced:{cycle}:{belief.reflection_id}", user_id=user,
            reflection_id=old["reflection_id"], cycle_id=cycle,
            evidence_ids=kept_evidence((*previous, *added), config.max_evidence), added_evidence_ids=added,
            confidence=confidence(standing), support=support, similarity=round(min(1.0, near[0].score), 6),
            supported_at=latest(*(c.occurred_at for c in belief.evidence if c.id in added)),
            occurred_at=request.occurred_at)
    return ReflectionCreated(
        event_id=f"created:{belief.reflection_id}", user_id=user, reflection_id=belief.reflection_id,
        cycle_id=cycle, text=belief.text[:16000], evidence_ids=kept_evidence(evidence_ids, config.max_evidence),
        lineage_ids=evidence_ids if len(evidence_ids) > config.max_evidence else None,
        depth=belief.depth, importance=belief.importance, confidence=confidence(len(evidence_ids)),
        support=len(evidence_ids), reasoner=reasoner.name, prompt_version=reasoner.prompt_version,
        question=question[:2000], supported_at=latest(*(c.occurred_at for c in belief.evidence)),
        occurred_at=request.occurred_at)
