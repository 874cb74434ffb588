"""A cycle is decided once: its outcome is stored before it is published
(streams/pipeline/requests.py, table `cycle-outcomes`), so a rerun after a
crash or a stop between the publish and the mark of the request done
publishes the same events again and never asks the reasoner twice. Shown
in-process (tests/memory_worker.py) over the real Qdrant Edge view.

    python -m pytest tests/test_outcomes.py -q
"""

from __future__ import annotations

import asyncio

from memory_worker import MemoryWorker, memory_runtime
from processors.embedders import HashingEmbedder
from processors.reasoners import OfflineReasoner
from processors.view import EdgeView
from schemas import ReflectionCycleCompleted
from streams.pipeline.runner import HandedOver
from streams.settings import Settings
from test_faults_crash import beliefs_of, episode_stream, points_of, users_by_partition

USERS = users_by_partition(1, 2)


class Counted(OfflineReasoner):
    """The offline reasoner, counting its calls."""

    calls = 0

    def questions(self, *args, **kwargs):
        Counted.calls += 1
        return super().questions(*args, **kwargs)


class StopsAfterEachPublish(MemoryWorker):
    """The requests pipeline stops right after each cycle's audit event
    reaches the log, before the request is marked done (the first time
    each), and reads its batch again (MemoryWorker.consume)."""

    def __init__(self, runtime) -> None:
        super().__init__(runtime)
        publish, self.stops = runtime.outlets.publish, set()

        async def publish_then_stop(events) -> None:
            await publish(events)
            done = {e.cycle_id for e in events if isinstance(e, ReflectionCycleCompleted)} - self.stops
            if done:
                self.stops |= done
                raise HandedOver("stopped after a cycle's outcome reached the log")
        runtime.outlets.publish = publish_then_stop


def run(tmp, worker_class) -> tuple[int, dict, list]:
    settings = Settings.load(env={}, data_dir=str(tmp), threshold=5.0, min_episodes=5, projector_batch=8)
    embedder, Counted.calls = HashingEmbedder(), 0
    view = EdgeView(settings.view_dir, settings.view, embedder.dim)
    worker = worker_class(memory_runtime(settings, view, embedder, Counted(embedder)))
    try:
        asyncio.run(worker.run(episode_stream(USERS, 40)))
        completed = [e.cycle_id for e in worker.runtime.outlets.reflections.events()
                     if isinstance(e, ReflectionCycleCompleted)]
        return Counted.calls, beliefs_of(points_of(view, USERS)), completed
    finally:
        view.close()


def test_a_cycle_rerun_after_its_outcome_reached_the_log_asks_the_reasoner_nothing(tmp_path):
    calls, beliefs, completed = run(tmp_path / "once", MemoryWorker)
    again_calls, again_beliefs, again_completed = run(tmp_path / "stopped", StopsAfterEachPublish)
    assert calls > 0 and len(set(completed)) >= len(USERS) * 2
    assert len(again_completed) > len(set(again_completed)), "no cycle was rerun"
    assert again_calls == calls  # the reruns reused what was decided
    assert set(again_completed) == set(completed) and again_beliefs == beliefs
