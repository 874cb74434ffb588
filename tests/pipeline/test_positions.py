"""Cycles read as of their place in the log, so ingest never waits for them.

Episodes that reach the log out of valid-time order (a client posting a
user's turns eight at a time) and retractions are projected at once; a cycle
reads only the episodes logged at or before its request, less those
retracted by then (processors/ports.py, POSITION and GONE), and a
retraction's walk runs in the user's request order (an erasure's takes the
text then). Shown in-process over
the real Qdrant Edge view (tests/support/memory_worker.py): the same late-arriving
history, with retractions of cited episodes, a manual cycle between them and
erasures near the end,
gives the same beliefs whether every cycle runs as soon as it is asked, in
batches of 5, or only once the whole history is in the view (a reasoner far
behind ingest), in batches of 256 — and in the second case the episodes
pipeline reads the whole history while no cycle has run, since nothing it
does waits for one.

    python -m pytest tests/pipeline/test_positions.py -q
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace

from processors.embedders import HashingEmbedder
from processors.reasoners import OfflineReasoner
from processors.ports import POSITION
from streams.adapters.view.edge import EdgeView
from schemas import (EpisodeRecorded, GateRequested, InvalidationRequested, ReflectionChallenged,
                     ReflectionCycleCompleted, ReflectionRequested)
from streams.settings import Settings
from streams.worker.pipeline.runner import HandedOver
from support.history import MIN_EPISODES, THRESHOLD, as_set, differences, erasing, history
from support.memory_worker import MemoryWorker, memory_runtime
from support.runs import beliefs_of, episode_stream, points_of, users_by_partition

USERS = users_by_partition(1, 4)
WAIT = 30.0  # seconds: ingest that waited for a cycle the reasoner holds back would not end in a third of it


def late(events, spread: int = 8, seed: int = 3):
    """Each user's episodes in log order, their valid times shuffled within
    runs of `spread`: what `spread` concurrent posts of consecutive turns give."""
    rng, by_user = random.Random(seed), {}
    for e in events:
        if isinstance(e, EpisodeRecorded):
            by_user.setdefault(e.user_id, []).append(e)
    times = {}
    for user, own in by_user.items():
        stamps = [e.occurred_at for e in own]
        for start in range(0, len(stamps), spread):
            block = stamps[start:start + spread]
            rng.shuffle(block)
            stamps[start:start + spread] = block
        times.update({e.episode_id: t for e, t in zip(own, stamps)})
    return [replace(e, occurred_at=times[e.episode_id]) if isinstance(e, EpisodeRecorded) else e for e in events]


class BehindReasoner(MemoryWorker):
    """Cycles run only once every episode is read and handled: the reasoner
    as far behind ingest as it can be."""

    async def consume(self, topic, runner) -> None:
        if topic is self.runtime.outlets.requests:
            episodes = self.runtime.outlets.episodes
            async with self.turns:
                await self.turns.wait_for(lambda: not self.unread(episodes) and self.busy == 0)
            self.ingested = time.monotonic()
            self.cycles_when_ingested = sum(isinstance(e, ReflectionCycleCompleted)
                                            for e in self.runtime.outlets.reflections.events())
        await super().consume(topic, runner)


def settings_for(tmp, batch: int, **overrides) -> Settings:
    return Settings.load(env={}, data_dir=str(tmp), threshold=THRESHOLD, min_episodes=MIN_EPISODES,
                         projector_batch=batch, **overrides)


def run(tmp, events, batch: int, worker_class=MemoryWorker, **overrides):
    settings = settings_for(tmp, batch, **overrides)
    embedder = HashingEmbedder()
    view = EdgeView(settings.view_dir, settings.view, embedder.dim)
    worker = worker_class(memory_runtime(settings, view, embedder, OfflineReasoner(embedder)))
    try:
        started = time.monotonic()
        asyncio.run(worker.run(list(events)))
        return worker, started, points_of(view, USERS)
    finally:
        view.close()


def test_late_episodes_never_wait_and_give_the_same_beliefs_whatever_the_reasoners_pace(tmp_path):
    events = late(erasing(history(USERS, settings_for(tmp_path, 256)), USERS))
    assert any(a.occurred_at > b.occurred_at for a, b in zip(events, events[len(USERS):])
               if a.user_id == b.user_id), "the history has no late episode"

    _, _, eager = run(tmp_path / "eager", events, batch=5)
    behind, started, later = run(tmp_path / "behind", events, batch=256, worker_class=BehindReasoner)

    for points in (eager, later):  # the erasures' walks took the text, whenever they ran
        erased = [p for u in USERS for p in points[u].values() if p.get("episode_id") == f"{u}-12"
                  and p["kind"] == "episode"]
        assert len(erased) == len(USERS) and not any("text" in p for p in erased)
        proofs = [p for u in USERS for p in points[u].values() if p["kind"] == "erasure"]
        assert sorted(p["episode_id"] for p in proofs) == sorted(f"{u}-12" for u in USERS)
    assert behind.cycles_when_ingested == 0
    assert behind.ingested - started < WAIT / 3, "ingest waited for the reasoner"
    beliefs = beliefs_of(eager)
    assert sum(map(len, beliefs.values())) >= len(USERS) * 3, "too few beliefs for the comparison to mean much"
    assert any(p["status"] != "live" or p.get("lost_evidence_ids") for b in beliefs.values() for p in b.values()), \
        "the retractions changed no belief"
    for user, held in beliefs.items():
        one = {rid: as_set(p) for rid, p in held.items()}
        other = {rid: as_set(p) for rid, p in beliefs_of(later)[user].items()}
        diff = differences(one, other)
        assert not diff, "\n".join([user, *(f"{rid}: {d}" for rid, d in diff.items())])


def test_an_episode_logged_again_keeps_its_first_offset_and_is_counted_once(tmp_path):
    """A retried write comes back after more episodes than the accumulator's
    window (100) holds: its point keeps the offset it was first logged at,
    and the user's episodes are counted once each."""
    events = episode_stream(USERS[:1], 130)
    worker, _, points = run(tmp_path, events + events[:3], batch=16)
    positions = {p["episode_id"]: p[POSITION] for p in points[USERS[0]].values() if p["kind"] == "episode"}
    assert positions == {e.episode_id: i for i, e in enumerate(events)}
    assert worker.runtime.tables.accumulators.get(USERS[0])["episodes"] == len(events)


