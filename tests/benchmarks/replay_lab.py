"""The replay lab on sample histories (issue 32): the same log gives an empty
diff, another reasoner a readable one, and what a replay costs.

    python tests/benchmarks/replay_lab.py [--seeds 7,11,12] [--episodes 2100] [--embedder minilm|hashing]
        [--reads 200] [--report FILE]

For each seed, one embedded Tansu and a `reflect worker` (offline reasoner,
the demo's settings) on streams/cli/sample.py's history of that seed; once every
cycle is done:

1. a rebuild of the view from the log (`POST /v1/admin/rebuild`), timed: the
   baseline;
2. `replay same` (offline reasoner, the same log), timed, then `reflect
   diff same`, which must be empty. The bar: replay ≤ 1.5 × rebuild + the
   cycles' own time (their `duration_ms`, summed off the side reflections
   topic);
3. on the first seed only, recall p95 over HTTP (`--reads` questions)
   alone and during a second offline replay, and `replay stand-in` with the
   Anthropic reasoner against tests/support/messages_api.py's stand-in (answering
   as the offline model, in this process): its diff report, as `reflect
   diff` prints it (`--report`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1]),
                str(Path(__file__).resolve().parents[2])]

import orjson  # noqa: E402

from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.cli.sample import history  # noqa: E402
from streams.producer import Publisher, make_episode  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402
from suite_figures import figure, print_scenario, target  # noqa: E402
from support.broker import read_topic  # noqa: E402
from support.harness import Worker, wait_for  # noqa: E402
from support.messages_api import MessagesServer, OfflineModel  # noqa: E402

QUESTIONS = ("what went wrong with the deploy?", "what does the user want before a retry?",
             "which pull requests were reverted?", "when does the user not ship?")


def settings_for(broker_url: str, data: Path, embedder: str) -> Settings:
    tag = uuid.uuid4().hex[:6]
    return Settings.load(env={}, broker=broker_url, app_id=f"lab-{tag}", topic_episodes=f"episodes-{tag}",
                         topic_requests=f"requests-{tag}", topic_reflections=f"reflections-{tag}",
                         data_dir=str(data), web_port=free_port(), embedder=embedder,
                         user_daily_tokens=0, daily_tokens=0, tenant_daily_tokens=0)


async def publish(settings: Settings, hist) -> None:
    async with Publisher(settings) as publisher:
        for e in hist.episodes:
            await publisher.publish(make_episode(hist.user_id, e.text, e.importance, episode_id=e.episode_id,
                                                 occurred_at=e.occurred_at, source=e.source))
        await publisher.flush()


def settled(worker: Worker, user: str, episodes: int) -> bool:
    stats = worker.stats(user)
    return stats.get("episodes") == episodes == stats.get("folded") and \
        stats.get("requests", 0) == stats.get("requests_done")


class Reads:
    """Recall over HTTP, one after the other on a thread, until stopped: latencies in ms."""

    def __init__(self, worker: Worker, user: str) -> None:
        self.worker, self.user, self.ms = worker, user, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        client, i = self.worker.client, 0
        while not self.stop.is_set():
            t = time.perf_counter()
            client.recall(self.user, QUESTIONS[i % len(QUESTIONS)])
            self.ms.append((time.perf_counter() - t) * 1000)
            i += 1

    def __enter__(self) -> "Reads":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)


def p95(ms: list[float]) -> float:
    return statistics.quantiles(ms, n=20)[-1] if len(ms) >= 20 else max(ms, default=0.0)


def reads_alone(worker: Worker, user: str, n: int) -> list[float]:
    with Reads(worker, user) as reads:
        wait_for(lambda: len(reads.ms) >= n, 300, f"{n} reads")
    return reads.ms


def rebuild_seconds(worker: Worker) -> float:
    client = worker.client
    client.start_rebuild()
    wait_for(lambda: client.rebuild_progress()["state"] in ("done", "failed"), 1800, "the rebuild", every=0.2)
    progress = client.rebuild_progress()
    assert progress["state"] == "done", progress
    return progress["seconds"]


def replay(worker: Worker, name: str, reasoner: str = "offline") -> dict:
    """A replay run to its end: its state."""
    client = worker.client
    client.start_replay(name, reasoner=reasoner)
    wait_for(lambda: client.replay(name)["state"] != "running", 3600, f"replay {name}", every=0.5)
    state = client.replay(name)
    assert state["state"] == "done", state
    return state


def cycles_seconds(settings: Settings, topic: str) -> float:
    """The cycles' own time on a reflections topic: their duration_ms, summed."""
    events = asyncio.run(read_topic(settings, topic, lambda r: orjson.loads(r.value), timeout=60))
    return sum(e.get("duration_ms", 0) for e in events if e.get("type") == "ReflectionCycleCompleted") / 1000


