"""Every record of a pipeline partition reaches its runner, in order, even
when the consumer's position moves past records that were never delivered
(streams/worker/read_order.py): a running Faust consumer on the real broker, whose
position is moved past a record as Faust's dropped deliveries move it."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaProducer
from faust.types import TP

from streams.worker.patches import patch_perform_seek
from streams.worker.pipeline.runner import Runner
from streams.worker.read_order import ReadOrder
from support.broker import one_partition_app
from support.harness import until

pytestmark = [pytest.mark.integration, pytest.mark.broker]


def read_through(settings, ordered: bool, tmp_path) -> list[int]:
    """Offsets the runner's `read` hands on, while a gap and then a dropped
    last record are made: the position moved past record 3, and past
    record 6, each once it was on the log and before it was fetched."""
    patch_perform_seek()
    topic = f"order-{uuid.uuid4().hex[:8]}"
    tp = TP(topic, 0)

    async def run() -> list[int]:
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap)
        await producer.start()

        async def produce(*offsets: int) -> None:
            for i in offsets:
                await (await producer.send(topic, b"record %d" % i, partition=0))

        app = one_partition_app(settings, f"order-{topic}", topic, tmp_path)
        app.read_order = ReadOrder(app) if ordered else None
        runner = Runner(SimpleNamespace(read_order=app.read_order, settings=settings))
        runner.topic = topic
        read: list[int] = []

        @app.agent(app.topic(topic, value_serializer="raw", partitions=1, acks=False))
        async def sink(stream):
            batches = stream.noack_take(10, within=0.05)
            while True:
                read.extend(e.message.offset for e in await runner.read(batches))

        await produce(0, 1, 2)
        await app.start()
        try:
            await until(lambda: read[-1:] == [2], "records 0–2 read")
            # Paused while records 3–5 land, so that the seek stays within the log (past its end, aiokafka
            # would reset to the earliest offset and read record 3 after all).
            app.consumer.pause_partitions([tp])
            await produce(3, 4, 5)
            await app.consumer.seek(tp, 4)  # record 3 "fetched and dropped": the position is past it
            app.consumer.resume_partitions([tp])
            await until(lambda: read[-1:] == [5], "records 3–5 read")
            app.consumer.pause_partitions([tp])  # record 6 lands while nothing is fetched …
            await produce(6)
            await app.consumer.seek(tp, 7)  # … and the position moves past it: the partition's last record
            app.consumer.resume_partitions([tp])
            await until(lambda: read[-1:] == [6], "record 6 read", timeout=5)  # the runner looks every second
        except AssertionError:
            pass  # what was read is the result
        finally:
            await app.stop()
            await producer.stop()
        return read

    return asyncio.run(asyncio.wait_for(run(), 120))


def test_records_the_consumer_moved_past_are_read_again_in_order(settings, tmp_path):
    assert read_through(settings, ordered=True, tmp_path=tmp_path) == list(range(7))


def test_without_the_order_check_those_records_are_lost(settings, tmp_path):
    """What the check prevents, so that the test above can fail: the runner
    reads on past record 3, and record 6 never comes."""
    read = read_through(settings, ordered=False, tmp_path=tmp_path)
    assert 3 not in read and 6 not in read and read[:3] == [0, 1, 2]
