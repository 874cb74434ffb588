"""A cycle is decided once: its outcome is stored before it is published
(streams/worker/pipeline/requests.py, table `cycle-outcomes`), so a rerun after a
crash or a stop between the publish and the mark of the request done never
asks the reasoner twice; and it publishes only what the log lacks
(streams/worker/on_log.py), so every record is on the log once and the spend is
charged once. A worker handing its partition over publishes nothing of a
cycle it decided meanwhile (the next owner does), and a cycle retried after
a transient fault keeps the answers it was given (Remembered). Shown
in-process (tests/support/memory_worker.py) over the real Qdrant Edge view.

    python -m pytest tests/integration/test_outcomes.py -q
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from processors.embedders import HashingEmbedder
from processors.ports import Usage, ViewUnavailable
from processors.reasoners import OfflineReasoner, Remembered
from streams.adapters.view.edge import EdgeView
from schemas import ReflectionCycleCompleted
from streams.producer import Publisher, make_episode
from streams.settings import Settings
from streams.topics import ensure_topics
from streams.worker.on_log import Log
from streams.worker.ownership import partition_of
from streams.worker.pipeline.runner import HandedOver
from support.memory_worker import MemoryWorker, memory_runtime
from support.runs import beliefs_of, episode_stream, points_of, users_by_partition

USERS = users_by_partition(1, 2)


class Counted(OfflineReasoner):
    """The offline reasoner, counting its calls and billing 100 tokens for
    each; `answered(question)` is told after each insights call."""

    calls = 0
    answered = staticmethod(lambda question: None)

    def questions(self, *args, **kwargs):
        Counted.calls += 1
        questions, used = super().questions(*args, **kwargs)
        return questions, used + Usage(input_tokens=100)

    def insights(self, question, *args, **kwargs):
        Counted.calls += 1
        found, used = super().insights(question, *args, **kwargs)
        Counted.answered(question)
        return found, used + Usage(input_tokens=100)


class FailsOnceAfterEachAnswer:
    """The real view, not answering (ViewUnavailable: a transient fault) at
    its first call after a question's insights were first answered: the
    cycle is retried from its start (streams/worker/pipeline/policy.py)."""

    def __init__(self, view) -> None:
        self._view, self.armed, self.asked, self.failures = view, False, set(), 0

    def answered(self, question: str) -> None:
        if question not in self.asked:
            self.asked.add(question)
            self.armed = True

    def __getattr__(self, name: str):
        attribute = getattr(self._view, name)
        if not callable(attribute) or name in ("close", "name"):
            return attribute

        def call(*args, **kwargs):
            if self.armed:
                self.armed, self.failures = False, self.failures + 1
                raise ViewUnavailable("injected: the view did not answer")
            return attribute(*args, **kwargs)
        return call


class StopsInPublish(MemoryWorker):
    """The requests pipeline stops once in each cycle's publish, after the
    first `published(events)` of its events reach the log and before the
    request is marked done, and reads its batch again (MemoryWorker.consume)."""

    published = staticmethod(lambda events: events)

    def __init__(self, runtime) -> None:
        super().__init__(runtime)
        publish, self.stops = runtime.outlets.publish, set()

        async def publish_then_stop(events) -> None:
            cycles = {e.cycle_id for e in events if isinstance(e, ReflectionCycleCompleted)} - self.stops
            if not cycles:
                return await publish(events)
            await publish(self.published(events))
            self.stops |= cycles
            raise HandedOver("stopped in a cycle's publish")
        runtime.outlets.publish = publish_then_stop


class StopsAfterEachPublish(StopsInPublish):
    pass


class StopsWithinEachPublish(StopsInPublish):
    published = staticmethod(lambda events: events[:len(events) // 2])  # the completion comes last


class StopsAfterEachCharge(MemoryWorker):
    """The requests pipeline stops once in each cycle right after its spend
    is charged (the charge on the changelog), before the request is marked
    done, and reads its batch again."""

    def __init__(self, runtime) -> None:
        super().__init__(runtime)
        self.stops = set()

        def stop_after_charge(table, key, value) -> None:
            if table == "last-cycle" and value["cycle_id"] not in self.stops:  # the charge's last write
                self.stops.add(value["cycle_id"])
                raise HandedOver("stopped after a cycle's charge")
        runtime.app.on_write = stop_after_charge


class HandsOverOnceDecided(MemoryWorker):
    """The worker starts handing its partitions over once in each cycle,
    right after the cycle's outcome is stored: the fence
    (Runtime.still_owns) must keep its events off the log, for the batch to
    be read again and the stored outcome published then."""

    def __init__(self, runtime) -> None:
        super().__init__(runtime)
        self.stopping, self.stops, self.published_while_stopping = set(), [], 0

        def stop_once_decided(table, key, value) -> None:
            if table == "cycle-outcomes" and value["cycle_id"] not in self.stopping:
                self.stopping.add(value["cycle_id"])
                runtime.app.should_stop, self.at_stop = True, len(runtime.outlets.reflections.records)
        runtime.app.on_write = stop_once_decided

    async def handed_over(self) -> None:
        if self.runtime.app.should_stop:
            self.stops.append(len(self.runtime.outlets.reflections.records) - self.at_stop)
            self.published_while_stopping += self.stops[-1]
            self.runtime.app.should_stop = False


def run(tmp, worker_class, faulty_view: bool = False) -> dict:
    settings = Settings.load(env={}, data_dir=str(tmp), threshold=5.0, min_episodes=5, projector_batch=8)
    embedder, Counted.calls = HashingEmbedder(), 0
    view = EdgeView(settings.view_dir, settings.view, embedder.dim)
    served = FailsOnceAfterEachAnswer(view) if faulty_view else view
    Counted.answered = served.answered if faulty_view else (lambda question: None)
    worker = worker_class(memory_runtime(settings, served, embedder, Counted(embedder)))
    try:
        asyncio.run(worker.run(episode_stream(USERS, 40)))
        published = worker.runtime.outlets.reflections.events()
        return {"calls": Counted.calls, "beliefs": beliefs_of(points_of(view, USERS)),
                "completed": [e.cycle_id for e in published if isinstance(e, ReflectionCycleCompleted)],
                "event_ids": [e.event_id for e in published], "stops": len(getattr(worker, "stops", ())),
                "spend": worker.runtime.tables.spend.data,
                "published_while_stopping": getattr(worker, "published_while_stopping", 0),
                "view_failures": getattr(served, "failures", 0)}
    finally:
        view.close()


@pytest.mark.parametrize("stopping", [StopsAfterEachPublish, StopsWithinEachPublish, StopsAfterEachCharge,
                                      HandsOverOnceDecided])
def test_a_cycle_rerun_asks_the_reasoner_nothing_and_publishes_what_the_log_lacks(tmp_path, stopping):
    once, again = run(tmp_path / "once", MemoryWorker), run(tmp_path / "stopped", stopping)
    assert once["calls"] > 0 and len(set(once["completed"])) >= len(USERS) * 2
    assert again["stops"] >= len(USERS) * 2, "no cycle was rerun"
    assert again["calls"] == once["calls"]  # the reruns reused what was decided
    assert sorted(again["event_ids"]) == sorted(once["event_ids"])  # each record on the log once
    assert again["completed"] == once["completed"] and again["beliefs"] == once["beliefs"]
    assert again["spend"] == once["spend"] and once["spend"]  # charged once
    assert again["published_while_stopping"] == 0  # fenced: nothing published for a partition handed over
    if stopping is HandsOverOnceDecided:
        assert again["stops"] == len(set(once["completed"])), "a cycle went on while its partition was handed over"


def test_a_cycle_retried_after_a_transient_fault_asks_the_reasoner_nothing_twice(tmp_path):
    """The answers a cycle paid for are kept for its retries (a transient
    fault of the view after the reasoner answered retries the whole cycle)."""
    once, again = run(tmp_path / "once", MemoryWorker), run(tmp_path / "faulty", MemoryWorker, faulty_view=True)
    assert again["view_failures"] >= len(USERS) * 2, "the fault was not injected"
    assert again["calls"] == once["calls"]
    assert again["completed"] == once["completed"] and again["beliefs"] == once["beliefs"]
    assert again["spend"] == once["spend"]


def test_a_remembered_reasoner_keeps_answers_not_failures():
    class Flaky:
        name, calls = "flaky", 0

        def questions(self, statements, n=3):
            self.calls += 1
            if self.calls == 1:
                raise TimeoutError("the API did not answer")
            return [f"about {len(statements)} statements"], Usage(calls=1)

    flaky = Flaky()
    remembered = Remembered(flaky)
    with pytest.raises(TimeoutError):
        remembered.questions(["a", "b"], n=3)
    answer = remembered.questions(["a", "b"], n=3)
    assert remembered.questions(["a", "b"], n=3) == answer and flaky.calls == 2  # kept
    assert remembered.questions(["a", "b", "c"], n=3) != answer and flaky.calls == 3  # another question
    assert remembered.name == "flaky"


@pytest.mark.integration
@pytest.mark.broker
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_the_log_says_which_events_it_holds_from_an_offset_on(settings, guarantee):
    """streams/worker/on_log.Log.holds on the real broker: what was published
    before `since` is not looked at, what after it is found, by event id
    (read committed under exactly_once)."""
    settings = dataclasses.replace(settings, processing_guarantee=guarantee)
    user = "u-log"
    tp = TopicPartition(settings.topic_episodes, partition_of(user, settings.partitions))

    async def published_around() -> tuple[set[str], set[str]]:
        await ensure_topics(settings)
        async with Publisher(settings) as publisher:
            before = [await publisher.publish_episode(user, f"before {i}", 0.5) for i in range(2)]
            consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap)
            await consumer.start()
            since = (await consumer.end_offsets([tp]))[tp]
            await consumer.stop()
            after = [await publisher.publish_episode(user, f"after {i}", 0.5) for i in range(2)]
        never = make_episode(user, "never published", 0.5)
        held = await Log(settings, app=None).holds(tp.topic, tp.partition, since,
                                                   [e.event_id for e in (*before, *after, never)])
        return held, {e.event_id for e in after}

    held, after = asyncio.run(published_around())
    assert held == after
