"""Ingest through the whole worker against the framework's and the box's limits.

    python tests/benchmarks/ingest.py [--episodes 5000]

Same episodes, same Tansu, same run:
- worker: `reflect worker` (validate → accumulate → project, hashing embedder),
  publish → all visible in the view;
- bare Faust agent counting events, and the same with a table write per event
  (tests/benchmarks/bare_agent.py): the framework's limit;
- raw aiokafka consumption of the topic: the box's limit;
- the hashing embedder alone on the texts.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for conftest helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import wait_for  # noqa: E402
from processors.embedders import HashingEmbedder  # noqa: E402
from projector_throughput import episodes, publish, worker_run  # noqa: E402
from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402


def bare(broker: EmbeddedBroker, n: int, with_table: bool, tmp: Path) -> float:
    tag = uuid.uuid4().hex[:6]
    settings = Settings.load(env={}, broker=broker.url, topic_episodes=f"bare-{tag}")
    asyncio.run(ensure_topics(settings))
    port = free_port()
    log = open(tmp / f"bare-{tag}.log", "wb")
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("bare_agent.py")), broker.url,
                              settings.topic_episodes, str(port), str(settings.partitions),
                              "table" if with_table else "-"], stdout=log, stderr=subprocess.STDOUT)

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


def main(n: int) -> None:
    texts = [e.text for e in episodes(n)]
    t = time.perf_counter()
    HashingEmbedder().embed(texts)
    embed_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        worker_s, raw_s = worker_run(broker, n, 256, Path(tmp))
        bare_s = bare(broker, n, False, Path(tmp))
        table_s = bare(broker, n, True, Path(tmp))
    worker = n / worker_s
    print(f"ingest, {n} episodes, Tansu, publish → done (2 cores, shared)")
    print(f"  reflect worker (hashing)        {worker:10,.0f}/s")
    for name, seconds in (("bare Faust agent", bare_s), ("bare agent + table per event", table_s),
                          ("raw aiokafka consume", raw_s), ("hashing embedder alone", embed_s)):
        print(f"  baseline {name:<28} {n / seconds:10,.0f}/s   worker/baseline = {worker / (n / seconds):.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=5000)
    main(parser.parse_args().episodes)
