"""A worker without a broker: the three pipelines run in-process over topics
and tables kept in memory, with whatever view, embedder and reasoner the test
gives them (the real Qdrant Edge view, HashingEmbedder, OfflineReasoner).

What runs is the worker's own code from `Runner.admit` on: the pipelines'
`handle()`, the error policy, the real `Tables` and `Outlets` classes — built
over `MemoryApp`, which answers the two calls they make of a Faust app
(`Table`, `topic`), and `MemoryLog` for streams/worker/on_log.Log. What is
replaced is Faust's consumer: each pipeline is a task that takes up to
`projector_batch` unread records of its topic, handles them, and only then
moves its position on (acknowledged when done, as
`Runner.run`). The tasks run concurrently, as Faust's agents do: a retraction
waits for its user's cycles, which the requests task runs meanwhile.

A topic is one ordered list, not partitions: each partition's order is a part
of it, so what the pipeline may rely on holds. A message's partition is the
one Kafka's default partitioner gives its key, which is where the pipelines
write their tables' changelog.

Here, not in `streams/`: only tests run it, beside the other stand-ins
(`faulty_worker.py`, `messages_api.py`).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import Any, Callable

from aiokafka.partitioner import DefaultPartitioner

from schemas import Event, decode
from streams.settings import Settings
from streams.worker.on_log import event_id
from streams.worker.pipeline.episodes import EpisodesPipeline
from streams.worker.pipeline.policy import Backoff
from streams.worker.pipeline.reflections import ReflectionsPipeline
from streams.worker.pipeline.requests import RequestsPipeline
from streams.worker.pipeline.runner import HandedOver
from streams.worker.runtime import Runtime

OnWrite = Callable[[str, str, Any], None]  # (table name, key, value): told of each changelog write


class MemoryTable:
    """The part of a Faust table the pipeline uses: `get` (the default for a
    missing key, as Faust's), `data`, and `send_changelog`, which records each
    write in order and tells the app's `on_write` as it happens."""

    def __init__(self, name: str, default: Callable[[], Any], app: "MemoryApp") -> None:
        self.name, self.default, self.app = name, default, app
        self.data: dict[str, Any] = {}
        self.changelog: list[tuple[int, str, Any]] = []  # (partition, key, value as written)

    def get(self, key: str) -> Any:
        return self.data[key] if key in self.data else self.default()

    def send_changelog(self, partition: int, key: str, value: Any) -> asyncio.Future:
        self.changelog.append((partition, key, copy.deepcopy(value)))
        self.app.on_write(self.name, key, value)
        sent = asyncio.get_running_loop().create_future()  # the broker's acknowledgement, at once
        sent.set_result(None)
        return sent


class MemoryTopic:
    """A topic's records in the order they were sent: (key, value bytes, headers)."""

    def __init__(self, name: str, app: "MemoryApp") -> None:
        self.name, self.app = name, app
        self.records: list[tuple[bytes, bytes, list]] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, key: bytes, value: bytes, headers=None) -> asyncio.Future:
        self.records.append((key, value, list(headers or ())))
        async with self.app.turns:
            self.app.turns.notify_all()  # a pipeline may be waiting for it
        acknowledged = asyncio.get_running_loop().create_future()
        acknowledged.set_result(None)  # what Faust's send returns: the broker's acknowledgement, awaited
        return acknowledged

    def events(self) -> list[Event]:
        return [decode(value) for _, value, _ in self.records]


class MemoryApp:
    """What `Tables.of` and `Outlets` ask of a Faust app, in memory. A topic
    name is one topic however often it is asked for (Outlets asks twice for
    the reflections dead-letter topic)."""

    def __init__(self) -> None:
        self.topics: dict[str, MemoryTopic] = {}
        self.tables: dict[str, MemoryTable] = {}
        self.turns = asyncio.Condition()  # notified when a record is sent and when a batch is done
        self.on_write: OnWrite = lambda table, key, value: None

    def Table(self, name: str, default: Callable[[], Any], partitions: int) -> MemoryTable:  # noqa: N802 (Faust's)
        return self.tables.setdefault(name, MemoryTable(name, default, self))

    def topic(self, name: str, **options: Any) -> MemoryTopic:
        return self.topics.setdefault(name, MemoryTopic(name, self))


