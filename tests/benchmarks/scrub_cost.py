"""What a scrub costs: an Edge view written point by point into a fresh
shard (EdgeView.rewritten, after an erasure or a forget), against copying
its files (EdgeView.copy, a compaction's copy) in the same run.

    python tests/benchmarks/scrub_cost.py [--points 50000] [--users 100] [--rounds 3]

Random 384-dimension vectors and short texts; each round times both, in
alternating order. The scrub runs while the worker's writes go on; the
file copy holds them.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

from processors.ports import ViewPoint  # noqa: E402
from streams.adapters.view.edge import EdgeView  # noqa: E402
from suite_figures import figure, print_scenario  # noqa: E402


def filled(root: Path, points: int, users: int) -> EdgeView:
    view, rng = EdgeView(root, "reflect", 384), np.random.default_rng(7)
    for start in range(0, points, 1000):
        vectors = rng.standard_normal((min(1000, points - start), 384)).astype(np.float32)
        view.upsert([ViewPoint(str(uuid.UUID(int=start + i + 1)), vector,
                               {"user_id": f"user-{(start + i) % users}", "kind": "episode", "position": start + i,
                                "text": f"episode {start + i}: the deploy of the auth layer, its logs and a retry"})
                     for i, vector in enumerate(vectors)])
    view.flush()
    return view


def timed(make) -> float:
    started = time.perf_counter()
    made = make()
    seconds = time.perf_counter() - started
    made.drop()
    return seconds


def measure(points: int = 50000, users: int = 100, rounds: int = 3) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        view = filled(Path(tmp), points, users)
        runs: dict[str, list[float]] = {"rewrite": [], "copy": []}
        for r in range(rounds):
            for kind in ("rewrite", "copy") if r % 2 == 0 else ("copy", "rewrite"):
                runs[kind].append(timed(view.rewritten if kind == "rewrite" else view.copy))
                print(f"round {r + 1}, {kind}: {runs[kind][-1]:.2f} s", file=sys.stderr)
        view.close()
        shutil.rmtree(tmp, ignore_errors=True)
    rewrite, copy = statistics.median(runs["rewrite"]), statistics.median(runs["copy"])
    return {"points": points, "runs": runs, "figures": [
        figure(f"scrub: {points} points rewritten", rewrite, "s", "file copy", copy),
        figure("scrub rate", points / rewrite, "points/s")]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=50000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print_scenario("scrub", measure(args.points, args.users, args.rounds))
