"""Ingest through the whole worker against the framework's and the box's limits.

    python tests/benchmarks/ingest.py [--episodes 5000] [--minilm 1000] [--probes 40]

Same episodes, same Tansu, same run:
- worker: `reflect worker` (validate → accumulate → project, hashing
  embedder), publish → all visible in the view;
- bare Faust agent counting events, the same with a table write per event,
  and three bare agents on the topic, as the worker's projector, accumulator
  and invalidator read it (tests/benchmarks/bare_agent.py): the framework's limit;
- raw aiokafka consumption of the topic: the box's limit;
- the hashing embedder alone on the texts;
- with `--minilm N`: the worker with the MiniLM embedder against MiniLM alone,
  on the short texts and on ~30-word conversational turns;
- latency: one episode at a time, publish → visible (polled every 5 ms), p50/p95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support
sys.path.insert(0, str(Path(__file__).resolve().parent))

from streams.adapters.factory import make_embedder  # noqa: E402
from projector_throughput import bench_worker, episodes, publish, raw_consume, visible_after_publish  # noqa: E402
from schemas import EpisodeRecorded  # noqa: E402
from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402
from suite_figures import figure, print_scenario, quantile, target  # noqa: E402
from support.harness import wait_for  # noqa: E402


def bare(broker: EmbeddedBroker, n: int, shape: str, tmp: Path) -> float:
    """Seconds for the bare app of this shape (`-`, `table`, `agents=N`: see bare_agent.py) to count n events."""
    tag = uuid.uuid4().hex[:6]
    settings = Settings.load(env={}, broker=broker.url, topic_episodes=f"bare-{tag}")
    asyncio.run(ensure_topics(settings))
    port = free_port()
    log = open(tmp / f"bare-{tag}.log", "wb")
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("bare_agent.py")), broker.url,
                              settings.topic_episodes, str(port), str(settings.partitions), str(tmp / tag),
                              shape], stdout=log, stderr=subprocess.STDOUT)

    def count() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=2) as answer:
                return json.loads(answer.read())["n"]
        except OSError:
            return -1
    try:
        probe = episodes(1)
        asyncio.run(publish(settings, probe))
        wait_for(lambda: count() == 1, 60, "the bare agent to consume")
        t = time.perf_counter()
        asyncio.run(publish(settings, episodes(n)))
        wait_for(lambda: count() == n + 1, 600, f"{n} events counted", every=0.05)
        return time.perf_counter() - t
    finally:
        child.kill()
        child.wait(10)


def embed_seconds(name: str, texts: list[str]) -> float:
    embedder = make_embedder(name)
    embedder.embed(texts[:8])  # load the model outside the timing
    t = time.perf_counter()
    for i in range(0, len(texts), 256):  # the projector's batch
        embedder.embed(texts[i:i + 256])
    return time.perf_counter() - t


SPEAKERS = ("I", "we", "my manager", "the on-call engineer", "our team", "the reviewer")
DOINGS = ("spent the morning chasing a flaky integration test that only fails on the second retry",
          "asked for the deploy logs before anyone touches the rollback button again",
          "moved the database migration to Tuesday because Friday releases keep going wrong",
          "reverted the pull request that changed how auth tokens are refreshed in staging",
          "wrote down why the cache latency doubled after the last schema change",
          "wants a dry run of every migration before it is applied to production")


def turns(n: int, users: int = 20) -> list[EpisodeRecorded]:
    """~30-word conversational turns, deterministic (what a chat agent records)."""
    out = []
    for i in range(n):
        text = (f"{SPEAKERS[i % len(SPEAKERS)]} {DOINGS[(i * 5) % len(DOINGS)]}, and later {SPEAKERS[(i + 2) % 6]} "
                f"said that {DOINGS[(i * 7 + 1) % len(DOINGS)]} (turn {i}).")
        out.append(EpisodeRecorded(user_id=f"user-{i % users}", episode_id=f"turn-{i}", text=text,
                                   importance=(i % 10) / 10))
    return out


def worker_rate(broker, tmp: Path, n: int, embedder: str, probes: int = 0,
                make=episodes) -> tuple[float, float, list[float]]:
    """(seconds for n visible, seconds raw consumption of the same topic, latency ms of single episodes)."""
    with bench_worker(broker, tmp, embedder=embedder, threshold=1e9) as (settings, w):
        probe = EpisodeRecorded(user_id="probe", episode_id="probe", text="probe", importance=0.1)
        asyncio.run(publish(settings, [probe]))
        wait_for(lambda: w.stats("probe").get("episodes") == 1, 120, "the worker to consume")
        elapsed = visible_after_publish(settings, w, make(n))
        latencies = []
        for i in range(probes):
            one = EpisodeRecorded(user_id="probe", episode_id=f"probe-{i}", text=f"probe {i}", importance=0.1)
            t = time.perf_counter()
            asyncio.run(publish(settings, [one]))
            wait_for(lambda: w.stats("probe").get("episodes") == i + 2, 30, "probe visible", every=0.005)
            latencies.append((time.perf_counter() - t) * 1000)
    return elapsed, asyncio.run(raw_consume(settings, n + 1)), latencies


def measure(n: int, minilm: int = 0, probes: int = 40) -> dict:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        tmp = Path(tmp)
        worker_s, raw_s, latencies = worker_rate(broker, tmp, n, "hashing", probes)
        bare_s = bare(broker, n, "-", tmp)
        table_s = bare(broker, n, "table", tmp)
        three_s = bare(broker, n, "agents=3", tmp)
        semantic = worker_rate(broker, tmp, minilm, "minilm")[0] if minilm else None
        chatty = worker_rate(broker, tmp, minilm, "minilm", make=turns)[0] if minilm else None
    texts = [e.text for e in episodes(max(n, minilm))]
    hashing_s = embed_seconds("hashing", texts[:n])
    worker = n / worker_s
    figures = [
        figure("worker, hashing embedder", worker, "episodes/s", "bare Faust agent", n / bare_s),
        figure("worker, hashing embedder", worker, "episodes/s", "bare agent + table per event", n / table_s),
        figure("worker, hashing embedder", worker, "episodes/s", "three bare agents on the topic", n / three_s),
        figure("worker, hashing embedder", worker, "episodes/s", "raw aiokafka consume", n / raw_s),
        figure("worker, hashing embedder", worker, "episodes/s", "hashing embedder alone", n / hashing_s),
        figure("publish → visible p50", quantile(latencies, 50), "ms"),
        figure("publish → visible p95", quantile(latencies, 95), "ms"),
    ]
    targets = [target("hashing ingest / bare Faust agent", worker / (n / bare_s), ">=", 1.0)]
    for label, worker_s, sample in ((("short texts", semantic, texts[:minilm]),
                                     ("~30-word turns", chatty, [e.text for e in turns(minilm)])) if minilm else ()):
        alone_s = embed_seconds("minilm", sample)
        figures.append(figure(f"worker, MiniLM, {label}", minilm / worker_s, "episodes/s",
                              "MiniLM embedder alone", minilm / alone_s))
        targets.append(target(f"MiniLM ingest / MiniLM embedder, {label}", alone_s / worker_s, ">=", 0.9))
    return {"episodes": n, "minilm_episodes": minilm, "figures": figures, "targets": targets}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=5000)
    parser.add_argument("--minilm", type=int, default=0, help="episodes through the MiniLM worker (0: skip)")
    parser.add_argument("--probes", type=int, default=40, help="single episodes timed for the latency")
    args = parser.parse_args()
    print_scenario("ingest", measure(args.episodes, args.minilm, args.probes))
