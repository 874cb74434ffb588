"""Producer side: validate at the edge, then publish keyed by user_id.

Keyed by user so one user's events stay in order on one partition,
co-partitioned with the per-user tables. Events are validated before any
connection is made, so bad input never reaches the broker.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaProducer

from schemas import ContractError, EpisodeRecorded, EpisodeRetracted, Event, now
from streams.security import client_options
from streams.settings import Settings


def make_episode(user_id: str, text: str | bytes, importance: float, *, episode_id: str | None = None,
                 occurred_at: str | None = None, source: str | None = None,
                 metadata: dict[str, Any] | None = None) -> EpisodeRecorded:
    """A validated EpisodeRecorded; raises ContractError naming the bad field."""
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


class Publisher:
    """One producer for many sends; use as `async with Publisher(settings) as p`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
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
        await self._producer.stop()

    async def publish(self, event: Event, topic: str | None = None, wait: bool = True) -> Event:
        value = event.encode()  # raises ContractError naming the field
        future = await self._producer.send(topic or self.settings.topic_episodes, value=value,
                                           key=event.user_id.encode())
        if wait:
            await future
        return event

    async def flush(self) -> None:
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


async def retract_episode(settings: Settings, user_id: str, episode_id: str,
                          reason: str = "incorrect") -> EpisodeRetracted:
    event = make_retraction(user_id, episode_id, reason)
    async with Publisher(settings) as publisher:
        return await publisher.publish(event)
