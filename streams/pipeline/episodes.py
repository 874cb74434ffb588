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
from dataclasses import replace
from typing import Any

from processors.accumulator import Accumulator, Trigger, admit, number, unnumbered
from processors.challenge import GATE_SCORE, gather
from processors.gate import asked, bearing_of
from processors.staleness import first_stale, went_stale
from processors.embedders import Precomputed
from processors.invalidator import Invalidator, empty_state
from processors.projector import EPISODE_TYPES, REFLECTION_TYPES, EpisodeProjector, ReflectionProjector, latest
from schemas import ChallengeRequested, EpisodeRecorded, EpisodeRetracted, Event, ReflectionRequested, parse_time
from streams import metrics
from streams.pipeline.policy import FAILED
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


def at_requests(items: list[tuple[Event, Any]], current, trigger: Trigger) -> list[list[tuple[Event, Any]]]:
    """The segment cut after each record that makes its user's accumulator
    ask for a cycle (a dry run of `admit` from `current(user)`)."""
    accs: dict[str, Accumulator] = {}
    out: list[list[tuple[Event, Any]]] = [[]]
    for item in items:
        user = item[0].user_id
        accs[user], request = admit(accs[user] if user in accs else current(user), item[0], trigger)
        out[-1].append(item)
        if request is not None:
            out.append([])
    return [chunk for chunk in out if chunk]


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
        self.invalidator = Invalidator(view, settings.citation_floor, settings.max_depth)
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
        project = metrics.timed_apply(EpisodeProjector(self.runtime.view, embedder).apply, "episode")
        for whole in segments(admitted):
            if isinstance(whole[0][0], EpisodeRetracted):
                await self.cycles_settled(whole[0][0].user_id)
            table = self.runtime.tables.accumulators
            # Cut after each record that asks for a cycle: what comes after it in the log is projected only
            # after its request is asked, so a late one waits for the cycle (late_settled) in every batching.
            for segment in at_requests(whole, lambda user: Accumulator.from_dict(table.get(user)), self.trigger):
                if not isinstance(segment[0][0], EpisodeRetracted):
                    await self.late_settled(segment)
                episodes = [(r, m) for r, m in segment if isinstance(r, EPISODE_TYPES)]
                async with self.runtime.projection_lock:  # a rebuild swaps views between batches only
                    applied = {id(m) for _, m in await self.runtime.policy.apply("project", project, episodes)}
                # What was dead-lettered is not counted either; manual requests go on in their place.
                kept = [(r, m) for r, m in segment if id(m) in applied or isinstance(r, ReflectionRequested)]
                await self.accumulate(kept, embedder)
                for record, message in kept:
                    if isinstance(record, EpisodeRetracted):
                        await self.invalidate(record, message)

    async def accumulate(self, applied: list[tuple[Event, Any]], embedder=None) -> None:
        """Fold the segment into the accumulators in order. Each user's new
        episodes since its last request form a run, which passes the
        contradiction gate where a request fires or the segment ends (see
        `gated`)."""
        table = self.runtime.tables.accumulators
        partitions = {r.user_id: m.partition for r, m in applied}
        changed: dict[str, Accumulator] = {}
        runs: dict[str, list[EpisodeRecorded]] = {}
        for record, _ in applied:
            user = record.user_id
            acc = changed[user] if user in changed else Accumulator.from_dict(table.get(user))
            if isinstance(record, EpisodeRecorded) and not acc.holds(record.episode_id):
                runs.setdefault(user, []).append(record)
            changed[user], request = admit(acc, record, self.trigger)
            if request is not None:
                await self.gated(user, runs.pop(user, []), changed, [request], embedder)
        for user, run in runs.items():
            await self.gated(user, run, changed, [], embedder)
        for user, acc in changed.items():
            write(table, partitions[user], user, acc.to_dict())

    async def gated(self, user: str, run: list[EpisodeRecorded], changed: dict[str, Accumulator],
                    fired: list[Event], embedder) -> None:
        """The run through the contradiction gate, then `fired` (the request the
        run's last episode fired, if any), all in the user's sequence.

        Each episode is judged against the beliefs of every request before it
        in the log, waited for: so what the gate sees, and the challenges it
        asks (at a quorum: processors/challenge.py), are a function of the
        log, not of batch sizes or timing."""
        acc = changed[user]
        acc = unnumbered(acc, fired)  # numbered again below, after the gate's own
        settings = self.runtime.settings
        while (self.gate or self.horizon) and run:
            await self.cycles_settled(user, acc.asked)
            vectors = (embedder or self.runtime.embedder).embed([e.text for e in run]) if self.gate else None
            try:  # a view that does not answer is waited for, as by every stage
                scores, quorums, live = await self.runtime.policy.until_done(
                    "challenge-gate", lambda: asyncio.to_thread(bearing_of, self.runtime.view, user, run, vectors,
                                                                settings.challenge_quorum, self.gate, self.vectors))
            except Exception:  # a bug of the gate's: the episodes are in the view already, nothing to dead-letter
                log.exception("the contradiction gate failed for %d episode(s) of user %s: not judged", len(run), user)
                break
            # An open challenge of a belief no longer live (superseded, invalid, stale) has nothing left to ask.
            acc = replace(acc, challenging=tuple(p for p in acc.challenging if p["id"] in quorums))
            judged = [{"id": e.episode_id, "occurred_at": e.occurred_at} for e in run]
            done, asked_now = 0, []
            while done < len(run) and not asked_now:  # the same beliefs until something is asked
                upto, stale, _ = first_stale(live, judged[done:], acc.stream_at, self.horizon)
                upto = upto or len(run) - done
                used = upto
                if self.gate:
                    pending, used = gather(acc.challenging, judged[done:done + upto], scores[done:done + upto],
                                           self.gate_score, quorums)
                    acc, asked_now = asked(replace(acc, challenging=pending), user, settings.challenge_daily)
                seen = (e["occurred_at"] for e in judged[done:done + used])
                acc = replace(acc, stream_at=latest(acc.stream_at, *seen))
                done += used
                if stale and used == upto:  # the stream passed their horizon at this episode
                    went = went_stale(user, [b for b in live if b["reflection_id"] in stale], judged[done - 1],
                                      self.horizon, acc.recent)
                    await asyncio.to_thread(self.project_beliefs, [e for e in went if isinstance(e, REFLECTION_TYPES)])
                    went, acc = numbered(went, acc)
                    asked_now = [*asked_now, *went]
            await self.publish(asked_now)
            run = run[done:]
        out = []
        for request in fired:
            acc, request = number(acc, request)
            out.append(request)
        changed[user] = acc
        await self.publish(out)

    async def late_settled(self, segment: list[tuple[Event, Any]]) -> None:
        """An episode that occurred no later than a request already asked of
        its user (valid time out of stream order: a late episode, or one after
        a retraction stamped later) waits for those cycles before it is
        projected: a cycle reads evidence by valid time, and must not see an
        episode that came after its request in the log."""
        table = self.runtime.tables.accumulators
        earliest: dict[str, Any] = {}
        for record, _ in segment:
            if isinstance(record, EpisodeRecorded):
                at = parse_time(record.occurred_at)
                earliest[record.user_id] = min(at, earliest.get(record.user_id, at))
        for user, at in earliest.items():
            asked_at = Accumulator.from_dict(table.get(user)).asked_at
            if asked_at is not None and at <= parse_time(asked_at) and self.due(user):
                await self.cycles_settled(user)

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
