"""Offsets Reflect owns: where the consumer group resumes a pipeline's topic
is decided here, never by Faust's acknowledgement bookkeeping.

The pipeline's source topics are declared without acks (`acks=False`, in
streams/worker/runtime.Outlets), so Faust tracks none of their messages and commits
none of their offsets (its streams acknowledge what they skip while the flow
is stopped, and it commits while it waits for the batch in hand:
faust-streaming#606). Instead, once a batch is handled and its effects are
durable — its points in the view with the view's watermark, every event it
published acknowledged by the broker, every table write on its changelog
(the producer flushed) — the runner reports it (`handled`), and the offset
after its last event becomes its partition's next commit. A pipeline handles
its batches in order, so that offset is the highest contiguous durable one.

A handover (a stop, or a rebalance revoking partitions) waits for the
batches in hand (`holding`, `let_go`: a batch waiting on another agent gives
up, streams/worker/pipeline/runner.py), then commits what is durable and lets the
partitions go. A batch given up fences its partitions for the rest of the
group generation it was read in: the next owner, or this worker once
assigned again, reads it again from the last commit. Commits go out in the
background, one at a time and coalesced, each through the group member's
own commit at its current generation, for the partitions it still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Iterable

log = logging.getLogger("reflect")


class Commits:
    def __init__(self, app) -> None:
        self.app = app
        self.durable: dict = {}  # TP → the offset after its last durable event
        self.committed: dict = {}  # TP → the offset this worker last committed
        self.fenced: dict = {}  # TP → the generation a batch of it was given up in
        self.in_hand = 0  # batches being handled now
        self._idle = asyncio.Condition()
        self._lock = asyncio.Lock()  # one commit at a time
        self._sending: asyncio.Task | None = None

    def current(self, message) -> bool:
        """Read in the group's current generation: not before a rebalance."""
        return message.generation_id == self.app.consumer_generation_id

    @contextlib.asynccontextmanager
    async def holding(self):
        self.in_hand += 1
        try:
            yield
        finally:
            self.in_hand -= 1
            async with self._idle:
                self._idle.notify_all()

    async def let_go(self) -> None:
        """Once no batch is in hand."""
        async with self._idle:
            await self._idle.wait_for(lambda: self.in_hand == 0)

    def handled(self, events: Iterable) -> None:
        """A batch whose effects are durable: its partitions' next commit."""
        for event in events:
            message = event.message
            tp, offset = message.tp, message.offset + 1
            if self.fenced.get(tp) != message.generation_id and offset > self.durable.get(tp, -1):
                self.durable[tp] = offset
        if self._sending is None or self._sending.done():
            self._sending = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        """Commits until nothing durable is left uncommitted (more may become
        durable while one is in flight), or the group refuses one."""
        while await self.send() and self._due(set(self.app.consumer.assignment()), None):
            pass

    def given_up(self, events: Iterable) -> None:
        for event in events:
            self.fenced[event.message.tp] = event.message.generation_id

    def assigned(self, tps: Iterable) -> None:
        """What was durable on a partition lost is no longer this worker's to commit."""
        held = set(tps)
        for table in (self.durable, self.committed):
            for tp in set(table) - held:
                del table[tp]

    def _due(self, assignment: set, only: Iterable | None) -> dict:
        wanted = assignment if only is None else assignment & set(only)
        return {tp: offset for tp, offset in self.durable.items()
                if tp in wanted and offset > self.committed.get(tp, -1)}

    async def send(self, only: Iterable | None = None) -> bool:
        """Commit what is durable and not committed yet, for the partitions
        the consumer holds (of `only`, if given). Whether all of it went."""
        async with self._lock:
            offsets = self._due(set(self.app.consumer.assignment()), only)
            if not offsets:
                return True
            # Faust's Consumer._commit (pinned: pyproject.toml; tests/integration/test_commits.py fails when it moves):
            # the group member's own commit, at its generation; False once the group rebalanced. Under
            # exactly_once, _commit_offsets commits each partition's transaction with its offsets
            # (tests/integration/test_commits.py): what the worker wrote becomes visible to read_committed readers.
            consumer = self.app.consumer
            commit = consumer._commit_offsets if self.app.in_transaction else consumer._commit
            if not await commit(offsets):
                log.info("a commit of %d partition(s) was refused (the group rebalanced): they are read again "
                         "from the last commit", len(offsets))
                return False
            self.committed.update(offsets)
            return True

    async def handed_over(self, only: Iterable | None = None) -> None:
        await self.let_go()
        await self.send(only)

    def install(self, app) -> None:
        """A revocation hands over here; a stop, in streams/worker/app.py (before the view closes)."""
        @app.on_partitions_revoked.connect
        async def revoked(app, revoked, **kwargs) -> None:
            await self.handed_over(revoked)

        @app.on_partitions_assigned.connect
        async def assigned(app, assigned, **kwargs) -> None:
            self.assigned(assigned)