def diff_report(worker: Worker, name: str) -> str:
    shown = subprocess.run([sys.executable, "-m", "streams.cli", "diff", name, "--api", worker.client.api],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def one_seed(broker: EmbeddedBroker, tmp: Path, seed: int, episodes: int, embedder: str, reads: int,
             stand_in: MessagesServer | None) -> dict:
    hist = history(seed=seed, episodes=episodes)
    settings = settings_for(broker.url, tmp / f"seed-{seed}", embedder)
    asyncio.run(ensure_topics(settings))
    env = {"ANTHROPIC_API_KEY": "bench-key", "ANTHROPIC_BASE_URL": stand_in.url} if stand_in else {}
    worker = Worker(settings, tmp / f"seed-{seed}.log", env).start(timeout=180)
    try:
        t = time.perf_counter()
        asyncio.run(publish(settings, hist))
        wait_for(lambda: settled(worker, hist.user_id, len(hist.episodes)), 1800, f"seed {seed} settled", every=0.5)
        print(f"seed {seed}: {len(hist.episodes)} episodes and their cycles in {time.perf_counter() - t:.1f} s",
              file=sys.stderr)
        rebuilt = rebuild_seconds(worker)
        state = replay(worker, "same")
        side = dataclasses.replace(settings, topic_reflections=state["topics"][1])
        own = cycles_seconds(side, side.topic_reflections)
        found = worker.client.replay_diff("same")
        out = {"seed": seed, "episodes": len(hist.episodes), "rebuild_s": rebuilt, "replay_s": state["seconds"],
               "cycles_s": round(own, 1), "cycles": state["estimate"]["cycles"],
               "diff": {k: len(v) if isinstance(v, list) else v for k, v in found.items()}}
        if stand_in:
            # Reads alone, then during another offline replay (the timed one ran without them; the
            # stand-in's model computes its answers in this process, so not during that one).
            alone = reads_alone(worker, hist.user_id, reads)
            with Reads(worker, hist.user_id) as during:
                replay(worker, "again")
            replay(worker, "stand-in", reasoner="anthropic")
            out |= {"read_p95_ms": round(p95(alone), 1), "read_p95_replaying_ms": round(p95(during.ms), 1),
                    "reads_replaying": len(during.ms), "stand_in_report": diff_report(worker, "stand-in")}
        print(f"seed {seed}: {out}", file=sys.stderr)
        return out
    finally:
        worker.stop(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="7,11,12")
    parser.add_argument("--episodes", type=int, default=2100)
    parser.add_argument("--embedder", default="minilm", choices=("minilm", "hashing"))
    parser.add_argument("--reads", type=int, default=200, help="reads measured with nothing else running")
    parser.add_argument("--report", default=None, help="write the stand-in's diff report there")
    parser.add_argument("--broker", default="noida", choices=("noida", "tansu"),
                        help="the embedded broker (noida-db: reflect up's)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the workers' data and logs there")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = []
    keep = contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory()
    with keep as tmp, EmbeddedBroker(kind=args.broker) as broker:
        stand_in = MessagesServer(OfflineModel())
        try:
            for i, seed in enumerate(seeds):
                runs.append(one_seed(broker, Path(tmp), seed, args.episodes, args.embedder, args.reads,
                                     stand_in if i == 0 else None))
        finally:
            stand_in.close()
    if args.report:
        Path(args.report).write_text(runs[0]["stand_in_report"])
    figures, targets = [], []
    for r in runs:
        bar = 1.5 * r["rebuild_s"] + r["cycles_s"]
        figures.append(figure(f"seed {r['seed']}: replay", r["replay_s"], "s", "1.5 × rebuild + cycles' own time",
                              bar))
        targets += [target(f"seed {r['seed']}: diff of the same log empty",
                           float(not (r["diff"]["added"] or r["diff"]["dropped"] or r["diff"]["changed"])), ">=", 1.0),
                    target(f"seed {r['seed']}: replay / (1.5 × rebuild + cycles)", r["replay_s"] / bar, "<=", 1.0)]
    first = runs[0]
    figures.append(figure("recall p95 during a replay", first["read_p95_replaying_ms"], "ms", "recall p95 alone",
                          first["read_p95_ms"]))
    targets.append(target("recall p95 replaying / alone", first["read_p95_replaying_ms"] / first["read_p95_ms"],
                          "<=", 1.5))
    print_scenario(f"Replay lab ({args.episodes} episodes a history, {args.embedder})",
                   {"figures": figures, "targets": targets})
    for r in runs:
        print({k: v for k, v in r.items() if k != "stand_in_report"})
    print(runs[0]["stand_in_report"])


if __name__ == "__main__":
    main()
