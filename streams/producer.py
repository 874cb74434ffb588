"""Producer side: validate at the edge, then publish keyed by user_id.

Keyed by user so one user's events stay in order on one partition,
co-partitioned with the per-user tables. Events are validated before any
connection is made, so bad input never reaches the broker.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

from aiokafka import AIOKafkaProducer

from schemas import ContractError, EpisodeRecorded, EpisodeRetracted, Event, UserForgotten, now
from streams.security import client_options
from streams.settings import Settings
from streams.shredding import Sealing

# An idempotency key (the API's `Idempotency-Key` header; `idempotency_key=`
# below) names an episode: its id is uuid5(IDEMPOTENCY_KEYS, "<user_id>\n<key>")
# in hex, so a write sent again with the same key is the same episode, and the
# same key of two users names two episodes. Neither part holds a newline, so
# the pair is unambiguous. The namespace is fixed for good: changing it would
# make every retried write a new episode.
IDEMPOTENCY_KEYS = uuid.UUID("d61187e2-b215-440d-9da4-14f359ef0199")
KEY_MAX = 255
# Visible ASCII, no space: nothing an HTTP hop could strip, fold or re-encode.
_KEY = re.compile(r"[\x21-\x7e]+")


def key_problem(key: Any) -> str | None:
    """Why `key` cannot be an idempotency key, None if it can."""
    if not isinstance(key, str) or not 1 <= len(key) <= KEY_MAX or not _KEY.fullmatch(key):
        return f"must be 1 to {KEY_MAX} visible ASCII characters (! to ~, no space)"
    return None


def episode_id_for_key(user_id: str, key: str) -> str:
    """The episode id `key` names for this user; raises ContractError for a bad key."""
    problem = key_problem(key)
    if problem:
        raise ContractError("idempotency_key", problem)
    return uuid.uuid5(IDEMPOTENCY_KEYS, f"{user_id}\n{key}").hex


def make_episode(user_id: str, text: str | bytes, importance: float, *, episode_id: str | None = None,
                 occurred_at: str | None = None, source: str | None = None,
                 metadata: dict[str, Any] | None = None, idempotency_key: str | None = None) -> EpisodeRecorded:
    """A validated EpisodeRecorded; raises ContractError naming the bad field.
    Its id: `episode_id`, else the one `idempotency_key` names, else a new
    random one (named here, once: publishing the event again is the same
    episode). Both given must name the same episode."""
    if idempotency_key is not None:
        keyed = episode_id_for_key(user_id, idempotency_key)
        if episode_id is not None and episode_id != keyed:
            raise ContractError("episode_id", f"differs from the id the idempotency key names ({keyed})")
        episode_id = keyed
    if isinstance(text, (bytes, bytearray)):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ContractError("text", f"is not valid UTF-8 (byte {exc.start})") from None
    given = {k: v for k, v in (("episode_id", episode_id), ("occurred_at", occurred_at)) if v is not None}
    event = EpisodeRecorded(user_id=user_id, text=text, importance=importance,
                            source=source, metadata=metadata, **given)
    event.encode()
    return event


def make_retraction(user_id: str, episode_id: str, reason: str = "incorrect", *,
                    occurred_at: str | None = None) -> EpisodeRetracted:
    event = EpisodeRetracted(user_id=user_id, episode_id=episode_id, reason=reason,
                             occurred_at=occurred_at or now())
    event.encode()
    return event


def make_forget(user_id: str) -> UserForgotten:
    event = UserForgotten(user_id=user_id)
    event.encode()
    return event


class Publisher:
    """One producer for many sends; use as `async with Publisher(settings) as p`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sealing = Sealing(settings)  # an episode's text goes on the log sealed (streams/shredding.py)
        self._handing: asyncio.Future | None = None  # the last event being handed to the producer
        # Not idempotent: aiokafka's idempotent producer fails on Tansu
        # (InitProducerId); duplicates are absorbed by idempotent consumers.
        self._producer = AIOKafkaProducer(**client_options(settings), acks="all",
                                          linger_ms=5, request_timeout_ms=15000)

    async def __aenter__(self) -> "Publisher":
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            if self._handing is not None and exc[0] is None:
                await self._handing  # what was published without waiting is handed over, as before the stop
        finally:
            await self._producer.stop()
            await self.sealing.close()

    async def publish(self, event: Event, topic: str | None = None, wait: bool = True) -> Event:
        """`event` on the log (an episode sealed first); returns it as given.
        Without `wait`, many are in flight at once: their keys go out
        together, and each event is handed to the producer once its key is
        acknowledged and the one published before it was handed over (the
        order of a user's events is kept); `flush` waits for all."""
        event.encode()  # raises ContractError naming the field, before any key is made
        sealed, key_acked = await self.sealing.sealing(event)
        before = self._handing

        async def hand_over() -> asyncio.Future:
            if key_acked is not None:
                await key_acked
            if before is not None:
                await before  # (a failure before this one fails this one too: nothing sent out of order)
            return await self._producer.send(topic or self.settings.topic_episodes, value=sealed.encode(),
                                             key=event.user_id.encode())
        self._handing = asyncio.ensure_future(hand_over())
        if wait:
            await (await self._handing)
        return event

    async def flush(self) -> None:
        if self._handing is not None:
            await self._handing
        await self._producer.flush()

    async def publish_episode(self, user_id: str, text: str, importance: float, *, wait: bool = True,
                              **fields: Any) -> EpisodeRecorded:
        return await self.publish(make_episode(user_id, text, importance, **fields), wait=wait)

    async def retract_episode(self, user_id: str, episode_id: str, reason: str = "incorrect", *,
                              wait: bool = True, **fields: Any) -> EpisodeRetracted:
        return await self.publish(make_retraction(user_id, episode_id, reason, **fields), wait=wait)


async def publish_episode(settings: Settings, user_id: str, text: str, importance: float,
                          **fields: Any) -> EpisodeRecorded:
    """One-shot helper; for many episodes keep a `Publisher` open."""
    event = make_episode(user_id, text, importance, **fields)
    async with Publisher(settings) as publisher:
        return await publisher.publish(event)


async def forget_user(settings: Settings, user_id: str) -> UserForgotten:
    """Everything of the user forgotten, once the worker carries it out (its proof: ErasureCompleted)."""
    async with Publisher(settings) as publisher:
        return await publisher.publish(make_forget(user_id))


async def retract_episode(settings: Settings, user_id: str, episode_id: str,
                          reason: str = "incorrect") -> EpisodeRetracted:
    event = make_retraction(user_id, episode_id, reason)
    async with Publisher(settings) as publisher:
        return await publisher.publish(event)
