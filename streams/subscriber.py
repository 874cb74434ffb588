"""A downstream service's consumer of Reflect's topics, texts opened.

    async with Subscriber(settings, ["reflections"], "my-service") as events:
        async for message, event in events:
            handle(event)             # idempotent on event.event_id
            await events.commit()     # after the effect: at least once

Each event is decoded and validated as the worker decodes it (schemas/);
one that is not is skipped and counted (`skipped`): it went to a dead-letter
topic when the worker read it. With `keys=True` (the default) sealed texts
are opened with the deployment's master key ring and key topic
(streams/shredding.py): an erased episode arrives as its EpisodeRetracted,
an erased cycle audit with its counts only, and a belief an erasure took as
it is on the log, still sealed (`event.sealed` set, no text). With
`keys=False` nothing is opened: the subscriber sees ids, times, counts and
statuses, never what a record said.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Sequence

from aiokafka import AIOKafkaConsumer

from schemas import ContractError, Event, decode
from streams.security import client_options
from streams.shredding import Sealing


class Subscriber:
    def __init__(self, settings, topics: Sequence[str], group_id: str, *, keys: bool = True,
                 batch: int = 500) -> None:
        self.settings, self.topics, self.batch = settings, list(topics), batch
        self.sealing = Sealing(settings) if keys else None
        self.skipped = 0
        self._consumer = AIOKafkaConsumer(*self.topics, **client_options(settings), group_id=group_id,
                                          auto_offset_reset="earliest", enable_auto_commit=False)

    async def __aenter__(self) -> "Subscriber":
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._consumer.stop()
        if self.sealing is not None:
            await self.sealing.close()

    async def commit(self) -> None:
        """What was handed out so far is done: the group resumes after it."""
        await self._consumer.commit()

    def __aiter__(self) -> AsyncIterator[tuple[Any, Event]]:
        return self._events()

    async def _events(self) -> AsyncIterator[tuple[Any, Event]]:
        while True:
            for messages in (await self._consumer.getmany(timeout_ms=1000, max_records=self.batch)).values():
                decoded = []
                for message in messages:
                    try:
                        decoded.append((message, decode(message.value)))
                    except ContractError:
                        self.skipped += 1
                if self.sealing is None:
                    for pair in decoded:
                        yield pair
                    continue
                open_one = await self.sealing.opener([event for _, event in decoded])
                for message, event in decoded:
                    try:
                        opened = open_one(event)
                    except ContractError:  # sealed, and not under its own key: a dead letter to the worker
                        self.skipped += 1
                        continue
                    yield message, event if opened is None else opened
