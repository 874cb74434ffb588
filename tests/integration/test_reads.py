"""The read path over HTTP: typed recall, refresh policies, pinned beliefs."""

from __future__ import annotations

import threading
import time
import urllib.parse
from dataclasses import replace

import pytest

from schemas import ReflectionCreated
from streams.producer import Publisher
from streams.topics import ensure_topics
from support.harness import run, wait_for
from support.messages_api import MessagesServer, OfflineModel

pytestmark = pytest.mark.integration
TEXTS = ["revert of PR {n}: the auth middleware broke login", "logs first, then retry the deploy job {n}",
         "revert of PR {n}: auth token refresh failed in staging"]


async def publish_rounds(settings, user, start, n):
    async with Publisher(settings) as p:
        for i in range(start, start + n):
            await p.publish_episode(user, TEXTS[i % 3].format(n=i), 0.8, episode_id=f"{user}-{i}",
                                    occurred_at=f"2026-06-{1 + i % 28:02d}T09:00:00Z", wait=False)
        await p.flush()


def belief(user, rid, text, evidence):
    return ReflectionCreated(user_id=user, reflection_id=rid, cycle_id=f"{user}:1", text=text,
                             evidence_ids=tuple(evidence), depth=1, importance=0.7, confidence=0.7,
                             reasoner="offline", prompt_version="offline-v1", question="q?")


async def _beliefs(settings, beliefs):
    async with Publisher(settings) as p:
        for b in beliefs:
            await p.publish(b, topic=settings.topic_reflections)


def recall(w, user, q, **params):
    return w.get(f"/v1/users/{user}/recall?" + urllib.parse.urlencode({"q": q, **params}))


def test_recall_routes_and_never_crosses_users(settings, worker):
    s = replace(settings, threshold=1000.0)  # beliefs are published below, as the reflector would
    run(ensure_topics(s))
    w = worker(s)
    run(publish_rounds(s, "ann", 0, 12))
    run(publish_rounds(s, "bob", 0, 12))
    text = "The user reverts pull requests whose auth middleware change broke login."
    run(_beliefs(s, [belief("ann", "ann-r1", text, ["ann-0", "ann-3", "ann-6"]),
                     belief("bob", "bob-r1", text, ["bob-0", "ann-3", "bob-6"])]))  # bob cites an id of ann's
    wait_for(lambda: all(w.stats(u).get("reflections") == 1 and w.stats(u).get("episodes") == 12
                         for u in ("ann", "bob")), 30, "episodes and beliefs of both")

    instance = recall(w, "ann", "When did the auth token refresh fail in staging?")
    assert instance["route"] == "instance" and instance["reason"].startswith("router: instance")
    assert instance["results"] and all(r["kind"] == "episode" and r["occurred_at"] for r in instance["results"])
    pattern = recall(w, "ann", "How does the user usually handle pull requests that break auth login?")
    assert pattern["route"] == "pattern" and "episodes only" not in pattern["reason"]
    found = pattern["results"][0]  # the belief, ranked first among the episodes served with it
    assert (found["id"], [e["id"] for e in found["evidence"]]) == ("ann-r1", ["ann-0", "ann-3", "ann-6"])
    bobs = recall(w, "bob", "How does the user usually handle pull requests that break auth login?")
    assert [e["id"] for e in bobs["results"][0]["evidence"]] == ["bob-0", "bob-6"]  # never ann's episode
    for answer in (instance, pattern, recall(w, "ann", "auth", mode="pattern"), recall(w, "ann", "PR", k=50)):
        ids = [r["id"] for r in answer["results"]] + [e["id"] for r in answer["results"] for e in r.get("evidence", ())]
        assert ids and not any(i.startswith("bob-") for i in ids)
        assert all(e.startswith("ann-") or e not in {f"bob-{i}" for i in range(12)}
                   for r in answer["results"] for e in r.get("evidence_ids", ()))
    assert recall(w, "ann", "x", mode="psychic")["error"]["field"] == "mode"
    assert w.get("/v1/users/ann/recall?q=")["error"]["field"] == "q"

    prompt = w.get("/v1/users/ann/beliefs?format=prompt&budget=60")
    assert prompt["beliefs"] >= 1 and len(prompt["prompt"]) // 4 <= 60
    assert prompt["prompt"].startswith("Observations about the user")
    ranked = w.get("/v1/users/ann/beliefs?limit=50")["beliefs"]
    assert [b["pinned_score"] for b in ranked] == sorted((b["pinned_score"] for b in ranked), reverse=True)


def test_a_blocking_read_waits_for_the_cycle_in_flight_and_a_concurrent_one_does_not(settings, worker):
    api = MessagesServer(OfflineModel(), delay=1.5)  # a slow model: the cycle is in flight for ~3 s
    try:
        s = replace(settings, threshold=4.0, min_episodes=5, reasoner="anthropic", reasoner_retries=0)
        run(ensure_topics(s))
        w = worker(s, env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})
        run(publish_rounds(s, "cy", 0, 5))  # 5 × 0.8 crosses the threshold: one cycle asked
        wait_for(lambda: w.stats("cy").get("cycles") == 1, 30, "the cycle asked for")
        assert w.get("/v1/users/cy/beliefs")["beliefs"] == []

        answers = {}

        def read(policy):
            t = time.perf_counter()
            answers[policy] = (w.get(f"/v1/users/cy/beliefs?refresh={policy}"), time.perf_counter() - t)

        blocking = threading.Thread(target=read, args=("blocking",))
        blocking.start()
        read("concurrent")
        blocking.join(30)
        (stale, stale_s), (fresh, _) = answers["concurrent"], answers["blocking"]
        assert stale["freshness"] == {**stale["freshness"], "fresh": False, "cycles_behind": 1, "policy": "concurrent"}
        assert stale["beliefs"] == [] and stale_s < 1.0  # it did not wait
        assert fresh["freshness"]["fresh"] and not fresh["freshness"]["timed_out"]
        assert fresh["beliefs"] and fresh["freshness"]["waited_ms"] > 500  # the cycle's beliefs, after waiting
        assert len(api.requests) == 2
    finally:
        api.close()
