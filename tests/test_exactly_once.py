"""`REFLECT_PROCESSING_GUARANTEE=exactly_once` on a broker with transactions
(noida-db here; Apache Kafka in production): Faust writes through one
transactional producer per partition, and Reflect's commits
(streams/commits.py) must commit those transactions with the offsets, or
nothing the worker wrote is ever visible to a `read_committed` consumer —
which is how a downstream service on such a deployment reads beliefs.

    REFLECT_TEST_BROKER=noida python -m pytest tests/test_exactly_once.py
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from conftest import TEST_BROKER, wait_for
from streams.topics import ensure_topics
from test_determinism import publish
from test_faults_crash import Workers, episode_stream, make_settings, users_by_partition

pytestmark = [pytest.mark.integration, pytest.mark.broker,
              pytest.mark.skipif(TEST_BROKER != "noida", reason="needs broker transactions: noida-db here "
                                 "(Tansu answers no InitProducerId)")]

PER_USER = 30


async def committed_events(settings, topic: str) -> list[dict]:
    """Every record of `topic` a read_committed consumer sees."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)  # the last stable offsets, under read_committed
        out = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out += [orjson.loads(r.value) for r in records]
        return out
    finally:
        await consumer.stop()


def test_what_an_exactly_once_worker_writes_is_committed_with_its_offsets(broker, tmp_path):
    settings = make_settings(broker.url, tmp_path / "data", threshold=5.0, min_episodes=5, projector_batch=16,
                             processing_guarantee="exactly_once")
    users = users_by_partition(1, settings.partitions)
    asyncio.run(ensure_topics(settings))
    workers = Workers(tmp_path)
    try:
        worker = workers.start(settings)
        asyncio.run(publish(settings, episode_stream(users, PER_USER)))
        wait_for(lambda: all(worker.stats(u).get("episodes") == PER_USER and worker.stats(u).get("cycles", 0) > 0
                             for u in users), 120, "every episode in the view and cycles done")
        done = {u: worker.stats(u)["cycles"] for u in users}

        def seen() -> int:  # cycles whose completion a read_committed consumer sees
            events = asyncio.run(committed_events(settings, settings.topic_reflections))
            return len({e["cycle_id"] for e in events if e["type"] == "ReflectionCycleCompleted"})
        wait_for(lambda: seen() >= sum(done.values()), 60,
                 f"the {sum(done.values())} cycles done committed for read_committed consumers")
    finally:
        workers.stop_all()