class MemoryLog:
    """streams/worker/on_log.Log over a `MemoryApp`'s topics: an offset is a place in
    the topic's one list."""

    def __init__(self, app: MemoryApp) -> None:
        self.app = app

    async def end(self, topic: str, partition: int) -> int:
        return len(self.app.topic(topic).records)

    async def past_end(self, topic: str, partition: int) -> int:
        return await self.end(topic, partition)

    async def holds(self, topic: str, partition: int, since: int, event_ids) -> set[str]:
        return set(event_ids) & {event_id(value) for _, value, _ in self.app.topic(topic).records[since:]}


def memory_runtime(settings: Settings, view, embedder, reasoner, backoff: Backoff = Backoff()) -> Runtime:
    """A runtime as `streams.worker.app.create_app` builds it, over a `MemoryApp`."""
    app = MemoryApp()
    runtime = Runtime.build(settings, app, view, embedder, reasoner, backoff)
    runtime.log = MemoryLog(app)
    return runtime


@dataclass(frozen=True)
class Message:
    """What the pipeline reads of a Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: list


@dataclass(frozen=True)
class Delivery:
    """A Faust event, as `Runner.admit` takes it."""

    message: Message


class MemoryWorker:
    """The three pipelines of a memory runtime, each over its topic."""

    def __init__(self, runtime: Runtime) -> None:
        outlets = runtime.outlets
        self.runtime, self.turns = runtime, runtime.app.turns
        self.batch = runtime.settings.projector_batch
        self.pipelines = ((outlets.episodes, EpisodesPipeline(runtime)),
                          (outlets.reflections, ReflectionsPipeline(runtime)),
                          (outlets.requests, RequestsPipeline(runtime)))
        self.position = {topic.name: 0 for topic, _ in self.pipelines}  # the next offset each pipeline reads
        self.busy = 0  # pipelines handling a batch now
        self.partitions = list(range(runtime.settings.partitions))
        self.partitioner = DefaultPartitioner()

    async def run(self, events: list[Event], timeout: float = 120.0) -> None:
        """Send `events` to the episodes topic, keyed by user, as a client's
        `Publisher` does, and drain."""
        for event in events:
            await self.runtime.outlets.episodes.send(key=event.user_id.encode(), value=event.encode())
        await self.drain(timeout)

    def redeliver(self, topic: MemoryTopic, offset: int) -> None:
        """Read `topic` again from `offset` at the next drain, as after a crash
        before the commit."""
        self.position[topic.name] = offset

    def unread(self, topic: MemoryTopic) -> int:
        return len(topic.records) - self.position[topic.name]

    def quiet(self) -> bool:
        return self.busy == 0 and not any(self.unread(topic) for topic, _ in self.pipelines)

    async def drain(self, timeout: float = 120.0) -> None:
        """Run the pipelines until every topic is read and no pipeline has
        anything in hand; a pipeline that raises fails the drain."""
        consumers = [asyncio.create_task(self.consume(topic, runner)) for topic, runner in self.pipelines]
        quieted = asyncio.create_task(self.quieted())
        try:
            done, _ = await asyncio.wait([quieted, *consumers], timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise TimeoutError(f"not quiet after {timeout} s: position {self.position}, "
                                   f"records {({t.name: len(t.records) for t, _ in self.pipelines})}")
            for task in done:
                task.result()
        finally:
            for task in (quieted, *consumers):
                task.cancel()
            await asyncio.gather(quieted, *consumers, return_exceptions=True)

    async def quieted(self) -> None:
        async with self.turns:
            await self.turns.wait_for(self.quiet)

    async def consume(self, topic: MemoryTopic, runner) -> None:
        while True:
            async with self.turns:
                await self.turns.wait_for(lambda: self.unread(topic))
                start = self.position[topic.name]
                batch = [Delivery(self.message(topic, offset))
                         for offset in range(start, min(start + self.batch, len(topic.records)))]
                self.busy += 1
            given_up = False
            try:
                admitted = await runner.admit(batch)
                await runner.handle(admitted, await runner.prepared(admitted))
                self.position[topic.name] = start + len(batch)  # acknowledged: handled
            except HandedOver:  # as the runner: read again from the last commit
                given_up = True
            finally:
                async with self.turns:
                    self.busy -= 1
                    self.turns.notify_all()
            if given_up:
                await self.handed_over()

    async def handed_over(self) -> None:
        """After a batch was given up, before it is read again."""

    def message(self, topic: MemoryTopic, offset: int) -> Message:
        key, value, headers = topic.records[offset]
        return Message(topic.name, self.partitioner(key, self.partitions, self.partitions), offset, key, value,
                       headers)
