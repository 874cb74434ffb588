"""A transient fault loses nothing: the view fails for 5 s mid-stream (every
call raises, as an engine that is down raises its own errors) while episodes,
cycles and an erasure keep coming. The worker retries, reports itself
degraded, dead-letters nothing, and ends with the view of a run without the
fault — the erasure's walk, which failed while the view was down, completed:
the belief derived from the erased episode is invalid and its text gone.

    python -m pytest tests/faults/test_faults_view.py -s
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from streams.topics import ensure_topics
from support.broker import read_topic
from support.harness import Worker, settings_env, wait_for
from support.history import as_set, erasing, history, settled
from support.runs import Workers, beliefs_of, episodes_of, make_settings, publish, users_by_partition, view_snapshot

pytestmark = [pytest.mark.faults, pytest.mark.integration]

FAULTY_WORKER = Path(__file__).parents[1] / "support" / "faulty_worker.py"
OUTAGE = 5.0  # seconds the view is down


class FaultyWorker(Worker):
    def launch(self) -> "FaultyWorker":
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen([sys.executable, str(FAULTY_WORKER)],
                                        env={**settings_env(self.settings), **self.env},
                                        stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self


def run(broker, tmp: Path, name: str, outage: bool) -> dict:
    (tmp / name).mkdir(parents=True)
    flag = tmp / name / "view-down"
    settings = make_settings(broker.url, tmp / name, threshold=15.0, min_episodes=10, session_timeout=6.0)
    users = users_by_partition(1, settings.partitions)
    events = erasing(history(users), users)
    asyncio.run(ensure_topics(settings))
    workers, seen = Workers(tmp / name), {}
    try:
        worker = FaultyWorker(settings, tmp / name / "worker.log", {"REFLECT_TEST_VIEW_DOWN": str(flag)}).start()
        workers.started.append(worker)
        half = len(events) // 2
        asyncio.run(publish(settings, events[:half]))
        if outage:
            wait_for(lambda: sum(worker.stats(u).get("episodes", 0) for u in users) >= half // 4, 60,
                     "a quarter of the first half in the view")
            flag.touch()
            asyncio.run(publish(settings, events[half:]))  # the erasures among them, walked while down
            seen["degraded"] = wait_for(lambda: (worker.get("/healthz") or {}).get("status") == "degraded"
                                        and worker.get("/healthz"), 30, "/healthz degraded")
            down_since = time.monotonic()
            wait_for(lambda: time.monotonic() - down_since >= OUTAGE, OUTAGE + 5, "the outage's length")
            flag.unlink()
        else:
            asyncio.run(publish(settings, events[half:]))
        wait_for(lambda: settled(worker, settings, events, users), 180, f"{name}: the whole history settled")
        seen["healthz"] = worker.get("/healthz")
    finally:
        workers.stop_all()
    dead = asyncio.run(read_topic(settings, settings.dlq_episodes)) + \
        asyncio.run(read_topic(settings, settings.dlq_reflections))
    snapshot = view_snapshot(settings, users)
    return {"beliefs": {u: {r: as_set(p) for r, p in b.items()} for u, b in beliefs_of(snapshot).items()},
            "episodes": episodes_of(snapshot), "dead_letters": len(dead), "seen": seen, "users": users,
            "log": (tmp / name / "worker.log").read_text(errors="replace")}


def test_a_view_down_for_five_seconds_loses_nothing_and_dead_letters_nothing(broker, tmp_path):
    calm = run(broker, tmp_path, "no-fault", outage=False)
    faulty = run(broker, tmp_path, "view-down", outage=True)
    stalled = faulty["seen"]["degraded"]["stalled"]
    print(f"stalled during the outage: {stalled}; dead letters {faulty['dead_letters']}")
    assert stalled and faulty["seen"]["healthz"] == {"status": "ok"}
    assert "stalled" in faulty["log"] and "resumed after" in faulty["log"]
    assert faulty["dead_letters"] == calm["dead_letters"] == 0
    assert faulty["episodes"] == calm["episodes"]
    assert faulty["beliefs"] == calm["beliefs"]
    erased = [p for b in faulty["beliefs"].values() for p in b.values()
              if f"{p['user_id']}-12" in p["evidence_ids"]]
    assert erased and all(p["status"] == "invalid" and "text" not in p for p in erased)


def test_healthz_tells_why_only_to_an_admin(broker, tmp_path):
    """A stage's error can name hosts and topics: with auth on, an anonymous
    probe learns `degraded` and nothing more; the admin token learns why."""
    from support.api import call

    token = "probe-admin-token-0123456789abcdef"
    flag = tmp_path / "view-down"
    settings = make_settings(broker.url, tmp_path, threshold=15.0, min_episodes=10, session_timeout=6.0)
    asyncio.run(ensure_topics(settings))
    worker = FaultyWorker(settings, tmp_path / "worker.log",
                          {"REFLECT_TEST_VIEW_DOWN": str(flag), "REFLECT_API_TOKEN": token})
    workers = Workers(tmp_path)
    workers.started.append(worker)
    try:
        worker.launch()

        def probe(credential: str | None) -> tuple[int, dict]:
            try:
                status, _, raw = call(settings.web_port, "GET", "/healthz", token=credential)
            except OSError:  # not listening yet
                return 0, {}
            return status, orjson.loads(raw)

        def degraded() -> tuple[int, dict] | None:
            seen = probe(token)
            return seen if seen[1].get("status") == "degraded" else None

        wait_for(lambda: probe(None) == (200, {"status": "ok"}), 60, "/healthz ok")
        flag.touch()
        asyncio.run(publish(settings, history(users_by_partition(1, settings.partitions))[:4]))
        admin = wait_for(degraded, 60, "/healthz degraded, seen by the admin")
        assert admin[0] == 503 and admin[1]["stalled"], admin
        assert probe(None) == (503, {"status": "degraded"})
        assert probe("not-the-token-at-all-0123456789") == (503, {"status": "degraded"})
    finally:
        flag.unlink(missing_ok=True)
        workers.stop_all()
