"""The same log gives the same beliefs: one history streamed twice — in batches
of 256 at once, and in batches of 5 with the worker stopped mid-stream and
restarted — ends with the same beliefs (ids, texts, evidence, depth,
confidence, status) and the same episodes in the view. So does a fresh
worker (another app id, a data directory of its own) consuming the first
run's three topics from the start, with the gates off: it adopts every
cycle the log completed and runs none again. (With the contradiction gate
on it does not: its catch-up puts the log's later beliefs in the view, which
the gate reads as it is.)

Several cycles a user, beliefs over beliefs, two retractions of episodes
beliefs cite and a manual cycle between them: what used to make the outcome
depend on timing (the reflector polling the view, beliefs reaching the
accumulator's window at a point of the stream that depends on timing, a
retraction racing a cycle, a manual request reading whatever window was
current).

    python -m pytest tests/test_determinism.py -s
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from collections import Counter

import pytest

from conftest import wait_for
from memory_worker import MemoryWorker, memory_runtime
from streams.adapters.factory import make_embedder
from streams.adapters.factory import make_reasoner
from streams.adapters.view.edge import EdgeView
from processors.accumulator import Accumulator, Trigger, admit
from schemas import EpisodeRecorded, EpisodeRetracted, ReflectionRequested
from streams.broker import free_port
from streams.producer import Publisher
from streams.settings import Settings
from streams.topics import ensure_topics
from test_faults_crash import (Workers, beliefs_of, episode_stream, episodes_of, make_settings, read_events,
                               users_by_partition, view_snapshot)

pytestmark = [pytest.mark.integration, pytest.mark.broker]

PER_USER, THRESHOLD, MIN_EPISODES = 120, 15.0, 10


def history(users, settings=None) -> list:
    """Each user: a retraction of an episode a belief cites after its 70th
    episode, a manual cycle after its 95th, and a retraction of its episode 24
    right after it, which revalidation cycles of the first retraction and the
    manual cycle race unless they are ordered. `settings`: the worker's (by
    default this test's trigger on the defaults)."""
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
    memory (tests/memory_worker.py), so the retraction reaches a belief
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


async def publish(settings, events) -> None:
    async with Publisher(settings) as publisher:
        for event in events:
            await publisher.publish(event, wait=False)
        await publisher.flush()


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


def run(broker, tmp, name: str, batch: int, restart_at: int | None, challenge: str = "on") -> dict:
    settings = make_settings(broker.url, tmp / name, threshold=THRESHOLD, min_episodes=MIN_EPISODES,
                             projector_batch=batch, session_timeout=6.0, challenge=challenge)
    users = users_by_partition(2, settings.partitions)
    asyncio.run(ensure_topics(settings))
    return consume(settings, tmp, name, users, history(users, settings), restart_at)


def consume(settings, tmp, name: str, users, events, restart_at: int | None, published: bool = False) -> dict:
    """A worker through the history (published first, unless the topics hold
    it), settled; what its view and the log hold."""
    (tmp / name).mkdir(parents=True, exist_ok=True)
    workers = Workers(tmp / name)
    started = time.monotonic()
    try:
        worker = workers.start(settings)
        if restart_at is None and not published:
            asyncio.run(publish(settings, events))
        elif restart_at is not None:
            asyncio.run(publish(settings, events[:restart_at]))
            wait_for(lambda: sum(worker.stats(u).get("episodes", 0) for u in users) >= restart_at // 3, 60,
                     "a third of the first part in the view")
            worker.stop()  # mid-stream: batches in flight, cycles asked and not yet run
            worker = workers.start(settings)
            asyncio.run(publish(settings, events[restart_at:]))
        wait_for(lambda: settled(worker, settings, events, users), 180, f"{name}: the whole history settled")
    finally:
        workers.stop_all()
    snapshot = view_snapshot(settings, users)
    beliefs = {u: {rid: as_set(p) for rid, p in held.items()} for u, held in beliefs_of(snapshot).items()}
    print(f"{name}: {sum(map(len, beliefs.values()))} beliefs in {time.monotonic() - started:.1f} s")
    reflections = read_events(settings, settings.topic_reflections)
    return {"beliefs": beliefs, "episodes": episodes_of(snapshot), "settings": settings, "users": users,
            "events": events,
            "created": {e["reflection_id"]: e["cycle_id"] for e in reflections if e["type"] == "ReflectionCreated"},
            "audits": Counter(e["cycle_id"] for e in reflections
                              if e["type"] in ("ReflectionCycleCompleted", "ReflectionChallenged"))}


def differences(one: dict, other: dict) -> dict:
    """Per belief id, what differs (for the failure message)."""
    out = {}
    for rid in sorted(one.keys() | other.keys()):
        a, b = one.get(rid, {}), other.get(rid, {})
        if a != b:
            out[rid] = {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}
    return out


def test_the_same_history_gives_the_same_beliefs_whatever_the_batches_and_a_restart(broker, tmp_path):
    once = run(broker, tmp_path, "at-once", batch=256, restart_at=None)
    again = run(broker, tmp_path, "small-batches-restarted", batch=5, restart_at=8 * 50)
    beliefs = once["beliefs"]
    assert sum(map(len, beliefs.values())) >= 8 * 3, "too few beliefs for the comparison to mean much"
    assert any(p["depth"] == 2 for b in beliefs.values() for p in b.values()), "no belief over beliefs"
    assert any(p["status"] != "live" or p.get("lost_evidence_ids") for b in beliefs.values() for p in b.values()), \
        "the retraction changed no belief"
    for user, held in beliefs.items():
        diff = differences(held, again["beliefs"][user])
        assert not diff, "\n".join([user, *(f"{rid}: {d}" for rid, d in diff.items())])
    assert again["episodes"] == once["episodes"]
    assert again["created"] == once["created"]  # and each belief was made by the same cycle


def test_a_fresh_worker_on_the_same_topics_adopts_every_cycle_and_holds_the_same_beliefs(broker, tmp_path):
    once = run(broker, tmp_path, "first", batch=256, restart_at=None, challenge="off")
    assert max(once["audits"].values()) == 1, "a cycle completed twice on the log"
    settings = once["settings"]
    fresh = consume(dataclasses.replace(settings, app_id=f"{settings.app_id}-fresh", data_dir=str(tmp_path / "fresh"),
                                        web_port=free_port()),
                    tmp_path, "fresh", once["users"], once["events"], None, published=True)
    assert fresh["audits"] == once["audits"], "the fresh worker ran again cycles the log had completed"
    assert sum(map(len, once["beliefs"].values())) >= 8 * 3, "too few beliefs for the comparison to mean much"
    assert fresh["beliefs"] == once["beliefs"] and fresh["episodes"] == once["episodes"]
