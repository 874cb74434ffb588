"""Invalidation: the walk's cost as the store grows, and its latency end to end.

    python tests/benchmarks/invalidation.py [--sizes 1000,10000,100000] [--retractions 40]

1. walk: one user's store of N beliefs (random vectors, each citing 3 of
   the user's episodes) in Qdrant Edge; retract an episode that exactly 10
   beliefs cite; time `Invalidator.on_retracted` (median of 20). Baseline in
   the same run: the same walk over a full scan of the user's beliefs, which
   is what grows with the store.
2. latency: a real `reflect worker` on a real Tansu; for each retraction, the
   time from publish to the belief's status `invalid` in the view (explain
   route polled every 5 ms), p50/p95; baseline: publish → visible of an
   episode through the same worker (the same hops, minus the walk).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from processors.invalidator import Invalidator, empty_state  # noqa: E402
from processors.projector import point_id  # noqa: E402
from processors.provenance import decide, reach  # noqa: E402
from processors.ports import ViewPoint  # noqa: E402
from streams.adapters.view.edge import EdgeView  # noqa: E402
from schemas import EpisodeRetracted, ReflectionCreated  # noqa: E402
from projector_throughput import bench_worker  # noqa: E402
from streams.broker import EmbeddedBroker  # noqa: E402
from streams.producer import Publisher  # noqa: E402
from suite_figures import figure, print_scenario, quantile, target  # noqa: E402
from support.harness import wait_for  # noqa: E402

DIM, DEPENDENTS = 384, 10


def store(view: EdgeView, n: int) -> None:
    rng = np.random.default_rng(7)
    for start in range(0, n, 2000):
        vectors = rng.normal(size=(min(2000, n - start), DIM)).astype(np.float32)
        view.upsert([ViewPoint(point_id("reflection", "ann", f"r{i}"), v / np.linalg.norm(v), {
            "user_id": "ann", "kind": "reflection", "reflection_id": f"r{i}", "status": "live", "depth": 1,
            "confidence": 0.6, "occurred_at": "2026-06-01T00:00:00Z",
            "evidence_ids": ["target" if i < DEPENDENTS else f"e{rng.integers(n)}", f"e{i}", f"e{i + 1}"]})
            for i, v in zip(range(start, start + len(vectors)), vectors)])


def scan_walk(view: EdgeView, cause: str) -> int:
    """The baseline: dependents found by reading every belief of the user."""
    beliefs = [p for _, p in view.scroll("ann", kind="reflection")]
    seeds = [(cause, p) for p in beliefs if cause in p["evidence_ids"]]
    reached, parent = reach(seeds, lambda x: [p for p in beliefs if x in p["evidence_ids"]], 2, cause)
    return len(decide(reached, parent, cause, {cause}, {}, 2, False))


def median_ms(fn, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def walk(sizes: list[int]) -> list[dict]:
    """Per store size: median ms of the indexed walk and of the scan baseline."""
    rows, retraction = [], EpisodeRetracted(user_id="ann", episode_id="target")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            view = EdgeView(tmp, "bench", DIM)
            store(view, n)
            invalidator = Invalidator(view, 2, 2)
            assert len(invalidator.on_retracted(retraction, empty_state())[0]) == DEPENDENTS * 2  # + revalidations
            assert scan_walk(view, "target") == DEPENDENTS
            indexed = median_ms(lambda: invalidator.on_retracted(retraction, empty_state()))
            scan = median_ms(lambda: scan_walk(view, "target"), reps=5 if n > 10_000 else 20)
            view.close()
        rows.append({"beliefs": n, "walk_ms": indexed, "scan_ms": scan})
    return rows


def measure(sizes: list[int], retractions: int) -> dict:
    rows = walk(sizes)
    invalid, visible = latency(retractions)
    figures = [figure(f"walk, {r['beliefs']:,} beliefs, {DEPENDENTS} dependents", r["walk_ms"], "ms",
                      "full scan of the user's beliefs", r["scan_ms"]) for r in rows]
    figures += [figure(f"retract → belief invalid p{p}", quantile(invalid, p), "ms",
                       f"episode → visible p{p}", quantile(visible, p)) for p in (50, 95)]
    return {"rows": rows, "figures": figures,
            "targets": [target("retract → invalid p95 (ms)", quantile(invalid, 95), "<=", 500)]}


async def publish(settings, events, topic=None) -> None:
    async with Publisher(settings) as p:
        for e in events:
            await p.publish(e, topic=topic)


def latency(retractions: int) -> tuple[list[float], list[float]]:
    """ms from publishing a retraction to its belief invalid; ms from an episode to visible."""
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker, \
            bench_worker(broker, Path(tmp), threshold=1e6) as (settings, w):
        visible, invalid = [], []
        for i in range(retractions):
            first = asyncio.run(_timed_episode(settings, w, f"a{i}"))
            visible.append(first)
            asyncio.run(_timed_episode(settings, w, f"b{i}"))
            belief = ReflectionCreated(user_id="ann", reflection_id=f"r{i}", cycle_id="ann:1", text=f"belief {i}",
                                       evidence_ids=(f"a{i}", f"b{i}"), depth=1, importance=0.5,
                                       confidence=0.6, reasoner="offline", prompt_version="v1", question="q")
            asyncio.run(publish(settings, [belief], settings.topic_reflections))
            wait_for(lambda: (w.get(f"/v1/users/ann/reflections/r{i}") or {}).get("belief"), 30, "belief",
                     every=0.005)
            t = time.perf_counter()
            asyncio.run(publish(settings, [EpisodeRetracted(user_id="ann", episode_id=f"a{i}")]))
            wait_for(lambda: w.get(f"/v1/users/ann/reflections/r{i}")["belief"]["status"] == "invalid", 30,
                     "invalid", every=0.005)
            invalid.append((time.perf_counter() - t) * 1000)

    return invalid, visible


async def _timed_episode(settings, w, eid) -> float:
    t = time.perf_counter()
    async with Publisher(settings) as p:
        await p.publish_episode("ann", f"episode {eid}", 0.5, episode_id=eid)
    await asyncio.to_thread(wait_for, lambda: "text" in (w.get(f"/v1/users/ann/episodes/{eid}") or {}), 30,
                            "episode", every=0.005)
    return (time.perf_counter() - t) * 1000


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--retractions", type=int, default=40)
    args = parser.parse_args()
    print_scenario("invalidation", measure([int(x) for x in args.sizes.split(",")], args.retractions))
