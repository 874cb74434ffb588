"""A downstream subscriber of the `reflections` topic, tested against a real worker.

The first section is the example a downstream team copies: a plain aiokafka
consumer that validates every event against the published schema files
(schemas/v1/<type>.json, loaded by path) with jsonschema. It imports nothing
from Reflect. The tests below it use Reflect's fixtures only to make a real
`reflect worker` emit every kind of event on `reflections`.
"""

from __future__ import annotations

# The example (down to "test scaffolding") needs only these:
import json
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from aiokafka import AIOKafkaConsumer
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

# The scaffolding uses Reflect to make a worker emit events:
import asyncio
import copy
import time
from dataclasses import replace

import jsonschema
import pytest

from streams.producer import Publisher
from streams.topics import ensure_topics
from support.harness import run

pytestmark = pytest.mark.integration


# ---------------------------------------------------------------- the example: nothing from Reflect

def load_validator(schema_dir: str | Path) -> Callable[[Any], str]:
    """validate(event) -> its type. Raises ValueError for what is not a Reflect
    event of a known type, jsonschema.ValidationError for one that breaks its schema."""
    files = {p.stem: json.loads(p.read_text("utf-8")) for p in Path(schema_dir).glob("*.json")}
    # The files $ref each other by $id (urn:reflect:schemas:v1:envelope#/$defs/id): resolve them locally.
    registry = Registry().with_resources((d["$id"], Resource.from_contents(d)) for d in files.values())
    by_type = {name: Draft202012Validator(d, registry=registry) for name, d in files.items()
               if name != "envelope"}  # <type>.json per event; envelope.json is shared by all of them

    def validate(event: Any) -> str:
        kind = event.get("type") if isinstance(event, dict) else None
        if kind not in by_type:
            raise ValueError(f"not a known Reflect event type: {kind!r}")
        by_type[kind].validate(event)
        return kind

    return validate


async def subscribe(bootstrap: str, topic: str, schema_dir: str | Path, group_id: str,
                    **options: Any) -> AsyncIterator[tuple[Any, dict]]:
    """Yield (message, event) for each event of `topic`, validated; its offset is
    committed once the caller asks for the next one, so an event is processed at
    least once: deduplicate on event["event_id"]. Messages are keyed by user_id,
    so one user's events arrive in the order Reflect produced them."""
    validate = load_validator(schema_dir)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group_id,
                                auto_offset_reset="earliest", enable_auto_commit=False, **options)
    await consumer.start()
    try:
        async for message in consumer:
            event = json.loads(message.value)
            validate(event)  # a bad event stops the subscriber: route it to your own DLQ instead if you prefer
            yield message, event
            await consumer.commit()
    finally:
        await consumer.stop()


# ---------------------------------------------------------------- test scaffolding

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "v1"
USER = "uma"
TEXT = "revert of PR {n}: the auth login broke in staging"  # one theme: the offline reasoner finds it


def of(events: list[dict], kind: str, **fields: Any) -> list[dict]:
    return [e for e in events if e["type"] == kind and all(e.get(k) == v for k, v in fields.items())]


