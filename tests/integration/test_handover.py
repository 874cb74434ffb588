"""A worker hands its partitions over promptly, with the contradiction gate
on and a slow model: ingest never waits for a cycle (the gate judges in the
requests pipeline), so every episode is in the view while the second cycle
still calls the model; asked to stop then, or revoked by a rebalance, the
worker lets its partitions go within seconds, and the worker after it
finishes every cycle, nothing lost.

    python -m pytest tests/integration/test_handover.py -s
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.broker import free_port
from streams.topics import ensure_topics
from streams.worker.ownership import partition_of
from support.broker import TEST_BROKER
from support.harness import wait_for
from support.messages_api import MessagesServer, OfflineModel
from support.runs import SHORT_GROUP_TIMEOUTS, Workers, episode_stream, make_settings, publish, read_events

pytestmark = [pytest.mark.integration, pytest.mark.broker]

EPISODES = 16  # one user's, each asking for a cycle
CALL_SECONDS = 1.5  # the stand-in model's delay per call: a cycle is in hand while the next is asked
STOP_BOUND = 10.0  # seconds: a cycle in hand ends within 2 calls, and nothing else is waited for
USER = "u1"
GATED = dict(challenge="on", projector_batch=1)  # each episode a batch, judged by the gate after the cycle before it


@contextlib.contextmanager
def busy_worker(broker, tmp_path):
    """(workers, the first one, its settings and env, the model) once the
    user's second cycle is calling the slow model, every episode already in
    the view; everything stopped after."""
    api = MessagesServer(OfflineModel(), delay=CALL_SECONDS)
    settings = make_settings(broker.url, tmp_path / "data", reasoner="anthropic", threshold=1.0, min_episodes=1,
                             **GATED, **SHORT_GROUP_TIMEOUTS)
    env = {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    asyncio.run(ensure_topics(settings))
    workers = Workers(tmp_path)
    try:
        worker = workers.start(settings, env)
        asyncio.run(publish(settings, [replace(e, importance=1.0) for e in episode_stream([USER], EPISODES)]))
        wait_for(lambda: len(api.requests) >= 2, 60, "the second cycle calling the model")
        # Each cycle takes 2 calls of CALL_SECONDS: ingest that waited for them would take a minute.
        wait_for(lambda: worker.stats(USER).get("episodes") == EPISODES, 2 * CALL_SECONDS,
                 "every episode in the view while the cycles go on")
        assert len(read_events(settings, settings.topic_reflections)) < EPISODES, "the handover must come mid-cycles"
        yield workers, worker, settings, env, api
    finally:
        workers.stop_all()
        api.close()


def committed(settings, topic: str) -> int:
    """The group's committed offset on the user's partition of `topic`."""
    async def read() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, group_id=settings.app_id,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            return await consumer.committed(TopicPartition(topic, partition_of(USER, settings.partitions))) or 0
        finally:
            await consumer.stop()
    return asyncio.run(read())


def all_done(worker, settings) -> int:
    """Waits until every episode is in the view and every cycle asked is
    done; the number of cycles asked."""
    def cycles() -> set:
        return {e["cycle_id"] for e in read_events(settings, settings.topic_reflections)
                if e["type"] == "ReflectionCycleCompleted"}
    wait_for(lambda: worker.stats(USER).get("episodes") == EPISODES and worker.stats(USER).get("cycles") == EPISODES
             and len(cycles()) >= EPISODES, 120, "every episode in the view and every cycle done")
    requests = {e["cycle_id"] for e in read_events(settings, settings.topic_requests)
                if e["type"] == "ReflectionRequested"}
    assert requests <= cycles(), f"requests never answered: {sorted(requests - cycles())}"
    return len(requests)


def test_a_stop_gives_up_what_waits_and_loses_nothing(broker, tmp_path):
    """Every episode asks for a cycle, each judged by the gate after the
    cycle before it; stopped with a cycle in hand, the worker ends within
    STOP_BOUND, and its successor does every cycle."""
    with busy_worker(broker, tmp_path) as (workers, worker, settings, env, api):
        started = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)
        try:
            worker.process.wait(STOP_BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not stop within {STOP_BOUND:g} s of SIGTERM: {worker.tail()}")
        stopped = time.monotonic() - started
        worker.stop()
        # Not past the request in hand (Faust acknowledged, as skipped, what came while its flow was stopped).
        assert committed(settings, settings.topic_requests) < 2 * EPISODES

        api.delay = 0.0
        asked = all_done(workers.start(settings, env), settings)
        print(f"\nstopped {stopped:.1f} s after SIGTERM, a cycle in hand ({CALL_SECONDS:g} s a call); "
              f"after the restart {asked} cycles asked, all done")


# On noida-db 0.2.3 (seen twice) the revoked worker's commit at the end of
# its handover was refused with IllegalGeneration; it rejoined under a new
# member id, and the group joined again every session timeout from then on,
# as after a dead member (tests/support/runs.py). Tansu hands over in ~9 s.
@pytest.mark.skipif(TEST_BROKER == "noida", reason="noida-db 0.2.3 refuses a commit made during a rebalance "
                    "(IllegalGeneration), so the revoked worker rejoins as a new member and the group never settles")
def test_a_rebalance_while_a_batch_waits_for_a_cycle_goes_on_at_once_and_loses_nothing(broker, tmp_path):
    """A second worker joins while the first one's cycles call the slow
    model (the gate on, as above): the rebalance waits for no more than the
    cycle in hand, and between the two workers every episode and cycle is
    done once the model answers."""
    with busy_worker(broker, tmp_path) as (workers, first, settings, env, api):
        second = workers.start(replace(settings, data_dir=str(tmp_path / "data-2"), web_port=free_port()), env,
                               name="second")
        # The rebalance as the joining worker saw it: from its request to join to its partitions, which
        # come once every member has rejoined. Not from its start: a loaded box slows a worker's start
        # (28.7 s in one CI run, the first worker's 10.3), not the handover this bounds.
        rebalance = logged_at(second.log_path, ASSIGNED) - logged_at(second.log_path, JOINING)

        api.delay = 0.0
        asked = all_done(second, settings)
        print(f"\n[rebalance] the second worker had its partitions {rebalance:.1f} s after it asked to join; "
              f"{asked} cycles asked, all done")
        # The cycle in hand, then a session (the first one's heartbeat may be that late).
        assert rebalance < STOP_BOUND + SHORT_GROUP_TIMEOUTS["session_timeout"], "the rebalance waited for a cycle"


JOINING, ASSIGNED = "(Re-)joining group", "Setting newly assigned partitions"  # aiokafka's own log lines


def logged_at(log: Path, line: str) -> float:
    """When a worker first logged `line`, in seconds (its log's timestamps)."""
    for text in log.read_text(errors="replace").splitlines():
        if line in text and text.startswith("["):
            return datetime.strptime(text[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"{log.name} never logged {line!r}")
