"""A real conversational import through the HTTP API, with and without cycles (issue 30).

    python tests/benchmarks/realtalk_import.py [--conversations 2] [--posters 8] [--delay 5]
        [--fresh stand-in,offline] [--embedder minilm|hashing] [--challenge on|off] [--data DIR] [--json]
    reflect bench --only import          (opt-in: not in a plain `reflect bench`)

REALTALK's conversations (tests/benchmarks/realtalk.py; the first N, each
one user, every turn one episode at the turn's time, importance 0.5) are
POSTed to `POST /v1/users/{user}/episodes` by `--posters` concurrent posters
per user, each taking the user's next turn: they reach the log a little out
of valid-time order, as a real import does. One embedded Tansu broker, one
run, each import on its own topics, group and data dir, a `reflect worker`
with the MiniLM embedder:

1. MiniLM alone on the same turn texts, in the projector's batches
   (`REFLECT_PROJECTOR_BATCH`, 256), in this process: texts/s, the best of
   three passes;
2. reasoner off: `REFLECT_THRESHOLD=1e9`, so no cycle is ever asked;
3. stand-in: `REFLECT_REASONER=anthropic` against tests/support/messages_api.py's
   Messages API server answering as the offline model after `--delay`
   seconds a call (the model's CPU is in this process, measured apart), the
   trigger on its defaults (threshold 15, 50 high-salience episodes: with
   importance 0.5, a cycle every 30 turns of a user after its first 50);
4. offline: `REFLECT_REASONER=offline`, the same trigger; its cycles run in
   the worker, sharing the box's cores with the ingest.

The end-to-end rate of an import is turns / (first post → every episode in
the view, `GET /v1/users/{u}/stats` `episodes` polled every 0.1 s). Cycles
still running then are not waited for in that figure.

Determinism (`--fresh`): once an import's cycles are all done (each user's
requests asked = done = what the trigger asks of its turns, and every
request on the log answered by its ReflectionCycleCompleted) its worker is
stopped and its view read; then a fresh worker (new app id, group, data dir)
consumes the same episodes log from the start, and its beliefs — ids, text,
evidence set, depth, confidence, support, status — and episodes are compared
with the first's: the same log, since concurrent posters order each import's
log differently. Twice: `recomputed`, with requests and reflections topics
of its own, so it runs every cycle again (and each belief must come from the
same cycle); `shared`, on the same three topics, which also projects the
first run's beliefs off the reflections topic. For the stand-in run the model answers at once after the import
is measured (beliefs do not depend on its delay), so the run takes minutes,
not the cycles × 2 calls × 5 s of a real model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1]),
                str(Path(__file__).resolve().parents[2])]

import orjson  # noqa: E402

import realtalk  # noqa: E402
from processors.accumulator import Accumulator, Trigger, admit  # noqa: E402
from streams.adapters.factory import make_embedder  # noqa: E402
from streams.adapters.view.edge import EdgeView  # noqa: E402
from schemas import EpisodeRecorded  # noqa: E402
from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.client import AsyncReflectClient  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402
from suite_figures import figure, print_scenario, target  # noqa: E402
from support.broker import read_topic  # noqa: E402
from support.harness import Worker, wait_for  # noqa: E402
from support.messages_api import MessagesServer, OfflineModel  # noqa: E402

IMPORTANCE = 0.5  # the data rates no turn above another
OFF = 1e9  # a threshold no import reaches: the reasoner off
EMBEDDERS = {"minilm": "MiniLM", "hashing": "hashing"}  # --embedder: name → label
POLL = 0.1  # seconds between two visibility polls
TRANSACTION_TIME = ("recorded_at", "created_at", "history", "reinforced_at", "weakened_at", "expired_at")
WAITED = re.compile(r"waited .* for the user's cycles")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Model:
    """The stand-in's answers (the offline model), with the CPU they cost in this process."""

    def __init__(self) -> None:
        self.offline, self.lock = OfflineModel(), threading.Lock()
        self.calls, self.cpu = 0, 0.0

    def __call__(self, body: dict):
        t = time.thread_time()  # the server answers each request on its own thread
        answer = self.offline(body)
        with self.lock:
            self.calls += 1
            self.cpu += time.thread_time() - t
        return answer