async def provoke_and_follow(s) -> tuple[list, list[dict]]:
    """Two threshold cycles (the second reinforces the first one's belief, and
    the episodes between them challenge it: it holds), then a retraction of
    cited evidence: weakened belief, revalidation cycle."""
    messages, events, ids = [], [], set()

    async def follow():
        async for message, event in subscribe(s.bootstrap, s.topic_reflections, SCHEMAS,
                                              group_id=f"{s.app_id}-downstream", session_timeout_ms=6000):
            messages.append(message)
            if event["event_id"] not in ids:  # at-least-once: the idempotency key
                ids.add(event["event_id"])
                events.append(event)

    async def episodes(numbers):
        async with Publisher(s) as p:
            for n in numbers:
                await p.publish_episode(USER, TEXT.format(n=n), 0.6, episode_id=f"{USER}-{n}")

    async def until(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if follower.done():  # the subscriber stopped: raise what stopped it (e.g. a ValidationError)
                follower.result()
                raise AssertionError(f"the subscriber stopped before {what}")
            if time.monotonic() > deadline:
                seen = [(e["type"], e.get("cycle_id"), e.get("why")) for e in events]
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; seen: {seen}")
            await asyncio.sleep(0.1)  # the poll interval of this bounded wait on a condition

    def cycle(cycle_id: str) -> Callable[[], list]:
        return lambda: of(events, "ReflectionCycleCompleted", cycle_id=cycle_id)

    follower = asyncio.create_task(follow())
    try:
        await episodes(range(4))  # 4 × 0.6 reaches the threshold of 2.0 with 4 high-salience episodes
        await until(cycle(f"{USER}:1"), "the first cycle")
        await episodes(range(4, 8))  # the same theme on new evidence: a near-duplicate insight
        await until(cycle(f"{USER}:2"), "the second cycle")
        [belief, *_] = of(events, "ReflectionCreated")
        async with Publisher(s) as p:
            await p.retract_episode(USER, belief["evidence_ids"][0], "incorrect")
        await until(lambda: of(events, "ReflectionInvalidated") and
                    of(events, "ReflectionCycleCompleted", why="revalidation"),
                    "the invalidation and the revalidation cycle")
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    return messages, events


def test_a_plain_consumer_validates_every_reflection_event_against_the_published_schemas(settings, worker):
    # max_depth=1: beliefs are not evidence for beliefs, so the second cycle's
    # insight can only reinforce the first one's (same depth) or be dropped.
    s = replace(settings, threshold=2.0, min_episodes=4, max_depth=1, challenge="on")  # the gate's events too
    run(ensure_topics(s))
    worker(s)
    messages, events = run(provoke_and_follow(s))

    validate = load_validator(SCHEMAS)
    assert all(validate(e) for e in events)  # each was validated as it came; again, explicitly
    assert {e["type"] for e in events} == {"ReflectionCreated", "ReflectionReinforced", "ReflectionInvalidated",
                                           "ReflectionCycleCompleted", "ReflectionChallenged"}
    assert all(m.key.decode() == json.loads(m.value)["user_id"] == USER for m in messages)  # keyed by user

    [created, *_] = of(events, "ReflectionCreated")
    reinforced = of(events, "ReflectionReinforced", reflection_id=created["reflection_id"])
    # The same theme on new evidence: the contradiction gate challenges the belief (it holds, and the
    # challenge cycle reinforces it), and the second threshold cycle's near-duplicate insight may too.
    assert reinforced and {r["cycle_id"].split(":")[1] for r in reinforced} <= {"2", "challenge"}
    assert all(set(r["added_evidence_ids"]) <= {f"{USER}-{n}" for n in range(4, 8)} for r in reinforced)
    challenged = of(events, "ReflectionChallenged")
    assert challenged and all((c["outcome"], c["verdict"], c["heuristic"], c["status"]) == ("ok", "holds", True, "live")
                              for c in challenged)
    [invalidated] = of(events, "ReflectionInvalidated", reflection_id=created["reflection_id"])
    assert invalidated["cause"] == created["evidence_ids"][0] and invalidated["status"] == "weakened"
    assert invalidated["path"] == [invalidated["cause"], created["reflection_id"]]
    assert [c["why"] for c in of(events, "ReflectionCycleCompleted")] == ["threshold", "threshold", "revalidation"]

    bad = copy.deepcopy(created)
    bad["evidence_ids"] = bad["evidence_ids"][:1]  # a belief must cite at least two records
    with pytest.raises(jsonschema.ValidationError, match="too short"):
        validate(bad)


def test_the_same_validation_rejects_unknown_and_invalid_events():
    validate = load_validator(SCHEMAS)
    good = {"type": "ReflectionCycleCompleted", "schema_version": 1, "event_id": "cycle:uma:1", "user_id": "uma",
            "occurred_at": "2026-12-01T10:00:00Z", "recorded_at": "2026-12-01T10:00:01.5+01:00",
            "cycle_id": "uma:1", "why": "threshold", "questions": [], "kept": 0, "dropped": 0,
            "duration_ms": 1.5, "outcome": "empty", "reasoner": "offline",
            "usage": {"calls": 0, "input_tokens": 0, "output_tokens": 0}, "a_field_from_v1.1": True}
    assert validate(good) == "ReflectionCycleCompleted"  # unknown fields are tolerated
    for unknown in ({**good, "type": "SomethingElse"}, {**good, "type": "envelope"}, {"no": "type"}, ["a list"]):
        with pytest.raises(ValueError, match="not a known Reflect event type"):
            validate(unknown)
    invalid = [{**good, "schema_version": 2}, {**good, "user_id": "has spaces"}, {**good, "outcome": "fine"},
               {**good, "recorded_at": "yesterday"}, {**good, "usage": {"calls": -1}},
               {k: v for k, v in good.items() if k != "event_id"}]
    for event in invalid:
        with pytest.raises(jsonschema.ValidationError):
            validate(event)
