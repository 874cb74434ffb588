"""The patches of streams/patches.py still apply to the installed Faust,
mode and aiokafka (pyproject.toml bounds their versions; these fail first
when an upgrade moves what they touch)."""

from __future__ import annotations

import asyncio
import inspect

import faust
from aiokafka import AIOKafkaConsumer
from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

from streams.patches import forget_given_up, patch_commit_floor, patch_fetch_wait, release


class Message:
    """A stand-in for Faust's Message: its partition and offset."""

    def __init__(self, offset: int) -> None:
        self.tp, self.offset = TP("t", 0), offset


def test_the_fetch_wait_patch_wraps_the_worker_consumer_and_its_start_reads_the_attribute():
    patch_fetch_wait()
    assert getattr(AIOKafkaConsumerThread._create_worker_consumer, "patched", False)

    async def built() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", fetch_max_wait_ms=1500)
    consumer = asyncio.run(built())
    assert consumer._fetch_max_wait_ms == 1500  # the attribute the patch sets …
    assert "self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start)  # … and start() reads


def test_the_runner_reads_batches_through_faust_s_manual_ack_api():
    """streams/pipeline/runner.py acknowledges a batch only when it is handled."""
    from faust.streams import Stream

    assert callable(Stream.noack_take) and callable(Stream.ack)
    code = [line.split("#")[0] for line in inspect.getsource(Stream.noack_take).splitlines()]
    assert not any("self.ack(" in line for line in code)  # it leaves the acks to us


def test_a_message_given_up_is_no_longer_waited_for_by_the_handover():
    """streams/patches.release: Faust's wait_empty waits on the consumer's
    `_unacked_messages`, and release takes a message out of it and wakes the
    wait as an acknowledgement does."""
    assert "self._unacked_messages" in inspect.getsource(Consumer.wait_empty)
    assert "self._waiting_for_ack" in inspect.getsource(Consumer._wait_for_ack)

    async def released() -> tuple:
        app = faust.App("patch-test", broker="kafka://127.0.0.1:1")
        given_up, other = Message(1), Message(2)
        unacked = app.consumer._unacked_messages
        unacked.add(given_up), unacked.add(other)
        app.consumer._waiting_for_ack = waiting = asyncio.get_running_loop().create_future()
        release(app, given_up)
        return given_up in unacked, other in unacked, waiting.done()
    assert asyncio.run(released()) == (False, True, True)  # out of the set, and wait_empty woken


def test_no_commit_passes_a_message_given_up():
    """streams/patches.patch_commit_floor: Faust's own gap check lets a
    commit pass a single message given up; the floor stops it there."""
    patch_commit_floor()

    async def offsets() -> tuple:
        app = faust.App("patch-test", broker="kafka://127.0.0.1:1")
        consumer = app.consumer
        consumer._committed_offset[TP("t", 0)] = 10
        consumer._acked[TP("t", 0)].extend(range(11, 16))  # 10 given up, 11-15 acknowledged as skipped
        release(app, Message(10))
        floored = consumer._new_offset(TP("t", 0))
        forget_given_up(app)
        consumer._acked[TP("t", 0)].extend(range(11, 16))
        return floored, consumer._new_offset(TP("t", 0))
    assert asyncio.run(offsets()) == (10, 16)  # held at the message given up; Faust alone commits past it
