"""The demo's loop without a broker: the sample history through the worker's
own pipelines (tests/support/memory_worker.py) over a real Qdrant Edge view, with the
given embedder and reasoner; what comes out is the live beliefs, as the HTTP
API serves them. Seconds instead of a broker and a child process: what the
score tests run for several seeds and reasoners.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from streams.adapters.view.edge import EdgeView
from streams.cli.sample import History
from streams.producer import make_episode
from streams.settings import Settings
from support.memory_worker import MemoryWorker, memory_runtime


def live_beliefs(hist: History, tmp: Path, embedder, reasoner, timeout: float = 600.0,
                 env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`env`: settings as the environment would give them (REFLECT_CHALLENGE=on…); the defaults otherwise."""
    async def run() -> list[dict[str, Any]]:
        settings = Settings.load(env=env or {}, data_dir=str(tmp))  # the demo's trigger: threshold and floor
        view = EdgeView(settings.view_dir, settings.view, embedder.dim)
        try:
            worker = MemoryWorker(memory_runtime(settings, view, embedder, reasoner))
            await worker.run([make_episode(hist.user_id, e.text, e.importance, episode_id=e.episode_id,
                                           occurred_at=e.occurred_at, source=e.source) for e in hist.episodes],
                             timeout)
            held = [p for _, p in view.scroll(hist.user_id, kind="reflection", status="live")]
        finally:
            view.close()
        return sorted(held, key=lambda p: (-p["confidence"], p["reflection_id"]))
    return asyncio.run(run())