class HandsOver(MemoryWorker):
    """The episodes pipeline stops right after each request it publishes
    reaches the log, the first time (as a worker killed or handing its
    partitions over there would), and reads its batch again only once every
    cycle asked so far is done: the view as far ahead of the state the
    replay starts from as it can be."""

    def __init__(self, runtime) -> None:
        super().__init__(runtime)
        publish, self.stops = runtime.outlets.publish, set()

        async def publish_then_stop(events) -> None:
            await publish(events)
            requests = {e.event_id for e in events if isinstance(e, (ReflectionRequested, GateRequested,
                                                                     InvalidationRequested))}
            if requests - self.stops:
                self.stops |= requests
                raise HandedOver("stopped after a request reached the log")
        runtime.outlets.publish = publish_then_stop

    async def handed_over(self) -> None:
        async with self.turns:
            await self.turns.wait_for(lambda: not self.unread(self.runtime.outlets.requests) and self.busy == 0)


def test_a_stop_after_a_request_reached_the_log_replays_to_the_same_beliefs(tmp_path):
    """With the contradiction gate on, which judges episodes against the
    beliefs in the view: each request the episodes pipeline asks is stored
    with the state that asked it before it is published, so a replay goes on
    from there and never judges an episode again against beliefs of a cycle
    asked after it."""
    events = history(USERS, settings_for(tmp_path, 256))
    _, _, once = run(tmp_path / "once", events, batch=256, challenge="on")
    stopped, _, again = run(tmp_path / "stopped", events, batch=5, challenge="on", worker_class=HandsOver)
    asked = [e for e in stopped.runtime.outlets.requests.events()]
    assert len(stopped.stops) >= len(USERS) * 8 and any(isinstance(e, GateRequested) for e in asked)
    assert any(isinstance(e, ReflectionChallenged) for e in stopped.runtime.outlets.reflections.events())
    for user, held in beliefs_of(once).items():
        diff = differences({rid: as_set(p) for rid, p in held.items()},
                           {rid: as_set(p) for rid, p in beliefs_of(again)[user].items()})
        assert not diff, "\n".join([user, *(f"{rid}: {d}" for rid, d in diff.items())])
