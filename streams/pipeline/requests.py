"""The requests pipeline: one agent over `reflection-requests`, one cycle at a time.

A user's requests are on one partition, so the user's cycles run in log
order. For each: refuse it (budget spent, breaker open) or run the five steps
off the event loop (a reasoner call takes seconds; heartbeats, the other
pipelines and the API go on); then write the cycle's belief events into the
view *before* publishing them, so the user's next cycle sees them whatever
the reflections pipeline has read — and mark the cycle done. A request whose
sequence is already marked done (a redelivery after a crash) is skipped.

A transient fault (the view, the broker) retries the cycle; a deterministic
one is dead-lettered with the request (stage "reflect"). Either way the
accumulator has reset: a failing cycle is never asked again by itself.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

from processors.accumulator import Accumulator
from processors.guard import Spend, day_of, tokens_of
from processors.projector import ReflectionProjector
from processors.reflector import CycleConfig, cycle_window, refused, run_cycle
from schemas import Event, ReflectionRequested
from streams import metrics
from streams.pipeline.runner import Runner
from streams.runtime import Runtime, write

log = logging.getLogger("reflect")


class RequestsPipeline(Runner):
    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self.config = CycleConfig.from_settings(runtime.settings)
        self.project = ReflectionProjector(runtime.view, runtime.embedder).apply

    async def handle(self, admitted: list[tuple[Event, Any]]) -> None:
        for request, message in admitted:
            await self.reflect(request, message)

    def done_already(self, request: ReflectionRequested) -> bool:
        done = self.runtime.tables.requests_done.get(request.user_id) or 0
        return request.sequence is not None and request.sequence <= done

    async def reflect(self, request: ReflectionRequested, message) -> None:
        if self.done_already(request):
            return
        runtime, user = self.runtime, request.user_id
        runtime.running[user] = request.cycle_id
        try:
            made = await runtime.policy.until_done("reflect", lambda: self.cycle(request, message.partition))
            await self.publish(made)
            completed = made[-1]
            runtime.tally.add(completed)
            metrics.cycle(completed)
            if completed.outcome in ("failed", "unavailable", "refused"):
                log.warning("cycle %s %s: %s", request.cycle_id, completed.outcome, completed.error,
                            extra={"cycle_id": request.cycle_id, "event_id": request.event_id,
                                   "outcome": completed.outcome})
        except Exception as error:
            log.exception("cycle %s failed outside the reasoner", request.cycle_id,
                          extra={"cycle_id": request.cycle_id, "event_id": request.event_id})
            await runtime.policy.reject(message, error, "reflect")
        finally:
            runtime.running.pop(user, None)
        await self.mark_done(request, message.partition)

    async def cycle(self, request: ReflectionRequested, partition: int) -> list[Event]:
        """One cycle's events, already in the view; refused when a budget is
        spent or the breaker is open."""
        runtime, user = self.runtime, request.user_id
        day, clock = day_of(datetime.now(timezone.utc)), asyncio.get_running_loop().time
        spend = runtime.tables.spend
        keys = (f"user:{user}", f"partition:{partition}")
        spent = [Spend.from_dict(spend.get(k)) for k in keys]
        reason = runtime.budget.refusal(*(s.today(day) for s in spent)) or runtime.breaker.refusal(clock())
        if reason:
            return [refused(request, runtime.reasoner, reason)]
        recent = Accumulator.from_dict(runtime.tables.accumulators.get(user)).recent
        made = await asyncio.to_thread(self.steps, request, recent)
        completed = made[-1]
        runtime.breaker.record(completed.outcome == "unavailable", clock())
        for key, s in zip(keys, spent):
            write(spend, partition, key, s.charged(day, tokens_of(completed.usage)).to_dict())
        return made

    def steps(self, request: ReflectionRequested, recent) -> list[Event]:
        """Steps 2–5, then the cycle's beliefs into the view (blocking: off the loop)."""
        runtime = self.runtime
        window = cycle_window(runtime.view, request, recent)
        made = metrics.traced_cycle(run_cycle)(request, window, runtime.view, runtime.embedder,
                                               runtime.reasoner, self.config)
        self.project(made)  # the beliefs in the view before the log goes on
        return made

    async def mark_done(self, request: ReflectionRequested, partition: int) -> None:
        user, done = request.user_id, self.runtime.tables.requests_done
        if request.sequence is not None and request.sequence > (done.get(user) or 0):
            write(done, partition, user, request.sequence)
        async with self.runtime.cycle_done:
            self.runtime.cycle_done.notify_all()
