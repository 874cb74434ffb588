"""The episodes pipeline: one agent over `episodes`, the roles in a fixed order.

For each batch: **project** (the view), then **accumulate** (per-user
triggers, which may ask for cycles, and manual requests, which the user's
agent publishes here so they are forwarded in stream order), then
**invalidate** (the provenance walk of each retraction). The order is the point: what the accumulator counts is
already in the view when it asks for a cycle, so the cycle reads exactly the
window its request names, and a retraction's invalidations are in the view
before anything after it in the log is handled.

Every request forwarded from here carries the user's next sequence number. A
retraction is handled alone, after the cycles of every request asked before
it are done (bounded by `cycle_wait`): a cycle then sees the log up to its
request and no further, whatever the timing — the same log gives the same
beliefs.

State changes (accumulators, invalidator state) are written only once the
effects they describe are in the view and the log: a crash or a transient
fault in between replays the batch from the state before it.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

from processors.accumulator import Accumulator, Trigger, admit_all, number
from processors.embedders import Precomputed
from processors.invalidator import Invalidator, empty_state
from processors.projector import EPISODE_TYPES, REFLECTION_TYPES, EpisodeProjector, ReflectionProjector
from schemas import EpisodeRecorded, EpisodeRetracted, Event, ReflectionRequested
from streams import metrics
from streams.pipeline.policy import FAILED
from streams.pipeline.runner import Runner
from streams.runtime import Runtime, write

log = logging.getLogger("reflect")


def segments(admitted: list[tuple[Event, Any]]) -> list[list[tuple[Event, Any]]]:
    """The batch in order, cut so that every retraction is a segment of its own."""
    out: list[list[tuple[Event, Any]]] = []
    for item in admitted:
        if isinstance(item[0], EpisodeRetracted) or not out or isinstance(out[-1][0][0], EpisodeRetracted):
            out.append([item])
        else:
            out[-1].append(item)
    return out


def numbered(events: list[Event], acc: Accumulator) -> tuple[list[Event], Accumulator]:
    """The requests among `events` with the user's next sequence numbers."""
    out = []
    for event in events:
        if isinstance(event, ReflectionRequested):
            acc, event = number(acc, event)
        out.append(event)
    return out, acc


class EpisodesPipeline(Runner):
    PROJECTS = True

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        view, embedder, settings = runtime.view, runtime.embedder, runtime.settings
        self.project_beliefs = ReflectionProjector(view, embedder).apply
        self.trigger = Trigger.from_settings(settings)
        self.invalidator = Invalidator(view, settings.citation_floor, settings.max_depth)

    async def prepare(self, admitted: list[tuple[Event, Any]]) -> dict:
        """The batch's episode texts embedded, while the batch before it is handled."""
        texts = list(dict.fromkeys(r.text for r, _ in admitted if isinstance(r, EpisodeRecorded)))
        return dict(zip(texts, await asyncio.to_thread(self.runtime.embedder.embed, texts))) if texts else {}

    async def handle(self, admitted: list[tuple[Event, Any]], prepared: dict | None = None) -> None:
        embedder = Precomputed(self.runtime.embedder, prepared or {})
        project = metrics.timed_apply(EpisodeProjector(self.runtime.view, embedder).apply, "episode")
        for segment in segments(admitted):
            if isinstance(segment[0][0], EpisodeRetracted):
                await self.cycles_settled(segment[0][0].user_id)
            episodes = [(r, m) for r, m in segment if isinstance(r, EPISODE_TYPES)]
            async with self.runtime.projection_lock:  # a rebuild swaps views between batches only
                applied = {id(m) for _, m in await self.runtime.policy.apply("project", project, episodes)}
            # What was dead-lettered is not counted either; manual requests go on in their place.
            kept = [(r, m) for r, m in segment if id(m) in applied or isinstance(r, ReflectionRequested)]
            await self.accumulate(kept)
            for record, message in kept:
                if isinstance(record, EpisodeRetracted):
                    await self.invalidate(record, message)

    async def accumulate(self, applied: list[tuple[Event, Any]]) -> None:
        table = self.runtime.tables.accumulators
        partitions = {r.user_id: m.partition for r, m in applied}
        changed, requests = admit_all(lambda user: Accumulator.from_dict(table.get(user)),
                                      [r for r, _ in applied], self.trigger)
        await self.publish(requests)
        for user, acc in changed.items():
            write(table, partitions[user], user, acc.to_dict())

    def due(self, user: str) -> bool:
        tables = self.runtime.tables
        return Accumulator.from_dict(tables.accumulators.get(user)).asked > (tables.requests_done.get(user) or 0)

    async def cycles_settled(self, user: str) -> None:
        """Wait (bounded) until the cycles of every request asked for this user are done."""
        done = self.runtime.cycle_done
        try:
            async with done:
                await asyncio.wait_for(done.wait_for(lambda: not self.due(user)), self.runtime.settings.cycle_wait)
        except asyncio.TimeoutError:
            log.warning("a retraction of user %s waited %.0f s for the user's cycles and goes on: beliefs of "
                        "the cycle still running may depend on timing (REFLECT_CYCLE_WAIT)",
                        user, self.runtime.settings.cycle_wait)

    async def invalidate(self, retraction: EpisodeRetracted, message) -> None:
        """The provenance walk of one retraction: its events into the view, then
        the log (revalidation requests numbered in the user's sequence), then
        the state (so a walk cut short is redone)."""
        user, tables = retraction.user_id, self.runtime.tables
        table = tables.provenance
        async with self.runtime.user_lock(user):
            def walk():
                state = copy.deepcopy(table.get(user) or empty_state())
                made, known = self.invalidator.on_retracted(retraction, state)
                self.project_beliefs([e for e in made if isinstance(e, REFLECTION_TYPES)])
                return state, made, known

            done = await self.runtime.policy.alone("invalidate", lambda: asyncio.to_thread(walk), message)
            if done is FAILED:
                return
            state, made, known = done
            if not known:
                log.info("retraction of episode %s of user %s, which the view never held: a tombstone, "
                         "nothing to invalidate", retraction.episode_id, user)
            acc = Accumulator.from_dict(tables.accumulators.get(user))
            made, acc = numbered(made, acc)
            await self.publish(made)
            metrics.invalidations(made)
            write(table, message.partition, user, state)
            write(tables.accumulators, message.partition, user, acc.to_dict())
