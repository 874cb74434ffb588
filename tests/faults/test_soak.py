"""Soak: a steady episode rate with reflection cycles and retractions mixed in,
against one real worker, for REFLECT_SOAK_SECONDS (60 by default, the CI run;
600 for the full one):

    REFLECT_SOAK_SECONDS=600 python -m pytest tests/faults/test_soak.py -s

Samples the worker's RSS and its lag (episodes acknowledged by the broker vs
episodes in the view) once a second, and probes publish → visible latency
once a second. Asserts that memory and lag do not grow in the second half
and that the view catches up soon after publishing stops; prints the figures.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time

import pytest

from schemas import parse_time
from streams.producer import Publisher, make_episode, make_retraction
from streams.topics import ensure_topics
from support.harness import wait_for
from support.runs import TEXTS, Workers, make_settings, proc_cpu_seconds, proc_rss_mib, read_events

pytestmark = [pytest.mark.soak, pytest.mark.faults, pytest.mark.integration, pytest.mark.broker]

SECONDS = float(os.environ.get("REFLECT_SOAK_SECONDS", "60"))
RATE = 50.0  # episodes/s
USERS = [f"s{i}" for i in range(10)]
RETRACT_EVERY = 25  # one retraction per 25 episodes, of an episode published ≥ 2 s before
RSS_SLACK_MIB = 30.0


def p95(values) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.95 * len(values)))] if values else None


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points: y per second."""
    if len(points) < 2:
        return 0.0
    mt, my = statistics.fmean(t for t, _ in points), statistics.fmean(y for _, y in points)
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / var if var else 0.0


class Load:
    """The steady stream from its own thread: episodes at RATE, a retraction
    every RETRACT_EVERY episodes; remembers when each episode was sent. Sent
    without waiting for each acknowledgement (the publisher keeps their
    order), and all acknowledged at the end: an offered rate that waited on
    each round trip fell short of RATE once the box was busy (2,334 of 3,000
    at four test processes on two cores), which measured the generator."""

    def __init__(self, settings, seconds: float) -> None:
        self.settings, self.seconds = settings, seconds
        self.sent: dict[tuple[str, str], float] = {}  # (user, episode id) → when it was sent (monotonic)
        self.retracted: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with Publisher(self.settings) as publisher:
            started, n = time.monotonic(), 0
            while time.monotonic() - started < self.seconds:
                await asyncio.sleep(max(0.0, started + n / RATE - time.monotonic()))  # pacing
                user = USERS[n % len(USERS)]
                i = n // len(USERS)
                episode = make_episode(user, TEXTS[i % len(TEXTS)].format(u=user, n=i),
                                       (0.6, 0.7, 0.8, 0.9, 0.5)[i % 5], episode_id=f"{user}-{i}")
                try:
                    await publisher.publish(episode, wait=False)
                    with self.lock:
                        self.sent[(user, episode.episode_id)] = time.monotonic()
                    if n % RETRACT_EVERY == RETRACT_EVERY - 1:
                        old = [k for k, t in self.sent.items() if k[0] == user and time.monotonic() - t > 2
                               and k not in self.retracted]
                        if old:
                            await publisher.publish(make_retraction(user, old[0][1], "incorrect"), wait=False)
                            self.retracted.append(old[0])
                except Exception as exc:
                    self.errors.append(f"{episode.episode_id}: {exc!r}")
                n += 1
            try:
                await publisher.flush()  # every one sent is acknowledged, or the run says why not
            except Exception as exc:
                self.errors.append(f"flush: {exc!r}")

    def latest(self) -> tuple[tuple[str, str], float] | None:
        with self.lock:
            return next(reversed(self.sent.items()), None)


