"""The same log gives the same beliefs: one history streamed twice — in batches
of 256 at once, and in batches of 5 with the worker stopped mid-stream and
restarted — ends with the same beliefs (ids, texts, evidence, depth,
confidence, status) and the same episodes in the view. So does a fresh
worker (another app id, a data directory of its own) consuming the first
run's three topics from the start, with the gates off: it adopts every
cycle the log completed and runs none again. (With the contradiction gate
on it does not: its catch-up puts the log's later beliefs in the view, which
the gate reads as it is.)

Several cycles a user, beliefs over beliefs, two retractions of episodes
beliefs cite and a manual cycle between them: what used to make the outcome
depend on timing (the reflector polling the view, beliefs reaching the
accumulator's window at a point of the stream that depends on timing, a
retraction racing a cycle, a manual request reading whatever window was
current).

    python -m pytest tests/integration/test_determinism.py -s
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter

import pytest

from streams.broker import free_port
from streams.topics import ensure_topics
from support.harness import wait_for
from support.history import MIN_EPISODES, THRESHOLD, as_set, differences, history, settled
from support.runs import (Workers, beliefs_of, episodes_of, make_settings, publish, read_events,
                          users_by_partition, view_snapshot)

pytestmark = [pytest.mark.integration, pytest.mark.broker]


def run(broker, tmp, name: str, batch: int, restart_at: int | None, challenge: str = "on") -> dict:
    settings = make_settings(broker.url, tmp / name, threshold=THRESHOLD, min_episodes=MIN_EPISODES,
                             projector_batch=batch, session_timeout=6.0, challenge=challenge)
    users = users_by_partition(2, settings.partitions)
    asyncio.run(ensure_topics(settings))
    return consume(settings, tmp, name, users, history(users, settings), restart_at)


def consume(settings, tmp, name: str, users, events, restart_at: int | None, published: bool = False) -> dict:
    """A worker through the history (published first, unless the topics hold
    it), settled; what its view and the log hold."""
    (tmp / name).mkdir(parents=True, exist_ok=True)
    workers = Workers(tmp / name)
    started = time.monotonic()
    try:
        worker = workers.start(settings)
        if restart_at is None and not published:
            asyncio.run(publish(settings, events))
        elif restart_at is not None:
            asyncio.run(publish(settings, events[:restart_at]))
            wait_for(lambda: sum(worker.stats(u).get("episodes", 0) for u in users) >= restart_at // 3, 60,
                     "a third of the first part in the view")
            worker.stop()  # mid-stream: batches in flight, cycles asked and not yet run
            worker = workers.start(settings)
            asyncio.run(publish(settings, events[restart_at:]))
        wait_for(lambda: settled(worker, settings, events, users), 180, f"{name}: the whole history settled")
    finally:
        workers.stop_all()
    snapshot = view_snapshot(settings, users)
    beliefs = {u: {rid: as_set(p) for rid, p in held.items()} for u, held in beliefs_of(snapshot).items()}
    print(f"{name}: {sum(map(len, beliefs.values()))} beliefs in {time.monotonic() - started:.1f} s")
    reflections = read_events(settings, settings.topic_reflections)
    return {"beliefs": beliefs, "episodes": episodes_of(snapshot), "settings": settings, "users": users,
            "events": events,
            "created": {e["reflection_id"]: e["cycle_id"] for e in reflections if e["type"] == "ReflectionCreated"},
            "audits": Counter(e["cycle_id"] for e in reflections
                              if e["type"] in ("ReflectionCycleCompleted", "ReflectionChallenged"))}


def test_the_same_history_gives_the_same_beliefs_whatever_the_batches_and_a_restart(broker, tmp_path):
    once = run(broker, tmp_path, "at-once", batch=256, restart_at=None)
    again = run(broker, tmp_path, "small-batches-restarted", batch=5, restart_at=8 * 50)
    beliefs = once["beliefs"]
    assert sum(map(len, beliefs.values())) >= 8 * 3, "too few beliefs for the comparison to mean much"
    assert any(p["depth"] == 2 for b in beliefs.values() for p in b.values()), "no belief over beliefs"
    assert any(p["status"] != "live" or p.get("lost_evidence_ids") for b in beliefs.values() for p in b.values()), \
        "the retraction changed no belief"
    for user, held in beliefs.items():
        diff = differences(held, again["beliefs"][user])
        assert not diff, "\n".join([user, *(f"{rid}: {d}" for rid, d in diff.items())])
    assert again["episodes"] == once["episodes"]
    assert again["created"] == once["created"]  # and each belief was made by the same cycle


def test_a_fresh_worker_on_the_same_topics_adopts_every_cycle_and_holds_the_same_beliefs(broker, tmp_path):
    once = run(broker, tmp_path, "first", batch=256, restart_at=None, challenge="off")
    assert max(once["audits"].values()) == 1, "a cycle completed twice on the log"
    settings = once["settings"]
    fresh = consume(dataclasses.replace(settings, app_id=f"{settings.app_id}-fresh", data_dir=str(tmp_path / "fresh"),
                                        web_port=free_port()),
                    tmp_path, "fresh", once["users"], once["events"], None, published=True)
    assert fresh["audits"] == once["audits"], "the fresh worker ran again cycles the log had completed"
    assert sum(map(len, once["beliefs"].values())) >= 8 * 3, "too few beliefs for the comparison to mean much"
    assert fresh["beliefs"] == once["beliefs"] and fresh["episodes"] == once["episodes"]
