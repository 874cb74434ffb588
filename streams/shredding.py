"""Crypto-shredding of what Reflect writes to its log.

An episode's text, source and metadata go on `episodes` sealed under a data
key of the episode's own (streams/keys.py, streams/adapters/sealing.py), a
belief's text and question under the belief's, a cycle's questions, drops
and error under the cycle's (a challenge cycle's reason and error too);
ids, times, counts and importance stay in clear, so the log still routes,
orders and counts without a key. Whoever
reads the log opens what it reads (`Sealing.opener`); an erasure destroys
the keys, and from then on every copy of those records — the topic, its
replays, its dead letters, a backup — reads as erased (`open_event`).

`REFLECT_SEAL=off` stops sealing what is written; what was sealed before
still opens, so a worker always has its `Sealing`. The master key ring is
read (or, at its default path, made) when first needed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import orjson

from processors.dlq import accept
from schemas import (ContractError, EpisodeRecorded, EpisodeRetracted, Event, ReflectionChallenged,
                     ReflectionCreated, ReflectionCycleCompleted)
from streams.adapters.sealing import KeyRing, Sealed, SealingError, open_sealed, seal
from streams.keys import KeyStore, scope_of


@dataclass(frozen=True)
class Sealable:
    """An event type whose text goes on the log sealed: the kind and record of its key, the fields sealed."""
    kind: str  # of its data key: streams/keys.py
    record: str  # the field naming the record the key belongs to
    fields: tuple[str, ...]


SEALABLE: dict[type, Sealable] = {
    EpisodeRecorded: Sealable("episode", "episode_id", ("text", "source", "metadata")),
    ReflectionCreated: Sealable("belief", "reflection_id", ("text", "question")),
    ReflectionCycleCompleted: Sealable("cycle", "cycle_id", ("questions", "drops", "error")),
    ReflectionChallenged: Sealable("cycle", "cycle_id", ("reason", "error")),  # a challenge cycle's
}
EMPTY = {"text": "", "questions": ()}  # what a sealed field holds in the record; the others None


def context(event: Event) -> str:
    """What a sealed text is bound to: moved onto another record, it does not open."""
    how = SEALABLE[type(event)]
    return f"{how.kind}\n{event.user_id}\n{getattr(event, how.record)}"


def seal_event(event: Event, kid: str, key: bytes) -> Event:
    how = SEALABLE[type(event)]
    clear = {name: getattr(event, name) for name in how.fields if getattr(event, name) is not None}
    sealed = seal(key, kid, orjson.dumps(clear), context(event))
    cleared = {name: EMPTY.get(name) for name in how.fields}
    return dataclasses.replace(event, **cleared, sealed=sealed.to_dict())


def open_event(event: Event, key: bytes | None) -> Event | None:
    """The event as it was written; once its key is gone, an episode reads as
    its erasure, a belief (destroyed only when an erasure invalidated it) as
    nothing at all, and a cycle's audit as its counts, without its texts or
    what it read (there is no key of it left for an erasure to find)."""
    fields = SEALABLE[type(event)].fields
    if key is None:
        if isinstance(event, ReflectionCycleCompleted):
            return dataclasses.replace(event, sealed=None, read_ids=())
        if isinstance(event, ReflectionChallenged):  # its verdict and what it did, not why
            return dataclasses.replace(event, sealed=None)
        return erased(event) if isinstance(event, EpisodeRecorded) else None
    clear = orjson.loads(open_sealed(key, Sealed.of(event.sealed), context(event)))
    opened = {k: tuple(v) if isinstance(v, list) else v for k, v in clear.items() if k in fields}
    return dataclasses.replace(event, sealed=None, **opened)


def erased(event: EpisodeRecorded) -> EpisodeRetracted:
    """A sealed episode whose key was destroyed, read as what it now is: erased."""
    return EpisodeRetracted(event_id=event.event_id, user_id=event.user_id, episode_id=event.episode_id,
                            reason="erasure", occurred_at=event.occurred_at, recorded_at=event.recorded_at)


def sealed_kid(record: Any) -> str | None:
    sealed = getattr(record, "sealed", None)
    return sealed.get("kid") if isinstance(sealed, dict) else None


class Sealing:
    """A worker's (or a publisher's) keys: seal what it writes, open what it reads."""

    def __init__(self, settings) -> None:
        self.settings = settings
        self.writes = settings.seal == "on"
        self._store: KeyStore | None = None
        self._starting = asyncio.Lock()

    async def store(self) -> KeyStore:
        async with self._starting:
            if self._store is None:
                path = self.settings.master_keys_path
                ring = KeyRing.load(path, create=not self.settings.master_keys)  # only the default is made
                self._store = await KeyStore(self.settings, ring, self.settings.topic_keys).__aenter__()
            return self._store

    async def check(self) -> None:
        """Every user key on the key topic unwraps under this ring, or
        SealingError naming the setting: workers on data dirs of their own
        that each made a ring of their own are stopped at start, not found
        out one dead letter or stalled batch at a time."""
        store = await self.store()
        for kid in [k for k in store.wrapped if scope_of(k)[0] == "user"]:
            store.unwrapped(kid)  # RingMismatch names the ring and REFLECT_MASTER_KEYS

    async def close(self) -> None:
        if self._store is not None:
            await self._store.__aexit__()
            self._store = None

    async def sealed(self, event: Event) -> Event:
        """`event` as it goes on the log: an episode's, a belief's or a
        cycle's text sealed under a new key of its own, when sealing is on;
        once the key is on the key topic."""
        sealed, acked = await self.sealing(event)
        if acked is not None:
            await acked
        return sealed

    async def sealing(self, event: Event) -> tuple[Event, asyncio.Future | None]:
        """As `sealed`, with its key's acknowledgement still to come (None:
        nothing was sealed), for a writer that keeps many in flight."""
        how = SEALABLE.get(type(event))
        if not self.writes or how is None or getattr(event, "sealed") is not None:
            return event, None
        kid, key, acked = await (await self.store()).sending(how.kind, event.user_id, getattr(event, how.record))
        return seal_event(event, kid, key), acked

    async def opener(self, records: Iterable[Any]) -> Callable[[Any], Any]:
        """What opens each of `records` (its keys fetched here, the key
        topic read again once at most): a sealed one opened, or what is left
        of it once its key is gone (`open_event`); any other record as it
        is. A sealed record that does not open under its own key is bad input."""
        kids = [kid for kid in map(sealed_kid, records) if kid is not None]
        if not kids:
            return lambda record: record
        store = await self.store()
        await store.fetch(kids)
        keys: dict[str, bytes | None | SealingError] = {}
        for kid in kids:
            try:
                keys[kid] = store.unwrapped(kid)
            except SealingError as error:
                if getattr(error, "retriable", False):  # the ring or the key topic is at fault, not the record:
                    raise  # retried by the caller's policy
                keys[kid] = error

        def open_one(record: Any) -> Any:
            kid = sealed_kid(record)
            if kid is None:
                return record
            key = keys[kid]
            try:
                if isinstance(key, SealingError):
                    raise key
                return open_event(record, key)
            except SealingError as error:
                raise ContractError("sealed", str(error)) from None
        return open_one

    async def destroy(self, kind: str, user_id: str, record: str = "") -> list[str]:
        """The scope's keys destroyed; what they sealed reads as erased from now on."""
        return await (await self.store()).destroy(kind, user_id, record)


async def read_records(messages, carries, sealing: Sealing | None) -> tuple[list[tuple[Any, Any]], list[Any]]:
    """(record, message) of each message that honours its topic's contract,
    opened (what an erasure left of it, if anything); and the messages that
    do not (dead-lettered when first read)."""
    accepted, refused = [], []
    for m in messages:
        try:
            accepted.append((accept(m, carries), m))
        except ContractError:
            refused.append(m)
    open_one = await opener(sealing, [r for r, _ in accepted])
    kept = []
    for record, m in accepted:
        try:
            opened = open_one(record)
        except ContractError:
            refused.append(m)
            continue
        if opened is not None:
            kept.append((opened, m))
    return kept, refused


async def opener(sealing: Sealing | None, records: Iterable[Any]) -> Callable[[Any], Any]:
    """`sealing.opener`; without keys (the tests' in-memory worker), a sealed record is bad input."""
    if sealing is not None:
        return await sealing.opener(records)

    def refuse(record: Any) -> Any:
        if sealed_kid(record) is not None:
            raise ContractError("sealed", "this reader holds no keys to open a sealed text")
        return record
    return refuse