def embed_alone(texts: list[str], batch: int, name: str = "minilm", passes: int = 3) -> tuple[float, float]:
    """texts/s of the embedder alone, in the projector's batches, and the CPU
    seconds it took: the best of a few passes (one pass moved 110-136 texts/s
    between runs on a quiet box)."""
    embedder = make_embedder(name)
    embedder.embed(texts[:8])  # the model loaded outside the timing
    best = (0.0, 0.0)
    for _ in range(passes):
        t, cpu = time.perf_counter(), time.process_time()
        for i in range(0, len(texts), batch):
            embedder.embed(texts[i:i + batch])
        best = max(best, (len(texts) / (time.perf_counter() - t), time.process_time() - cpu))
    return best


def cpu_bound(run: dict, alone: float) -> float:
    """The highest import / embedder-alone ratio the import's CPU allows on
    this box's cores: it cannot end before its worker, posters and broker
    have had their CPU seconds, all cores busy."""
    spent = run["worker_cpu_s"] + run["bench_cpu_s"] + run["broker_cpu_s"]
    return (run["turns"] / alone) * (os.cpu_count() or 1) / spent


def expected_requests(convs, settings: Settings) -> dict[str, int]:
    """What the trigger asks of each user's turns (importance alike: the order does not matter)."""
    trigger, out = Trigger.from_settings(settings), {}
    for c in convs:
        acc = Accumulator()
        for t in c.turns:
            acc, _ = admit(acc, EpisodeRecorded(user_id=c.id, episode_id=t.id, text=t.text, importance=IMPORTANCE,
                                                occurred_at=t.occurred_at), trigger)
        out[c.id] = acc.asked
    return out


async def post_all(api: str, convs, posters: int) -> list[str]:
    """Every turn POSTed, `posters` at a time per user, each poster taking the user's next turn."""
    errors: list[str] = []

    async def user(conv, client):
        turns = iter(conv.turns)

        async def poster():
            for t in turns:  # shared: the next turn not yet taken
                try:
                    await client.record(conv.id, t.text, IMPORTANCE, episode_id=t.id, occurred_at=t.occurred_at)
                except Exception as exc:  # reported, and the import fails on it
                    errors.append(f"{t.id}: {exc!r}")
        await asyncio.gather(*(poster() for _ in range(posters)))

    clients = [AsyncReflectClient(api, env={}, timeout=30) for _ in convs]
    try:
        await asyncio.gather(*(user(c, client) for c, client in zip(convs, clients)))
    finally:
        for client in clients:
            await client.aclose()
    return errors


def read_events(settings: Settings, topic: str) -> list[dict]:
    return asyncio.run(read_topic(settings, topic, lambda r: orjson.loads(r.value), timeout=120))


def settled(worker: Worker, expected: dict[str, int], turns: dict[str, int]) -> dict:
    """Users not settled yet ({} when all are): episodes all in the view, the
    requests the trigger asks all asked, and all done."""
    out = {}
    for u, n in expected.items():
        s = worker.stats(u)
        if (s.get("episodes"), s.get("requests"), s.get("requests_done")) != (turns[u], n, n):
            out[u] = {k: s.get(k) for k in ("episodes", "requests", "requests_done")}
    return out


def snapshot(settings: Settings, users, dim: int) -> dict[str, dict[str, dict]]:
    """{user: {point id: payload}} of a stopped worker's view, less transaction times
    (when it ran, not what it decided), evidence as sets (ties in a rerank may reorder it)."""
    view = EdgeView(settings.view_dir, settings.view, dim)
    try:
        out = {}
        for u in users:
            out[u] = {}
            for pid, p in view.scroll(u):
                p = {k: v for k, v in p.items() if k not in TRANSACTION_TIME}
                for key in ("evidence_ids", "lost_evidence_ids"):
                    if key in p:
                        p[key] = sorted(p[key])
                out[u][pid] = p
        return out
    finally:
        view.close()


def created(settings: Settings) -> dict[str, str]:
    """reflection id → the cycle that made it, off a reflections topic."""
    return {e["reflection_id"]: e["cycle_id"] for e in read_events(settings, settings.topic_reflections)
            if e["type"] == "ReflectionCreated"}


def beliefs_of(snap: dict) -> dict[str, dict]:
    return {p["reflection_id"]: p for points in snap.values() for p in points.values() if p["kind"] == "reflection"}


