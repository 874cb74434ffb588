"""The pipeline's error policy: what a failure means, and what happens next.

Two kinds of failure, told apart so that nothing is lost and nothing loops:

* **transient** — the view, the broker or another dependency did not answer
  (a connection error, a timeout, a Qdrant server restarting). The step is
  retried with capped backoff for as long as the fault lasts. Meanwhile the
  batch is not acknowledged, so Faust never commits past it and a crash
  replays it; the stage is reported stalled (`/healthz`, the
  `reflect_pipeline_stalled` gauge) and the partition reads no further.
* **deterministic** — one record that fails alone, on every try, while its
  dependencies answer: it goes to the topic's dead-letter topic with the
  reason and its original bytes (`reflect dlq replay` after a fix); the rest
  of its batch is applied.

A failure whose kind is unknown counts as transient while a probe of the view
fails: an engine that raises its own errors while down must not send a whole
stream to the dead-letter topic. And it counts as deterministic only once it
failed twice in a row with the view answering: an outage that ends between
the failure and the probe is still an outage (the in-memory suite saw one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from streams.adapters.failures import transient
from streams.worker import metrics
from processors.dlq import redacted

log = logging.getLogger("reflect")

FAILED = object()  # what `Policy.alone` answers for a record it dead-lettered
TRIES_ALONE = 3  # tries of one record, its dependencies answering, before it is dead-lettered
PROBE_USER = "\x00probe"  # a user id no event can carry: counting its points costs one index lookup
CONFIRMED = 2  # failures in a row, the view answering each time, that make a failure deterministic


@dataclass(frozen=True)
class Backoff:
    first: float = 0.1
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        return min(self.cap, self.first * 2 ** attempt)


@dataclass
class Stall:
    since: float
    error: str
    attempts: int = 0


@dataclass
class Health:
    """Stages waiting on a dependency now: what /healthz and /metrics report."""

    stalled: dict[str, Stall] = field(default_factory=dict)

    def degraded(self) -> dict[str, Any]:
        now = time.monotonic()
        return {stage: {"seconds": round(now - s.since, 1), "attempts": s.attempts, "error": s.error}
                for stage, s in self.stalled.items()}


DeadLetter = Callable[[Any, BaseException, str], Awaitable[None]]


class Policy:
    """Runs a pipeline step under the error policy (one per worker)."""

    def __init__(self, view, dead_letter: DeadLetter, health: Health, backoff: Backoff = Backoff()) -> None:
        self.view, self.dead_letter, self.health, self.backoff = view, dead_letter, health, backoff

    async def view_answers(self) -> bool:
        try:
            await asyncio.to_thread(self.view.count, PROBE_USER)
            return True
        except Exception:
            return False

    async def _kind(self, error: BaseException) -> bool:
        """True if transient (see the module docstring)."""
        return transient(error) or not await self.view_answers()

    async def until_done(self, stage: str, step: Callable[[], Awaitable[Any]]) -> Any:
        """`step()` retried through transient failures until it succeeds; a
        deterministic failure (`CONFIRMED` in a row) is raised to the caller."""
        attempt, refused = 0, 0
        while True:
            try:
                done = await step()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                refused = 0 if await self._kind(error) else refused + 1
                if refused >= CONFIRMED:
                    self._cleared(stage)
                    raise
                self._stalled(stage, error, attempt)
                await asyncio.sleep(self.backoff.delay(attempt))
                attempt += 1
                continue
            if self._cleared(stage):
                log.warning("%s resumed after %d retries", stage, attempt, extra={"stage": stage})
            return done

    def _cleared(self, stage: str) -> bool:
        """The stage no longer waits; whether it did."""
        if self.health.stalled.pop(stage, None) is None:
            return False
        metrics.stalled(stage, False)
        return True

    def _stalled(self, stage: str, error: BaseException, attempt: int) -> None:
        stall = self.health.stalled.get(stage)
        if stall is None:
            stall = self.health.stalled[stage] = Stall(time.monotonic(), "")
            metrics.stalled(stage, True)
            log.error("%s stalled: %s; retrying with backoff, the partition waits (nothing is "
                      "committed past it)", stage, redacted(error), extra={"stage": stage})
        stall.error, stall.attempts = redacted(error)[:500], attempt + 1

    async def apply(self, stage: str, apply: Callable[[list], Any], items: Sequence[tuple[Any, Any]]) -> list:
        """Apply `apply` (blocking, run off the event loop) to the records of
        `items` ((record, message) pairs) as one batch; on a deterministic
        failure, record by record, dead-lettering what fails alone. Returns the
        pairs that were applied."""
        if not items:
            return []
        records = [record for record, _ in items]
        try:
            await self.until_done(stage, lambda: asyncio.to_thread(apply, records))
            return list(items)
        except Exception:
            log.warning("%s: a batch of %d failed; applying its records one by one", stage, len(items),
                        exc_info=True, extra={"stage": stage})
        applied = []
        for record, message in items:
            if await self.alone(stage, lambda: asyncio.to_thread(apply, [record]), message) is not FAILED:
                applied.append((record, message))
        return applied

    async def alone(self, stage: str, step: Callable[[], Awaitable[Any]], message) -> Any:
        """`step()` for one record: its result, or FAILED once it failed
        TRIES_ALONE times with its dependencies answering (dead-lettered)."""
        error: BaseException | None = None
        for _ in range(TRIES_ALONE):
            try:
                return await self.until_done(stage, step)
            except Exception as failed:
                error = failed
        log.error("%s failed alone %d times: dead-lettered", stage, TRIES_ALONE, exc_info=error,
                  extra={"stage": stage})
        await self.reject(message, error, stage)
        return FAILED

    async def reject(self, message, error: BaseException, stage: str) -> None:
        """Dead-letter a record (its publish retried like any other)."""
        await self.until_done("dead-letter", lambda: self.dead_letter(message, error, stage))
