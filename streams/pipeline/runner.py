"""The loop every pipeline agent runs: a batch of one topic's events, decoded
once, handled, and acknowledged only when handling is done.

Acknowledged means committable: Faust commits an offset once every event
before it is acknowledged, so a batch that waits on a transient fault holds
its partition's commit where it is, and a crash meanwhile replays it. (Faust's
`take_events` acknowledges a batch even when its handler raises or is
cancelled; `noack_take` leaves that to us.)
"""

from __future__ import annotations

from typing import Any

from processors.dlq import accept, carried
from schemas import ContractError, Event
from streams import metrics
from streams.runtime import Runtime


class Runner:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.carries = carried(runtime.settings)

    async def run(self, stream) -> None:
        settings = self.runtime.settings
        async for events in stream.noack_take(settings.projector_batch, within=settings.projector_within):
            await self.handle(await self.admit(events))
            for event in events:
                await stream.ack(event)

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

    async def handle(self, admitted: list[tuple[Event, Any]]) -> None:
        raise NotImplementedError

    async def publish(self, events: list[Event]) -> None:
        if events:
            await self.runtime.policy.until_done("publish", lambda: self.runtime.outlets.publish(events))
