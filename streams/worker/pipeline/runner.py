"""The loop every pipeline agent runs: a batch of one topic's events, decoded
once, handled, and only then reported durable (streams/worker/commits.py), which
decides the offset the group resumes from. A batch that waits on a transient
fault holds its partitions' commits where they are, and a crash meanwhile
replays it. Faust acknowledges nothing here: the topics are declared
without acks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from processors.dlq import accept, carried
from schemas import ContractError, Event
from streams.shredding import opener
from streams.worker import compaction, metrics
from streams.worker.runtime import Runtime

log = logging.getLogger("reflect")
AUDIT_AFTER = 1.0  # seconds between a waiting runner's looks for dropped records (streams/worker/read_order.py)


class HandedOver(BaseException):
    """A batch given up because the worker hands its partitions over (it
    stops, or a rebalance revokes them) while the batch waits on another
    agent. It is left unacknowledged and read again from the last commit by
    whoever owns its partition next, as after a crash: every effect is
    idempotent. A BaseException, like a cancellation, so that no step's
    error policy takes it for a failure of the record."""


class Runner:
    PROJECTS = False  # whether the topic's events are projected into the view
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.carries = carried(runtime.settings)

    async def run(self, stream) -> None:
        """Batches handled one after the other, in order; while one is handled
        the next is read, decoded and prepared (`prepare`: work that depends on
        the batch alone, such as embedding its texts), so the cores do not sit
        idle while a batch waits on the broker's acknowledgements. While the
        batch in hand is still being prepared, what arrives meanwhile joins
        the next batch (`Batches`), so that a backlog is prepared in a few
        large batches, one after the other, rather than in many small ones
        side by side; a lone event is never held back for company."""
        settings = self.runtime.settings
        self.topic = stream.channel.get_topic_name()
        batches = stream.noack_take(settings.projector_batch, within=settings.projector_within)
        reader = Batches(lambda: self.read(batches), settings.projector_batch)
        ahead = asyncio.ensure_future(self.read_ahead(reader, None))
        try:
            while True:
                try:
                    batch = await ahead
                except StopAsyncIteration:
                    return
                ahead = asyncio.ensure_future(self.read_ahead(reader, batch[2]))
                async with self.runtime.commits.holding():
                    await self.step(*batch)
        finally:
            ahead.cancel()  # a batch read ahead is not handled: it is read again from the last commit
            reader.close()

    async def step(self, events, admitted, prepared) -> None:
        """One batch handled and reported durable, or given up.

        Given up while the worker hands its partitions over (a stop, or a
        rebalance that revokes them: streams/worker/commits.py waits for the batch
        in hand before it commits and lets the partitions go). Events read
        before the group's last rebalance are dropped: the consumer read its
        partitions again from their last commit since."""
        runtime, commits = self.runtime, self.runtime.commits
        if runtime.handing_over():
            prepared.cancel()
            log.info("a batch of %d event(s) read as the worker hands its partitions over: given up, it is read "
                     "again from the last commit", len(events))
            return commits.given_up(events)
        current = [e for e in events if commits.current(e.message)]
        if len(current) < len(events):
            log.info("%d event(s) read before the group's last rebalance dropped: read again from the last commit",
                     len(events) - len(current))
            events, admitted = current, [(r, m) for r, m in admitted if commits.current(m)]
        await runtime.ownership.wait_whole(events)  # a partition just gained is caught up first
        try:
            await self.handle(admitted, await prepared)
        except HandedOver as why:
            log.warning("a batch of %d event(s) given up while the worker hands its partitions over (%s): it is "
                        "read again from the last commit", len(events), why)
            return commits.given_up(events)
        if self.PROJECTS:  # how far the view holds this topic: streams/worker/ownership.py
            await runtime.ownership.applied(events)
            await compaction.check(runtime)
        await runtime.app.producer.flush()  # the tables' changelog records, sent as they were written
        commits.handled(events)

    async def read_ahead(self, reader: "Batches", busy: asyncio.Future | None):
        events = await reader.next(busy)
        admitted = await self.admit(events)
        return events, admitted, asyncio.ensure_future(self.prepared(admitted))

    async def read(self, batches) -> list:
        """The next batch, less what comes out of order (streams/worker/read_order.py);
        while it is awaited, a look every AUDIT_AFTER seconds for records
        fetched and dropped on their way here."""
        order = self.runtime.read_order
        coming = asyncio.ensure_future(batches.__anext__())
        try:
            while order is not None and not (await asyncio.wait({coming}, timeout=AUDIT_AFTER))[0]:
                await order.audit(self.topic)
            events = await coming
        finally:
            coming.cancel()  # a run that stops reads nothing more
        return events if order is None else await order.in_order(events)

    async def prepared(self, admitted: list[tuple[Event, Any]]) -> Any:
        """`prepare`'s result, or None when it failed: `handle` then does the
        work itself, under the error policy."""
        try:
            return await self.prepare(admitted)
        except Exception:
            log.debug("preparing a batch failed; it is handled without", exc_info=True)
            return None

    async def prepare(self, admitted: list[tuple[Event, Any]]) -> Any:
        return None

    async def admit(self, events) -> list[tuple[Event, Any]]:
        """(record, message) of every event that honours its topic's contract,
        a sealed one opened (streams/shredding.py: an erased one is read as
        what is left of it); the rest dead-lettered with the reason (stage
        "decode")."""
        accepted = []
        for event in events:
            try:
                accepted.append((accept(event.message, self.carries), event.message))
            except ContractError as error:
                await self.reject(event.message, error)
        sealing = self.runtime.sealing  # the key topic unreachable is a transient fault: retried
        open_one = await self.runtime.policy.until_done("open", lambda: opener(sealing, [r for r, _ in accepted]))
        out = []
        for record, message in accepted:
            try:
                opened = open_one(record)
            except ContractError as error:
                await self.reject(message, error)
                continue
            metrics.event(message, "ok", record.TYPE)
            if opened is not None:  # None: a belief an erasure took, whose key is gone
                out.append((opened, message))
        return out

    async def reject(self, message, error: ContractError) -> None:
        metrics.event(message, "dead_lettered")
        await self.runtime.policy.reject(message, error, "decode")

    async def handle(self, admitted: list[tuple[Event, Any]], prepared: Any = None) -> None:
        raise NotImplementedError

    async def publish(self, events: list[Event]) -> None:
        if events:
            await self.runtime.policy.until_done("publish", lambda: self.runtime.outlets.publish(events))


class Batches:
    """The batches a runner handles, in the order read: each what `read`
    gives (one of the stream's batches, never empty), joined by the ones
    read while `busy` (the batch before, still being prepared) is not done,
    up to `most` events; what a join takes beyond `most` opens the next
    batch. A batch is handed out as soon as `busy` is done: one read in
    flight then waits on for the batch after."""

    def __init__(self, read: Callable[[], Awaitable[list]], most: int) -> None:
        self.read, self.most = read, most
        self.coming: asyncio.Future | None = None  # a read in flight, kept for the next batch
        self.left: list = []  # read beyond `most`: the next batch's start

    async def next(self, busy: asyncio.Future | None = None) -> list:
        events, self.left = self.left, []
        while len(events) < self.most and not (events and (busy is None or busy.done())):
            if self.coming is None:
                self.coming = asyncio.ensure_future(self.read())
            await asyncio.wait({self.coming, busy} if events else {self.coming},
                               return_when=asyncio.FIRST_COMPLETED)
            if self.coming.done():
                coming, self.coming = self.coming, None
                events = events + coming.result()  # StopAsyncIteration: the stream has ended
        events, self.left = events[:self.most], events[self.most:]
        return events

    def close(self) -> None:
        """The read in flight cancelled: a run that stops reads nothing more."""
        if self.coming is not None:
            self.coming.cancel()
