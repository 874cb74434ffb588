"""Projector throughput into the embedded view, batched vs one event at a time.

    python tests/benchmarks/projector_throughput.py [--episodes N]

Two measurements, each against its baselines in the same run (the machine is
shared and noisy: compare the ratios, not the times):

1. core: decode → plan → embed (hashing) → upsert into Qdrant Edge,
   in-process, batches of 256 vs batches of 1; baselines: decode alone and
   the embedder alone on the same texts.
2. worker: a real `reflect worker` on a real Tansu, episodes published after
   the worker is consuming, time until all are visible in the view, with
   REFLECT_PROJECTOR_BATCH=256 vs 1; baseline: raw aiokafka consumption of the
   same topic.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support

from aiokafka import AIOKafkaConsumer  # noqa: E402

from processors.embedders import HashingEmbedder  # noqa: E402
from processors.projector import EpisodeProjector  # noqa: E402
from streams.adapters.view.edge import EdgeView  # noqa: E402
from schemas import EpisodeRecorded, decode  # noqa: E402
from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.producer import Publisher  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402
from support.harness import Worker, wait_for  # noqa: E402

WORDS = ("deploy auth token retry logs review revert migration flaky test cache latency budget "
         "schema oncall alert rollback staging prod merge conflict docs").split()


def episodes(n: int, users: int = 20) -> list[EpisodeRecorded]:
    out = []
    for i in range(n):
        words = " ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 7, 11, 13, 17))
        out.append(EpisodeRecorded(user_id=f"user-{i % users}", episode_id=f"ep-{i}",
                                   text=f"episode {i}: {words}", importance=(i % 10) / 10))
    return out


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:10,.0f}/s"


def core(n: int) -> None:
    raws = [e.encode() for e in episodes(n)]
    t = time.perf_counter()
    records = [decode(r) for r in raws]
    decode_s = time.perf_counter() - t
    t = time.perf_counter()
    embedder = HashingEmbedder()
    for i in range(0, n, 256):
        embedder.embed([r.text for r in records[i:i + 256]])
    embed_s = time.perf_counter() - t
    results = {}
    for batch in (256, 1):
        with tempfile.TemporaryDirectory() as tmp:
            view = EdgeView(tmp, "bench", 384)
            projector = EpisodeProjector(view, HashingEmbedder())
            t = time.perf_counter()
            for i in range(0, n, batch):
                projector.apply([decode(r) for r in raws[i:i + batch]])
            results[batch] = time.perf_counter() - t
            assert sum(view.count(f"user-{u}") for u in range(20)) == n
            view.close()
    print(f"core, {n} episodes, hashing embedder, Qdrant Edge")
    print(f"  projector batch=256      {rate(n, results[256])}")
    print(f"  projector batch=1        {rate(n, results[1])}   batch/one = {results[1] / results[256]:.1f}x")
    print(f"  baseline decode alone    {rate(n, decode_s)}")
    print(f"  baseline embedder alone  {rate(n, embed_s)}   projector(256)/embedder = "
          f"{embed_s / results[256]:.2f}")


async def publish(settings: Settings, events) -> None:
    async with Publisher(settings) as p:
        for e in events:
            await p.publish(e, wait=False)
        await p.flush()


async def raw_consume(settings: Settings, n: int) -> float:
    consumer = AIOKafkaConsumer(settings.topic_episodes, bootstrap_servers=settings.bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        t, got = time.perf_counter(), 0
        while got < n:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10000)
            got += sum(len(v) for v in batches.values())
        return time.perf_counter() - t
    finally:
        await consumer.stop()


@contextlib.contextmanager
def bench_worker(broker: EmbeddedBroker, tmp: Path, **overrides):
    """A real `reflect worker` with its own app id, topics and data dir: (settings, worker)."""
    tag = uuid.uuid4().hex[:6]
    settings = Settings.load(env={}, broker=broker.url, app_id=f"bench-{tag}", topic_episodes=f"episodes-{tag}",
                             data_dir=str(tmp / tag), web_port=free_port(), **overrides)
    asyncio.run(ensure_topics(settings))
    w = Worker(settings, tmp / f"worker-{tag}.log").start()
    try:
        yield settings, w
    finally:
        w.stop()


def visible_after_publish(settings: Settings, w: Worker, events) -> float:
    """Seconds from publishing `events` until the worker's view holds them all."""
    expected: dict[str, int] = {}
    for e in events:
        expected[e.user_id] = expected.get(e.user_id, 0) + 1
    waiting = sorted(expected)

    def all_visible() -> bool:
        # One request per poll, as the bare agent's baseline gets: a user is
        # asked about until it is complete, then the next (polling every user
        # each time cost the worker a third of its event loop).
        while waiting and w.stats(waiting[0]).get("episodes") == expected[waiting[0]]:
            waiting.pop(0)
            if waiting:
                return False
        return not waiting
    t = time.perf_counter()
    asyncio.run(publish(settings, events))
    wait_for(all_visible, 600, f"{len(events)} episodes", every=0.05)
    return time.perf_counter() - t


def worker_run(broker: EmbeddedBroker, n: int, batch: int, tmp: Path) -> tuple[float, float]:
    with bench_worker(broker, tmp, projector_batch=batch) as (settings, w):
        probe = EpisodeRecorded(user_id="probe", episode_id="probe", text="probe", importance=0.1)
        asyncio.run(publish(settings, [probe]))
        wait_for(lambda: w.stats("probe").get("episodes") == 1, 60, "the worker to consume")
        elapsed = visible_after_publish(settings, w, episodes(n))
    return elapsed, asyncio.run(raw_consume(settings, n + 1))


def worker(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        batched, raw = worker_run(broker, n, 256, Path(tmp))
        single, _ = worker_run(broker, n, 1, Path(tmp))
    print(f"worker, {n} episodes, Tansu, publish → visible in the view (stats polled every 50 ms)")
    print(f"  REFLECT_PROJECTOR_BATCH=256  {rate(n, batched)}")
    print(f"  REFLECT_PROJECTOR_BATCH=1    {rate(n, single)}   batch/one = {single / batched:.1f}x")
    print(f"  baseline raw aiokafka consume {rate(n, raw)}   worker(256)/raw = {raw / batched:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=5000)
    args = parser.parse_args()
    core(args.episodes)
    worker(args.episodes)
