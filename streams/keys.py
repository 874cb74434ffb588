"""The data keys of crypto-shredding, on a compacted key topic.

One record per key version, keyed `kind \\0 user \\0 record \\0 version`
(kind `user`, `episode`, `belief` or `cycle`), its value the wrapped key
(streams/adapters/sealing.py): a user key wrapped under the current master
key, a data key under one version of its user's key. Destroying a scope
(`destroy`) writes a marker for every version of it, `{"destroyed": true}`;
once the broker compacts, the wrapped key is gone from the log (the marker
is the key's last record), and whatever it sealed — in any topic, replay or
backup — no longer opens. A marker rather than a null tombstone: compaction
drops a tombstone after `delete.retention.ms`, and a reader that then found
no record of a key could not tell a destroyed key from one it was never
meant to see (another key topic, a lost one), which must stop it, not read
as erased (`KeyUnknown`).

Every key is a fresh version with an id of its own, never a rewrite of
another: two workers that make a user's key at once, or a retried publish
that seals an episode twice, leave two versions, each still opening what
it sealed (compaction keeps the last record per key, so a rewrite would
orphan what the first sealed).

Each store reads the whole topic at start and follows it on each miss (a
key is produced, and acknowledged, before anything it seals), and, while it
seals, in the background every FRESH seconds: a user key destroyed by
another process (a forget) is not sealed under for much longer than that.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streams.adapters.sealing import KeyRing, Sealed, SealingError, new_key, unwrap_under, wrap_under
from streams.security import client_options

DESTROYED = b'{"destroyed":true}'


def _said(read: asyncio.Future) -> None:
    """A background read of the key topic that failed: logged, tried again by the next seal."""
    if not read.cancelled() and read.exception() is not None:
        log.warning("could not read the key topic again (%r): sealing goes on under the keys held",
                    read.exception())


class KeyUnknown(SealingError):
    """A key this store has no record of, made or destroyed: the key topic is
    another than its writer's, or was lost. Never read as erased; retried,
    so the reader waits (and says why) rather than dropping what it reads."""
    retriable = True

log = logging.getLogger("reflect")
KINDS = ("user", "episode", "belief", "cycle")
READ_TIMEOUT = 30.0  # seconds to read the key topic to its end
FRESH = 1.0  # seconds a writer seals under a user key before reading again what was destroyed since


def key_id(kind: str, user_id: str, record: str = "", version: str | None = None) -> str:
    if kind not in KINDS:
        raise ValueError(f"a key is of a user, an episode, a belief or a cycle, not {kind!r}")
    return "\0".join((kind, user_id, record, version or secrets.token_hex(8)))


def scope_of(kid: str) -> tuple[str, str, str]:
    kind, user, record, _ = kid.split("\0")
    return kind, user, record


class KeyStore:
    """Make, find and destroy keys; `async with KeyStore(settings, ring, topic)`.

    One consumer follows the key topic for the store's life: a refresh reads
    what was added since the last one, not the topic again from its start."""

    def __init__(self, settings, ring: KeyRing, topic: str) -> None:
        self.settings, self.ring, self.topic = settings, ring, topic
        self.wrapped: dict[str, Sealed] = {}  # key id → its wrapped key; a destroyed one is absent
        self.destroyed: set[str] = set()  # key ids with a destruction marker
        self._of_user: dict[str, set[str]] = {}  # user → the ids of their keys held, of every kind
        self._producer = AIOKafkaProducer(**client_options(settings), acks="all", request_timeout_ms=15000)
        self._consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False,
                                          fetch_max_wait_ms=100)
        self._sealing_under: dict[str, tuple[str, bytes]] = {}  # user → (id, key) of the user key in use
        self._tps: list[TopicPartition] = []
        self._reading = asyncio.Lock()  # one refresh at a time: a consumer reads for one caller
        self._read_at = 0.0  # when the topic was last read to its end (monotonic)
        self._freshening: asyncio.Future | None = None  # the background read `_keep_fresh` started

    async def __aenter__(self) -> "KeyStore":
        try:
            await self._producer.start()
            await self._consumer.start()
            self._tps = [TopicPartition(self.topic, p)
                         for p in sorted(self._consumer.partitions_for_topic(self.topic) or ())]
            if not self._tps:
                raise SealingError(f"no key topic {self.topic}: create it first (reflect topics create)")
            self._consumer.assign(self._tps)
            await self._consumer.seek_to_beginning(*self._tps)
            await self.refresh(fetch=True)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        if self._freshening is not None:
            self._freshening.cancel()
        await self._consumer.stop()
        await self._producer.stop()

    async def refresh(self, fetch: bool = False, chase: bool = True) -> None:
        """The key topic read to its end as it is now: every key made, less
        every key destroyed. Tansu's ListOffsets can end short of a batch of
        several records, the high watermark of a fetch does not: `fetch`
        makes one even when ListOffsets says nothing is new, and the read
        goes on to the high watermark each fetch reports — unless `chase`
        is off: then to where the topic ended when it began (while writers
        go on, a read that chases their keys does not end)."""
        async with self._reading:
            ends = await self._consumer.end_offsets(self._tps)
            ends = {tp: max(end, self._consumer.highwater(tp) or 0) for tp, end in ends.items()}
            deadline = time.monotonic() + READ_TIMEOUT

            def end(tp):
                return max(ends[tp], self._consumer.highwater(tp) or 0) if chase else ends[tp]
            while fetch or not all([await self._consumer.position(tp) >= end(tp) for tp in self._tps]):
                fetch = False
                for records in (await self._consumer.getmany(*self._tps, timeout_ms=200)).values():
                    for r in records:
                        kid = r.key.decode()
                        if r.value is None or r.value == DESTROYED:  # (None: a tombstone, as earlier builds wrote)
                            self._drop(kid)
                        else:
                            self._hold(kid, Sealed.of(orjson.loads(r.value)))
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not read the key topic {self.topic} to its end in {READ_TIMEOUT} s")
            self._read_at = time.monotonic()

    async def fetch(self, kids) -> None:
        """Ready to unwrap `kids`: the topic read again when one is not held
        (made, or destroyed, since the last refresh)."""
        for fetch in (False, True):
            if all(kid in self.wrapped or kid in self.destroyed for kid in kids):
                return
            await self.refresh(fetch)

    async def new(self, kind: str, user_id: str, record: str) -> tuple[str, bytes]:
        """A new data key for an episode, a belief or a cycle, wrapped under a
        version of the user's key (made first if the user has none); once
        the broker has acknowledged it."""
        kid, key, acked = await self.sending(kind, user_id, record)
        await acked
        return kid, key

    async def sending(self, kind: str, user_id: str, record: str) -> tuple[str, bytes, asyncio.Future]:
        """As `new`, with the broker's acknowledgement still to come: nothing
        the key seals may be sent before it (a reader would not find the key)."""
        parent_kid, parent = await self._user_key(user_id)
        kid, key = key_id(kind, user_id, record), new_key()
        wrapped = wrap_under(parent, parent_kid, key, kid)
        acked = await self._producer.send(self.topic, key=kid.encode(), value=orjson.dumps(wrapped.to_dict()))
        self._hold(kid, wrapped)
        return kid, key, acked

    async def key(self, kid: str) -> bytes | None:
        """The key, or None: destroyed (it, or its user's key)."""
        await self.fetch([kid])
        return self.unwrapped(kid)

    def unwrapped(self, kid: str) -> bytes | None:
        """The key as held now, or None: destroyed. KeyUnknown when the topic
        has no record of it; SealingError when it will not unwrap (a master
        key missing from the ring, or a record altered)."""
        wrapped = self.wrapped.get(kid)
        if wrapped is None:
            if kid in self.destroyed:
                return None
            raise KeyUnknown(f"key {kid.replace(chr(0), '/')} is not on the key topic {self.topic}: a writer "
                             "on another key topic, or the topic was lost")
        if scope_of(kid)[0] == "user":
            return self.ring.unwrap(wrapped, kid)
        parent = self.unwrapped(wrapped.kid)
        return None if parent is None else unwrap_under(parent, wrapped, kid)

    async def destroy(self, kind: str, user_id: str, record: str = "") -> list[str]:
        """Every version of the scope tombstoned — for kind `user`, every key
        of the user: what they wrapped no longer opens anywhere; their ids."""
        await self.refresh(fetch=True)  # every version of the scope
        gone = sorted(kid for kid in self._of_user.get(user_id, ())
                      if kind == "user" or scope_of(kid)[::2] == (kind, record))
        await self._tombstones(gone)
        return gone

    async def _user_key(self, user_id: str) -> tuple[str, bytes]:
        """The version of the user's key that new keys go under: the same one while it lasts."""
        self._keep_fresh()
        if user_id in self._sealing_under:
            return self._sealing_under[user_id]
        held = self._user_versions(user_id)
        if not held:
            await self.refresh()
            held = self._user_versions(user_id)
        if held:
            kid = min(held)  # any version opens what it wrapped
            key = self.ring.unwrap(self.wrapped[kid], kid)
        else:
            kid, key = key_id("user", user_id), new_key()
            await self._put(kid, self.ring.wrap(key, kid))
        self._sealing_under[user_id] = kid, key
        return kid, key

    def _keep_fresh(self) -> None:
        """The topic read again in the background once FRESH seconds have
        passed since it was last read, one read at a time: a user version
        destroyed since (a forget) is dropped from `_sealing_under` then.
        Sealing never waits for it (inline, the reads of every writer that
        came at once, one after the other, cost a sixth of sealed ingest)."""
        if time.monotonic() - self._read_at > FRESH and (self._freshening is None or self._freshening.done()):
            self._freshening = asyncio.ensure_future(self.refresh(chase=False))
            self._freshening.add_done_callback(_said)

    def _user_versions(self, user_id: str) -> list[str]:
        return [kid for kid in self._of_user.get(user_id, ()) if scope_of(kid)[0] == "user"]

    def _hold(self, kid: str, wrapped: Sealed) -> None:
        self.wrapped[kid] = wrapped
        self.destroyed.discard(kid)
        self._of_user.setdefault(scope_of(kid)[1], set()).add(kid)

    def _drop(self, kid: str) -> None:
        self.wrapped.pop(kid, None)
        self.destroyed.add(kid)
        user = scope_of(kid)[1]
        self._of_user.get(user, set()).discard(kid)
        if self._sealing_under.get(user, ("",))[0] == kid:
            del self._sealing_under[user]

    async def _put(self, kid: str, wrapped: Sealed) -> None:
        await (await self._producer.send(self.topic, key=kid.encode(), value=orjson.dumps(wrapped.to_dict())))
        self._hold(kid, wrapped)

    async def _tombstones(self, kids: list[str]) -> None:
        sent = [await self._producer.send(self.topic, key=kid.encode(), value=DESTROYED) for kid in kids]
        await asyncio.gather(*sent)
        for kid in kids:
            self._drop(kid)
