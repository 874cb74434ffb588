"""The patches of streams/patches.py still apply to the installed Faust,
mode and aiokafka (pyproject.toml bounds their versions; these fail first
when an upgrade moves what they touch)."""

from __future__ import annotations

import asyncio
import inspect

from aiokafka import AIOKafkaConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

from streams.patches import patch_fetch_wait


def test_the_fetch_wait_patch_wraps_the_worker_consumer_and_its_start_reads_the_attribute():
    patch_fetch_wait()
    assert getattr(AIOKafkaConsumerThread._create_worker_consumer, "patched", False)

    async def built() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", fetch_max_wait_ms=1500)
    consumer = asyncio.run(built())
    assert consumer._fetch_max_wait_ms == 1500  # the attribute the patch sets …
    assert "self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start)  # … and start() reads
