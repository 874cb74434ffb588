"""Offsets Reflect owns (streams/worker/commits.py): the group resumes each of the
pipeline's topics where the worker's effects are durable, committed through
Faust's `Consumer._commit` (pinned in pyproject.toml: this fails first when
it moves), and never where Faust's acknowledgements would put it (see also
tests/integration/test_handover.py: a stop with a batch given up commits nothing past it).

Under `REFLECT_PROCESSING_GUARANTEE=exactly_once`, on a broker with
transactions (noida-db here; Apache Kafka in production), the commits also
commit each partition's transaction, or nothing the worker wrote is ever
visible to a `read_committed` consumer — which is how a downstream service
on such a deployment reads beliefs.

    python -m pytest tests/integration/test_commits.py -s
    REFLECT_TEST_BROKER=noida python -m pytest tests/integration/test_commits.py -s
"""

from __future__ import annotations

import asyncio
import contextlib

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.topics import ensure_topics
from support.broker import TEST_BROKER
from support.harness import wait_for
from support.runs import (Workers, committed_to_end, episode_stream, make_settings, publish, read_events,
                          users_by_partition)

pytestmark = [pytest.mark.integration, pytest.mark.broker]

PER_USER = 30


@contextlib.contextmanager
def fed_worker(broker, tmp_path, **overrides):
    """(settings, worker, users): one worker, every user's episodes in its
    view and cycles done; stopped at the end whatever happened."""
    settings = make_settings(broker.url, tmp_path / "data", threshold=5.0, min_episodes=5, projector_batch=16,
                             **overrides)
    users = users_by_partition(1, settings.partitions)
    asyncio.run(ensure_topics(settings))
    workers = Workers(tmp_path)
    try:
        worker = workers.start(settings)
        asyncio.run(publish(settings, episode_stream(users, PER_USER)))
        wait_for(lambda: all(worker.stats(u).get("episodes") == PER_USER and worker.stats(u).get("cycles", 0) > 0
                             for u in users), 120, "every episode in the view and cycles done")
        yield settings, worker, users
    finally:
        workers.stop_all()


def test_every_pipeline_topic_is_committed_to_its_end_once_its_effects_are_durable(broker, tmp_path):
    with fed_worker(broker, tmp_path) as (settings, worker, users):
        assert read_events(settings, settings.topic_reflections), "no belief event: the reflections topic is empty"
        for topic in (settings.topic_episodes, settings.topic_requests, settings.topic_reflections):
            wait_for(lambda: committed_to_end(settings, topic), 30, f"{topic} committed to its end")


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


@pytest.mark.skipif(TEST_BROKER != "noida", reason="needs broker transactions: noida-db here "
                    "(Tansu answers no InitProducerId)")
def test_what_an_exactly_once_worker_writes_is_committed_with_its_offsets(broker, tmp_path):
    with fed_worker(broker, tmp_path, processing_guarantee="exactly_once") as (settings, worker, users):
        done = sum(worker.stats(u)["cycles"] for u in users)

        def seen() -> int:  # cycles whose completion a read_committed consumer sees
            events = asyncio.run(committed_events(settings, settings.topic_reflections))
            return len({e["cycle_id"] for e in events if e["type"] == "ReflectionCycleCompleted"})
        wait_for(lambda: seen() >= done, 60, f"the {done} cycles done committed for read_committed consumers")
