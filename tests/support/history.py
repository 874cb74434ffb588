"""The determinism history: several cycles a user, beliefs over beliefs, two
retractions of episodes beliefs cite and a manual cycle between them (what
used to make the outcome depend on timing); when a worker has settled on it,
and how two runs' beliefs are compared. The determinism, view-fault,
in-memory pipeline and position tests run it."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile

from processors.accumulator import Accumulator, Trigger, admit
from schemas import EpisodeRecorded, EpisodeRetracted, ReflectionRequested
from streams.adapters.factory import make_embedder, make_reasoner
from streams.adapters.view.edge import EdgeView
from streams.settings import Settings
from support.memory_worker import MemoryWorker, memory_runtime
from support.runs import episode_stream, read_events

PER_USER, THRESHOLD, MIN_EPISODES = 120, 15.0, 10


def history(users, settings=None) -> list:
    """Each user: a retraction of an episode a belief cites after its 70th
    episode, a manual cycle after its 95th, and a retraction of its episode 24
    right after it, which revalidation cycles of the first retraction and the
    manual cycle race unless they are ordered. `settings`: the worker's (by
    default THRESHOLD and MIN_EPISODES on the defaults)."""
    stream, n = episode_stream(users, PER_USER), len(users)
    settings = settings or Settings.load(env={}, threshold=THRESHOLD, min_episodes=MIN_EPISODES)
    cited = cited_by_then(stream[:70 * n], settings, users)

    def each(make):
        return [make(u) for u in users]
    first = each(lambda u: EpisodeRetracted(user_id=u, episode_id=cited[u], occurred_at="2026-06-01T10:10:30Z"))
    asked = each(lambda u: ReflectionRequested(event_id=f"request:{u}:manual:m1", user_id=u, why="manual",
                                               cycle_id=f"{u}:manual:m1", occurred_at="2026-06-01T10:35:30Z"))
    second = each(lambda u: EpisodeRetracted(user_id=u, episode_id=f"{u}-24", occurred_at="2026-06-01T10:35:40Z"))
    return stream[:70 * n] + first + stream[70 * n:96 * n] + asked + second + stream[96 * n:]


def cited_by_then(stream, settings, users) -> dict[str, str]:
    """Per user, the first episode of the stream that a live belief cites once
    `stream` is reflected on: the same pipeline, reasoner and embedder in
    memory (tests/support/memory_worker.py), so the retraction reaches a belief
    whatever the reasoner finds, and the history is fixed before either run."""
    embedder = make_embedder(settings.embedder)
    with tempfile.TemporaryDirectory() as tmp:
        settings = dataclasses.replace(settings, data_dir=tmp)
        view = EdgeView(settings.view_dir, settings.view, embedder.dim)
        try:
            asyncio.run(MemoryWorker(memory_runtime(settings, view, embedder, make_reasoner(settings, embedder)))
                        .run(list(stream)))
            cites = {u: {e for _, p in view.scroll(u, kind="reflection", status="live")
                         for e in p.get("evidence_ids", ())} for u in users}
        finally:
            view.close()
    return {u: next(e.episode_id for e in stream if e.user_id == u and e.episode_id in cites[u]) for u in users}


def as_set(payload: dict) -> dict:
    """Evidence compared as a set: what a belief rests on, not the order a
    reasoner listed it in (which ties in a rerank may change)."""
    return {**payload, "evidence_ids": sorted(payload.get("evidence_ids", ())),
            "lost_evidence_ids": sorted(payload.get("lost_evidence_ids", ()))}


def cycles_asked(events, users) -> dict[str, int]:
    trigger, accs = Trigger(THRESHOLD, MIN_EPISODES), {u: Accumulator() for u in users}
    for e in events:
        accs[e.user_id], _ = admit(accs[e.user_id], e, trigger)
    return {u: acc.cycles for u, acc in accs.items()}


def settled(worker, settings, events, users) -> bool:
    """Every episode in the view, every cycle asked done, every request the
    user asked done (a retraction's walk too, which has no audit event), and
    every request on the log answered by its audit event."""
    asked, recorded = cycles_asked(events, users), {u: 0 for u in users}
    retracted = {u: len({e.episode_id for e in events if isinstance(e, EpisodeRetracted) and e.user_id == u})
                 for u in users}
    for e in events:
        recorded[e.user_id] += isinstance(e, EpisodeRecorded)
    for u in users:
        stats = worker.stats(u)
        if (stats.get("episodes"), stats.get("retracted"), stats.get("cycles")) != \
                (recorded[u] - retracted[u], retracted[u], asked[u]) or stats["requests"] != stats["requests_done"]:
            return False
    requests = {e["cycle_id"] for e in read_events(settings, settings.topic_requests) if "cycle_id" in e}
    completed = {e["cycle_id"] for e in read_events(settings, settings.topic_reflections)  # a challenge's audit
                 if e["type"] in ("ReflectionCycleCompleted", "ReflectionChallenged")}     # is ReflectionChallenged
    return requests <= completed


def differences(one: dict, other: dict) -> dict:
    """Per belief id, what differs (for the failure message)."""
    out = {}
    for rid in sorted(one.keys() | other.keys()):
        a, b = one.get(rid, {}), other.get(rid, {})
        if a != b:
            out[rid] = {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}
    return out


def erasing(events: list, users: list[str]) -> list:
    """The history with an erasure of each user's episode 12 (an auth revert,
    cited by beliefs) near its end."""
    erasures = [EpisodeRetracted(user_id=u, episode_id=f"{u}-12", reason="erasure",
                                 occurred_at="2026-06-01T10:55:30Z") for u in users]
    return events[:-len(users) * 4] + erasures + events[-len(users) * 4:]
