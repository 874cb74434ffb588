"""The staleness gate, bi-temporal and deterministic.

A belief knows when its newest support occurred (`supported_at`, valid time
of the newest evidence it cites). The user's stream has a valid time too: the
latest `occurred_at` of the user's episodes so far. When the stream moves past
a live belief's support by the horizon (REFLECT_STALE_AFTER_DAYS), the belief
goes stale at the episode that moved it there — in the user's valid time,
never the wall clock, so a replay decides the same at the same point of the
log. A stale belief is served only when asked for (`include=stale`), never
pinned into a prompt, never offered as evidence. It is revalidated by a
challenge cycle over its evidence and the user's recent episodes newer than
its support, and challenged again by new episodes that bear on it, as a live
belief is: a verdict of holds on newer evidence makes it live again
(ReflectionStaled with stale=false, after the reinforcement); so does a
reflection cycle that says it again on newer evidence.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, Mapping, Sequence

from processors.challenge import MAX_CHALLENGERS
from processors.ports import VectorStore
from processors.projector import point_id
from schemas import ChallengeRequested, Event, ReflectionReinforced, ReflectionStaled, parse_time

REFRESH = uuid.UUID("9a7e2d41-5c3b-4f0e-8b6a-1d2c3e4f5a6b")  # namespace of staleness revalidation cycle ids


def supported_at(belief: Mapping[str, Any]) -> str:
    return belief.get("supported_at") or belief["occurred_at"]


def first_stale(beliefs: Sequence[Mapping[str, Any]], episodes: Sequence[Mapping[str, Any]], stream_at: str | None,
                horizon_days: float) -> tuple[int | None, list[str], str | None]:
    """(episodes up to and including the first that moves the stream past some
    live beliefs' horizon, those beliefs' ids by id, the stream's valid time
    then) — or (None, [], the stream's valid time after all of them)."""
    horizon = timedelta(days=horizon_days)
    due = sorted(((parse_time(supported_at(b)) + horizon, b["reflection_id"]) for b in beliefs), key=lambda d: d[0])
    stream = parse_time(stream_at) if stream_at else None
    for n, episode in enumerate(episodes, start=1):
        at = parse_time(episode["occurred_at"])
        if stream is None or at > stream:
            stream, stream_at = at, episode["occurred_at"]
        passed = sorted(rid for limit, rid in due if limit < stream)
        if passed and horizon_days > 0:
            return n, passed, stream_at
    return None, [], stream_at


def went_stale(user: str, beliefs: Sequence[Mapping[str, Any]], cause: Mapping[str, Any], horizon_days: float,
               recent: Sequence[Mapping[str, Any]]) -> list[Event]:
    """For each belief gone stale at `cause` (an episode): its ReflectionStaled,
    and a challenge of it by the user's recent episodes newer than its
    support (the newest MAX_CHALLENGERS; none, no challenge): a cycle over its
    evidence and the recent window, whose verdict brings it back (holds: fresh
    support), supersedes it, or leaves it stale (unrelated)."""
    ids = [r["id"] for r in recent]
    recent = recent[:ids.index(cause["id"]) + 1] if cause["id"] in ids else recent  # the log up to the cause
    out: list[Event] = []
    for b in beliefs:
        rid, since = b["reflection_id"], parse_time(supported_at(b))
        out.append(ReflectionStaled(event_id=f"staled:{rid}:{cause['id']}", user_id=user, reflection_id=rid,
                                    stale=True, supported_at=supported_at(b), horizon_days=horizon_days,
                                    cause=cause["id"], occurred_at=cause["occurred_at"]))
        newer = tuple(r["id"] for r in recent if r.get("kind", "episode") == "episode"
                      and parse_time(r["occurred_at"]) > since and r["id"] not in b.get("evidence_ids", ()))
        if newer:
            cycle = f"{user}:refresh:{uuid.uuid5(REFRESH, rid + ':' + cause['id'])}"
            out.append(ChallengeRequested(event_id=f"request:{cycle}", user_id=user, cycle_id=cycle,
                                          reflection_id=rid, challenger_ids=newer[-MAX_CHALLENGERS:], similarity=0.0,
                                          occurred_at=cause["occurred_at"]))
    return out


def refreshed(held: Mapping[str, Any] | None, event: Event, horizon_days: float,
              cycle_id: str) -> list[ReflectionStaled]:
    """A reinforcement of a stale belief (`held`, as the view holds it) on
    fresh evidence — newer than its support, and within the horizon of the
    cycle's valid time — makes it live again: the event saying so, or nothing."""
    if not horizon_days or not isinstance(event, ReflectionReinforced) or not event.supported_at:
        return []
    if not held or held.get("status") != "stale" or held.get("user_id") != event.user_id:
        return []
    newest = parse_time(event.supported_at)
    if newest <= parse_time(supported_at(held)) or \
            newest + timedelta(days=horizon_days) < parse_time(event.occurred_at):
        return []
    return [ReflectionStaled(event_id=f"refreshed:{event.reflection_id}:{cycle_id}", user_id=event.user_id,
                             reflection_id=event.reflection_id, stale=False, supported_at=event.supported_at,
                             horizon_days=horizon_days, cause=cycle_id, occurred_at=event.occurred_at)]


def held(view: VectorStore, event: Any) -> dict[str, Any] | None:
    """The belief an event names, as the view holds it."""
    pid = point_id("reflection", event.user_id, event.reflection_id)
    return view.get([pid]).get(pid)
