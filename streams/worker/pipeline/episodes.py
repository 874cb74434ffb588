"""The episodes pipeline: one agent over `episodes`, the roles in a fixed order.

For each batch: **project** (the view), then **accumulate** (per-user
triggers, which may ask for cycles; manual requests, which the user's agent
publishes here so they are forwarded in stream order; retractions, forwarded
so that their provenance walk runs in the requests pipeline, in the user's
request order; a UserForgotten, which resets the user's accumulator and is
forwarded likewise). What the accumulator counts is already in the view when
it asks for a cycle, so the cycle reads exactly the window its request names.
A retraction or a forget is a segment of its own: the runs the gates judge
end there.

Every request forwarded from here carries the user's next sequence number
and its position: the offset of the record that asked for it. Episodes and
retractions are projected at once, however late they come, and a cycle
reads only what was logged at or before its request (processors/ports.py,
POSITION and GONE): the same log gives the same beliefs, and nothing here
waits for a cycle. The contradiction and staleness gates (off by default)
judge new episodes against the beliefs of the cycles asked before them, so
each run of a user's new episodes is forwarded to them as a GateRequested,
judged in the requests pipeline in the user's request order.

Each accumulator carries the offset of the last record it folded in, so a
redelivery at or below it changes nothing. A request (or any event this
pipeline decides) is published only once the state that decided it is
stored with it, in an outbox that a redelivery publishes again (`emit`): a
crash or a handover never replays a record against a view that the cycles
of its own requests have already moved on. The rest of a segment's state
is stored once the segment is done, and before its batch is acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from processors.accumulator import Accumulator, Trigger, admit, number
from processors.embedders import Precomputed
from processors.gate import gate_requests
from processors.invalidator import forwarded
from processors.projector import EPISODE_TYPES, EpisodeProjector, first_logged
from schemas import EpisodeRecorded, EpisodeRetracted, Event, ReflectionRequested, UserForgotten, from_dict
from streams.worker import metrics
from streams.worker.pipeline.runner import Runner
from streams.worker.replay import SideRun
from streams.worker.runtime import Runtime, write

log = logging.getLogger("reflect")


ALONE = (EpisodeRetracted, UserForgotten)  # each a segment of its own
FORWARDED = (ReflectionRequested, UserForgotten)  # not projected: forwarded by the accumulator


def segments(admitted: list[tuple[Event, Any]]) -> list[list[tuple[Event, Any]]]:
    """The batch in order, cut so that every retraction and forget is a segment of its own."""
    out: list[list[tuple[Event, Any]]] = []
    for item in admitted:
        if isinstance(item[0], ALONE) or not out or isinstance(out[-1][0][0], ALONE):
            out.append([item])
        else:
            out[-1].append(item)
    return out


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
        projector = EpisodeProjector(self.runtime.view, embedder, erase_now=False, unseen=unseen)
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

    async def accumulate(self, applied: list[tuple[Event, Any]], first: dict[str, int] | None = None) -> None:
        """Fold the segment into the accumulators in order, skipping what the
        state holds already (a redelivery) and an episode logged before
        (`first`: a retried write, however far back). Each user's new
        episodes since its last request form a run, which passes the
        contradiction gate where a request fires or the segment ends (see
        `gated`). Whatever is published is stored first (`emit`); the rest of
        the state once the segment is done."""
        table = self.runtime.tables.accumulators
        partitions = {r.user_id: m.partition for r, m in applied}
        changed = {user: await self.resent(user, partition) for user, partition in partitions.items()}
        runs: dict[str, list[tuple[EpisodeRecorded, Accumulator]]] = {}  # with the state as each was admitted
        positions = {r.episode_id: m.offset for r, m in applied if isinstance(r, EpisodeRecorded)}
        redelivered: dict[str, list[int]] = {}  # user → the offsets skipped, after the state's own
        for record, message in applied:
            user, acc = record.user_id, changed[record.user_id]
            if acc.applied_at(message.offset):
                redelivered.setdefault(user, [acc.applied]).append(message.offset)
                continue
            acc = replace(acc, applied=message.offset)
            if isinstance(record, EpisodeRecorded) and (first or {}).get(record.episode_id, message.offset) < \
                    message.offset:
                log.info("user %s: episode %s logged again at offset %d (first at %d): counted once", user,
                         record.episode_id, message.offset, first[record.episode_id])
                changed[user] = acc  # logged before: counted then
                continue
            new = isinstance(record, EpisodeRecorded) and not acc.holds(record.episode_id)
            changed[user], request = admit(acc, record, self.trigger)
            if new:
                runs.setdefault(user, []).append((record, changed[user]))
            if isinstance(record, EpisodeRetracted):  # its walk runs in the user's request order
                changed[user], request = number(changed[user], forwarded(record, message.offset))
                await self.emit(user, message.partition, changed[user], [request])
            elif request is not None:  # a cycle asked, or a forget (carried out in the user's request order)
                request = replace(request, position=message.offset)
                await self.gated(user, message.partition, runs.pop(user, []), changed, [request], positions)
        for user, (state, *offsets) in redelivered.items():  # a crash or a handover between a write and its commit
            log.info("user %s: %d record(s) at offsets %d–%d redelivered, applied already (the state is at %d): "
                     "skipped", user, len(offsets), offsets[0], offsets[-1], state)
        for user, run in runs.items():
            await self.gated(user, partitions[user], run, changed, [], positions)
        await asyncio.gather(*(write(table, partitions[user], user, acc.to_dict()) for user, acc in changed.items()))

    async def resent(self, user: str, partition: int) -> Accumulator:
        """The user's state, once what it was stored with but may not have
        reached the log (a crash or a handover after `emit` stored it) is
        published again: the same events, so a second copy changes nothing."""
        acc = Accumulator.from_dict(self.runtime.tables.accumulators.get(user))
        if acc.outbox:
            await self.publish([from_dict(e) for e in acc.outbox])
        return replace(acc, outbox=())

    async def emit(self, user: str, partition: int, state: Accumulator, events: list[Event]) -> None:
        """`events` on the log, once the state that decided them is stored
        with them (the broker has acknowledged its changelog record): the log
        never holds a request that a replay would decide again from an older
        state, against a view the request's cycle has moved on since."""
        if not events:
            return
        table = self.runtime.tables.accumulators
        await write(table, partition, user, replace(state, outbox=tuple(e.to_dict() for e in events)).to_dict())
        await self.publish(events)

    async def gated(self, user: str, partition: int, run: list[tuple[EpisodeRecorded, Accumulator]],
                    changed: dict[str, Accumulator], fired: list[Event], positions: dict[str, int]) -> None:
        """The run forwarded to the gates when one is on (GateRequested: they
        judge it in the requests pipeline, after the cycles asked before it),
        then `fired` (the request the run's last episode fired, if any),
        stored with the state before they are published. Runs are numbered
        apart from the user's requests: where a run ends depends on the
        batches, so their count does too (never what they decide: a run cut
        in two is judged as one, as nothing is asked between the parts)."""
        acc, asked = changed[user], []
        if self.gated_on:
            for request in gate_requests(user, run, positions):
                acc = replace(acc, gate_runs=acc.gate_runs + 1)
                asked.append(replace(request, sequence=acc.gate_runs))
        changed[user] = acc
        await self.emit(user, partition, acc, [*asked, *fired])
