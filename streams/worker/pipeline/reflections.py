"""The reflections pipeline: one agent over `reflections`.

**project**: belief events into the view. Their writers (the reflector, the
invalidator) put them in the view themselves, so here this is an
idempotent catch-up — what makes a replay or a rebuild see them, and what
covers a writer that crashed between its publish and its own write.

**invalidate**: a belief may reach the log citing an episode whose
retraction was walked before the belief was in the view; the invalidator
remembers what is gone and decides such a belief now.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from processors.invalidator import Invalidator, empty_state
from processors.projector import REFLECTION_TYPES, ReflectionProjector
from schemas import Event, ReflectionCreated, ReflectionReinforced
from streams.worker import metrics
from streams.worker.pipeline.policy import FAILED
from streams.worker.pipeline.runner import Runner
from streams.worker.runtime import Runtime, write


class ReflectionsPipeline(Runner):
    PROJECTS = True

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        settings = runtime.settings
        self.project = ReflectionProjector(runtime.view, runtime.embedder, erase_now=False).apply
        self.invalidator = Invalidator(runtime.view, settings.citation_floor, settings.max_depth)

    async def handle(self, admitted: list[tuple[Event, Any]], prepared: Any = None) -> None:
        beliefs = [((r, m.offset), m) for r, m in admitted if isinstance(r, REFLECTION_TYPES)]
        project = metrics.timed_apply(lambda at: self.project([r for r, _ in at], [p for _, p in at]), "reflection")
        async with self.runtime.projection_lock:
            applied = await self.runtime.policy.apply("project-reflections", project, beliefs)
        for (record, _), message in applied:
            if isinstance(record, (ReflectionCreated, ReflectionReinforced)):
                await self.check(record, message)

    async def check(self, belief: ReflectionCreated | ReflectionReinforced, message) -> None:
        user, table = belief.user_id, self.runtime.tables.provenance
        async with self.runtime.user_lock(user):
            def decide():
                state = copy.deepcopy(table.get(user) or empty_state())
                made = self.invalidator.on_belief(belief, state)
                self.project([e for e in made if isinstance(e, REFLECTION_TYPES)])
                return state, made

            done = await self.runtime.policy.alone("invalidate", lambda: asyncio.to_thread(decide), message)
            if done is FAILED:
                return
            state, made = done
            if made:  # else nothing it knows changed: no changelog record per belief
                await self.publish(made)
                metrics.invalidations(made)
                write(table, message.partition, user, state)
