"""The episodes pipeline: one agent over `episodes`, the roles in a fixed order.

For each batch: **project** (the view), then **accumulate** (per-user
triggers, which may ask for cycles; manual requests, which the user's agent
publishes here so they are forwarded in stream order; retractions, forwarded
so that their provenance walk runs in the requests pipeline, in the user's
request order). What the accumulator counts is already in the view when it
asks for a cycle, so the cycle reads exactly the window its request names.
A retraction is a segment of its own: the runs the gates judge end there.

Every request forwarded from here carries the user's next sequence number
and its position: the offset of the record that asked for it. Episodes and
retractions are projected at once, however late they come, and a cycle
reads only what was logged at or before its request (processors/view.py,
POSITION and GONE): the same log gives the same beliefs, and nothing here
waits for a cycle — but the contradiction and staleness gates, off by
default, which judge new episodes against the beliefs of the cycles asked
before them (`cycles_settled`, bounded by `cycle_wait`).

Each accumulator carries the offset of the last record it folded in, so a
redelivery at or below it changes nothing. A request (or any event this
pipeline decides) is published only once the state that decided it is
stored with it, in an outbox that a redelivery publishes again (`emit`): a
crash or a handover never replays a record against a view that the cycles
of its own requests have already moved on (the gates read the view as it
is). The rest of a segment's state is stored once the segment is done, and
before its batch is acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from processors.accumulator import Accumulator, Trigger, admit, judged, number, unnumbered
from processors.challenge import GATE_SCORE, gather
from processors.gate import asked, bearing_of
from processors.staleness import first_stale, went_stale
from processors.embedders import Precomputed
from processors.invalidator import forwarded, placed
from processors.projector import (EPISODE_TYPES, REFLECTION_TYPES, EpisodeProjector, ReflectionProjector,
                                  first_logged, latest)
from schemas import ChallengeRequested, EpisodeRecorded, EpisodeRetracted, Event, ReflectionRequested, from_dict
from streams import metrics
from streams.pipeline.runner import HandedOver, Runner
from streams.runtime import Runtime, write

log = logging.getLogger("reflect")
HANDOVER_CHECK = 0.5  # seconds between looks for a handover while a batch waits for cycles


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
        if isinstance(event, (ReflectionRequested, ChallengeRequested)):
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
        self.gate = settings.challenge == "on"
        self.horizon = settings.stale_after_days
        self.vectors: dict = {}  # the gate's cache of belief and evidence vectors (processors/gate.py)
        self.gate_score = GATE_SCORE.get(settings.embedder, 0.5) if settings.challenge_min_score is None \
            else settings.challenge_min_score

    async def prepare(self, admitted: list[tuple[Event, Any]]) -> dict:
        """The batch's episode texts embedded, while the batch before it is handled."""
        texts = list(dict.fromkeys(r.text for r, _ in admitted if isinstance(r, EpisodeRecorded)))
        return dict(zip(texts, await asyncio.to_thread(self.runtime.embedder.embed, texts))) if texts else {}

    async def handle(self, admitted: list[tuple[Event, Any]], prepared: dict | None = None) -> None:
        embedder = Precomputed(self.runtime.embedder, prepared or {})
        projector = EpisodeProjector(self.runtime.view, embedder, erase_now=False)
        project = metrics.timed_apply(lambda at: projector.apply([r for r, _ in at], [p for _, p in at]), "episode")
        for segment in segments(admitted):
            # Projected at once, late or not: a cycle reads only what its request's position precedes.
            episodes = [((r, m.offset), m) for r, m in segment if isinstance(r, EPISODE_TYPES)]
            async with self.runtime.projection_lock:  # a rebuild swaps views between batches only
                applied = {id(m) for _, m in await self.runtime.policy.apply("project", project, episodes)}
            # What was dead-lettered is not counted either; manual requests go on in their place.
            kept = [(r, m) for r, m in segment if id(m) in applied or isinstance(r, ReflectionRequested)]
            recorded = [r for r, _ in kept if isinstance(r, EpisodeRecorded)]
            first = await self.runtime.policy.until_done(
                "project", lambda: asyncio.to_thread(first_logged, self.runtime.view, recorded))
            await self.accumulate(kept, embedder, first)

    async def accumulate(self, applied: list[tuple[Event, Any]], embedder=None,
                         first: dict[str, int] | None = None) -> None:
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
        for record, message in applied:
            user, acc = record.user_id, changed[record.user_id]
            if acc.applied_at(message.offset):
                continue
            acc = replace(acc, applied=message.offset)
            if isinstance(record, EpisodeRecorded) and (first or {}).get(record.episode_id, message.offset) < \
                    message.offset:
                changed[user] = acc  # logged before: counted then
                continue
            new = isinstance(record, EpisodeRecorded) and not acc.holds(record.episode_id)
            changed[user], request = admit(acc, record, self.trigger)
            if new:
                runs.setdefault(user, []).append((record, changed[user]))
            if isinstance(record, EpisodeRetracted):  # its walk runs in the user's request order
                changed[user], request = number(changed[user], forwarded(record, message.offset))
                await self.emit(user, message.partition, changed[user], [request])
            elif request is not None:
                request = replace(request, position=message.offset)
                await self.gated(user, message.partition, runs.pop(user, []), changed, [request], embedder, positions)
        for user, run in runs.items():
            await self.gated(user, partitions[user], run, changed, [], embedder, positions)
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
                    changed: dict[str, Accumulator], fired: list[Event], embedder,
                    positions: dict[str, int]) -> None:
        """The run through the contradiction gate, then `fired` (the request the
        run's last episode fired, if any), all in the user's sequence.

        Each episode is judged against the beliefs of every request before it
        in the log, waited for: so what the gate sees, and the challenges it
        asks (at a quorum: processors/challenge.py), are a function of the
        log, not of batch sizes or timing. What it asks before the run's end
        is stored with the state as of the episode that asked it
        (`judged`), so a replay goes on from there."""
        acc = changed[user]
        acc = unnumbered(acc, fired)  # numbered again below, after the gate's own
        settings = self.runtime.settings
        episodes, start, last = [e for e, _ in run], 0, []
        while (self.gate or self.horizon) and start < len(episodes):
            await self.cycles_settled(user, acc.asked)
            todo = episodes[start:]
            vectors = (embedder or self.runtime.embedder).embed([e.text for e in todo]) if self.gate else None
            try:  # a view that does not answer is waited for, as by every stage
                scores, quorums, live = await self.runtime.policy.until_done(
                    "challenge-gate", lambda: asyncio.to_thread(bearing_of, self.runtime.view, user, todo, vectors,
                                                                settings.challenge_quorum, self.gate, self.vectors))
            except Exception:  # a bug of the gate's: the episodes are in the view already, nothing to dead-letter
                log.exception("the contradiction gate failed for %d episode(s) of user %s: not judged", len(todo), user)
                break
            # An open challenge of a belief no longer live (superseded, invalid, stale) has nothing left to ask.
            acc = replace(acc, challenging=tuple(p for p in acc.challenging if p["id"] in quorums))
            stamps = [{"id": e.episode_id, "occurred_at": e.occurred_at} for e in todo]
            done, asked_now = 0, []
            while done < len(todo) and not asked_now:  # the same beliefs until something is asked
                upto, stale, _ = first_stale(live, stamps[done:], acc.stream_at, self.horizon)
                upto = upto or len(todo) - done
                used = upto
                if self.gate:
                    pending, used = gather(acc.challenging, stamps[done:done + upto], scores[done:done + upto],
                                           self.gate_score, quorums)
                    acc, asked_now = asked(replace(acc, challenging=pending), user, settings.challenge_daily)
                seen = (e["occurred_at"] for e in stamps[done:done + used])
                acc = replace(acc, stream_at=latest(acc.stream_at, *seen))
                done += used
                if stale and used == upto:  # the stream passed their horizon at this episode
                    went = went_stale(user, [b for b in live if b["reflection_id"] in stale], stamps[done - 1],
                                      self.horizon, acc.recent)
                    await asyncio.to_thread(self.project_beliefs, [e for e in went if isinstance(e, REFLECTION_TYPES)])
                    went, acc = numbered(went, acc)
                    asked_now = [*asked_now, *went]
            start += done
            asked_now = placed(asked_now, positions.get(stamps[done - 1]["id"]))
            if start < len(episodes) or not fired:
                await self.emit(user, partition, judged(run[start - 1][1], acc), asked_now)
            else:  # asked by the episode that fired: stored with what it fired
                last = asked_now
        for request in fired:
            acc, request = number(acc, request)
            last.append(request)
        changed[user] = acc
        await self.emit(user, partition, acc, last)

    def due(self, user: str) -> bool:
        tables = self.runtime.tables
        return Accumulator.from_dict(tables.accumulators.get(user)).asked > (tables.requests_done.get(user) or 0)

    async def cycles_settled(self, user: str, asked: int | None = None) -> None:
        """Wait (bounded) until the cycles of every request asked for this user
        (or of the first `asked` of them) are done. Given up (HandedOver) when
        the worker hands its partitions over: the requests agent then reads no
        more requests, so the cycle may never come."""
        done, tables, runtime = self.runtime.cycle_done, self.runtime.tables, self.runtime
        settled = (lambda: not self.due(user)) if asked is None else \
            (lambda: (tables.requests_done.get(user) or 0) >= asked)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + runtime.settings.cycle_wait
        async with done:
            while not settled():
                if runtime.handing_over():
                    raise HandedOver(f"user {user} waited for the user's cycles")
                if loop.time() >= deadline:
                    log.warning("user %s waited %.0f s for the user's cycles and goes on (a retraction, or the "
                                "contradiction gate): beliefs of the cycle still running may depend on timing "
                                "(REFLECT_CYCLE_WAIT)", user, runtime.settings.cycle_wait)
                    return
                try:  # woken by each cycle done; a handover notifies nothing, so it is looked for every HANDOVER_CHECK
                    await asyncio.wait_for(done.wait(), min(HANDOVER_CHECK, deadline - loop.time()))
                except asyncio.TimeoutError:
                    pass
