"""Compaction: a live-grown Edge view is copied, optimized and swapped in by
the worker itself, with nothing lost of what arrives meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from processors.ports import ViewPoint
from streams.adapters.view.edge import OPTIMIZED_FILE, EdgeView
from streams.adapters.view.shared import SharedView
from streams.topics import ensure_topics
from streams.worker.compaction import due, held_spans
from support.harness import run, wait_for
from support.swaps import publish_rounds, snapshot


def test_a_view_is_due_when_grown_by_the_share_past_its_last_optimize():
    assert not due(49_999, 0, 0.5, 50_000)  # too small to matter
    assert due(50_000, 0, 0.5, 50_000)  # never optimized
    assert not due(75_000, 50_000, 0.5, 50_000) and due(75_001, 50_000, 0.5, 50_000)
    assert not due(10**7, 0, 0.0, 50_000)  # growth 0: never


def test_the_copy_replays_both_topics_of_every_partition_the_worker_owns():
    held = {TopicPartition("episodes", 1): 40, TopicPartition("episodes", 3): 7,
            TopicPartition("reflections", 1): 5, TopicPartition("episodes", 2): 9}  # 2: no longer owned
    assert held_spans(held, {0, 1, 3}, ("episodes", "reflections")) == {
        TopicPartition("episodes", 0): 0, TopicPartition("episodes", 1): 40, TopicPartition("episodes", 3): 7,
        TopicPartition("reflections", 0): 0, TopicPartition("reflections", 1): 5,
        TopicPartition("reflections", 3): 0}  # none applied yet: all of it


def _points(n: int, start: int = 0) -> list[ViewPoint]:
    return [ViewPoint(f"00000000-0000-0000-0000-{i:012d}", [1.0, float(i % 7), 0.5, 0.0],
                      {"user_id": "u", "kind": "episode", "status": "recorded", "text": f"episode {i}",
                       "occurred_at": "2026-01-01T00:00:00Z"}) for i in range(start, start + n)]


def test_writes_wait_while_held_and_reads_go_on(tmp_path):
    view = SharedView(EdgeView(tmp_path, "reflect", 4))
    view.upsert(_points(3))
    wrote = threading.Event()
    writer = threading.Thread(target=lambda: (view.upsert(_points(1, 3)), wrote.set()))
    with view.writes_held() as held:
        writer.start()
        assert view.count("u") == 3  # a read, from this thread, while writes are held
        assert not wrote.wait(0.5), "a write ran while writes were held"
        copy = held.copy()
    assert wrote.wait(10) and view.count("u") == 4
    writer.join(10)
    assert copy.count("u") == 3 and copy.name != view.name  # the copy holds what was there when held
    copy.close()


def test_optimize_records_the_size_growth_is_measured_from(tmp_path):
    view = EdgeView(tmp_path, "reflect", 4)
    view.upsert(_points(30))
    assert view.growth() == (30, 0)
    view.optimize()
    view.upsert(_points(5, 30))
    assert view.growth() == (35, 30)
    assert json.loads((view.path / OPTIMIZED_FILE).read_text()) == {"points": 30}
    view.close()


@pytest.mark.integration
def test_a_grown_view_is_compacted_live_and_answers_as_a_rebuild_does(settings, worker):
    if settings.qdrant_url:
        pytest.skip("a Qdrant server optimizes its own segments: only an Edge view is compacted")
    # 5 users × 40 episodes and their beliefs: the first compaction comes at 150
    # points, the next when the view has doubled since.
    s = replace(settings, threshold=4.0, min_episodes=5, compact_min_points=150, compact_growth=1.0)
    run(ensure_topics(s))
    w = worker(s)
    users = [f"u{i}" for i in range(5)]
    progress = lambda: w.get("/v1/admin/rebuild") or {}  # noqa: E731
    seen, stop = [], threading.Event()

    def keep_reading():  # a reader throughout: what it sees of a user never goes back
        while not stop.is_set():
            seen.append((progress().get("state"), w.stats("u1").get("episodes"), w.stats("late0").get("episodes")))

    reader = threading.Thread(target=keep_reading)
    reader.start()
    try:
        run(publish_rounds(s, users, 40))
        wait_for(lambda: progress().get("kind") == "compaction", 60, "a compaction to start")
        # More episodes while it runs (or right after): what the copy missed must come from the log.
        run(publish_rounds(s, [f"late{i}" for i in range(5)], 40))
        wait_for(lambda: all(w.stats(u).get("episodes") == 40 for u in users + [f"late{i}" for i in range(5)]),
                 90, "every episode")
        wait_for(lambda: progress().get("state") in ("done", "failed"), 120, "the compaction to end", every=0.5)
    finally:
        stop.set()
        reader.join(10)
    done = progress()
    assert done["kind"] == "compaction" and done["state"] == "done", done
    view_dir = Path(s.data_dir) / "view"
    active = json.loads((view_dir / "reflect.json").read_text())
    shards = sorted(p.name for p in view_dir.iterdir() if p.is_dir())
    assert shards == [done["new_view"]] and done["new_view"] in json.dumps(active)  # the old one dropped
    assert json.loads((view_dir / done["new_view"] / OPTIMIZED_FILE).read_text())["points"] >= 150
    for user in (1, 2):  # u1 was in the copy; late0 came after it, from the log
        counts = [read[user] for read in seen if read[user] is not None]
        assert counts and counts == sorted(counts), f"a read went back during the compaction: {counts}"
    assert {state for state, *_ in seen} & {"copying", "running", "optimizing", "swapping"}

    everyone = users + [f"late{i}" for i in range(5)]

    def settled():  # every episode folded, every request done, and the same view a second apart
        if not all(st.get("folded") == 40 and st.get("requests") == st.get("requests_done")
                   for st in map(w.stats, everyone)):
            return False
        now_seen, previous = snapshot(w, everyone), last.get("seen")
        last["seen"] = now_seen
        return now_seen == previous

    last: dict = {}
    wait_for(settled, 60, "the pipeline to settle", every=1.0)
    compacted = snapshot(w, everyone)
    # The reference: the whole log replayed into a fresh view.
    rebuilt = subprocess.run([sys.executable, "-m", "streams.cli", "rebuild", "--api",
                              f"http://127.0.0.1:{s.web_port}", "--timeout", "120"],
                             capture_output=True, text=True, timeout=150)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert snapshot(w, everyone) == compacted


def test_a_stopping_worker_kills_the_optimize_it_would_wait_minutes_for(tmp_path):
    from streams.adapters.view import edge

    view = EdgeView(tmp_path, "reflect", 4)
    view.upsert(_points(30))
    failed: list[Exception] = []
    optimizing = threading.Thread(target=lambda: _capture(view.optimize, failed))
    optimizing.start()
    wait_for(lambda: edge._OPTIMIZING, 10, "the optimize child", every=0.001)
    edge.stop_optimizing()
    optimizing.join(30)
    assert not optimizing.is_alive()
    assert failed and "exit status -9" in str(failed[0])  # killed, and said so
    assert view.growth() == (30, 0)  # the shard serves as before, not recorded as optimized
    view.close()


def _capture(call, errors: list) -> None:
    try:
        call()
    except Exception as exc:
        errors.append(exc)
