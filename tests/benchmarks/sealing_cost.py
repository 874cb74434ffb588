"""What crypto-shredding costs: the same episodes through a worker with
REFLECT_SEAL=on against one with it off, on one broker, in one run.

    python tests/benchmarks/sealing_cost.py [--episodes 2000] [--users 4] [--reads 200]
        [--embedder hashing|minilm] [--rounds 2]

Per round, off and on, in turns first (each on its own topics and data dir,
cycles off):
- ingest: the episodes POSTed over HTTP, 8 posters a user (the worker seals
  each before it goes on the log: a new data key on the key topic, then the
  episode), seconds until every one is in the view;
- read: recall over HTTP, one at a time, p50 and p95 (reads open nothing:
  the view holds what the worker opened);
- rebuild: `reflect rebuild` (every record on the log opened again).
The figures are on's against off's; the texts are streams/cli/sample.py's
histories (seeds 7, 8, …), the hashing embedder by default so that what
sealing adds is not hidden under MiniLM's time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realtalk_import import post_all  # noqa: E402
from replay_lab import QUESTIONS  # noqa: E402
from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.cli.sample import history  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402
from suite_figures import figure, print_scenario, quantile  # noqa: E402
from support.harness import Worker, wait_for  # noqa: E402

POSTERS = 8


def conversations(users: int, episodes: int) -> list:
    """One sample history a user, as the import's posters take them."""
    out = []
    for u in range(users):
        h = history(seed=7 + u, episodes=episodes, user_id=f"user-{u}")
        out.append(SimpleNamespace(id=h.user_id, turns=[
            SimpleNamespace(id=e.episode_id, text=e.text, occurred_at=e.occurred_at) for e in h.episodes]))
    return out


def one(broker: EmbeddedBroker, tmp: Path, seal: str, convs, embedder: str, reads: int) -> dict:
    tag = uuid.uuid4().hex[:6]
    settings = Settings.load(env={}, broker=broker.url, app_id=f"seal-{seal}-{tag}", topic_episodes=f"episodes-{tag}",
                             topic_requests=f"reflection-requests-{tag}", topic_reflections=f"reflections-{tag}",
                             data_dir=str(tmp / tag), web_port=free_port(), embedder=embedder, seal=seal,
                             threshold=1e9)
    asyncio.run(ensure_topics(settings))
    w = Worker(settings, tmp / f"worker-{tag}.log").start(timeout=180)
    try:
        n = sum(len(c.turns) for c in convs)
        t0 = time.perf_counter()
        errors = asyncio.run(post_all(f"http://127.0.0.1:{settings.web_port}", convs, POSTERS))
        assert not errors, errors[:3]
        waiting = [c.id for c in convs]

        def visible() -> bool:
            while waiting and w.stats(waiting[0]).get("episodes") == len(convs[0].turns):
                waiting.pop(0)
            return not waiting
        wait_for(visible, 600, f"seal {seal}: every episode in the view", every=0.05)
        ingest = n / (time.perf_counter() - t0)
        client, ms = w.client, []
        for i in range(reads):
            t = time.perf_counter()
            client.recall(convs[i % len(convs)].id, QUESTIONS[i % len(QUESTIONS)])
            ms.append((time.perf_counter() - t) * 1000)
        done = subprocess.run([sys.executable, "-m", "streams.cli", "rebuild", "--api",
                               f"http://127.0.0.1:{settings.web_port}"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        rebuild = w.get("/v1/admin/rebuild")["rate"]
        return {"ingest": ingest, "p50": quantile(ms, 50), "p95": quantile(ms, 95), "rebuild": rebuild}
    finally:
        w.stop()


def measure(episodes: int = 500, users: int = 4, reads: int = 200, embedder: str = "hashing",
            rounds: int = 2) -> dict:
    convs = conversations(users, episodes)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        for r in range(rounds):
            for seal in ("off", "on") if r % 2 == 0 else ("on", "off"):  # neither always first
                runs[seal].append(one(broker, Path(tmp), seal, convs, embedder, reads))
                print(f"round {r + 1}, seal {seal}: {runs[seal][-1]}", file=sys.stderr)

    def median(seal: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[seal])
    n = users * episodes
    return {"episodes": n, "embedder": embedder, "runs": runs, "figures": [
        figure("ingest over HTTP, sealed", median("on", "ingest"), "episodes/s", "in clear", median("off", "ingest")),
        figure("recall p50, sealed", median("on", "p50"), "ms", "in clear", median("off", "p50")),
        figure("recall p95, sealed", median("on", "p95"), "ms", "in clear", median("off", "p95")),
        figure("rebuild, sealed", median("on", "rebuild"), "events/s", "in clear", median("off", "rebuild"))]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=500, help="per user")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--embedder", default="hashing", choices=("hashing", "minilm"))
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print_scenario("sealing", measure(args.episodes, args.users, args.reads, args.embedder, args.rounds))
