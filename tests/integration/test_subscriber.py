"""The package's subscriber (streams/subscriber.py) on the real broker: with
keys it hands out the texts a downstream service needs, without them only
ids, and after an erasure what is left of each record."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from schemas import EpisodeRecorded, EpisodeRetracted, ReflectionCreated
from streams.producer import Publisher
from streams.subscriber import Subscriber
from support.harness import run, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.broker]


async def taken(settings, topics, keys: bool, until, timeout: float = 30.0) -> list:
    """Every event the subscriber hands out, until `until(events)` holds."""
    out: list = []
    async with Subscriber(settings, topics, f"sub-{time.monotonic_ns()}", keys=keys) as events:
        async def read():
            async for _, event in events:
                out.append(event)
                if until(out):
                    return
        await asyncio.wait_for(read(), timeout)
    return out


def test_a_subscriber_with_keys_reads_texts_one_without_reads_ids_and_an_erasure_reaches_both(settings, worker):
    s = replace(settings, threshold=1000.0)
    w = worker(s)
    belief = ReflectionCreated(user_id="sue", reflection_id="sue-b", cycle_id="sue:1", text="sue ships on Tuesdays",
                               evidence_ids=("sue-a", "sue-c"), depth=1, importance=0.5, confidence=0.6,
                               reasoner="offline", prompt_version="v1", question="when does sue ship?")

    async def publish():
        async with Publisher(s) as p:
            await p.publish_episode("sue", "sue shipped the release on Tuesday", 0.6, episode_id="sue-a")
            await p.publish_episode("sue", "Tuesday again: sue's release went out", 0.6, episode_id="sue-c")
            await p.publish(belief, topic=s.topic_reflections)
    run(publish())
    both = [s.topic_episodes, s.topic_reflections]
    three = lambda events: len(events) >= 3  # noqa: E731
    opened = {getattr(e, "episode_id", None) or e.reflection_id: e for e in run(taken(s, both, True, three))}
    assert opened["sue-a"].text == "sue shipped the release on Tuesday"
    assert (opened["sue-b"].text, opened["sue-b"].question) == (belief.text, belief.question)
    blind = {getattr(e, "episode_id", None) or e.reflection_id: e for e in run(taken(s, both, False, three))}
    assert all(e.sealed and not getattr(e, "text", "") for e in blind.values())
    assert blind["sue-b"].evidence_ids == ("sue-a", "sue-c")  # ids stay in clear

    erasure = w.client.retract("sue", "sue-a", "erasure").event_id
    wait_for(lambda: "erasure_id" in w.get(f"/v1/users/sue/erasures/{erasure}"), 30, "the erasure's proof")
    after = run(taken(s, both, True, lambda events: sum(isinstance(e, EpisodeRetracted) for e in events) >= 2
                      and any(isinstance(e, ReflectionCreated) for e in events)))
    records = [e for e in after if isinstance(e, (EpisodeRecorded, EpisodeRetracted)) and e.episode_id == "sue-a"]
    assert len(records) == 2 and all(isinstance(e, EpisodeRetracted) and e.reason == "erasure" for e in records), \
        records  # the record, read as its erasure, and the retraction
    [gone] = [e for e in after if isinstance(e, ReflectionCreated)]
    assert gone.sealed and not gone.text  # a belief the erasure took: as logged, still sealed
    assert [e.text for e in after if isinstance(e, EpisodeRecorded)] == ["Tuesday again: sue's release went out"]
