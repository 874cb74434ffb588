"""Is a view adapter safe to call from several threads at once? The hammer
behind the concurrency note of `streams.adapters.view.shared.SharedView`.

    python tests/benchmarks/view_threads.py [--engine edge|local] [--threads 4] [--rounds 300]

Fills one view with `--users` × `--points` points, answers a fixed set of
reads (get, count, search, scroll) serially, then runs `--threads` threads
at once, each mixing those reads with upserts: re-upserts of the read users'
own points unchanged (writes on the very segments being read, answers
unchanged) and batches of a new user of its own. Every concurrent answer must equal its
serial one, and the written users must end as a serial run leaves them.
Prints the calls made, the mismatches and the errors; exit 1 if any. Then
whether a call lets other threads run: the longest the main thread went
without running while another thread made batched searches, against the
time one batch takes (equal: the call holds the GIL throughout).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from processors.ports import ViewPoint  # noqa: E402
from streams.adapters.view.edge import EdgeView  # noqa: E402
from streams.adapters.view.qdrant import QdrantView  # noqa: E402

DIM = 32


def points(user: str, n: int, seed: int) -> list[ViewPoint]:
    rng = np.random.default_rng(seed)
    return [ViewPoint(str(uuid.uuid5(uuid.NAMESPACE_OID, f"{user}/{i}")), rng.normal(size=DIM).tolist(),
                      {"user_id": user, "kind": "episode", "status": "recorded", "text": f"{user} {i}"})
            for i in range(n)]


def reads(users: list[str], base: dict[str, list[ViewPoint]]):
    """(name, call) pairs whose answers the writers never change."""
    rng = np.random.default_rng(7)
    out = []
    for user in users:
        ids = [p.id for p in base[user][::37]]
        vector = rng.normal(size=DIM).tolist()
        out += [(f"get {user}", lambda v, ids=ids: v.get(ids)),
                (f"count {user}", lambda v, u=user: v.count(u, kind="episode")),
                (f"search {user}", lambda v, u=user, q=vector: [(h.id, round(h.score, 5)) for h in v.search(u, q, 10)]),
                (f"scroll {user}", lambda v, u=user: sorted(i for i, _ in v.scroll(u)))]
    return out


def own_batch(user_points: list[ViewPoint], r: int) -> list[ViewPoint]:
    """What a writer upserts for its new user at round r (r % 8 == 0)."""
    start = (r // 8) * 20 % len(user_points)
    return user_points[start:start + 20]


def written(view, users: list[str]):
    return {u: (view.count(u), sorted(view.scroll(u))) for u in users}


def hammer(view, threads: int, rounds: int, base: dict[str, list[ViewPoint]], fresh: dict[str, list[ViewPoint]]):
    checks = reads(list(base), base)
    expected = {name: call(view) for name, call in checks}
    tallies = [(Counter(), Counter(), []) for _ in range(threads)]  # one per thread: no shared counter
    start = threading.Barrier(threads)

    def work(n: int) -> None:
        rng, (calls, mismatches, errors) = random.Random(n), tallies[n]
        start.wait()
        for r in range(rounds):
            try:
                if r % 8 == 0:
                    view.upsert(own_batch(fresh[f"w{n}"], r))
                    calls["upsert"] += 1
                elif r % 8 == 4:
                    view.upsert(rng.sample(base[rng.choice(list(base))], 50))
                    calls["upsert"] += 1
                else:
                    name, call = rng.choice(checks)
                    calls[name.split()[0]] += 1
                    if call(view) != expected[name]:
                        mismatches[name] += 1
            except Exception as exc:  # noqa: BLE001 -- counted: the hammer's answer
                errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - began
    calls, mismatches, errors = (sum((t[i] for t in tallies), empty)
                                 for i, empty in enumerate((Counter(), Counter(), [])))
    return calls, mismatches, errors, seconds


@dataclass
class Trial:
    calls: Counter
    mismatches: Counter
    errors: list[str]
    differs: bool | str  # the written users against a serial run's; a string if unreadable
    seconds: float

    @property
    def clean(self) -> bool:
        return not (self.mismatches or self.errors or self.differs)


def trial(open_view, threads: int, rounds: int, users: int, per_user: int) -> Trial:
    """Hammer `open_view("hammered")` and replay its writes serially into `open_view("serial")`."""
    base = {f"u{i}": points(f"u{i}", per_user, i) for i in range(users)}
    fresh = {f"w{n}": points(f"w{n}", 400, 100 + n) for n in range(threads)}
    view, serial = open_view("hammered"), open_view("serial")
    try:
        for v in (view, serial):
            for batch in base.values():
                v.upsert(batch)
        calls, mismatches, errors, seconds = hammer(view, threads, rounds, base, fresh)
        for n in range(threads):
            for r in range(0, rounds, 8):
                serial.upsert(own_batch(fresh[f"w{n}"], r))
        try:
            differs = written(view, list(fresh)) != written(serial, list(fresh))
        except Exception as exc:  # noqa: BLE001 -- the view was left broken
            differs = f"unreadable ({type(exc).__name__}: {exc})"
    finally:
        view.close()
        serial.close()
    return Trial(calls, mismatches, errors, differs, seconds)


def gil_held(view, user: str, batches: int = 5) -> tuple[float, float]:
    """(ms one batched search of 30 vectors takes, longest ms the main thread
    went without running while another thread made `batches` of them)."""
    vectors = np.random.default_rng(3).normal(size=(30, DIM)).tolist()
    began = time.perf_counter()
    view.search_many(user, vectors, 10)
    one = time.perf_counter() - began
    searching = threading.Thread(target=lambda: [view.search_many(user, vectors, 10) for _ in range(batches)])
    longest, last = 0.0, time.perf_counter()
    searching.start()
    while searching.is_alive():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    return one * 1000, longest * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("edge", "local"), default="edge")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--points", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        def open_view(name: str):
            if args.engine == "edge":
                return EdgeView(Path(tmp) / name, "reflect", DIM)
            return QdrantView.connect(None, "reflect", DIM, path=str(Path(tmp) / name))

        t = trial(open_view, args.threads, args.rounds, args.users, args.points)
        print(f"{args.engine}: {args.threads} threads × {args.rounds} calls in {t.seconds:.2f} s: {dict(t.calls)}")
        print(f"mismatched reads: {sum(t.mismatches.values())} {dict(t.mismatches)}; written users differ "
              f"from serial: {t.differs}; errors: {len(t.errors)} {Counter(t.errors).most_common(3)}")
        if args.engine == "edge":  # local mode holds the GIL by being Python
            probed = open_view("probed")
            probed.upsert(points("p", 50_000, 9))
            print("one batched search over 50k points: %.1f ms; the main thread's longest stall meanwhile: %.1f ms"
                  % gil_held(probed, "p"))
            probed.close()
    return 0 if t.clean else 1


if __name__ == "__main__":
    sys.exit(main())
