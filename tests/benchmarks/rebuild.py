"""Rebuild rate: replaying the log into a successor view, against live projection.

    python tests/benchmarks/rebuild.py [--episodes 20000]

A real `reflect worker` on Tansu. Baseline: the episodes published after the
worker is consuming, until all are visible in the view (the live projector's
rate). Then `reflect rebuild` replays the same log into a new view and swaps it
in; its rate is events/s from its own progress report. Both embed with the
hashing embedder and write Qdrant Edge, so the ratio is replay vs live.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for conftest helpers

from conftest import Worker, wait_for  # noqa: E402
from projector_throughput import episodes, publish  # noqa: E402
from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        tag = uuid.uuid4().hex[:6]
        settings = Settings.load(env={}, broker=broker.url, app_id=f"bench-{tag}", data_dir=str(Path(tmp) / tag),
                                 web_port=free_port(), threshold=1e6)
        asyncio.run(ensure_topics(settings))
        w = Worker(settings, Path(tmp) / "worker.log").start()
        try:
            events = episodes(n)
            users = sorted({e.user_id for e in events})
            t = time.perf_counter()
            asyncio.run(publish(settings, events))
            wait_for(lambda: sum(w.stats(u)["episodes"] for u in users) == n, 600, f"{n} episodes", every=0.05)
            live = time.perf_counter() - t
            done = subprocess.run([sys.executable, "-m", "streams.cli", "rebuild", "--api",
                                   f"http://127.0.0.1:{settings.web_port}"], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            progress = w.get("/v1/admin/rebuild")
            assert sum(w.stats(u)["episodes"] for u in users) == n  # the new view holds them all
        finally:
            w.stop()
    print(f"rebuild, {n} episodes, Tansu, hashing embedder, Qdrant Edge")
    print(f"  reflect rebuild          {progress['rate']:10,.0f} events/s ({progress['events']} events, "
          f"{progress['seconds']} s, {progress['old_view']} → {progress['new_view']})")
    print(f"  baseline live projection {n / live:10,.0f} events/s   rebuild/live = {progress['rate'] / (n / live):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20000)
    main(parser.parse_args().episodes)
