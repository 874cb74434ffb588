"""`reflect rebuild`: replay the log into a fresh view while reads go on, then swap."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from streams.producer import Publisher
from streams.topics import ensure_topics
from support.harness import run, wait_for
from support.messages_api import MessagesServer, OfflineModel
from support.runs import Model, worker_env
from support.swaps import publish_rounds, snapshot

pytestmark = pytest.mark.integration


def test_rebuild_answers_as_before_serves_reads_meanwhile_and_never_calls_the_reasoner(settings, worker):
    api = MessagesServer(OfflineModel())
    try:
        s = replace(settings, threshold=4.0, min_episodes=5, reasoner="anthropic")
        run(ensure_topics(s))
        w = worker(s, env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})
        users = [f"u{i}" for i in range(5)]
        run(publish_rounds(s, users, 40))
        wait_for(lambda: all(w.stats(u).get("episodes") == 40 and w.stats(u).get("cycles") == 8 for u in users),
                 60, "episodes and cycles")
        wait_for(lambda: all(w.stats(u).get("reflections", 0) > 0 for u in users), 60, "beliefs")
        run(_retract_one(s, "u0", "u0-2"))
        wait_for(lambda: w.stats("u0")["retracted"] == 1, 30, "the retraction")
        # Settled: every cycle asked (threshold and revalidation alike) has run, and the view is still.
        cycles_run = lambda: sum((w.get("/v1/reasoner") or {}).get("cycles", {}).values())  # noqa: E731
        last = {}

        def settled():  # the same view a second apart, with every requested cycle run
            now_seen, previous = snapshot(w, users), last.get("seen")
            last["seen"] = now_seen
            asked = run(_cycle_ids(s, s.topic_requests, ("ReflectionRequested", "ChallengeRequested")))
            done = run(_cycle_ids(s, s.topic_reflections, ("ReflectionCycleCompleted",)))  # revalidations too
            return now_seen == previous and asked <= done and cycles_run() == len(done)

        wait_for(settled, 60, "the pipeline to settle", every=1.0)
        before, calls = snapshot(w, users), len(api.requests)
        assert any(b["status"] == "live" for u in users for b in before[u]["beliefs"])

        reads, stop = [], threading.Event()

        def keep_reading():  # a reader during the rebuild: answers from the old view
            while not stop.is_set():
                state = (w.get("/v1/admin/rebuild") or {}).get("state")
                answer = w.get("/v1/users/u1/beliefs?limit=1000")
                got = [{k: v for k, v in b.items() if k != "pinned_score"} for b in answer.get("beliefs", ())]
                reads.append((state, got == before["u1"]["beliefs"] or answer))

        reader = threading.Thread(target=keep_reading)
        reader.start()
        try:
            done = subprocess.run([sys.executable, "-m", "streams.cli", "rebuild", "--api",
                                   f"http://127.0.0.1:{s.web_port}", "--timeout", "120"],
                                  capture_output=True, text=True, timeout=150)
        finally:
            stop.set()
            reader.join(10)
        assert done.returncode == 0, done.stderr
        assert "now serves" in done.stdout and "reflect-0001" in done.stdout
        assert any(state in ("running", "swapping") for state, _ in reads)
        bad = [same for _, same in reads if same is not True]
        assert bad == []

        after = snapshot(w, users)
        for user in users:  # a readable diff first
            for key in before[user]:
                assert after[user][key] == before[user][key], (user, key)
        assert after == before  # same beliefs, statuses, evidence, provenance, episodes
        assert len(api.requests) == calls  # beliefs came from their events: no reasoner call
        progress = w.get("/v1/admin/rebuild")
        assert progress["state"] == "done" and progress["new_view"] == "reflect-0002" and progress["events"] > 200
    finally:
        api.close()


async def _retract_one(settings, user, episode_id):
    async with Publisher(settings) as p:
        await p.retract_episode(user, episode_id)


async def _cycle_ids(settings, topic, kinds) -> set[str]:
    """The cycle ids of a topic's records of `kinds`: read until a fetch comes back empty."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        seen = set()
        while batch := await consumer.getmany(timeout_ms=500):
            seen |= {e["cycle_id"] for v in batch.values() for m in v for e in [orjson.loads(m.value)]
                     if e["type"] in kinds}
        return seen
    finally:
        await consumer.stop()


HELD = ["Fay keeps the plover-ember checklist next to every deploy of the billing service",
        "Fay reviewed the scheduler filters with the team on Tuesday",
        "Fay wants the export job's logs attached before anyone retries it",
        "Fay paired with us on the flaky search test"]


def test_a_cycle_asked_before_an_erasure_reads_the_text_even_after_a_rebuild_before_the_walk(settings, worker):
    """An erasure takes an episode's text in its walk, after the cycles asked
    before it: a view rebuilt in between must not take it sooner, or what they
    believe would depend on when the rebuild ran. The stand-in model holds the
    user's first cycle, so the second, asked before the erasure, runs after
    the rebuild; it must read the erased episode as the first did."""
    model = Model()
    try:
        w = worker(replace(settings, threshold=1000.0, reasoner="anthropic"), env=worker_env(model))
        for i, text in enumerate(HELD):
            w.client.record("fay", text, 0.8, episode_id=f"held-{i}")
        wait_for(lambda: w.stats("fay").get("episodes") == len(HELD), 30, "episodes projected")
        model.hold = "record_insights"
        w.client.reflect("fay")
        wait_for(model.held.is_set, 60, "the first cycle held in its model call")
        w.client.reflect("fay")  # asked before the erasure: it reads held-0 when it runs
        w.client.retract("fay", "held-0", "erasure")
        wait_for(lambda: w.stats("fay").get("episodes") == len(HELD) - 1, 30, "the erasure projected")
        done = subprocess.run([sys.executable, "-m", "streams.cli", "rebuild", "--api", w.client.api],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        model.release.set()
        calls = wait_for(lambda: (c := [text for tool, user, text in model.read if tool == "record_insights"])
                         and len(c) == 2 and c, 60, "the second cycle's model call")
        assert "plover-ember" in calls[0] and "plover-ember" in calls[1]
        # Then the walk, and the text is gone.
        wait_for(lambda: "plover-ember" not in orjson.dumps(w.get("/v1/users/fay/episodes/held-0")).decode(), 60,
                 "the erasure's walk")
    finally:
        model.close()