def compare(one: dict, other: dict) -> dict:
    """The two views' beliefs and episodes, compared."""
    a, b = beliefs_of(one), beliefs_of(other)
    core = ("text", "evidence_ids", "status")
    differ = sorted(r for r in a.keys() | b.keys() if a.get(r) != b.get(r))
    differ_core = sorted(r for r in a.keys() & b.keys() if any(a[r].get(k) != b[r].get(k) for k in core))
    episodes = [{pid: p for points in snap.values() for pid, p in points.items() if p["kind"] == "episode"}
                for snap in (one, other)]
    return {"beliefs": len(a), "beliefs_fresh": len(b), "live": sum(p["status"] == "live" for p in a.values()),
            "deepest": max((p.get("depth", 1) for p in a.values()), default=0),
            "only_first": sorted(a.keys() - b.keys())[:10], "only_fresh": sorted(b.keys() - a.keys())[:10],
            "differ": len(differ), "differ_core": len(differ_core),
            "examples": {r: {k: (a.get(r, {}).get(k), b.get(r, {}).get(k))
                             for k in sorted(a.get(r, {}).keys() | b.get(r, {}).keys())
                             if a.get(r, {}).get(k) != b.get(r, {}).get(k)} for r in differ[:3]},
            "episodes_same": episodes[0] == episodes[1], "identical": not differ and episodes[0] == episodes[1]}


