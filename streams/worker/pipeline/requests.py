"""The requests pipeline: one agent over `reflection-requests`, one request at a time.

A user's requests are on one partition, so the user's cycles, and the
provenance walks of its retractions (`InvalidationRequested`, see
`invalidate`), run in log order. For each cycle: refuse it (budget spent,
breaker open) or run the five steps off the event loop (a reasoner call
takes seconds; heartbeats, the other pipelines and the API go on); store
the outcome (table `cycle-outcomes`: a rerun after a crash or a stop reuses
it, with no second model call, and publishes only the events the log lacks:
streams/worker/on_log.py); then publish the cycle's events and, once the broker
has them, write them into the view — the log before the view, and the view
before the user's next request, whose cycle sees them whatever the
reflections pipeline has read — and mark the cycle done. A request whose
sequence is already marked done (a redelivery after a crash) is skipped,
and one whose cycle the log completed when this worker gained the partition
is adopted (streams/worker/ownership.py, `on_log`): its events are in the view
already, and the model is not asked twice.
A worker handing the partition over publishes nothing: the next owner does.

A transient fault (the view, the broker) retries the cycle, with the
reasoner's answers kept (processors/reasoners.Remembered); a deterministic
one is dead-lettered with the request (stage "reflect"). Either way the
accumulator has reset: a failing cycle is never asked again by itself.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from processors.accumulator import Accumulator
from processors.challenger import refused_challenge, run_challenge
from processors.gate import Gates, Rules, bearing_of, weigh
from processors.guard import Spend, day_of, tokens_of
from processors.invalidator import Invalidator, empty_state, placed
from processors.projector import REFLECTION_TYPES, ReflectionProjector, forgotten_payload, forgotten_point
from processors.ports import Reasoner, ViewPoint
from processors.reasoners import Remembered
from processors.reflector import CycleConfig, cycle_window, refused, run_cycle
from processors.tenants import tenant_of
from schemas import (ChallengeRequested, ErasureCompleted, Event, GateRequested, InvalidationRequested,
                     ReflectionCycleCompleted, ReflectionRequested, UserForgotten, from_dict)
from streams.shredding import opener
from streams.worker import metrics
from streams.worker.cycle_notes import summary
from streams.worker.ownership import partition_of
from streams.worker.pipeline.policy import FAILED
from streams.worker.pipeline.runner import HandedOver, Runner
from streams.worker.runtime import Runtime, write

log = logging.getLogger("reflect")


def shredded(proof: ErasureCompleted) -> tuple[str, ...]:
    """The key scopes an erasure destroys: its episode's, those of the
    beliefs it took and of the cycles that read either. Named by scope, so
    that a walk run again after a crash names the same ones, whether or not
    the first run destroyed them."""
    return (f"episode:{proof.episode_id}", *(f"belief:{b}" for b in proof.beliefs),
            *(f"cycle:{c}" for c in proof.cycles))


def today() -> str:
    return day_of(datetime.now(timezone.utc))


def spend_keys(request: ReflectionRequested, partition: int, delimiter: str) -> tuple[str, str, str]:
    """The user's, the partition's and the user's tenant's keys in `reasoner-spend`,
    in the order Budget.refusal takes their spend. A key's changelog partition
    is the one it is written from, so a key written from many partitions (a
    tenant's) names the partition: one writer each, nothing overwritten on recovery."""
    return (f"user:{request.user_id}", f"partition:{partition}",
            f"tenant:{partition}:{tenant_of(request.user_id, delimiter)}")


class RequestsPipeline(Runner):
    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        settings = runtime.settings
        self.config = CycleConfig.from_settings(settings)
        self.project = ReflectionProjector(runtime.view, runtime.embedder, erase_now=False).apply
        self.invalidator = Invalidator(runtime.view, settings.citation_floor, settings.max_depth)
        self.rules = Rules.from_settings(settings)
        self.vectors: dict = {}  # the gate's cache of belief and evidence vectors (processors/gate.py)

    async def handle(self, admitted: list[tuple[Event, Any]], prepared: Any = None) -> None:
        for request, message in admitted:
            if isinstance(request, InvalidationRequested):
                await self.invalidate(request, message)
            elif isinstance(request, UserForgotten):
                await self.forget(request, message)
            elif isinstance(request, GateRequested):
                await self.judge(request, message)
            else:
                await self.reflect(request, message)

    def done_already(self, request: ReflectionRequested) -> bool:
        done = self.runtime.tables.requests_done.get(request.user_id) or 0
        return request.sequence is not None and request.sequence <= done

    def adopted(self, request: ReflectionRequested) -> bool:
        """The log completed the cycle and this worker's state knows nothing of it."""
        stored = self.runtime.tables.outcomes.get(request.user_id) or {}
        return stored.get("cycle_id") != request.cycle_id and \
            self.runtime.ownership.on_log(request.user_id, request.cycle_id)

    async def reflect(self, request: ReflectionRequested, message) -> None:
        if self.done_already(request):
            return
        runtime, user, partition = self.runtime, request.user_id, message.partition
        if self.adopted(request):
            log.info("cycle %s was completed on the log before this worker gained its partition: adopted, "
                     "not run again", request.cycle_id)
            return await self.mark_done(request, partition)
        runtime.running[user] = request.cycle_id
        try:
            made, unpublished = await self.decided(request)
            if made is None:
                reasoner = Remembered(runtime.reasoner)  # a retry after a transient fault asks nothing twice
                made = await runtime.policy.alone("reflect", lambda: self.cycle(request, partition, reasoner),
                                                  message)
                unpublished = made
                if made is not FAILED:  # stored before it is published: a rerun reuses it, no second model call
                    # Sealed as they go on the log, stored as they will go there: the changelog holds no text.
                    unpublished = await runtime.policy.until_done("seal", lambda: runtime.outlets.sealed(made))
                    await write(runtime.tables.outcomes, partition, user,
                                {"cycle_id": request.cycle_id, "events": [e.to_dict() for e in unpublished],
                                 "since": await self.log_ends(made, user)})
            if made is not FAILED:
                if not runtime.still_owns(message):  # the next owner publishes the stored outcome
                    raise HandedOver(f"cycle {request.cycle_id} decided as its partition is handed over")
                # The log first, then the view: the view never holds a belief the log lacks. The user's
                # next request waits for both, so its cycle reads this one's beliefs.
                await self.publish(unpublished)
                self.account(request, made[-1], partition)
                await runtime.policy.until_done("project-reflections",
                                                lambda: asyncio.to_thread(self.project, made))
        finally:
            runtime.running.pop(user, None)
        await self.mark_done(request, partition)

    async def decided(self, request: ReflectionRequested) -> tuple[list[Event] | None, list[Event]]:
        """The cycle's events, if it was decided before (a crash or a stop
        came before it was marked done), and those of them the log lacks:
        the log, read from where it ended when they were stored
        (streams/worker/on_log.py), says which are there already."""
        stored = self.runtime.tables.outcomes.get(request.user_id) or {}
        if stored.get("cycle_id") != request.cycle_id:
            return None, []
        stored_events = [from_dict(e) for e in stored["events"]]  # sealed as they go on the log
        runtime, held = self.runtime, set()
        open_one = await runtime.policy.until_done("open", lambda: opener(runtime.sealing, stored_events))
        made = [opened for opened in map(open_one, stored_events) if opened is not None]
        partition, ids = partition_of(request.user_id, runtime.settings.partitions), [e.event_id for e in made]
        for topic, since in (stored.get("since") or {}).items():
            held |= await runtime.policy.until_done(
                "read-log", lambda topic=topic, since=since: runtime.log.holds(topic, partition, since, ids))
        log.info("cycle %s was decided before a stop or a crash: %d of its %d events are on the log already, "
                 "the rest is published now", request.cycle_id, len(held), len(made))
        return made, [e for e in stored_events if e.event_id not in held]

    async def log_ends(self, events: list[Event], user: str) -> dict[str, int]:
        """Where each topic the events go to ends now, on the user's partition."""
        runtime, partition = self.runtime, partition_of(user, self.runtime.settings.partitions)
        topics = {runtime.outlets.topic_of(e).get_topic_name() for e in events}
        return {t: await runtime.policy.until_done("read-log", lambda t=t: runtime.log.end(t, partition))
                for t in sorted(topics)}

    async def cycle(self, request: ReflectionRequested, partition: int, reasoner: Reasoner) -> list[Event]:
        """One cycle's events; refused when a budget is spent or the breaker is open."""
        runtime = self.runtime
        spent = [s.today(today()) for s in self.spent(request, partition)]
        if isinstance(request, ChallengeRequested):  # challenges get half of each budget: they never starve cycles
            spent = [2 * tokens for tokens in spent]
        reason = runtime.budget.refusal(*spent) or runtime.breaker.refusal(asyncio.get_running_loop().time())
        if reason:
            refusal = refused_challenge if isinstance(request, ChallengeRequested) else refused
            return [refusal(request, runtime.reasoner, reason)]
        if isinstance(request, ChallengeRequested):  # a challenge cycle counts against the same budgets
            return await asyncio.to_thread(self.challenge, request, reasoner)
        recent = Accumulator.from_dict(runtime.tables.accumulators.get(request.user_id)).recent
        return await asyncio.to_thread(self.steps, request, recent, reasoner)

    def spent(self, request: ReflectionRequested, partition: int) -> list[Spend]:
        """What the user, this partition and the user's tenant in it spent
        (keys of the requests topic's partitions: each has one writer)."""
        spend = self.runtime.tables.spend
        return [Spend.from_dict(spend.get(key)) for key in self.spend_keys(request, partition)]

    def spend_keys(self, request: ReflectionRequested, partition: int) -> tuple[str, str, str]:
        return spend_keys(request, partition, self.runtime.settings.tenant_delimiter)

    def account(self, request: ReflectionRequested, completed, partition: int) -> None:
        """Once its events are in the log (a rerun charges nothing twice: Spend.charged):
        the breaker, the spend, the tally."""
        runtime = self.runtime
        if completed.outcome != "refused":  # a refusal says nothing of the API
            runtime.breaker.record(completed.outcome == "unavailable", asyncio.get_running_loop().time())
        for key, s in zip(self.spend_keys(request, partition), self.spent(request, partition)):
            charged = s.charged(today(), tokens_of(completed.usage), request.cycle_id)
            write(runtime.tables.spend, partition, key, charged.to_dict())
        runtime.tally.add(completed)
        if isinstance(completed, ReflectionCycleCompleted):  # a challenge is told by its own event
            write(runtime.tables.last_cycle, partition, request.user_id, summary(completed))
        metrics.cycle(completed)
        if completed.outcome in ("failed", "unavailable", "refused"):
            log.warning("cycle %s %s: %s", request.cycle_id, completed.outcome, completed.error,
                        extra={"cycle_id": request.cycle_id, "event_id": request.event_id,
                               "outcome": completed.outcome})

    def steps(self, request: ReflectionRequested, recent, reasoner: Reasoner) -> list[Event]:
        """Steps 2–5 (blocking: off the loop)."""
        runtime = self.runtime
        window = cycle_window(runtime.view, request, recent)
        return metrics.traced_cycle(run_cycle)(request, window, runtime.view, runtime.embedder, reasoner,
                                               self.config)

    def challenge(self, request: ChallengeRequested, reasoner: Reasoner) -> list[Event]:
        """A challenge cycle (blocking: off the loop)."""
        runtime = self.runtime
        return run_challenge(request, runtime.view, runtime.embedder, reasoner, self.config)

    async def mark_done(self, request: ReflectionRequested, partition: int) -> None:
        user, done = request.user_id, self.runtime.tables.requests_done
        if request.sequence is not None and request.sequence > (done.get(user) or 0):
            write(done, partition, user, request.sequence)
        async with self.runtime.cycle_done:
            self.runtime.cycle_done.notify_all()

    async def invalidate(self, request: InvalidationRequested, message) -> None:
        """The provenance walk of a retraction, in the user's request order:
        after the cycles asked before it, which read the episode as of their
        own positions. Its events go into the view, then the log; the
        revalidation cycles it asks run here and now, at the retraction's
        position, so no request asked later can come between; then the state
        (a walk cut short is redone from the state before it). The user's
        lock keeps the reflections pipeline's check of a late belief out
        meanwhile; the projection lock, a swap of the view (a scrub's)
        between the walk's writes to the view and its events on the log."""
        if self.done_already(request):
            return
        retraction, user, table = request.retraction(), request.user_id, self.runtime.tables.provenance
        async with self.runtime.user_lock(user):
            def walk():
                state = copy.deepcopy(table.get(user) or empty_state())
                made, known = self.invalidator.on_retracted(retraction, state)
                if self.runtime.sealing is not None:
                    made = [replace(e, keys=shredded(e)) if isinstance(e, ErasureCompleted) else e for e in made]
                # An erasure's proof goes into the view once its keys are destroyed (`shred`), below.
                self.project([e for e in made if isinstance(e, REFLECTION_TYPES)
                              and not isinstance(e, ErasureCompleted)])
                return state, made, known

            # The walk's writes to the view and its events on the log, with no swap of the view between (a
            # scrub's, a compaction's): its strip of the episode is not on the log, its proof is, after it.
            async with self.runtime.projection_lock:
                done = await self.runtime.policy.alone("invalidate", lambda: asyncio.to_thread(walk), message)
                if done is not FAILED:
                    state, made, known = done
                    proofs = [e for e in made if isinstance(e, ErasureCompleted)]
                    await self.shred(proofs)  # then its proof, in the view and on the log
                    await self.runtime.policy.until_done("project", lambda: asyncio.to_thread(self.project, proofs))
                    await self.publish([e for e in made if isinstance(e, REFLECTION_TYPES)])
            if done is not FAILED:
                if not known:
                    log.info("retraction of episode %s of user %s, which the view never held: a tombstone, "
                             "nothing to invalidate", retraction.episode_id, user)
                self.runtime.scrub_asked |= bool(proofs)  # the erased text out of the view's files too
                metrics.invalidations(made)
                revalidations = placed([e for e in made if isinstance(e, ReflectionRequested)], request.position)
                for revalidation in revalidations:
                    await self.reflect(revalidation, message)
                state["revalidations"] = state.get("revalidations", 0) + len(revalidations)  # for stats
                write(table, message.partition, user, state)
        await self.mark_done(request, message.partition)

    async def shred(self, proofs: list[ErasureCompleted]) -> None:
        """An erasure's keys destroyed before its proof is published
        (`shredded`; streams/shredding.py), so that the texts they sealed,
        in any copy of the log, no longer open."""
        for proof in proofs:
            for scope in proof.keys:
                kind, _, record = scope.partition(":")
                await self.runtime.policy.until_done(
                    "shred", lambda: self.runtime.sealing.destroy(kind, proof.user_id, record))

    async def forget(self, request: UserForgotten, message) -> None:
        """A user forgotten, in the user's request order: after the cycles
        asked before it. Every key of the user destroyed, so that all they
        said or were believed to be, on every topic and in any copy, reads as
        erased; then every point the view holds of them (all of them were
        projected before the keys went: the live projectors wait meanwhile),
        with a marker, so that a batch opened before and projected after is
        not kept either (processors/projector.py, `forgotten_point`); the
        user's tables, but for the numbers a redelivery is told by; then the
        proof, in the view and on the log. What is logged after is the
        user's anew, under new keys."""
        if self.done_already(request):
            return
        runtime, user, partition = self.runtime, request.user_id, message.partition
        async with runtime.user_lock(user), runtime.projection_lock:
            pid = forgotten_point(user)
            held = (await runtime.policy.until_done("project", lambda: asyncio.to_thread(
                runtime.view.get, [pid]))).get(pid, {})
            # Dropped before a crash (a replay's marker has no count): keys the user has made since are
            # their new life's, not to destroy again.
            done = held.get("forget_id") == request.event_id and "points" in held
            points = held["points"] if done else await self.drop(request, partition)
            tables = runtime.tables
            gates = Gates.from_dict(tables.gates.get(user))
            await asyncio.gather(*(write(table, partition, user, {}) for table in
                                   (tables.provenance, tables.outcomes, tables.last_cycle)),
                                 write(tables.gates, partition, user, Gates(done=gates.done).to_dict()))
            proof = ErasureCompleted(
                event_id=f"erasure:{request.event_id}", user_id=user, erasure_id=request.event_id, scope="user",
                episodes=(), beliefs=(), keys=(f"user:{user}",) if runtime.sealing else (), points=points,
                occurred_at=request.occurred_at)
            await runtime.policy.until_done("project", lambda: asyncio.to_thread(self.project, [proof]))
            await self.publish([proof])  # lock held: a swap of the view sees the drop and its proof, or neither
        runtime.scrub_asked = True
        log.info("user %s forgotten (%s): their keys destroyed, %d point(s) dropped from the view", user,
                 request.event_id, points)
        await self.mark_done(request, partition)

    async def drop(self, request: UserForgotten, partition: int) -> int:
        """The user's keys destroyed, then their points and the marker
        (`forget`); how many points left the view. Episodes logged after the
        keys went are kept: they are the user's anew (sealed under new keys;
        in clear, those logged after the forget are, as a replay keeps them)."""
        runtime, user, kinds = self.runtime, request.user_id, ["episode", "reflection", "cycle"]  # not proofs
        if runtime.sealing is not None:
            await runtime.policy.until_done("shred", lambda: runtime.sealing.destroy("user", user))
        settings = runtime.settings
        ends = [await runtime.policy.until_done("read-log", lambda t=topic: runtime.log.past_end(t, partition))
                for topic in (settings.topic_episodes, settings.topic_reflections)]
        before = ends[0] if runtime.sealing is not None and runtime.sealing.writes else request.position

        def drop() -> int:
            def held() -> int:
                return sum(runtime.view.count(user, kind=kind) for kind in kinds)
            points = held()
            runtime.view.forget([user], kinds=kinds, before=before)
            points -= held()
            marker = forgotten_payload(request, before, ends[1]) | {"points": points}
            runtime.view.upsert([ViewPoint(forgotten_point(user), None, marker)])
            return points
        return await runtime.policy.until_done("project", lambda: asyncio.to_thread(drop))

    async def judge(self, request: GateRequested, message) -> None:
        """A run of the user's new episodes through the contradiction and
        staleness gates, after every request asked before it: against the
        beliefs of those cycles. Judged in steps, each up to an episode that
        asks for something (a challenge, a belief gone stale): what it asks
        is stored with the gates' state (an outbox), then done here and now —
        the ReflectionStaled events published and projected, the challenge
        cycles run at that episode's position — and the next step judges
        against what they decided. A crash or a handover resumes from the
        state: the outbox is done again where it is not done, and judging
        goes on from the first episode not judged."""
        user, partition, table = request.user_id, message.partition, self.runtime.tables.gates
        gates = Gates.from_dict(table.get(user))
        if request.sequence is not None and request.sequence <= gates.done:
            return  # a redelivery
        gates = await self.carry_out(gates.at(request), request, partition, message)
        episodes, settings = list(request.episodes), self.runtime.settings
        while gates.judged < len(episodes):
            todo = episodes[gates.judged:]
            try:  # a view that does not answer is waited for, as by every stage
                scores, quorums, live = await self.runtime.policy.until_done(
                    "challenge-gate", lambda: asyncio.to_thread(bearing_of, self.runtime.view, user, todo,
                                                                settings.challenge_quorum, self.rules.contradiction,
                                                                self.vectors))
            except Exception:  # a bug of the gate's: the episodes are in the view already, nothing to dead-letter
                log.exception("the gates failed for %d episode(s) of user %s: not judged", len(todo), user)
                break
            gates, asked_now, done = weigh(gates, user, todo, scores, quorums, live, request.recent, self.rules)
            asked_now = placed(asked_now, todo[done - 1]["position"])
            gates = replace(gates, judged=gates.judged + done, outbox=tuple(e.to_dict() for e in asked_now))
            gates = await self.store(gates, request, partition)  # decided, stored, then done
            gates = await self.carry_out(gates, request, partition, message)
        if request.sequence is not None and gates.done != request.sequence:  # cut short, or stored before
            await write(table, partition, user, replace(gates, done=request.sequence).to_dict())

    async def store(self, gates: Gates, request: GateRequested, partition: int) -> Gates:
        """The gates' state written, marked done in the same write once the
        run is judged to its end and nothing it asked is left to do."""
        gates = gates.closed(request)
        await write(self.runtime.tables.gates, partition, request.user_id, gates.to_dict())
        return gates

    async def carry_out(self, gates: Gates, request: GateRequested, partition: int, message) -> Gates:
        """What the gates decided and stored, done: ReflectionStaled events on
        the log, then in the view; each challenge cycle run, and taken out of
        the outbox once done (a crash asks no done cycle again)."""
        events = [from_dict(e) for e in gates.outbox]
        if not events:
            return gates
        staled = [e for e in events if isinstance(e, REFLECTION_TYPES)]
        if staled:
            await self.publish(staled)
            await self.runtime.policy.until_done("project-reflections", lambda: asyncio.to_thread(self.project, staled))
        challenges = [e for e in events if isinstance(e, ChallengeRequested)]
        for n, challenge in enumerate(challenges, start=1):
            await self.reflect(challenge, message)
            gates = await self.store(replace(gates, outbox=tuple(c.to_dict() for c in challenges[n:])), request,
                                     partition)
        if not challenges:
            gates = await self.store(replace(gates, outbox=()), request, partition)
        return gates
