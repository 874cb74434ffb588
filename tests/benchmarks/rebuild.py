"""Rebuild rate: replaying the log into a successor view, against live projection.

    python tests/benchmarks/rebuild.py [--episodes 20000]

A real `reflect worker` on Tansu: the episodes published after the worker is
consuming, until all are visible in the view (the live projector's rate).
Then `reflect rebuild` replays the same log into a new view and swaps it in;
its rate is events/s from its own progress report. Baselines in the same run:
raw aiokafka consumption of the same topic (the box's limit, the target's
denominator) and the live rate (both embed with the hashing embedder and
write Qdrant Edge).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support
sys.path.insert(0, str(Path(__file__).resolve().parent))

from projector_throughput import bench_worker, episodes, raw_consume, visible_after_publish  # noqa: E402
from streams.broker import EmbeddedBroker  # noqa: E402
from suite_figures import figure, print_scenario, target  # noqa: E402


def measure(n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker, \
            bench_worker(broker, Path(tmp), threshold=1e6) as (settings, w):
        live = n / visible_after_publish(settings, w, episodes(n))
        done = subprocess.run([sys.executable, "-m", "streams.cli", "rebuild", "--api",
                               f"http://127.0.0.1:{settings.web_port}"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        progress = w.get("/v1/admin/rebuild")
        assert sum(w.stats(f"user-{u}")["episodes"] for u in range(20)) == n  # the new view holds them all
        raw = n / asyncio.run(raw_consume(settings, n))
    rate = progress["rate"]
    return {"events": progress["events"], "figures": [
        figure("reflect rebuild", rate, "events/s", "raw aiokafka consume", raw),
        figure("reflect rebuild", rate, "events/s", "live projection", live)],
        "targets": [target("rebuild / raw consumption", rate / raw, ">=", 0.5)]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20000)
    print_scenario("rebuild", measure(parser.parse_args().episodes))
