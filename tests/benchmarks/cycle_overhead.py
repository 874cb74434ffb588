"""Reflection cycle overhead as a user's store grows, model time excluded.

    python tests/benchmarks/cycle_overhead.py [--sizes 1000,10000,50000] [--reps 9]

For each size: one user's store of N episodes (plus 20 beliefs) in a Qdrant
Edge view, then the median duration of one cycle over the newest 100
records, as the reflector runs it (window read → questions → evidence per
question → insights → judge → near-duplicate check):
- offline reasoner (no calls at all);
- the anthropic reasoner against tests/support/messages_api.py's server with zero
  delay (prompt building, the SDK, HTTP on loopback, parsing);
- baseline, same run: the naive design that fetches and sorts the user's
  whole store for every evidence lookup (scroll every point with its
  vector, score and sort in Python), with the offline reasoner.
What must hold: the cycle is flat in N (ratio 50k/1k ≤ 1.5); the naive one is not.

    python tests/benchmarks/cycle_overhead.py --embedder minilm [--sizes 500,50000] [--reps 5]

With MiniLM (issue 34, item 5: an offline cycle at 500 episodes ≤ 1 s, at
50k ≤ 1.5× that) the store is the demo's sample history (streams/cli/sample.py,
development seed 8, N episodes over its three months; each distinct text
embedded once), 20 beliefs in the offline reasoner's form, and the cycle runs
on the newest 33 episodes (the demo's mean window: 2,100 episodes, 63
cycles) with the user's beliefs, as the reflector reads them: the offline
reasoner with MiniLM, a fresh one each repetition (nothing remembered from
the one before: the cost of a cycle whose texts are all new).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from processors.embedders import HashingEmbedder  # noqa: E402
from processors.projector import episode_payload, point_id, reflection_payload  # noqa: E402
from processors.reasoners import OfflineReasoner  # noqa: E402
from processors.reflector import CycleConfig, cycle_window, run_cycle  # noqa: E402
from processors.ports import VECTOR, Hit, ViewPoint  # noqa: E402
from streams.adapters.view.edge import EdgeView  # noqa: E402
from read_latency import DIM, START, episode_text, stamp  # noqa: E402
from schemas import EpisodeRecorded, ReflectionCreated, ReflectionRequested  # noqa: E402
from suite_figures import figure, print_scenario, target  # noqa: E402
from support.messages_api import MessagesServer, OfflineModel  # noqa: E402

USER, WINDOW, BELIEFS = "user-bench", 100, 20


def store(root: Path, n: int) -> tuple[EdgeView, ReflectionRequested]:
    """N episodes of one user over 150 days, 20 beliefs; the request of a cycle on the newest 100."""
    rng, embedder, view = random.Random(n), HashingEmbedder(DIM), EdgeView(root, "bench", DIM)
    episodes = [EpisodeRecorded(user_id=USER, episode_id=f"ep-{i}", text=episode_text(rng),
                                importance=round(rng.random(), 3),
                                occurred_at=stamp(START + timedelta(minutes=i * 150 * 24 * 60 // n)))
                for i in range(n)]
    beliefs = [ReflectionCreated(user_id=USER, reflection_id=f"r-{b}", cycle_id=f"{USER}:{b}",
                                 text=f"the user usually {episode_text(rng)}",
                                 evidence_ids=tuple(e.episode_id for e in rng.sample(episodes, 4)), depth=1,
                                 importance=0.7, confidence=0.6, reasoner="offline", prompt_version="v1",
                                 question="q", occurred_at=episodes[n // 2].occurred_at) for b in range(BELIEFS)]
    for start in range(0, n, 2000):
        chunk = episodes[start:start + 2000]
        view.upsert([ViewPoint(point_id("episode", USER, e.episode_id), v, episode_payload(e))
                     for e, v in zip(chunk, embedder.embed([e.text for e in chunk]))])
    view.upsert([ViewPoint(point_id("reflection", USER, b.reflection_id), v, reflection_payload(b))
                 for b, v in zip(beliefs, embedder.embed([b.text for b in beliefs]))])
    view.flush()
    newest = episodes[-WINDOW:]
    request = ReflectionRequested(user_id=USER, cycle_id=f"{USER}:bench", why="threshold",
                                  occurred_at=newest[-1].occurred_at,
                                  window_episode_ids=tuple(e.episode_id for e in newest))
    return view, request


class WholeStore:
    """The naive design: every evidence lookup fetches the user's whole store
    and sorts it by similarity (what a cycle costs without the vector index)."""

    def __init__(self, view: EdgeView) -> None:
        self.view = view

    def search(self, user_id, vector, k, before=None, upto=None, **match) -> list[Hit]:
        q, shard, offset, points = self.view._q, self.view._shard, None, []
        while True:
            where = self.view._filter(user_id, match, upto=upto)
            records, offset = shard.scroll(q.ScrollRequest(offset=offset, limit=2048, with_payload=True,
                                                           with_vector=True, filter=where))
            points += [r for r in records if before is None or r.payload["occurred_at"] <= before]
            if offset is None:
                break
        if not points:
            return []
        matrix = np.asarray([r.vector[VECTOR] for r in points], dtype=np.float32)
        scores = matrix @ np.asarray(vector, dtype=np.float32) / (np.linalg.norm(matrix, axis=1) + 1e-9)
        order = np.argsort(-scores)[:k]
        return [Hit(str(points[i].id), float(scores[i]), dict(points[i].payload)) for i in order]

    def search_many(self, user_id, vectors, k, before=None, upto=None, **match) -> list[list[Hit]]:
        return [self.search(user_id, v, k, before, upto, **match) for v in vectors]

    def search_hybrid(self, user_id, vectors, texts, k, before=None, scoring=None, prefetch=None, ids=None,
                      upto=None, **match) -> list[list[Hit]]:
        # The naive design has no BM25: cosine over the whole store, restricted to `ids` if given.
        found = self.search_many(user_id, vectors, k if ids is None else len(ids) + k, before, upto, **match)
        keep = None if ids is None else set(ids)
        return [[h for h in hits if keep is None or h.id in keep][:k] for hits in found]

    def __getattr__(self, name):  # everything but the evidence search as the view does it
        return getattr(self.view, name)


def cycle_ms(view, request, reasoner, reps: int, embedder=None) -> float:
    """Median milliseconds of a whole cycle (window read included); nothing is
    written, so every repetition sees the same store and decides the same.
    `reasoner`: one, or a function making a fresh one for each repetition."""
    return cycle_times(view, request, reasoner, reps, embedder)[0]


def cycle_times(view, request, reasoner, reps: int, embedder=None) -> tuple[float, float]:
    """(median wall ms, median CPU ms of the process: every thread, onnxruntime's included)."""
    embedder, config, times, cpu = embedder or HashingEmbedder(DIM), CycleConfig(), [], []
    for _ in range(reps):
        reasoner_ = reasoner() if callable(reasoner) and not hasattr(reasoner, "questions") else reasoner
        t, c = time.perf_counter(), time.process_time()
        # The window as the reflector reads it: the request's episodes and the user's earlier beliefs.
        made = run_cycle(request, cycle_window(view, request, ()), view, embedder, reasoner_, config)
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
        assert made[-1].outcome in ("ok", "empty"), made[-1].error
    return statistics.median(times), statistics.median(cpu)


def measure(sizes: list[int], reps: int = 9) -> dict:
    server = MessagesServer(OfflineModel())
    os.environ.setdefault("ANTHROPIC_API_KEY", "bench")
    try:
        import anthropic

        from streams.adapters.anthropic import AnthropicReasoner
        http = AnthropicReasoner(anthropic.Anthropic(api_key="bench", base_url=server.url, max_retries=0),
                                 "claude-haiku-4-5")
        rows = []
        for n in sizes:
            with tempfile.TemporaryDirectory() as tmp:
                view, request = store(Path(tmp), n)
                rows.append({"episodes": n,
                             "offline_ms": cycle_ms(view, request, OfflineReasoner(), reps),
                             "anthropic_http_ms": cycle_ms(view, request, http, reps),
                             "naive_whole_store_ms": cycle_ms(WholeStore(view), request, OfflineReasoner(),
                                                              max(3, reps // 3))})
                view.close()
    finally:
        server.close()
    figures = [figure(f"cycle at {r['episodes']:,} episodes, {kind}", r[f"{kind}_ms"], "ms",
                      "naive whole-store cycle", r["naive_whole_store_ms"])
               for r in rows for kind in ("offline", "anthropic_http")]
    growth = {kind: rows[-1][f"{kind}_ms"] / rows[0][f"{kind}_ms"]
              for kind in ("offline", "anthropic_http", "naive_whole_store")}
    figures += [figure(f"growth {rows[-1]['episodes']:,}/{rows[0]['episodes']:,}, {kind}", g, "x")
                for kind, g in growth.items()]
    return {"rows": rows, "figures": figures,
            "targets": [target(f"cycle growth {rows[-1]['episodes']:,}/{rows[0]['episodes']:,} episodes (offline)",
                               growth["offline"], "<=", 1.5)]}


SAMPLE_SEED, SAMPLE_WINDOW = 8, 33


def sample_store(root: Path, n: int, embedder) -> tuple[EdgeView, ReflectionRequested]:
    """The demo's sample history of N episodes (MiniLM vectors), 20 beliefs
    in the offline reasoner's form; the request of a cycle on the newest 33."""
    from processors.extractive import belief_text, generalized
    from streams.cli.sample import history

    hist, rng = history(seed=SAMPLE_SEED, episodes=n), random.Random(n)
    episodes = [EpisodeRecorded(user_id=USER, episode_id=e.episode_id, text=e.text, importance=e.importance,
                                occurred_at=e.occurred_at) for e in hist.episodes]
    planted = [e for e in hist.episodes if e.pattern]
    beliefs = []
    for b, e in enumerate(rng.sample(planted, min(BELIEFS, len(planted)))):
        cited = rng.sample(episodes[:n // 2], 3)
        beliefs.append(ReflectionCreated(
            user_id=USER, reflection_id=f"r-{b}", cycle_id=f"{USER}:{b}", text=belief_text(
                3, generalized(e.text), [c.occurred_at for c in cited]),
            evidence_ids=tuple(c.episode_id for c in cited),
            depth=1, importance=0.7, confidence=0.6, reasoner="offline-extractive", prompt_version="extractive-v3",
            question="q", occurred_at=episodes[n // 2].occurred_at))
    view = EdgeView(root, "bench", embedder.dim)
    distinct = list(dict.fromkeys(e.text for e in episodes))
    vectors = dict(zip(distinct, embedder.embed(distinct)))
    for start in range(0, n, 2000):
        chunk = episodes[start:start + 2000]
        view.upsert([ViewPoint(point_id("episode", USER, e.episode_id), vectors[e.text], episode_payload(e))
                     for e in chunk])
    view.upsert([ViewPoint(point_id("reflection", USER, b.reflection_id), v, reflection_payload(b))
                 for b, v in zip(beliefs, embedder.embed([b.text for b in beliefs]))])
    view.flush()
    newest = episodes[-SAMPLE_WINDOW:]
    return view, ReflectionRequested(user_id=USER, cycle_id=f"{USER}:bench", why="threshold",
                                     occurred_at=newest[-1].occurred_at,
                                     window_episode_ids=tuple(e.episode_id for e in newest))


def measure_minilm(sizes: list[int], reps: int = 5) -> dict:
    from streams.adapters.minilm import MiniLMEmbedder

    embedder, rows = MiniLMEmbedder(), []
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            view, request = sample_store(Path(tmp), n, embedder)
            wall, cpu = cycle_times(view, request, lambda: OfflineReasoner(embedder), reps, embedder)
            rows.append({"episodes": n, "offline_minilm_ms": wall, "offline_minilm_cpu_ms": cpu})
            view.close()
    figures = [figure(f"cycle at {r['episodes']:,} episodes, offline, MiniLM", r["offline_minilm_ms"], "ms")
               for r in rows] + [figure(f"its CPU time at {r['episodes']:,} episodes", r["offline_minilm_cpu_ms"], "ms")
                                 for r in rows]
    growth = rows[-1]["offline_minilm_ms"] / rows[0]["offline_minilm_ms"]
    figures.append(figure(f"growth {rows[-1]['episodes']:,}/{rows[0]['episodes']:,}, offline, MiniLM", growth, "x"))
    return {"rows": rows, "figures": figures, "targets": [
        target(f"cycle at {rows[0]['episodes']:,} episodes, offline, MiniLM (ms)", rows[0]["offline_minilm_ms"],
               "<=", 1000),
        target(f"cycle growth {rows[-1]['episodes']:,}/{rows[0]['episodes']:,} episodes (offline, MiniLM)", growth,
               "<=", 1.5)]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=None, help="default 1000,10000,50000 (hashing), 500,50000 (minilm)")
    parser.add_argument("--reps", type=int, default=None, help="default 9 (hashing), 5 (minilm)")
    parser.add_argument("--embedder", choices=("hashing", "minilm"), default="hashing")
    args = parser.parse_args()
    if args.embedder == "minilm":
        print_scenario("cycle overhead, MiniLM", measure_minilm(
            [int(s) for s in (args.sizes or "500,50000").split(",")], args.reps or 5))
    else:
        print_scenario("cycle overhead", measure([int(s) for s in (args.sizes or "1000,10000,50000").split(",")],
                                                 args.reps or 9))
