"""What the log already holds, asked before a rerun publishes again.

A cycle's outcome is stored (table `cycle-outcomes`) before it is
published, with the end of each topic's partition it will be published to
(`end`): a lower bound of where its records land. A rerun of a stored
outcome (a crash or a stop came before the cycle was marked done) reads
those partitions from there (`holds`) and publishes only the events the log
lacks, so a record is on the log once however the worker died. Without
broker transactions (the embedded broker has none) this read is what keeps
"every request completed exactly once" on the log itself, not only in the
downstream consumers' deduplication by event id.
"""

from __future__ import annotations

import asyncio
from typing import Iterable

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.security import client_options
from streams.settings import Settings

READ_TIMEOUT = 30.0  # seconds one read of a span may take; a timeout is transient (retried by the policy)


class Log:
    def __init__(self, settings: Settings, app) -> None:
        self.settings, self.app = settings, app

    async def end(self, topic: str, partition: int) -> int:
        """The partition's end offset (ListOffsets, through the worker's own
        consumer: Faust's `highwaters`). Never past the true end, so a safe
        place to start looking for what is published after it."""
        tp = TopicPartition(topic, partition)
        ends = await asyncio.wait_for(self.app.consumer.highwaters(tp), READ_TIMEOUT)
        return ends.get(tp) or 0

    async def past_end(self, topic: str, partition: int) -> int:
        """At or past the partition's last record, unlike `end`: ListOffsets
        raised to the high watermark a fetch reports (Tansu's ListOffsets
        answers one past the last batch's base offset). Every record
        written before the call is before it."""
        return await asyncio.wait_for(self._past_end(TopicPartition(topic, partition)), READ_TIMEOUT)

    async def _past_end(self, tp: TopicPartition) -> int:
        consumer = AIOKafkaConsumer(**client_options(self.settings), enable_auto_commit=False, fetch_max_wait_ms=100)
        await consumer.start()
        try:
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            consumer.seek(tp, end)
            while consumer.highwater(tp) is None:  # a fetch answered: its high watermark is known
                await consumer.getmany(tp, timeout_ms=100, max_records=1)
            return max(end, consumer.highwater(tp))
        finally:
            await consumer.stop()

    async def holds(self, topic: str, partition: int, since: int, event_ids: Iterable[str]) -> set[str]:
        """Which of `event_ids` the partition holds from offset `since` on."""
        return await asyncio.wait_for(self._read(TopicPartition(topic, partition), since, set(event_ids)),
                                      READ_TIMEOUT)

    async def _read(self, tp: TopicPartition, since: int, wanted: set[str]) -> set[str]:
        # Under exactly_once, a record of a transaction aborted by a crash is not on the log: read committed.
        isolation = "read_committed" if self.settings.processing_guarantee == "exactly_once" else "read_uncommitted"
        consumer = AIOKafkaConsumer(**client_options(self.settings), enable_auto_commit=False,
                                    fetch_max_wait_ms=100, isolation_level=isolation)
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, since)
            found: set[str] = set()
            # To the end a fetch reports (Tansu's ListOffsets can be short of it): the high watermark, or
            # under read_committed the last stable offset (an open transaction's records are not read).
            end_of = consumer.last_stable_offset if isolation == "read_committed" else consumer.highwater
            while found != wanted:
                for messages in (await consumer.getmany(tp, timeout_ms=200)).values():
                    found |= wanted & {event_id(m.value) for m in messages}
                end = end_of(tp)
                if end is not None and await consumer.position(tp) >= end:
                    break
            return found
        finally:
            await consumer.stop()


def event_id(value: bytes | None) -> str | None:
    try:
        record = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None  # not an event (dead-lettered where it was read)
    return record.get("event_id") if isinstance(record, dict) else None
