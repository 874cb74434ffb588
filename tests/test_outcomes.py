"""A cycle is decided once: its outcome is stored before it is published
(streams/pipeline/requests.py, table `cycle-outcomes`), so a rerun after a
crash or a stop between the publish and the mark of the request done never
asks the reasoner twice; and it publishes only what the log lacks
(streams/on_log.py), so every record is on the log once and the spend is
charged once. Shown in-process (tests/memory_worker.py) over the real
Qdrant Edge view.

    python -m pytest tests/test_outcomes.py -q
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from memory_worker import MemoryWorker, memory_runtime
from processors.embedders import HashingEmbedder
from processors.reasoners import OfflineReasoner, Usage
from processors.view import EdgeView
from schemas import ReflectionCycleCompleted
from streams.on_log import Log
from streams.ownership import partition_of
from streams.pipeline.runner import HandedOver
from streams.producer import Publisher, make_episode
from streams.settings import Settings
from streams.topics import ensure_topics
from test_faults_crash import beliefs_of, episode_stream, points_of, users_by_partition

USERS = users_by_partition(1, 2)


class Counted(OfflineReasoner):
    """The offline reasoner, counting its calls and billing 100 tokens for each."""

    calls = 0

    def questions(self, *args, **kwargs):
        Counted.calls += 1
        questions, used = super().questions(*args, **kwargs)
        return questions, used + Usage(input_tokens=100)


class StopsInPublish(MemoryWorker):
    """The requests pipeline stops once in each cycle's publish, after the
    first `published(events)` of its events reach the log and before the
    request is marked done, and reads its batch again (MemoryWorker.consume)."""

    published = staticmethod(lambda events: events)

    def __init__(self, runtime) -> None:
        super().__init__(runtime)
        publish, self.stops = runtime.outlets.publish, set()

        async def publish_then_stop(events) -> None:
            cycles = {e.cycle_id for e in events if isinstance(e, ReflectionCycleCompleted)} - self.stops
            if not cycles:
                return await publish(events)
            await publish(self.published(events))
            self.stops |= cycles
            raise HandedOver("stopped in a cycle's publish")
        runtime.outlets.publish = publish_then_stop


class StopsAfterEachPublish(StopsInPublish):
    pass


class StopsWithinEachPublish(StopsInPublish):
    published = staticmethod(lambda events: events[:len(events) // 2])  # the completion comes last


class StopsAfterEachCharge(MemoryWorker):
    """The requests pipeline stops once in each cycle right after its spend
    is charged (the charge on the changelog), before the request is marked
    done, and reads its batch again."""

    def __init__(self, runtime) -> None:
        super().__init__(runtime)
        self.stops = set()

        def stop_after_charge(table, key, value) -> None:
            if table == "last-cycle" and value["cycle_id"] not in self.stops:  # the charge's last write
                self.stops.add(value["cycle_id"])
                raise HandedOver("stopped after a cycle's charge")
        runtime.app.on_write = stop_after_charge


def run(tmp, worker_class) -> dict:
    settings = Settings.load(env={}, data_dir=str(tmp), threshold=5.0, min_episodes=5, projector_batch=8)
    embedder, Counted.calls = HashingEmbedder(), 0
    view = EdgeView(settings.view_dir, settings.view, embedder.dim)
    worker = worker_class(memory_runtime(settings, view, embedder, Counted(embedder)))
    try:
        asyncio.run(worker.run(episode_stream(USERS, 40)))
        published = worker.runtime.outlets.reflections.events()
        return {"calls": Counted.calls, "beliefs": beliefs_of(points_of(view, USERS)),
                "completed": [e.cycle_id for e in published if isinstance(e, ReflectionCycleCompleted)],
                "event_ids": [e.event_id for e in published], "stops": len(getattr(worker, "stops", ())),
                "spend": worker.runtime.tables.spend.data}
    finally:
        view.close()


@pytest.mark.parametrize("stopping", [StopsAfterEachPublish, StopsWithinEachPublish, StopsAfterEachCharge])
def test_a_cycle_rerun_asks_the_reasoner_nothing_and_publishes_what_the_log_lacks(tmp_path, stopping):
    once, again = run(tmp_path / "once", MemoryWorker), run(tmp_path / "stopped", stopping)
    assert once["calls"] > 0 and len(set(once["completed"])) >= len(USERS) * 2
    assert again["stops"] >= len(USERS) * 2, "no cycle was rerun"
    assert again["calls"] == once["calls"]  # the reruns reused what was decided
    assert sorted(again["event_ids"]) == sorted(once["event_ids"])  # each record on the log once
    assert again["completed"] == once["completed"] and again["beliefs"] == once["beliefs"]
    assert again["spend"] == once["spend"] and once["spend"]  # charged once


@pytest.mark.integration
@pytest.mark.broker
def test_the_log_says_which_events_it_holds_from_an_offset_on(settings):
    """streams/on_log.Log.holds on the real broker: what was published
    before `since` is not looked at, what after it is found, by event id."""
    user = "u-log"
    tp = TopicPartition(settings.topic_episodes, partition_of(user, settings.partitions))

    async def published_around() -> tuple[set[str], set[str]]:
        await ensure_topics(settings)
        async with Publisher(settings) as publisher:
            before = [await publisher.publish_episode(user, f"before {i}", 0.5) for i in range(2)]
            consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap)
            await consumer.start()
            since = (await consumer.end_offsets([tp]))[tp]
            await consumer.stop()
            after = [await publisher.publish_episode(user, f"after {i}", 0.5) for i in range(2)]
        never = make_episode(user, "never published", 0.5)
        held = await Log(settings, app=None).holds(tp.topic, tp.partition, since,
                                                   [e.event_id for e in (*before, *after, never)])
        return held, {e.event_id for e in after}

    held, after = asyncio.run(published_around())
    assert held == after