def test_soak(broker, tmp_path):
    settings = make_settings(broker.url, tmp_path / "data", threshold=15.0, min_episodes=10)
    asyncio.run(ensure_topics(settings))
    workers = Workers(tmp_path)
    try:
        worker = workers.start(settings)
        pid = worker.process.pid
        load = Load(settings, SECONDS)
        started = time.monotonic()
        load.thread.start()

        samples: list[dict] = []  # t, rss, published, visible, lag
        latencies: list[float] = []
        probing = threading.Event()

        def probe() -> None:  # once a second: the newest acknowledged episode, polled every 10 ms
            while not probing.is_set():
                newest = load.latest()
                if newest:
                    (user, eid), sent_at = newest
                    deadline = time.monotonic() + 30
                    # Poll every 10 ms, bounded, and stop at once when the run ends.
                    while time.monotonic() < deadline and not probing.wait(0.01):
                        if "status" in (worker.get(f"/v1/users/{user}/episodes/{eid}") or {}):
                            latencies.append(time.monotonic() - sent_at)
                            break
                probing.wait(1.0)
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()

        def sample() -> dict:
            visible = sum(s.get("episodes", 0) + s.get("retracted", 0) for s in map(worker.stats, USERS))
            published = len(load.sent)
            return {"t": time.monotonic() - started, "rss": proc_rss_mib(pid), "published": published,
                    "visible": visible, "lag": published - visible}
        cpu_started = proc_cpu_seconds(pid)
        while load.thread.is_alive():
            samples.append(sample())
            worker.alive()
            load.thread.join(1.0)  # a sample a second while the load runs
        published_for = time.monotonic() - started
        cpu = proc_cpu_seconds(pid) - cpu_started
        probing.set()
        prober.join(35)
        assert not load.errors, load.errors[:5]

        # After publishing stops, the view catches up within a bound.
        stopped = time.monotonic()
        wait_for(lambda: sample()["lag"] == 0, 30, "the view to catch up with every acknowledged episode")
        catch_up = time.monotonic() - stopped

        # ... and the reflector with every cycle asked for (an audit event each).
        def cycles_pending() -> int:
            asked = {e["cycle_id"] for e in read_events(settings, settings.topic_requests) if "cycle_id" in e}
            done = {e["cycle_id"] for e in read_events(settings, settings.topic_reflections)
                    if e["type"] == "ReflectionCycleCompleted"}
            return len(asked - done)
        pending_at_stop = cycles_pending()
        wait_for(lambda: cycles_pending() == 0, 60, "every cycle asked for to be done", every=1.0)
        cycles_catch_up = time.monotonic() - stopped

        half = [s for s in samples if s["t"] >= published_for / 2]
        rss_mid, rss_end = half[0]["rss"], samples[-1]["rss"]
        lag_trend = slope([(s["t"], s["lag"]) for s in half])  # episodes per second
        reflections = read_events(settings, settings.topic_reflections)
        requests = {e["cycle_id"]: e for e in read_events(settings, settings.topic_requests) if "cycle_id" in e}
        cycles = [e for e in reflections if e["type"] == "ReflectionCycleCompleted"]
        waited = [(parse_time(c["recorded_at"]) - parse_time(requests[c["cycle_id"]]["recorded_at"])).total_seconds()
                  for c in cycles if c["cycle_id"] in requests]
        by_time = sorted(((parse_time(requests[c["cycle_id"]]["recorded_at"]), w) for c, w in
                          zip([c for c in cycles if c["cycle_id"] in requests], waited)))
        quarter = max(1, len(by_time) // 4)
        dlq = len(read_events(settings, settings.dlq_episodes)) + len(read_events(settings, settings.dlq_reflections))
        figures = {
            "seconds": round(published_for, 1), "events_in": len(load.sent) + len(load.retracted),
            "episodes": len(load.sent), "retractions": len(load.retracted), "dlq": dlq,
            "cycles": len(cycles), "cycle_outcomes": {o: sum(c["outcome"] == o for c in cycles)
                                                      for o in {c["outcome"] for c in cycles}},
            "beliefs": sum(e["type"] == "ReflectionCreated" for e in reflections),
            "invalidations": sum(e["type"] == "ReflectionInvalidated" for e in reflections),
            "p95_publish_to_visible_ms": round(1000 * p95(latencies)) if latencies else None,
            "p50_publish_to_visible_ms": round(1000 * statistics.median(latencies)) if latencies else None,
            "p95_cycle_ms": p95([c["duration_ms"] for c in cycles]),
            "p95_request_to_cycle_done_ms": round(1000 * p95(waited)) if waited else None,
            "cycles_asked": len(requests),
            "request_to_done_s_first_last_quarter": [round(statistics.median(w for _, w in part), 1)
                                                     for part in (by_time[:quarter], by_time[-quarter:])],
            "rss_mib_start_mid_end_peak": [round(x) for x in (samples[0]["rss"], rss_mid, rss_end,
                                                              max(s["rss"] for s in samples))],
            "lag_max": max(s["lag"] for s in samples), "lag_trend_per_s_second_half": round(lag_trend, 2),
            # The reflector's bounded wait for the view (10 s, then the cycle goes on): each one
            # holds every later cycle back, which is what the p95 request → done shows.
            "reflector_view_timeouts": worker.log_path.read_text(errors="replace").count("view still behind"),
            "catch_up_s": round(catch_up, 1), "cycles_pending_at_stop": pending_at_stop,
            "cycles_catch_up_s": round(cycles_catch_up, 1), "worker_cpu_share": round(cpu / published_for, 2),
        }
        print(f"\n[soak {SECONDS:.0f} s at {RATE:.0f}/s] " + ", ".join(f"{k}={v}" for k, v in figures.items()))

        assert len(load.sent) >= 0.9 * RATE * SECONDS  # the load was offered
        assert dlq == 0
        assert cycles and all(c["outcome"] in ("ok", "empty") for c in cycles)
        assert len(latencies) >= SECONDS / 2
        # Memory: the second half grows by at most 20 % (plus slack for the view's points).
        assert rss_end <= rss_mid * 1.2 + RSS_SLACK_MIB, (rss_mid, rss_end)
        # Lag: not trending up in the second half — over its length, the trend
        # adds less than two seconds of input — and gone soon after the load stops.
        assert lag_trend * (published_for / 2) < 2 * RATE, lag_trend
        assert catch_up < 15
        assert cycles_catch_up < 30  # the reflector keeps up too: its backlog drains soon after the load stops
    finally:
        workers.stop_all()


