"""The loop every pipeline agent runs: a batch of one topic's events, decoded
once, handled, and acknowledged only when handling is done.

Acknowledged means committable: Faust commits an offset once every event
before it is acknowledged, so a batch that waits on a transient fault holds
its partition's commit where it is, and a crash meanwhile replays it. (Faust's
`take_events` acknowledges a batch even when its handler raises or is
cancelled; `noack_take` leaves that to us.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from processors.dlq import accept, carried
from schemas import ContractError, Event
from streams import compaction, metrics
from streams.patches import release
from streams.runtime import Runtime

log = logging.getLogger("reflect")


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
        idle while a batch waits on the broker's acknowledgements."""
        settings = self.runtime.settings
        batches = stream.noack_take(settings.projector_batch, within=settings.projector_within)
        ahead = asyncio.ensure_future(self.read_ahead(batches))
        abandoned = False
        try:
            while True:
                try:
                    batch = await ahead
                except StopAsyncIteration:
                    return
                ahead = asyncio.ensure_future(self.read_ahead(batches))
                abandoned = await self.step(stream, *batch, abandoned=abandoned)
        finally:
            ahead.cancel()  # a batch read ahead is not acknowledged: it is read again after a restart

    async def step(self, stream, events, admitted, prepared, abandoned: bool) -> bool:
        """One batch handled and acknowledged; whether it was given up instead.
        After a batch is given up, those read before the handover are dropped
        too: handled now, they would go before it. Faust ends the handover
        only once every message it delivered is acknowledged or given up, so
        what comes after is read afresh from the last commit."""
        if abandoned and self.runtime.handing_over():
            prepared.cancel()
            self.give_up(events)
            return True
        await self.runtime.ownership.wait_whole(events)  # a partition just gained is caught up first
        try:
            await self.handle(admitted, await prepared)
        except HandedOver as why:
            log.warning("a batch of %d event(s) left unacknowledged while the worker hands its partitions over "
                        "(%s): it is read again from the last commit", len(events), why)
            self.give_up(events)
            return True
        if self.PROJECTS:  # how far the view holds this topic: streams/ownership.py
            await self.runtime.ownership.applied(events)
            await compaction.check(self.runtime)
        for event in events:
            await stream.ack(event)
        return False

    def give_up(self, events) -> None:
        """Not acknowledged, so not committed, and not waited for either."""
        for event in events:
            release(self.runtime.app, event.message)

    async def read_ahead(self, batches):
        events = await batches.__anext__()
        admitted = await self.admit(events)
        return events, admitted, asyncio.ensure_future(self.prepared(admitted))

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
        """(record, message) of every event that honours its topic's contract;
        the rest dead-lettered with the reason (stage "decode")."""
        out = []
        for event in events:
            try:
                record = accept(event.message, self.carries)
            except ContractError as error:
                metrics.event(event.message, "dead_lettered")
                await self.runtime.policy.reject(event.message, error, "decode")
                continue
            metrics.event(event.message, "ok", record.TYPE)
            out.append((record, event.message))
        return out

    async def handle(self, admitted: list[tuple[Event, Any]], prepared: Any = None) -> None:
        raise NotImplementedError

    async def publish(self, events: list[Event]) -> None:
        if events:
            await self.runtime.policy.until_done("publish", lambda: self.runtime.outlets.publish(events))
