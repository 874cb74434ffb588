"""The episodes pipeline: one agent over `episodes`; each batch read,
decided and written, segment by segment (processors/segment.py).

For each segment: **project** it (the view: episodes and retractions at
once, however late they come, each at its log position), then **fold** it
into the users' accumulators (`fold`, pure: per-user triggers, which may ask
for cycles; manual requests, which the user's agent publishes here so they
are forwarded in stream order; retractions and forgets, forwarded so that
they are carried out in the requests pipeline, in the user's request order;
the runs of new episodes the contradiction and staleness gates judge), then
**store and publish** what the fold decided, each once.

Every request forwarded from here carries the user's next sequence number
and its position: the offset of the record that asked for it. What the
accumulator counts is already in the view when it asks for a cycle, and a
cycle reads only what was logged at or before its request (processors/ports.py,
POSITION and GONE): the same log gives the same beliefs, and nothing here
waits for a cycle.

Each accumulator carries the offset of the last record it folded in, so a
redelivery at or below it changes nothing. What a segment decides is
published only once the state that decided it is stored with it, in an
outbox that a redelivery publishes again (`resent`): a crash or a handover
never replays a record against a view that the cycles of its own requests
have already moved on. Every state is stored before its batch is
acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from processors.accumulator import Accumulator, Trigger
from processors.embedders import Precomputed
from processors.projector import EPISODE_TYPES, EpisodeProjector, first_logged
from processors.segment import FORWARDED, fold, segments
from schemas import EpisodeRecorded, Event, from_dict
from streams.worker import metrics
from streams.worker.pipeline.runner import Runner
from streams.worker.replay import SideRun
from streams.worker.runtime import Runtime, write

log = logging.getLogger("reflect")


class EpisodesPipeline(Runner):
    PROJECTS = True

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        settings = runtime.settings
        self.trigger = Trigger.from_settings(settings)
        self.gated_on = settings.challenge == "on" or bool(settings.stale_after_days)  # either gate
        self.replaying = SideRun.of(settings)  # a replay's side worker: streams/worker/replay.py

    async def admit(self, events) -> list[tuple[Event, Any]]:
        admitted = await super().admit(events)
        if self.replaying is None:
            return admitted
        return [(r, m) for r, m in admitted if self.replaying.keeps(r, m)]

    async def prepare(self, admitted: list[tuple[Event, Any]]) -> dict:
        """The batch's episode texts embedded, while the batch before it is handled."""
        texts = list(dict.fromkeys(r.text for r, _ in admitted if isinstance(r, EpisodeRecorded)))
        return dict(zip(texts, await asyncio.to_thread(self.runtime.embedder.embed, texts))) if texts else {}

    async def handle(self, admitted: list[tuple[Event, Any]], prepared: dict | None = None) -> None:
        embedder = Precomputed(self.runtime.embedder, prepared or {})
        unseen = self.replaying.spec.unseen if self.replaying else None
        projector = EpisodeProjector(self.runtime.view, embedder, forget_now=False, unseen=unseen)
        project = metrics.timed_apply(lambda at: projector.apply([r for r, _ in at], [p for _, p in at]), "episode")
        for segment in segments(admitted):
            # Projected at once, late or not: a cycle reads only what its request's position precedes.
            episodes = [((r, m.offset), m) for r, m in segment if isinstance(r, EPISODE_TYPES)]
            async with self.runtime.projection_lock:  # a rebuild swaps views between batches only
                applied = {id(m) for _, m in await self.runtime.policy.apply("project", project, episodes)}
            # What was dead-lettered is not counted either; manual requests go on in their place.
            kept = [(r, m) for r, m in segment if id(m) in applied or isinstance(r, FORWARDED)]
            recorded = [r for r, _ in kept if isinstance(r, EpisodeRecorded)]
            first = await self.runtime.policy.until_done(
                "project", lambda: asyncio.to_thread(first_logged, self.runtime.view, recorded))
            await self.accumulate(kept, first)

    async def accumulate(self, applied: list[tuple[Event, Any]], first: dict[str, int]) -> None:
        """The segment read (each user's state), decided (`fold`, pure) and
        written: each state stored with the events it decided before they
        are published (an outbox that a redelivery publishes again), then
        stored without them, before the batch is acknowledged."""
        partitions = {r.user_id: m.partition for r, m in applied}
        states = {user: await self.resent(user) for user in partitions}
        folded = fold(states, [(r, m.offset) for r, m in applied], first, self.trigger, self.gated_on)
        for user, episode, at, was in folded.again:
            log.info("user %s: episode %s logged again at offset %d (first at %d): counted once",
                     user, episode, at, was)
        # Redelivered: a crash or a handover between a write and its commit.
        for user, (state, offsets) in folded.redelivered.items():
            log.info("user %s: %d record(s) at offsets %d–%d redelivered, applied already (the state is at %d): "
                     "skipped", user, len(offsets), offsets[0], offsets[-1], state)
        table = self.runtime.tables.accumulators
        # The log never holds a request that a replay would decide again from
        # an older state, against a view the request's cycle has moved on since.
        await asyncio.gather(*(write(table, partitions[user], user, replace(
            folded.states[user], outbox=tuple(e.to_dict() for e in events)).to_dict())
            for user, events in folded.asks.items()))
        await self.publish([e for events in folded.asks.values() for e in events])
        await asyncio.gather(*(write(table, partitions[user], user, state.to_dict())
                               for user, state in folded.states.items()))

    async def resent(self, user: str) -> Accumulator:
        """The user's state, once what it was stored with but may not have
        reached the log (a crash or a handover after it was stored) is
        published again: the same events, so a second copy changes nothing."""
        acc = Accumulator.from_dict(self.runtime.tables.accumulators.get(user))
        if acc.outbox:
            await self.publish([from_dict(e) for e in acc.outbox])
        return replace(acc, outbox=())
