"""Read latency of the belief layer: pinned beliefs and recall, in-process and over HTTP.

    python tests/benchmarks/read_latency.py [--users 100] [--episodes 5000] [--beliefs 20] [--n 200] [--quick]
                                            [--optimized [SHARE]] [--questions hashing|minilm]

1. build: a store of users × episodes (default 100 × 5000 = 500k) plus
   `--beliefs` beliefs per user (each citing 3–8 of its user's episodes),
   written straight into a Qdrant Edge view at <tmp>/data/view ("reflect")
   with the projector's payloads and hashing-embedder vectors; build time and
   points/s. `--optimized SHARE`: the view is optimized once that share of
   every user's records is in (1: as `reflect rebuild` leaves it; 0.67: a
   live view compacted at REFLECT_COMPACT_GROWTH 0.5, just before its next
   compaction); without, never (grown live, with compaction off).
2. in-process, the view reopened: first the first reads of every user (cold:
   whichever read touches a user's points first pays for faulting them in);
   then, warm, N random (user, question) pairs, round robin with the order
   rotated each pair so noise and cache order hit every read alike: p50/p95/p99 of
   `live_beliefs(limit=50)`, `recall(mode="instance")`, `recall(mode="pattern")`;
   baseline in the same run: read-time synthesis, the pattern question answered
   from raw episodes only (embed, one search of 40 episodes, rerank to 10,
   group by the terms they share). Then where recall's
   time goes: the real `recall` with its view, embedder, `_search`,
   `_evidence` and `rerank` wrapped in timers (and, inside the view calls,
   Edge's own query/retrieve vs the Python around them).
3. HTTP: a real `reflect worker` on a real Tansu, opening the same view
   directory; first requests of every user (cold), then p50/p95/p99 of
   GET /beliefs?limit=50 and /recall (pattern, instance) for the same pairs,
   one connection per request (urllib, no keep-alive), each answer checked
   against the in-process one; baseline: GET /healthz on the same worker.
   HTTP overhead = HTTP − in-process.
4. memory: the peak RSS (VmHWM) of that worker after serving every user,
   against a worker of the same settings over an empty view in the same run.

The machine is shared and noisy: compare the ratios, not the times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402

import processors.retrieval as retrieval  # noqa: E402
from processors.embedders import HashingEmbedder  # noqa: E402
from streams.adapters.factory import make_embedder  # noqa: E402
from processors.projector import episode_payload, point_id, reflection_payload  # noqa: E402
from processors.extractive import THEME_CUT, generalized, themes  # noqa: E402
from processors.reflection import Candidate, Weights, rerank  # noqa: E402
from processors.retrieval import recall  # noqa: E402
from processors.ports import ViewPoint  # noqa: E402
from streams.adapters.view.edge import EdgeView  # noqa: E402
from schemas import EpisodeRecorded, ReflectionCreated  # noqa: E402
from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.http.routes.beliefs import live_beliefs  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402
from suite_figures import figure, print_scenario, target  # noqa: E402
from support.harness import Worker  # noqa: E402

DIM, VIEW, BATCH = 384, "reflect", 2000
SYNTHESIS = "baseline read-time synthesis"
# The baseline's Python rerank (what recall did before the engine's formula).
RECALL_WEIGHTS = Weights(recency=0.5, importance=0.5, similarity=2.0)
VERBS = ("retried fixed reverted merged reviewed deployed skipped pinned bumped rolled cached mocked "
         "rebased squashed profiled refactored linted debugged").split()
NOUNS = ("flaky test, auth token, db migration, redis cache, staging deploy, prod alert, ci pipeline, "
         "merge conflict, api schema, docs page, oncall page, latency budget, feature flag, lockfile, "
         "docker image, release branch, error logs, unit tests, type hints, pull request").split(", ")
AREAS = "billing search checkout login payments gateway worker scheduler frontend backend".split()
OUTCOMES = ("it passed, it failed again, rollback needed, review approved, retry worked, "
            "timeout persisted, cache invalidated, tests green, build broke").split(", ")
ASKS = ("how does the user usually handle {n} in {a}?", "what does the user prefer when the {n} breaks?",
        "does the user always {v} the {n} before {n2}?", "what is the user's approach to {n} and {n2}?")
START = datetime(2026, 1, 1, tzinfo=timezone.utc)


def stamp(t: datetime) -> str:
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")


def episode_text(rng: random.Random) -> str:
    return (f"{rng.choice(VERBS)} the {rng.choice(NOUNS)} in {rng.choice(AREAS)} after "
            f"{rng.choice(NOUNS)}: {rng.choice(OUTCOMES)}")


def question(rng: random.Random) -> str:
    return rng.choice(ASKS).format(n=rng.choice(NOUNS), n2=rng.choice(NOUNS), a=rng.choice(AREAS),
                                   v=rng.choice(VERBS))


# ------------------------------------------------------------------ 1. build

def user_records(u: int, episodes: int, beliefs: int) -> list:
    """One user's episodes, then beliefs citing them (its own random stream:
    the same records whatever order the users are written in)."""
    rng, user = random.Random(f"11-{u}"), f"user-{u:03d}"
    records = []
    for i in range(episodes):
        at = stamp(START + timedelta(minutes=rng.randrange(0, 150 * 24 * 60)))
        records.append(EpisodeRecorded(user_id=user, episode_id=f"{user}-ep-{i}", text=episode_text(rng),
                                       importance=round(rng.random(), 3), occurred_at=at, recorded_at=at))
    for r in range(beliefs):
        cited = rng.sample(records[:episodes], rng.randint(3, 8))
        words = [w for e in cited[:2] for w in e.text.split(":")[0].split()]
        at = stamp(START + timedelta(days=150 - rng.uniform(0, 60)))
        records.append(ReflectionCreated(
            user_id=user, reflection_id=f"{user}-r{r}", cycle_id=f"{user}:{r}",
            text="the user usually " + " ".join(words[:10]), evidence_ids=tuple(e.episode_id for e in cited),
            depth=1, importance=max(e.importance for e in cited), confidence=round(rng.uniform(0.4, 0.9), 3),
            reasoner="offline", prompt_version="v1", question="q", occurred_at=at, recorded_at=at))
    return records


def build(root: Path, users: int, episodes: int, beliefs: int, optimized: float = 0.0) -> int:
    """The store, written the way it grows live; `optimized` is the share of
    every user's records written before the view is optimized (1: as `reflect
    rebuild` leaves it; 0.67: a view compacted when it was two thirds of its
    size, then grown by half again; 0: never optimized)."""
    embedder = HashingEmbedder(DIM)
    t0 = time.perf_counter()
    view = EdgeView(root, VIEW, DIM)
    parts = defaultdict(float)
    total = 0
    n = episodes + beliefs
    cut = round(min(optimized, 1.0) * n)
    for i, (low, high) in enumerate([(0, cut), (cut, n)] if optimized > 0 else [(0, n)]):
        if i:  # as a rebuild or a compaction leaves it (EdgeView.optimize, in a child process)
            t = time.perf_counter()
            view.optimize()
            parts["optimize"] += time.perf_counter() - t
        for u in range(users if low < high else 0):
            records = user_records(u, episodes, beliefs)[low:high]
            for start in range(0, len(records), BATCH):
                chunk = records[start:start + BATCH]
                t = time.perf_counter()
                vectors = embedder.embed([e.text for e in chunk])
                parts["embed"] += time.perf_counter() - t
                t = time.perf_counter()
                points = [ViewPoint(point_id("episode", e.user_id, e.episode_id), v, episode_payload(e))
                          if isinstance(e, EpisodeRecorded) else
                          ViewPoint(point_id("reflection", e.user_id, e.reflection_id), v, reflection_payload(e))
                          for e, v in zip(chunk, vectors)]
                parts["payloads"] += time.perf_counter() - t
                t = time.perf_counter()
                view.upsert(points)
                parts["upsert"] += time.perf_counter() - t
                total += len(chunk)
    t = time.perf_counter()
    view.flush()
    parts["flush"] = time.perf_counter() - t
    t = time.perf_counter()
    view.close()
    parts["close"] = time.perf_counter() - t
    elapsed = time.perf_counter() - t0
    parts["events"] = elapsed - sum(parts.values())
    print(f"build: {users} users × ({episodes} episodes + {beliefs} beliefs) = {total:,} points "
          f"in {elapsed:.1f} s ({total / elapsed:,.0f} points/s)")
    print("  " + "   ".join(f"{k} {v:.1f} s ({v / elapsed:.0%})" for k, v in parts.items()))
    return total


# ------------------------------------------------------------ 2. in-process

def q(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def stats(values: list[float]) -> tuple[float, float, float]:
    return q(values, 50), q(values, 95), q(values, 99)


def rotated(names: list[str], i: int) -> list[str]:
    """The reads in another order each round: none always runs first (cold) or after its twin (warm)."""
    i %= len(names)
    return names[i:] + names[:i]


def first_reads(users: int, reads: dict, question_of) -> dict[str, list[float]]:
    """The first reads of every user after the view opens, in the order given (ms).
    The pages of a user's points are faulted in by whichever read touches them first."""
    cold: dict[str, list[float]] = defaultdict(list)
    for u in range(users):
        user = f"user-{u:03d}"
        for name, read in reads.items():
            t = time.perf_counter()
            read(user, question_of(u))
            cold[name].append((time.perf_counter() - t) * 1000)
    return cold


def synthesize_at_read(view, embedder, user: str, query: str, k: int = 10) -> list[tuple[str, list[str]]]:
    """The baseline: a pattern question answered with no beliefs, by synthesis at
    read time — the top episodes reranked, then grouped by what recurs in them
    (the offline reasoner's grouping: by meaning, groups of ≥ 2)."""
    vector = embedder.embed([query])[0]
    found = [Candidate(h.payload["episode_id"], "episode", h.payload["text"], float(h.payload.get("importance", 0.0)),
                       h.payload["occurred_at"], int(h.payload.get("depth", 0)), h.score)
             for h in view.search(user, vector, 4 * k, kind="episode", status="recorded")]
    top = rerank(found, datetime.now(timezone.utc), k, RECALL_WEIGHTS)
    texts = [c.text for c in top]
    return [(generalized(texts[t.first]), [top[m].id for m in t.members])
            for t in themes(texts, embedder.embed(texts), THEME_CUT.get(embedder.name, 0.45))]


class Clock:
    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.kind = ""  # the record kind of the search under way, for nested labels

    @contextlib.contextmanager
    def __call__(self, what: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.spent[what.format(kind=self.kind)] += time.perf_counter() - t


class TimedShard:
    """Qdrant Edge's shard with query/retrieve timed: the engine, without the Python around it."""

    def __init__(self, shard, clock: Clock) -> None:
        self._shard, self._clock = shard, clock

    def query(self, *a, **kw):
        with self._clock("{kind}:edge"):
            return self._shard.query(*a, **kw)

    def query_batch(self, *a, **kw):  # what search_hybrid calls
        with self._clock("{kind}:edge"):
            return self._shard.query_batch(*a, **kw)

    def retrieve(self, *a, **kw):
        with self._clock("evidence:edge"):
            return self._shard.retrieve(*a, **kw)

    def __getattr__(self, name):
        return getattr(self._shard, name)


class TimedView:
    def __init__(self, view: EdgeView, clock: Clock) -> None:
        self._view, self._clock = view, clock

    def search_hybrid(self, user_id, vectors, texts, k, before=None, scoring=None, **match):
        self._clock.kind = match.get("kind", "")
        with self._clock("{kind}:view"):
            return self._view.search_hybrid(user_id, vectors, texts, k, before, scoring, **match)

    def get(self, ids):
        with self._clock("evidence:view"):
            return self._view.get(ids)

    def __getattr__(self, name):
        return getattr(self._view, name)


class TimedEmbedder:
    def __init__(self, embedder, clock: Clock) -> None:
        self._embedder, self._clock = embedder, clock
        self.name, self.dim = embedder.name, embedder.dim

    def embed(self, texts):
        with self._clock("embed"):
            return self._embedder.embed(texts)


@contextlib.contextmanager
def timed_steps(clock: Clock):
    """recall's own steps (module globals of processors.retrieval) wrapped in timers; restored after."""
    real = {name: getattr(retrieval, name) for name in ("_search", "_evidence")}
    labels = {"_search": "{kind}", "_evidence": "evidence"}

    def wrap(name):
        def timed(*a, **kw):
            if name == "_search":
                clock.kind = a[5] if len(a) > 5 else kw["kind"]
            with clock(labels[name]):
                return real[name](*a, **kw)
        return timed

    for name in real:
        setattr(retrieval, name, wrap(name))
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(retrieval, name, fn)


ROWS = (("embed", "embed the question"),
        ("reflection", "search beliefs (_search: 10 live)"), ("reflection:view", "  view.search_hybrid"),
        ("reflection:edge", "    Edge shard.query"),
        ("episode", "search episodes (_search: 10 recorded)"), ("episode:view", "  view.search_hybrid"),
        ("episode:edge", "    Edge shard.query"),
        ("evidence", "evidence (_evidence)"), ("evidence:view", "  view.get"),
        ("evidence:edge", "    Edge shard.retrieve"),
        ("other", "other (route, now, results)"))


def breakdown(view: EdgeView, embedder, pairs, min_score: float) -> None:
    for mode in ("pattern", "instance"):
        clock = Clock()
        timed_view, timed_embedder = TimedView(view, clock), TimedEmbedder(embedder, clock)
        shard, view._shard = view._shard, TimedShard(view._shard, clock)
        evidence_ids = 0
        try:
            with timed_steps(clock):
                total = 0.0
                for user, query in pairs:
                    t = time.perf_counter()
                    out = recall(timed_view, timed_embedder, user, query, mode, 10, min_belief_score=min_score)
                    total += time.perf_counter() - t
                    evidence_ids += sum(len(r.get("evidence_ids", ())) for r in out["results"])
        finally:
            view._shard = shard
        spent = dict(clock.spent)
        spent["other"] = total - sum(v for k, v in spent.items() if ":" not in k)
        n = len(pairs)
        print(f"  where recall(mode={mode}) spends its time: {n} calls, {total / n * 1000:.2f} ms/call"
              + (f", {evidence_ids / n:.1f} cited ids/call (each looked up as an episode and as a belief)"
                 if evidence_ids else ""))
        for key, label in ROWS:
            if key in spent:
                print(f"    {label:<40} {spent[key] / n * 1000:7.3f} ms  {spent[key] / total:6.1%}")


def in_process(root: Path, users: int, n: int, min_score: float, questions: str) -> tuple[dict, list, dict]:
    embedder = make_embedder(questions)
    t = time.perf_counter()
    view = EdgeView(root, VIEW, DIM)
    opened = time.perf_counter() - t
    rng = random.Random(5)
    pairs = [(f"user-{rng.randrange(users):03d}", question(rng)) for _ in range(n)]
    reads = {
        "beliefs limit=50": lambda u, s: live_beliefs(view, u, 50),
        "recall instance": lambda u, s: recall(view, embedder, u, s, "instance", 10, min_belief_score=min_score),
        "recall pattern": lambda u, s: recall(view, embedder, u, s, "pattern", 10, min_belief_score=min_score),
        SYNTHESIS: lambda u, s: synthesize_at_read(view, embedder, u, s),
    }
    asks = random.Random(9)
    cold = first_reads(users, {k: reads[k] for k in ("beliefs limit=50", "recall pattern", "recall instance")},
                       lambda u: question(asks))
    times: dict[str, list[float]] = {name: [] for name in reads}
    fallbacks, served, answers = 0, [], {}
    for i, (user, query) in enumerate(pairs):
        for name in rotated(list(reads), i):
            read = reads[name]
            t = time.perf_counter()
            out = read(user, query)
            times[name].append((time.perf_counter() - t) * 1000)
            if name == "beliefs limit=50":
                served.append(len(out))
                answers[name, i] = [b["reflection_id"] for b in out]
            elif name.startswith("recall"):
                answers[name, i] = [r["id"] for r in out["results"]]
                fallbacks += name == "recall pattern" and "episodes instead" in out["reason"]
    results = [len(answers["recall pattern", i]) for i in range(n)]
    print(f"in-process: view reopened in {opened:.2f} s; first reads of each of {users} users after the open "
          "(in this order), p50: " + ", ".join(f"{k} {q(v, 50):.2f} ms" for k, v in cold.items()))
    print(f"  then warm: {n} random (user, question) pairs, round robin, order rotated each pair")
    print(f"  beliefs served per call: {min(served)}..{max(served)}; pattern recall fell back to episodes "
          f"in {fallbacks}/{n} (min_belief_score {min_score}); "
          f"pattern results per call {min(results)}..{max(results)}, mean {statistics.mean(results):.1f}")
    base = stats(times[SYNTHESIS])
    print(f"  {'read':<24} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}   p50/baseline  p95/baseline")
    for name, values in times.items():
        p = stats(values)
        print(f"  {name:<24} {p[0]:8.2f} {p[1]:8.2f} {p[2]:8.2f}   {p[0] / base[0]:10.2f}x  {p[1] / base[1]:10.2f}x")
    breakdown(view, embedder, pairs, min_score)
    view.flush()
    view.close()
    return {name: stats(values) for name, values in times.items()}, pairs, answers


# ------------------------------------------------------------------ 3. HTTP

class PatientWorker(Worker):
    """support.harness's Worker with a longer start timeout: a large view takes a while to load."""

    def start(self, timeout: float = 600, every: float = 0.2) -> "PatientWorker":
        return super().start(timeout, every)


def fetch(port: int, path: str):
    # urllib sends Connection: close: one TCP connection per request, no keep-alive.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
        return orjson.loads(answer.read())


def over_http(tmp: Path, users: int, pairs, local: dict, answers: dict, min_score: float,
              questions: str) -> tuple[dict, dict]:
    """Stats per route, and the peak RSS (KiB) of this worker and of one over an empty view."""
    with EmbeddedBroker(log_path=str(tmp / "tansu.log")) as broker:
        tag = uuid.uuid4().hex[:6]
        settings = Settings.load(env={}, broker=broker.url, app_id=f"bench-read-{tag}",
                                 topic_episodes=f"episodes-{tag}", topic_requests=f"reflection-requests-{tag}",
                                 topic_reflections=f"reflections-{tag}", data_dir=str(tmp / "data"),
                                 web_port=free_port(), embedder=questions, recall_min_score=min_score)
        asyncio.run(ensure_topics(settings))
        t = time.perf_counter()
        w = PatientWorker(settings, tmp / "worker.log").start()
        started = time.perf_counter() - t
        try:
            port = settings.web_port
            user0 = pairs[0][0]
            assert fetch(port, f"/v1/users/{user0}/stats")["reflections"] > 0, "the worker sees an empty view"
            routes = {
                "baseline GET /healthz": lambda u, s: "/healthz",
                "beliefs limit=50": lambda u, s: f"/v1/users/{u}/beliefs?limit=50",
                "recall instance": lambda u, s: f"/v1/users/{u}/recall?" + urllib.parse.urlencode(
                    {"q": s, "mode": "instance", "k": 10}),
                "recall pattern": lambda u, s: f"/v1/users/{u}/recall?" + urllib.parse.urlencode(
                    {"q": s, "mode": "pattern", "k": 10}),
            }
            asks = random.Random(9)
            cold = first_reads(users, {k: (lambda path: lambda u, s: fetch(port, path(u, s)))(routes[k])
                                       for k in ("beliefs limit=50", "recall pattern", "recall instance")},
                               lambda u: question(asks))
            times: dict[str, list[float]] = {name: [] for name in routes}
            same: dict[str, int] = defaultdict(int)
            for i, (user, query) in enumerate(pairs):
                for name in rotated(list(routes), i):
                    path = routes[name]
                    t = time.perf_counter()
                    out = fetch(port, path(user, query))
                    times[name].append((time.perf_counter() - t) * 1000)
                    if name.startswith("recall"):
                        same[name] += [r["id"] for r in out["results"]] == answers[name, i]
                    elif name.startswith("beliefs"):
                        same[name] += [b["reflection_id"] for b in out["beliefs"]] == answers[name, i]
            rss = {"loaded": peak_rss_kib(w.process.pid)}
        finally:
            w.stop()
        rss["empty"] = empty_worker_rss(settings, tmp)
    print(f"HTTP: reflect worker on Tansu, started (view load + group join) in {started:.1f} s; first requests "
          f"for each of {users} users (in this order), p50: "
          + ", ".join(f"{k} {q(v, 50):.2f} ms" for k, v in cold.items()))
    print(f"  then warm: {len(pairs)} requests per route, round robin, order rotated, one connection each")
    print("  same answer as in-process (ids, in order): "
          + ", ".join(f"{name} {count}/{len(pairs)}" for name, count in same.items()))
    base = stats(times["baseline GET /healthz"])
    print(f"  {'route':<24} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}   p50 vs in-process     p50/healthz")
    for name, values in times.items():
        p = stats(values)
        if name in local:
            extra = f"+{p[0] - local[name][0]:6.2f} ms ({p[0] / local[name][0]:5.2f}x)"
        else:
            extra = f"{'':>22}"
        print(f"  {name:<24} {p[0]:8.2f} {p[1]:8.2f} {p[2]:8.2f}   {extra}  {p[0] / base[0]:9.2f}x")
    return {name: stats(values) for name, values in times.items()}, rss


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc (Linux only)")


def empty_worker_rss(settings: Settings, tmp: Path) -> int:
    """The baseline of memory: the same worker over an empty view, after one read."""
    empty = dataclasses.replace(settings, app_id=settings.app_id + "-empty", data_dir=str(tmp / "empty"),
                                web_port=free_port())
    w = PatientWorker(empty, tmp / "empty-worker.log").start()
    try:
        fetch(empty.web_port, "/v1/users/user-000/beliefs?limit=50")
        return peak_rss_kib(w.process.pid)
    finally:
        w.stop()


def measure(users: int, episodes: int, beliefs: int = 20, n: int = 200, http: bool = True,
            optimized: float = 0.0, questions: str = "hashing") -> dict:
    # The worker's default cosine floor for a belief to answer a pattern question,
    # used in-process too so both sides serve the same answers.
    min_score = Settings.load(env={}).recall_min_score
    with tempfile.TemporaryDirectory() as tmp:
        view_dir = Path(tmp) / "data" / "view"
        points = build(view_dir, users, episodes, beliefs, optimized)
        local, pairs, answers = in_process(view_dir, users, n, min_score, questions)
        remote, rss = over_http(Path(tmp), users, pairs, local, answers, min_score, questions) if http else ({}, {})
    base = local[SYNTHESIS]
    figures = [figure(f"in-process {name} p{p}", local[name][i], "ms", f"read-time synthesis p{p}", base[i])
               for name in ("beliefs limit=50", "recall pattern", "recall instance") for i, p in ((0, 50), (1, 95))]
    figures += [figure(f"HTTP {name} p{p}", remote[name][i], "ms", f"in-process p{p}", local[name][i])
                for name in ("beliefs limit=50", "recall pattern") if name in remote for i, p in ((0, 50), (1, 95))]
    out = {"users": users, "episodes_per_user": episodes, "points": points, "figures": figures,
           "latency_ms": {name: dict(zip(("p50", "p95", "p99"), v)) for name, v in local.items()},
           "targets": [target("beliefs p95 in-process (ms)", local["beliefs limit=50"][1], "<=", 5.0)]}
    if rss:
        out["memory"] = {"figures": [figure(f"worker peak RSS, {users} users × {episodes} episodes",
                                            rss["loaded"] / 1024, "MiB", "worker over an empty view",
                                            rss["empty"] / 1024)]}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--episodes", type=int, default=5000, help="per user")
    parser.add_argument("--beliefs", type=int, default=20, help="per user")
    parser.add_argument("--n", type=int, default=200, help="(user, question) pairs per read")
    parser.add_argument("--quick", action="store_true", help="20 users × 1000 episodes, N=100: a smoke run")
    parser.add_argument("--no-http", action="store_true", help="skip the worker over HTTP")
    parser.add_argument("--optimized", type=float, nargs="?", const=1.0, default=0.0, metavar="SHARE",
                        help="optimize the store once SHARE of it is written (alone: 1, as `reflect rebuild` "
                             "leaves it; 0.67: as a compaction at growth 0.5 leaves it at worst; without: "
                             "never optimized, grown live)")
    parser.add_argument("--questions", choices=("hashing", "minilm"), default="hashing",
                        help="the embedder of the questions, in-process and the worker's (the stored vectors stay "
                             "hashing: this measures the cost of embedding a question, not relevance)")
    args = parser.parse_args()
    if args.quick:
        args.users, args.episodes, args.n = 20, 1000, 100
    started = time.perf_counter()
    result = measure(args.users, args.episodes, args.beliefs, args.n, not args.no_http, args.optimized,
                     args.questions)
    print_scenario("read path", result)
    if "memory" in result:
        print_scenario("memory", result["memory"])
    print(f"total {time.perf_counter() - started:.0f} s")
