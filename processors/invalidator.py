"""Invalidator: retractions → ReflectionInvalidated (+ revalidation requests).

The reverse-provenance index is the view's keyword index on `lineage_ids`,
every record a belief has ever cited, not only the newest `evidence_ids` it
shows (beliefs citing X = one indexed filter), written in the same upsert as
the belief and rebuilt by any replay, so there is no second copy to keep in
step.
Its cost follows the dependents, not the store.

Every writer of a belief event puts it in the view before the user's next
request runs (the reflector once the log has it, a walk before publishing).
A retraction is walked in the user's request order
(streams/worker/pipeline/requests.py), after the cycles asked before it, so their
beliefs are in the view when it is walked. A belief that still reaches the
log citing what a walk found gone (a revalidation asked by a late belief,
below, which is not numbered in that order) is caught too: this processor
also reads every ReflectionCreated / Reinforced and checks each against what
it knows is gone. That knowledge — gone ids, and its own decisions — is its
own state (a Faust table keyed by user), so whichever comes first, each
belief is decided once per lost piece of evidence.

That state is bounded per user (`bounded`); what it drops can no longer
matter, or the bound says what it costs:

* `decided` keeps only weakened beliefs, at most one entry per weakened live
  belief: the confidence and losses a later loss must start from. An invalid
  belief's entry goes, as its id is in `gone`, which says it is invalid (and
  the view says so too once it projects the invalidation).
* `gone` keeps the MAX_GONE newest ids by valid time. The losses of weakened
  beliefs stay counted through `decided`. A retraction redelivered after
  MAX_GONE newer losses is decided again: what it reached is invalid or
  already lost it, so it emits nothing, except an erasure, carried out again
  with the same event ids. A belief event arriving after MAX_GONE newer
  losses, citing what was lost before them, is not invalidated by it: the
  reflector cites only what the view serves, so that takes a view as far
  behind.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from processors.ports import VectorStore
from processors.projector import point_id
from processors.provenance import Decision, decide, reach
from schemas import (ChallengeRequested, EpisodeRetracted, ErasureCompleted, Event, InvalidationRequested,
                     ReflectionCreated, ReflectionInvalidated, ReflectionReinforced, ReflectionRequested, now,
                     parse_time)

REVALIDATE = uuid.UUID("0b5c1f0e-7c1a-4f57-8d6e-2b9f3b1c8e44")
FORWARD = uuid.UUID("5d0b8c3e-2f64-4c1e-9a57-3e8d1f6b0a29")
MAX_GONE = 1024  # gone ids a user's state keeps at most, the newest by valid time


def forwarded(retraction: EpisodeRetracted, position: int) -> InvalidationRequested:
    """A retraction as the reflector's queue takes it, at its position in the
    episodes topic; its id derives from the retraction's, so a redelivery
    forwards the same event."""
    return InvalidationRequested(
        event_id=f"invalidation:{uuid.uuid5(FORWARD, retraction.event_id)}", user_id=retraction.user_id,
        episode_id=retraction.episode_id, reason=retraction.reason, retraction_id=retraction.event_id,
        occurred_at=retraction.occurred_at, position=position)


def placed(events: list[Event], position: int | None) -> list[Event]:
    """The requests among `events` at `position`: the offset of the record
    that asked for them, which bounds what their cycles read."""
    return [replace(e, position=position) if isinstance(e, (ReflectionRequested, ChallengeRequested)) else e
            for e in events]


def empty_state() -> dict[str, Any]:
    # gone: id → {"at": valid time, "erasure": bool}
    # decided: weakened belief id → {"lost", "status", "confidence"} after its last decision
    return {"gone": {}, "decided": {}}


def bounded(state: dict[str, Any], max_gone: int = MAX_GONE) -> dict[str, Any]:
    """The state without what can no longer matter (see the module's docstring)."""
    gone = state["gone"]
    if len(gone) > max_gone:
        gone = dict(sorted(gone.items(), key=lambda item: (parse_time(item[1]["at"]), item[0]))[-max_gone:])
    decided = {rid: d for rid, d in state["decided"].items()
               if not (d["status"] == "invalid" and rid in state["gone"])}
    return {"gone": gone, "decided": decided}


def overlay(state: dict[str, Any], rid: str) -> dict[str, Any]:
    """What this processor knows of a belief that the view may not show yet."""
    if rid in state["gone"]:
        return {"status": "invalid", "confidence": 0.0}
    return {k: v for k, v in state["decided"].get(rid, {}).items() if k != "lost"}


def lost_ids(state: dict[str, Any]) -> set[str]:
    """Every id known to be gone: those in `gone`, and what weakened beliefs
    lost, whose ids `gone` may have dropped since."""
    return {*state["gone"], *(e for d in state["decided"].values() for e in d["lost"])}


class Invalidator:
    def __init__(self, view: VectorStore, citation_floor: int, max_depth: int, max_gone: int = MAX_GONE) -> None:
        self.view, self.floor, self.max_depth, self.max_gone = view, citation_floor, max_depth, max_gone

    def _dependents(self, user: str, state: dict[str, Any]):
        def of(record_id: str) -> list[dict[str, Any]]:
            found: dict[str, dict[str, Any]] = {}
            # Every belief that ever cited it (lineage), and those projected before lineage was kept.
            for field in ("lineage_ids", "evidence_ids"):
                found |= {p["reflection_id"]: p for _, p in self.view.scroll(user, kind="reflection",
                                                                             **{field: record_id})
                          if p.get("user_id") == user}
            # Sorted: the walk's order decides paths, and must not follow the engine's.
            return [{**p, **overlay(state, rid)} for rid, p in sorted(found.items())]
        return of

    def on_retracted(self, event: EpisodeRetracted, state: dict[str, Any]) -> tuple[list[Event], bool]:
        """Events for a retraction, and whether anything knew the episode at all."""
        user, cause = event.user_id, event.episode_id
        pid = point_id("episode", user, cause)
        held = self.view.get([pid]).get(pid, {})
        known = "recorded_at" in held  # a tombstone has none
        erasure = event.reason == "erasure"
        if erasure and "text" in held:  # kept until now for the cycles asked before it (projector.py)
            self.view.strip([pid], {"retraction_reason": "erasure"}, drop=["text"])
        if cause in state["gone"] and (state["gone"][cause]["erasure"] or not erasure):
            return [], known  # redelivered: decided already
        # New, or an episode retracted before and now to be erased as well.
        state["gone"][cause] = {"at": state["gone"].get(cause, {}).get("at", event.occurred_at), "erasure": erasure}
        seeds = [(cause, p) for p in self._dependents(user, state)(cause)]
        out = self._decide(user, cause, seeds, state)
        state.update(bounded(state, self.max_gone))
        state.pop("pending", None)  # what state written before beliefs reached the view first held
        if erasure:  # its proof, last: what the walk took the text of
            beliefs = tuple(e.reflection_id for e in out if isinstance(e, ReflectionInvalidated))
            out.append(ErasureCompleted(
                event_id=f"erasure:{event.event_id}", user_id=user, erasure_id=event.event_id, episode_id=cause,
                episodes=(cause,) if known else (), occurred_at=event.occurred_at, beliefs=beliefs,
                cycles=self._readers(user, (cause, *beliefs))))
        return out, known or bool(seeds)

    def _readers(self, user: str, records) -> tuple[str, ...]:
        """The cycles that read any of `records` (their questions and notes derive from them)."""
        return tuple(sorted({p["cycle_id"] for rid in records
                             for _, p in self.view.scroll(user, kind="cycle", read_ids=rid)
                             if p.get("user_id") == user}))

    def on_belief(self, event: ReflectionCreated | ReflectionReinforced, state: dict[str, Any]) -> list[Event]:
        """Decide a belief that reached the log citing what is already gone, as
        the view holds it now (its writer put it there first)."""
        rid, user = event.reflection_id, event.user_id
        decided = state["decided"].get(rid, {})
        more = (event.lineage_ids or ()) if isinstance(event, ReflectionCreated) else event.added_evidence_ids
        cited = (*event.evidence_ids, *more)  # its lineage, as far as this event says
        lost = [e for e in dict.fromkeys(cited) if e in state["gone"] and e not in decided.get("lost", ())]
        if not lost or rid in state["gone"]:  # an invalid belief's id is in gone
            return []
        pid = point_id("reflection", user, rid)
        held = self.view.get([pid]).get(pid) or {"evidence_ids": list(event.evidence_ids),
                                                  "lineage_ids": list(dict.fromkeys(cited)),
                                                  "confidence": event.confidence, "depth": getattr(event, "depth", 1)}
        payload = {"status": "live", **held, "reflection_id": rid, **overlay(state, rid)}
        out = self._decide(user, lost[0], [(lost[0], payload)], state)
        state.update(bounded(state, self.max_gone))
        state.pop("pending", None)
        return out

    def _decide(self, user: str, cause: str, seeds, state: dict[str, Any]) -> list[Event]:
        reached, parent = reach(seeds, self._dependents(user, state), self.max_depth, root=cause)
        erasure = state["gone"][cause]["erasure"]
        lost_before = {rid: d["lost"] for rid, d in state["decided"].items()}
        decisions = decide(reached, parent, cause, lost_ids(state), lost_before, self.floor, erasure)
        at, expired = state["gone"][cause]["at"], now()
        out: list[Event] = []
        for d in decisions:
            state["decided"][d.reflection_id] = {
                "lost": sorted({*lost_before.get(d.reflection_id, ()), *d.lost}),
                "status": "invalid" if d.status == "invalid" else "live", "confidence": d.confidence}
            if d.status == "invalid":
                state["gone"][d.reflection_id] = {"at": at, "erasure": erasure}
            out.append(ReflectionInvalidated(
                event_id=f"invalidated:{d.reflection_id}:{cause}{':erasure' if erasure else ''}", user_id=user,
                reflection_id=d.reflection_id,
                cause=cause, path=d.path, status=d.status, invalid_at=at, expired_at=expired,
                confidence=d.confidence, surviving_evidence_ids=d.surviving, erased=erasure))
            # What still stands is reflected on again: to confirm a weakened belief, or
            # to re-derive, without the erased text, one an erasure took away.
            if len(d.surviving) >= self.floor and (d.status == "weakened" or erasure):
                out.append(self._revalidation(user, d, cause, at, state))
        return out

    def _revalidation(self, user: str, d: Decision, cause: str, at: str, state) -> ReflectionRequested:
        beliefs = self.view.get([point_id("reflection", user, e) for e in d.surviving])
        is_belief = {e for e in d.surviving if point_id("reflection", user, e) in beliefs}
        cycle = f"{user}:revalidate:{uuid.uuid5(REVALIDATE, f'{d.reflection_id}:{cause}')}"
        return ReflectionRequested(
            event_id=f"request:{cycle}", user_id=user, cycle_id=cycle, why="revalidation", occurred_at=at,
            reflection_id=d.reflection_id, evidence_ids=d.surviving,
            window_episode_ids=tuple(e for e in d.surviving if e not in is_belief),
            window_reflection_ids=tuple(e for e in d.surviving if e in is_belief))