class Import:
    """One import on its own topics, group and data dir: the worker, the posts, the figures."""

    def __init__(self, name: str, broker, tmp: Path, convs, posters: int, env: dict[str, str],
                 embedder: str = "minilm", **overrides):
        tag = uuid.uuid4().hex[:6]
        self.name, self.tmp, self.convs, self.posters, self.env = name, tmp, convs, posters, env
        self.broker_pid = broker.process.pid
        self.settings = Settings.load(
            env={}, broker=broker.url, app_id=f"import-{name}-{tag}", topic_episodes=f"episodes-{tag}",
            topic_requests=f"reflection-requests-{tag}", topic_reflections=f"reflections-{tag}",
            data_dir=str(tmp / f"{name}-{tag}"), web_port=free_port(), embedder=embedder,
            user_daily_tokens=0, daily_tokens=0, **overrides)
        asyncio.run(ensure_topics(self.settings))
        self.turns = {c.id: len(c.turns) for c in convs}
        self.expected = expected_requests(convs, self.settings)
        self.workers: list[Worker] = []

    def start(self, settings: Settings, label: str) -> Worker:
        w = Worker(settings, self.tmp / f"{label}.log", self.env)
        self.workers.append(w)
        return w.start(timeout=180)

    def run(self, model: Model | None = None) -> dict:
        """Post every turn; seconds until all are visible, and what the worker did meanwhile."""
        w = self.worker = self.start(self.settings, self.name)
        users, n = list(self.turns), sum(self.turns.values())
        cpu0, here0, calls0 = cpu_seconds(w.process.pid), time.process_time(), model.calls if model else 0
        broker0 = cpu_seconds(self.broker_pid)
        model_cpu0 = model.cpu if model else 0.0
        t0 = time.perf_counter()
        errors = asyncio.run(post_all(f"http://127.0.0.1:{self.settings.web_port}", self.convs, self.posters))
        posted = time.perf_counter() - t0
        assert not errors, f"{len(errors)} posts failed: {errors[:3]}"
        waiting = list(users)

        def visible() -> bool:
            while waiting and w.alive() and w.stats(waiting[0]).get("episodes") == self.turns[waiting[0]]:
                waiting.pop(0)
            return not waiting
        wait_for(visible, max(300.0, n / 2), f"{self.name}: every turn in the view", every=POLL)
        seconds = time.perf_counter() - t0
        stats = {u: w.stats(u) for u in users}
        out = {"turns": n, "seconds": round(seconds, 2), "rate": n / seconds, "posted_s": round(posted, 2),
               "worker_cpu_s": round(cpu_seconds(w.process.pid) - cpu0, 1),
               "bench_cpu_s": round(time.process_time() - here0, 1),
               "broker_cpu_s": round(cpu_seconds(self.broker_pid) - broker0, 1),
               "requests_asked": sum(s.get("requests", 0) for s in stats.values()),
               "requests_done": sum(s.get("requests_done", 0) for s in stats.values()),
               "requests_expected": sum(self.expected.values())}
        if model:
            out |= {"model_calls": model.calls - calls0, "model_cpu_s": round(model.cpu - model_cpu0, 2)}
        return out

    def wait_settled(self, timeout: float, what: str) -> None:
        last = {}

        def done() -> bool:
            last["missing"] = settled(self.worker, self.expected, self.turns)
            return self.worker.alive() and not last["missing"]
        try:
            wait_for(done, timeout, what, every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; not settled: {last.get('missing')}; log: {self.worker.tail(10)}") from None

    def settle(self, timeout: float) -> dict:
        """Waits until every cycle is done and answered on the log; its outcomes."""
        t, cpu = time.perf_counter(), cpu_seconds(self.worker.process.pid)
        self.wait_settled(timeout, f"{self.name}: every cycle done")
        waited, cpu = time.perf_counter() - t, cpu_seconds(self.worker.process.pid) - cpu
        requests = {e["cycle_id"] for e in read_events(self.settings, self.settings.topic_requests)
                    if e["type"] == "ReflectionRequested"}
        completed = [e for e in read_events(self.settings, self.settings.topic_reflections)
                     if e["type"] == "ReflectionCycleCompleted"]
        unanswered = requests - {e["cycle_id"] for e in completed}
        assert not unanswered, f"{self.name}: requests never answered: {sorted(unanswered)[:5]}"
        return {"settle_s": round(waited, 1), "settle_cpu_s": round(cpu, 1), "cycles": len(requests),
                "outcomes": dict(Counter(e.get("outcome") for e in completed))}

    def fresh(self, dim: int, timeout: float) -> dict[str, dict]:
        """The first worker stopped and its view read; then, each from the start
        of the same episodes log, a fresh worker (new app id, group, data dir)
        `shared`: on the same three topics, as the brief puts it — it also
        reads the first run's beliefs off the reflections topic; `recomputed`:
        with requests and reflections topics of its own, so every cycle is
        run again and its beliefs are its own. Each view against the first's."""
        self.worker.stop()
        users = list(self.turns)
        first = snapshot(self.settings, users, dim)
        made = created(self.settings)
        out = {}
        for variant in ("recomputed", "shared"):
            tag = f"{variant}-{uuid.uuid4().hex[:4]}"
            settings = dataclasses.replace(self.settings, app_id=f"{self.settings.app_id}-{tag}",
                                           data_dir=f"{self.settings.data_dir}-{tag}", web_port=free_port())
            if variant == "recomputed":
                settings = dataclasses.replace(settings, topic_requests=f"{settings.topic_requests}-{tag}",
                                               topic_reflections=f"{settings.topic_reflections}-{tag}")
                asyncio.run(ensure_topics(settings))
            t = time.perf_counter()
            self.worker = self.start(settings, f"{self.name}-{tag}")
            self.wait_settled(timeout, f"{self.name}: the fresh worker ({variant}) settled")
            seconds, cpu = time.perf_counter() - t, cpu_seconds(self.worker.process.pid)
            self.worker.stop()
            out[variant] = {"fresh_s": round(seconds, 1), "fresh_cpu_s": round(cpu, 1),
                            **compare(first, snapshot(settings, users, dim))}
            if variant == "recomputed":  # and each belief made by the same cycle
                again = created(settings)
                out[variant]["same_cycles"] = again == made
                out[variant]["identical"] = out[variant]["identical"] and again == made
        return out

    def waited_lines(self) -> int:
        """Worker log lines saying a batch waited for its user's cycles (every worker of this import)."""
        return sum(len(WAITED.findall(w.log_path.read_text(errors="replace"))) for w in self.workers)

    def stop(self) -> None:
        for w in self.workers:
            if w.process is not None:
                w.stop()


def measure(conversations: int = 2, posters: int = 8, delay: float = 5.0, fresh=("stand-in", "offline"),
            data: str | None = None, keep: str | None = None, embedder: str = "minilm",
            challenge: str | None = None) -> dict:
    convs = realtalk.load(data)[:conversations]
    texts = [t.text for c in convs for t in c.turns]
    batch = Settings.load(env={}).projector_batch
    (alone, alone_cpu), label = embed_alone(texts, batch, embedder), EMBEDDERS[embedder]
    print(f"{label} alone: {alone:.1f} texts/s over {len(texts)} turns (batches of {batch}), {alone_cpu:.1f} s "
          "of CPU", file=sys.stderr)
    dim = make_embedder(embedder).dim
    model = Model()
    api = MessagesServer(model, delay=delay)
    runs: dict[str, dict] = {}
    checks: dict[str, dict] = {}
    with work_dir(keep) as tmp, EmbeddedBroker() as broker:
        tmp = Path(tmp)
        stand_in_env = {"ANTHROPIC_API_KEY": "bench-key", "ANTHROPIC_BASE_URL": api.url}
        plan = (("off", {}, {"threshold": OFF}),
                ("stand-in", stand_in_env, {"reasoner": "anthropic"}),
                ("offline", {}, {"reasoner": "offline"}))
        try:
            for name, env, overrides in plan:
                gate = {} if challenge is None else {"challenge": challenge}
                run = Import(name, broker, tmp, convs, posters, env, embedder, **overrides, **gate)
                try:
                    api.delay = delay
                    runs[name] = run.run(model if name == "stand-in" else None)
                    print(f"{name}: {runs[name]}", file=sys.stderr)
                    if name != "off" and name in fresh:
                        api.delay = 0.0  # measured: the remaining cycles need not take 5 s a call
                        runs[name] |= run.settle(timeout=1800)
                        checks[name] = run.fresh(dim, timeout=1800)
                        print(f"{name} fresh worker: {checks[name]}", file=sys.stderr)
                    runs[name]["waited_lines"] = run.waited_lines()
                    runs[name]["cpu_bound"] = round(cpu_bound(runs[name], alone), 3)
                finally:
                    run.stop()
        finally:
            api.close()
    n = len(texts)
    off, stand, offline = runs["off"]["rate"], runs["stand-in"]["rate"], runs["offline"]["rate"]
    figures = [figure(f"{label} embedder alone", alone, "texts/s"),
               figure("import, reasoner off", off, "episodes/s", f"{label} alone", alone),
               figure(f"import, stand-in ({delay:g} s a call)", stand, "episodes/s", f"{label} alone", alone),
               figure(f"import, stand-in ({delay:g} s a call)", stand, "episodes/s", "import, reasoner off", off),
               figure("import, offline reasoner", offline, "episodes/s", f"{label} alone", alone),
               figure("import, offline reasoner", offline, "episodes/s", "import, reasoner off", off)]
    figures += [figure(f"import, {name}: most {label} alone its CPU allows", run["cpu_bound"], "×")
                for name, run in runs.items()]
    targets = [target(f"import (stand-in) / {label} alone", stand / alone, ">=", 0.8),
               target("import (stand-in) / import (reasoner off)", stand / off, ">=", 0.9)]
    for name, check in checks.items():
        for variant, c in check.items():
            figures.append(figure(f"{name}, fresh worker ({variant}): beliefs", c["beliefs_fresh"], "beliefs",
                                  "the first worker's", c["beliefs"]))
            targets.append(target(f"{name}: fresh worker's beliefs identical ({variant})", float(c["identical"]),
                                  ">=", 1.0))
    return {"data": f"{realtalk.SOURCE}@{realtalk.SOURCE_COMMIT[:12]}",
            "conversations": [c.name for c in convs], "turns": n, "posters_per_user": posters, "delay_s": delay,
            "embed_batch": batch, "alone_cpu_s": round(alone_cpu, 1), "runs": runs, "determinism": checks,
            "figures": figures, "targets": targets}


def work_dir(keep: str | None):
    """`keep` (made if need be, left after), else a temporary directory."""
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return contextlib.nullcontext(keep)
    return tempfile.TemporaryDirectory()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=2, help="the first N of REALTALK's 10 (2: 929 turns)")
    parser.add_argument("--posters", type=int, default=8, help="concurrent posts per user")
    parser.add_argument("--delay", type=float, default=5.0, help="seconds the stand-in model takes a call")
    parser.add_argument("--fresh", default="stand-in,offline",
                        help="imports whose log a fresh worker consumes again (comma-separated; '' for none)")
    parser.add_argument("--data", default=None, help="REALTALK's data/ files, or a git snapshot (realtalk.py)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the workers' data and logs there")
    parser.add_argument("--embedder", default="minilm", choices=sorted(EMBEDDERS),
                        help="the workers' and the baseline's (hashing: what the rest of an import costs)")
    parser.add_argument("--challenge", choices=("on", "off"), default=None,
                        help="the contradiction gate (REFLECT_CHALLENGE) in every import (default: the setting's)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    result = measure(args.conversations, args.posters, args.delay,
                     tuple(x for x in args.fresh.split(",") if x), args.data, args.keep, args.embedder,
                     args.challenge)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return
    print_scenario(f"REALTALK import ({result['turns']} turns of {len(result['conversations'])} conversations, "
                   f"{args.posters} posters a user)", result)
    for name, r in result["runs"].items():
        print(f"  {name}: {r}")
    for name, check in result["determinism"].items():
        for variant, c in check.items():
            print(f"  {name}, fresh worker on the same log ({variant}): beliefs identical "
                  f"{'yes' if c['identical'] else 'NO'} ({c['beliefs']} beliefs, {c['live']} live, depth ≤ "
                  f"{c['deepest']}; fresh {c['beliefs_fresh']}; differ {c['differ']}, in text/evidence/status "
                  f"{c['differ_core']}; episodes same {c['episodes_same']}"
                  + (f"; each made by the same cycle {c['same_cycles']}" if "same_cycles" in c else "")
                  + f"; {c['fresh_s']} s) {c['examples'] if c['differ'] else ''}")


if __name__ == "__main__":
    main()
