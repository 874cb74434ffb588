"""Revoked tokens: a compacted topic that every worker reads whole.

`POST /v1/admin/revocations` (`reflect token revoke`) appends one record
keyed by the token's `jti`, holding when the token expires. Each worker's
RevocationWatch reads the topic from its start, without a consumer group, into
the `auth.Revocations` its guard checks: a revoked token is refused (401) by
every worker once that worker has read the record, typically within a fetch
(the route answers once the worker that took it has). A worker starts serving
only after reading the topic to the end it had at start: it never accepts a
token revoked before it came up. Compaction keeps one record per token id;
a record whose token has expired is ignored, since its token fails on `exp`.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from mode import Service

from streams.auth import Revocations
from streams.security import client_options
from streams.settings import Settings

log = logging.getLogger(__name__)

FETCH_MS = 200  # how long one read of the topic waits for new records
START_TIMEOUT = 60.0  # seconds a worker may take to read the topic at start before it gives up
RETRY_AFTER = 1.0  # seconds before reading again after a broker error


def record(jti: str, expires_at: float) -> bytes:
    return orjson.dumps({"jti": jti, "expires_at": expires_at})


def parsed(raw: bytes | None) -> tuple[str, float] | None:
    """(jti, expires_at) of a record, None if it is not one (logged, skipped:
    only the admin route writes this topic)."""
    try:
        data = orjson.loads(raw or b"")
        jti, expires = data["jti"], float(data["expires_at"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return (jti, expires) if isinstance(jti, str) and jti else None


class RevocationWatch(Service):
    """Reads every partition of the revocations topic into `revoked`."""

    def __init__(self, revoked: Revocations, settings: Settings, **kwargs) -> None:
        self.revoked, self.settings = revoked, settings
        self.consumer: AIOKafkaConsumer | None = None
        self.read = asyncio.Condition()  # notified after each read of the topic
        super().__init__(**kwargs)

    async def read_back(self, jti: str, timeout: float) -> None:
        """Once this worker has read the revocation of `jti` (TimeoutError past `timeout`)."""
        async with self.read:
            await asyncio.wait_for(self.read.wait_for(lambda: jti in self.revoked), timeout)

    async def on_start(self) -> None:
        topic = self.settings.topic_revocations
        self.consumer = AIOKafkaConsumer(**client_options(self.settings), group_id=None, enable_auto_commit=False,
                                         auto_offset_reset="earliest", fetch_max_wait_ms=FETCH_MS)
        await self.consumer.start()
        known = await self.consumer.topics()  # loads the metadata partitions_for_topic reads
        parts = [TopicPartition(topic, p) for p in sorted(self.consumer.partitions_for_topic(topic) or ())]
        if topic not in known or not parts:
            raise RuntimeError(f"the revocations topic {topic!r} does not exist: run `reflect topics create`")
        self.consumer.assign(parts)
        await self.consumer.seek_to_beginning(*parts)
        ends = await self.consumer.end_offsets(parts)
        await asyncio.wait_for(self._read_until(ends), START_TIMEOUT)
        log.info("%d revoked tokens in force", len(self.revoked))

    async def _read_until(self, ends: dict[TopicPartition, int]) -> None:
        for tp, end in ends.items():
            while await self.consumer.position(tp) < end:
                await self._read_once()

    async def _read_once(self) -> None:
        batches = await self.consumer.getmany(timeout_ms=FETCH_MS)
        for records in batches.values():
            for message in records:
                found = parsed(message.value)
                if found is None:
                    log.warning("skipped a record that is no revocation at %s[%d]@%d", message.topic,
                                message.partition, message.offset)
                    continue
                self.revoked.add(*found, time.time())
        async with self.read:
            self.read.notify_all()

    @Service.task
    async def _follow(self) -> None:
        while not self.should_stop:
            try:
                await self._read_once()
            except KafkaError as exc:  # transient: the next read retries; revocations read so far stay in force
                log.warning("reading revocations failed (%r); retrying", exc)
                await self.sleep(RETRY_AFTER)

    async def on_stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
