"""The contradiction gate's I/O shell: how a run of a user's episodes bears
on the user's live beliefs — one scroll of the live beliefs and one read of
the vectors of the beliefs and the evidence they cite, then exact cosines
(processors/challenge.bearings) — and the challenge requests the user's open
challenges become, within the user's daily challenge budget."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timezone
from typing import Sequence

from processors.accumulator import Accumulator, number
from processors.challenge import Challenge, bearings, closed, quorum_of
from processors.projector import point_id
from processors.view import VectorStore
from schemas import ChallengeRequested, EpisodeRecorded, parse_time

CHALLENGES = uuid.UUID("4b0f7f36-1a8e-4c53-9d1e-5f0c2a7e6b19")  # namespace of challenge cycle ids


def bearing_of(view: VectorStore, user: str, episodes: Sequence[EpisodeRecorded], vectors, quorum: int,
               scored: bool = True,
               cache: dict | None = None) -> tuple[list[dict[str, float]], dict[str, int], list[dict]]:
    """Per episode, belief id → score (see challenge.bearings; none unless
    `scored`), for the live and the stale beliefs (fresh support brings a
    stale one back through a challenge that holds); each one's quorum of
    challengers (challenge.quorum_of); and the live beliefs."""
    beliefs = sorted((p for status in ("live", "stale") for _, p in view.scroll(user, kind="reflection", status=status)
                      if p.get("user_id") == user and p.get("reflection_id")), key=lambda p: p["reflection_id"])
    quorums = {p["reflection_id"]: quorum_of(p, quorum) for p in beliefs}
    live = [p for p in beliefs if p.get("status") == "live"]
    if not beliefs or not episodes or not scored:
        return [{} for _ in episodes], quorums, live
    own = {point_id("reflection", user, p["reflection_id"]): p["reflection_id"] for p in beliefs}
    # An evidence id names an episode, or (in a belief of depth 2) possibly a belief: ask for both points then.
    cited = {point_id(kind, user, e): e for p in beliefs for e in p.get("evidence_ids", ())
             if e not in p.get("lost_evidence_ids", ())
             for kind in (("episode", "reflection") if int(p.get("depth", 1)) > 1 else ("episode",))}
    found = _vectors(view, [*own, *cited], cache)
    return bearings([{"id": e.episode_id, "occurred_at": e.occurred_at} for e in episodes], vectors, beliefs,
                    {rid: found[pid] for pid, rid in own.items() if pid in found},
                    {eid: found[pid] for pid, eid in cited.items() if pid in found}), quorums, live


CACHED = 200_000  # vectors the gate keeps between runs (a point's vector never changes while it is served)


def _vectors(view: VectorStore, ids: list[str], cache: dict | None) -> dict:
    """The vectors of `ids`: from `cache` where it has them, the rest in one
    read. A point without a vector is remembered as such too: the ids asked
    for are of served beliefs and their evidence, and an id that names no
    belief (an episode's, asked for as a belief's too) never comes to."""
    if cache is None:
        return view.vectors(ids)
    missing = [i for i in dict.fromkeys(ids) if i not in cache]
    if missing:
        if len(cache) + len(missing) > CACHED:
            cache.clear()
        found = view.vectors(missing)
        cache.update({i: found.get(i) for i in missing})
    return {i: cache[i] for i in ids if cache.get(i) is not None}


def day_of(at: str) -> str:
    return parse_time(at).astimezone(timezone.utc).date().isoformat()


def asked(acc: Accumulator, user: str, daily: int) -> tuple[Accumulator, list[ChallengeRequested]]:
    """The user's open challenges that reached their quorum, as requests
    numbered in the user's sequence, within the budget of the user's current
    day of valid time (UTC, so a replay counts the same): at most `daily`
    challenges, and each belief at most once. What does not fit stays open."""
    out = []
    for c in closed(acc.challenging):
        day = max(day_of(c.occurred_at), acc.challenge_day or "")  # the stream's day: never back
        if day != acc.challenge_day:
            acc = replace(acc, challenge_day=day, challenged=0, challenged_ids=())
        if acc.challenged >= daily or c.reflection_id in acc.challenged_ids:
            continue  # stays open
        acc = replace(acc, challenged=acc.challenged + 1, challenged_ids=(*acc.challenged_ids, c.reflection_id))
        acc, request = number(acc, request_of(user, c))
        out.append(request)
    asked_now = {r.reflection_id for r in out}
    return replace(acc, challenging=tuple(p for p in acc.challenging if p["id"] not in asked_now)), out


def request_of(user: str, c: Challenge) -> ChallengeRequested:
    # Deterministic: the same log asks the same challenge, a redelivery publishes the same ids.
    cycle = f"{user}:challenge:{uuid.uuid5(CHALLENGES, '|'.join((c.reflection_id, *c.challenger_ids)))}"
    return ChallengeRequested(event_id=f"request:{cycle}", user_id=user, cycle_id=cycle,
                              reflection_id=c.reflection_id, challenger_ids=c.challenger_ids,
                              similarity=max(-1.0, min(1.0, c.similarity)), occurred_at=c.occurred_at)
