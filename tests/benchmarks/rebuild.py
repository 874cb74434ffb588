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
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for conftest helpers

from projector_throughput import bench_worker, episodes, visible_after_publish  # noqa: E402
from streams.broker import EmbeddedBroker  # noqa: E402


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker, \
            bench_worker(broker, Path(tmp), threshold=1e6) as (settings, w):
        live = visible_after_publish(settings, w, episodes(n))
        done = subprocess.run([sys.executable, "-m", "streams.cli", "rebuild", "--api",
                               f"http://127.0.0.1:{settings.web_port}"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        progress = w.get("/v1/admin/rebuild")
        assert sum(w.stats(f"user-{u}")["episodes"] for u in range(20)) == n  # the new view holds them all
    print(f"rebuild, {n} episodes, Tansu, hashing embedder, Qdrant Edge")
    print(f"  reflect rebuild          {progress['rate']:10,.0f} events/s ({progress['events']} events, "
          f"{progress['seconds']} s, {progress['old_view']} → {progress['new_view']})")
    print(f"  baseline live projection {n / live:10,.0f} events/s   rebuild/live = {progress['rate'] / (n / live):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20000)
    main(parser.parse_args().episodes)
