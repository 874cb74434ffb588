"""The data keys of crypto-shredding, on a compacted key topic.

One record per key version, keyed `kind \\0 user \\0 record \\0 version`
(kind `user`, `episode` or `belief`), its value the wrapped key
(streams/adapters/sealing.py): a user key wrapped under the current master
key, a data key under one version of its user's key. Destroying a scope
(`destroy`) writes a tombstone for every version of it; once the broker
compacts, the wrapped key is gone from the log, and whatever it sealed —
in any topic, replay or backup — no longer opens.

Every key is a fresh version with an id of its own, never a rewrite of
another: two workers that make a user's key at once, or a retried publish
that seals an episode twice, leave two versions, each still opening what
it sealed (compaction keeps the last record per key, so a rewrite would
orphan what the first sealed).

Each store reads the whole topic at start and follows it on each miss (a
key is produced, and acknowledged, before anything it seals): a key
neither held nor found when read to the end was destroyed.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streams.adapters.sealing import KeyRing, Sealed, SealingError, new_key, unwrap_under, wrap_under
from streams.security import client_options

KINDS = ("user", "episode", "belief")
READ_TIMEOUT = 30.0  # seconds to read the key topic to its end


def key_id(kind: str, user_id: str, record: str = "", version: str | None = None) -> str:
    if kind not in KINDS:
        raise ValueError(f"a key is of a user, an episode or a belief, not {kind!r}")
    return "\0".join((kind, user_id, record, version or secrets.token_hex(8)))


def scope_of(kid: str) -> tuple[str, str, str]:
    kind, user, record, _ = kid.split("\0")
    return kind, user, record


class KeyStore:
    """Make, find and destroy keys; `async with KeyStore(settings, ring, topic)`."""

    def __init__(self, settings, ring: KeyRing, topic: str) -> None:
        self.settings, self.ring, self.topic = settings, ring, topic
        self.wrapped: dict[str, Sealed] = {}  # key id → its wrapped key; a destroyed one is absent
        self._producer = AIOKafkaProducer(**client_options(settings), acks="all", request_timeout_ms=15000)

    async def __aenter__(self) -> "KeyStore":
        await self._producer.start()
        try:
            await self.refresh()
        except BaseException:
            await self._producer.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self._producer.stop()

    async def refresh(self) -> None:
        """The key topic read to its end: every key made, less every key destroyed."""
        consumer = AIOKafkaConsumer(**client_options(self.settings), enable_auto_commit=False,
                                    fetch_max_wait_ms=100)
        await consumer.start()
        try:
            tps = [TopicPartition(self.topic, p) for p in sorted(consumer.partitions_for_topic(self.topic) or ())]
            if not tps:
                raise SealingError(f"no key topic {self.topic}: create it first (ensure_key_topic)")
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + READ_TIMEOUT
            while True:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for r in records:
                        kid = r.key.decode()
                        if r.value is None:
                            self.wrapped.pop(kid, None)
                        else:
                            self.wrapped[kid] = Sealed.of(orjson.loads(r.value))
                marks = [consumer.highwater(tp) for tp in tps]
                if None not in marks and all([await consumer.position(tp) >= m for tp, m in zip(tps, marks)]):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not read the key topic {self.topic} to its end in {READ_TIMEOUT} s")
        finally:
            await consumer.stop()

    async def new(self, kind: str, user_id: str, record: str) -> tuple[str, bytes]:
        """A new data key for an episode or a belief, wrapped under a version
        of the user's key (made first if the user has none)."""
        parent_kid, parent = await self._user_key(user_id)
        kid, key = key_id(kind, user_id, record), new_key()
        await self._put(kid, wrap_under(parent, parent_kid, key, kid))
        return kid, key

    async def key(self, kid: str) -> bytes | None:
        """The key, or None: destroyed (it, or its user's key)."""
        if kid not in self.wrapped:
            await self.refresh()
        wrapped = self.wrapped.get(kid)
        if wrapped is None:
            return None
        if scope_of(kid)[0] == "user":
            return self.ring.unwrap(wrapped, kid)
        parent = await self.key(wrapped.kid)
        return None if parent is None else unwrap_under(parent, wrapped, kid)

    async def destroy(self, kind: str, user_id: str, record: str = "") -> list[str]:
        """Every version of the scope tombstoned — for kind `user`, every key
        of the user: what they wrapped no longer opens anywhere; their ids."""
        await self.refresh()
        gone = [kid for kid in self.wrapped if scope_of(kid)[1] == user_id
                and (kind == "user" or scope_of(kid)[::2] == (kind, record))]
        await self._tombstones(gone)
        return gone

    async def _user_key(self, user_id: str) -> tuple[str, bytes]:
        held = self._versions("user", user_id)
        if not held:
            await self.refresh()
            held = self._versions("user", user_id)
        if held:
            kid = min(held)  # any version opens what it wrapped; the same one while it lasts
            return kid, self.ring.unwrap(self.wrapped[kid], kid)
        kid, key = key_id("user", user_id), new_key()
        await self._put(kid, self.ring.wrap(key, kid))
        return kid, key

    def _versions(self, kind: str, user_id: str) -> list[str]:
        return [kid for kid in self.wrapped if scope_of(kid)[:2] == (kind, user_id)]

    async def _put(self, kid: str, wrapped: Sealed) -> None:
        await (await self._producer.send(self.topic, key=kid.encode(), value=orjson.dumps(wrapped.to_dict())))
        self.wrapped[kid] = wrapped

    async def _tombstones(self, kids: list[str]) -> None:
        sent = [await self._producer.send(self.topic, key=kid.encode(), value=None) for kid in kids]
        await asyncio.gather(*sent)
        for kid in kids:
            self.wrapped.pop(kid, None)
