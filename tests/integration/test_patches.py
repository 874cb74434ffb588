"""The patches of streams/worker/patches.py still apply to the installed Faust,
mode and aiokafka (pyproject.toml bounds their versions; these fail first
when an upgrade moves what they touch)."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

from streams.worker.patches import patch_fetch_wait, patch_perform_seek, patch_recovery_seek_floor
from streams.worker.read_order import ReadOrder
from support.broker import one_partition_app
from support.harness import until


def test_the_fetch_wait_patch_wraps_the_worker_consumer_and_its_start_reads_the_attribute():
    patch_fetch_wait()
    assert getattr(AIOKafkaConsumerThread._create_worker_consumer, "patched", False)

    async def built() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", fetch_max_wait_ms=1500)
    consumer = asyncio.run(built())
    assert consumer._fetch_max_wait_ms == 1500  # the attribute the patch sets …
    assert "self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start)  # … and start() reads


@pytest.mark.integration
@pytest.mark.broker
def test_seeks_land_where_the_patches_say_on_a_running_consumer(settings, tmp_path):
    """patch_perform_seek: a stream partition with no commit whose
    position moved past its first records is read from its start once Faust
    seeks its partitions to their commits (without the patch it stays where
    it was: a record fetched and dropped there is lost), and the app's
    read order expects its next record there.
    patch_recovery_seek_floor: a recovery seek below -1 lands on 0 (without
    it aiokafka raises and Faust crashes the worker)."""
    patch_perform_seek()
    patch_recovery_seek_floor()
    topic = f"seek-{uuid.uuid4().hex[:8]}"
    tp = TP(topic, 0)

    async def positions() -> tuple[int, int, int]:
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap)
        await producer.start()
        try:
            for i in range(3):
                await (await producer.send(topic, b"record %d" % i, partition=0))
        finally:
            await producer.stop()
        app = one_partition_app(settings, f"seek-{topic}", topic, tmp_path)
        app.read_order = ReadOrder(app)

        @app.agent(app.topic(topic, value_serializer="raw", partitions=1, acks=False))
        async def sink(stream):
            async for _ in stream.noack():
                pass
        await app.start()
        try:
            await until(lambda: tp in app.consumer.assignment(), "the partition assigned", timeout=60)
            await app.consumer.seek(tp, 2)  # past its first records, as after a fetch that was dropped
            moved = await app.consumer.position(tp)
            await app.consumer.perform_seek()
            sought = await app.consumer.position(tp)
            assert app.read_order.expected[tp] == sought  # where the runner reads next (streams/worker/read_order.py)
            # patch_recovery_seek_floor: below -1, or None (a standby's offset not yet known), is read from 0,
            # as -1 (aiokafka refuses a negative seek, and None)
            # What recovery asks the consumer for, not its position after: the running agent fetches on.
            asked, seek_wait = [], app.consumer.seek_wait

            async def recorded(offsets):
                asked.append(dict(offsets))
                await seek_wait(offsets)

            app.consumer.seek_wait = recorded
            for offset in (-2, None):
                await app.tables.recovery._seek_offsets(app.consumer, {tp}, Counter({tp: offset}), "standby")
            return moved, sought, [a[tp] for a in asked]
        finally:
            await app.stop()

    moved, sought, floored = asyncio.run(asyncio.wait_for(positions(), 120))
    assert (moved, sought, floored) == (2, 0, [0, 0])
