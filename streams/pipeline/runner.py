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
from streams.runtime import Runtime

log = logging.getLogger("reflect")


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
        try:
            while True:
                try:
                    events, admitted, prepared = await ahead
                except StopAsyncIteration:
                    return
                ahead = asyncio.ensure_future(self.read_ahead(batches))
                await self.runtime.ownership.wait_whole(events)  # a partition just gained is caught up first
                await self.handle(admitted, await prepared)
                if self.PROJECTS:  # how far the view holds this topic: streams/ownership.py
                    self.runtime.ownership.applied(events)
                    await compaction.check(self.runtime)
                for event in events:
                    await stream.ack(event)
        finally:
            ahead.cancel()  # a batch read ahead is not acknowledged: it is read again after a restart

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
