"""Dead letters: what a processor could not take, with the original bytes and
Kafka Connect style error headers, so an operator can read why and replay."""

from __future__ import annotations

import re

from schemas import (ChallengeRequested, ContractError, EpisodeRecorded, EpisodeRetracted, ErasureCompleted, Event,
                     GateRequested, InvalidationRequested, ReflectionChallenged, ReflectionCreated,
                     ReflectionCycleCompleted, ReflectionInvalidated, ReflectionReinforced, ReflectionRequested,
                     ReflectionStaled, UserForgotten, decode)


# The event types each topic carries; anything else there is bad input.
# A manual ReflectionRequested rides on the user's episodes partition, so the
# accumulator forwards it in stream order (processors/accumulator.py); so
# does a UserForgotten.
ON_EPISODES = (EpisodeRecorded, EpisodeRetracted, ReflectionRequested, UserForgotten)
ON_REFLECTIONS = (ReflectionCreated, ReflectionReinforced, ReflectionInvalidated, ReflectionCycleCompleted,
                  ReflectionChallenged, ReflectionStaled, ErasureCompleted)
ON_REQUESTS = (ReflectionRequested, ChallengeRequested, InvalidationRequested, GateRequested, UserForgotten)


def carried(settings) -> dict[str, tuple[type, ...]]:
    return {settings.topic_episodes: ON_EPISODES, settings.topic_reflections: ON_REFLECTIONS,
            settings.topic_requests: ON_REQUESTS}


def accept(message, carries: dict[str, tuple[type, ...]]) -> Event:
    """The record of a Kafka message, or ContractError: it must decode, be of a
    type its topic carries, and be keyed by its user (one user's events in
    order on one partition, co-partitioned with the per-user tables, which are
    written to the partition of the event)."""
    record = decode(message.value)
    if not isinstance(record, carries[message.topic]):
        raise ContractError("type", f"{record.TYPE} does not belong on {message.topic}")
    if isinstance(record, ReflectionRequested) and EpisodeRecorded in carries[message.topic] \
            and record.why != "manual":  # the others are made from this topic, never put on it
        raise ContractError("why", f"only a manual request belongs on {message.topic}")
    if message.key != record.user_id.encode():
        raise ContractError("(key)", f"the message key must be the user_id {record.user_id!r}")
    return record


_GOT = re.compile(r" \(got .*\)$", re.S)


def said(error: BaseException) -> str:
    """An error's message as a log or a dead letter's header may show it: a
    contract error's without the value it quotes (that may be a piece of an
    episode's text, which an erasure must reach), others cut short."""
    if isinstance(error, ContractError):
        return f"{error.field}: {_GOT.sub('', error.reason)}"
    text = str(error)
    return text if len(text) <= 500 else text[:500] + "…"


def redacted(error: BaseException) -> str:
    """The error for a log line: its kind, then what `said` shows."""
    return said(error) if isinstance(error, ContractError) else f"{type(error).__name__}: {said(error)}"


def dead_letter_headers(topic: str, partition: int, offset: int, error: Exception,
                        stage: str) -> list[tuple[str, bytes]]:
    field = error.field if isinstance(error, ContractError) else ""
    headers = {
        "__connect.errors.topic": topic,
        "__connect.errors.partition": str(partition),
        "__connect.errors.offset": str(offset),
        "__connect.errors.stage": stage,
        "__connect.errors.exception.class.name": type(error).__name__,
        "__connect.errors.exception.message": said(error),
        "reflect.errors.field": field,
    }
    return [(k, v.encode("utf-8", "replace")) for k, v in headers.items()]
