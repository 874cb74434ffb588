"""Retraction-safe beliefs on the real broker: a worker with every processor,
beliefs published to the reflections topic as the reflector would publish
them (so the graph is known), then retractions."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.parse
from dataclasses import replace

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from schemas import EpisodeRecorded, EpisodeRetracted, ReflectionCreated, decode, now
from streams.producer import Publisher
from streams.settings import Settings
from streams.shredding import Sealing
from streams.topics import ensure_topics
from support.harness import run, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.broker]


def created(user, rid, evidence, depth=1, text=None):
    return ReflectionCreated(user_id=user, reflection_id=rid, cycle_id=f"{user}:1", text=text or f"belief {rid}",
                             evidence_ids=tuple(evidence), depth=depth, importance=0.6, confidence=0.6,
                             reasoner="offline", prompt_version="offline-v1", question="q?")


async def publish_rounds(settings, episodes, beliefs):
    async with Publisher(settings) as p:
        for user, eid, text in episodes:
            await p.publish_episode(user, text, 0.6, episode_id=eid)
        for belief in beliefs:
            await p.publish(belief, topic=settings.topic_reflections)


async def _retract(settings, *retractions) -> list[str]:
    """Their event ids (an erasure's names its proof)."""
    async with Publisher(settings) as p:
        return [(await p.retract_episode(user, eid, reason)).event_id for user, eid, reason in retractions]


async def opened(values, settings=None):
    """schemas/README.md's, as written there: raw values decoded and opened."""
    sealing = Sealing(settings or Settings.load())
    try:
        records = [decode(v) for v in values]
        open_one = await sealing.opener(records)  # reads the key topic
        return [open_one(r) for r in records]
    finally:
        await sealing.close()


async def _events(settings, topic, until, timeout=30.0, raw=False):
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    seen = []

    async def drain():
        async for message in consumer:
            seen.append(message.value if raw else orjson.loads(message.value))
            if until(seen):
                return
    try:
        await asyncio.wait_for(drain(), timeout)
    finally:
        await consumer.stop()
    return seen


def invalidations(events, user):
    return [e for e in events if e["type"] == "ReflectionInvalidated" and e["user_id"] == user]


def explain(w, user, rid):
    return w.get(f"/v1/users/{user}/reflections/{rid}")


@pytest.fixture
def stack(settings, worker):
    s = replace(settings, threshold=1000.0)  # only the cycles this test asks for
    run(ensure_topics(s))
    return s, worker(s)


def test_retractions_walk_the_provenance_graph(stack):
    s, w = stack
    run(publish_rounds(s, [(u, f"{u}-{e}", f"{u} episode {e}") for u in ("gil", "dee", "wes") for e in "abc"], [
        created("gil", "gil-b1", ["gil-a", "gil-b"]), created("gil", "gil-b2", ["gil-a", "gil-c"]),
        created("gil", "gil-top", ["gil-b1", "gil-b2"], depth=2),                   # rests on two that rest on a
        created("dee", "dee-l", ["dee-a", "dee-b"]), created("dee", "dee-r", ["dee-a", "dee-c"]),
        created("dee", "dee-top", ["dee-l", "dee-r", "dee-a"], depth=2),             # a diamond, and a direct path
        created("wes", "wes-3", ["wes-a", "wes-b", "wes-c"])]))                      # three pieces of evidence
    wait_for(lambda: all(explain(w, u, r).get("belief") for u, r in (("gil", "gil-top"), ("dee", "dee-top"),
                                                                       ("wes", "wes-3"))), 30, "beliefs projected")
    run(_retract(s, ("gil", "gil-a", "incorrect"), ("dee", "dee-a", "incorrect"), ("wes", "wes-a", "incorrect"),
                 ("wes", "never-recorded", "incorrect")))

    def settled(seen):  # users sit on different partitions: wait for each one's outcome
        return (any(e["type"] == "ReflectionCycleCompleted" and e["why"] == "revalidation" for e in seen)
                and len(invalidations(seen, "gil")) >= 3
                and any(e["reflection_id"] == "dee-top" for e in invalidations(seen, "dee")))

    events = run(_events(s, s.topic_reflections, settled))
    assert {e["reflection_id"]: e["status"] for e in invalidations(events, "gil")} == {
        "gil-b1": "invalid", "gil-b2": "invalid", "gil-top": "invalid"}
    top = [e for e in invalidations(events, "dee") if e["reflection_id"] == "dee-top"]
    assert len(top) == 1 and top[0]["path"][0] == "dee-a"  # one invalidation, not one per path
    [weakened] = invalidations(events, "wes")
    assert (weakened["status"], weakened["surviving_evidence_ids"]) == ("weakened", ["wes-b", "wes-c"])
    [cycle] = [e for e in events if e["type"] == "ReflectionCycleCompleted"]
    assert cycle["user_id"] == "wes" and cycle["why"] == "revalidation"  # asked on what survives

    wait_for(lambda: explain(w, "gil", "gil-top")["belief"]["status"] == "invalid", 30, "gil-top invalid in the view")
    assert [b["reflection_id"] for b in w.get("/v1/users/gil/beliefs")["beliefs"]] == []
    # wes sits on another partition than gil: wait for its own projection too.
    wes = wait_for(lambda: (lambda b: b if b.get("wes-3", {}).get("confidence") != 0.6 else None)(
        {x["reflection_id"]: x for x in w.get("/v1/users/wes/beliefs")["beliefs"]}), 30, "wes-3 weakened in the view")
    assert wes["wes-3"]["confidence"] == 0.4  # still served, weaker
    # Anything the revalidation formed rests only on what survives.
    assert all(set(b["evidence_ids"]) <= {"wes-b", "wes-c"} for r, b in wes.items() if r != "wes-3")
    tree = explain(w, "gil", "gil-top")["provenance"]
    assert [(c["id"], c["status"]) for c in tree["evidence"]] == [("gil-b1", "invalid"), ("gil-b2", "invalid")]
    assert tree["evidence"][0]["evidence"][0] == {**tree["evidence"][0]["evidence"][0], "id": "gil-a",
                                                  "status": "retracted", "lost": True}
    # A no-op with a log line, after wes-a's revalidation: its request comes later in wes's order.
    wait_for(lambda: "never-recorded" in w.log_path.read_text(), 30, "the unknown retraction logged")
    assert w.alive()


def test_as_of_and_erasure(stack):
    s, w = stack
    run(publish_rounds(s, [("eve", "eve-a", "SECRET-4242 sits in the payroll export"), ("eve", "eve-b", "eve b"),
                     ("eve", "eve-c", "eve c")],
                 [created("eve", "eve-b1", ["eve-a", "eve-b", "eve-c"], text="payroll exports hold SECRET-4242"),
                  created("eve", "eve-top", ["eve-b1", "eve-b"], depth=2)]))
    wait_for(lambda: explain(w, "eve", "eve-top").get("belief"), 30, "beliefs projected")
    before = urllib.parse.quote(now())
    [erasure] = run(_retract(s, ("eve", "eve-a", "erasure")))
    wait_for(lambda: explain(w, "eve", "eve-top")["belief"]["status"] == "invalid", 30, "eve-top invalid")
    # Its proof: on the log, and served (`reflect explain --erasure`), ids only.
    proof = wait_for(lambda: (lambda got: got if "erasure_id" in got else None)(
        w.get(f"/v1/users/eve/erasures/{erasure}")), 30, "the erasure's proof projected")
    assert (proof["episode_id"], proof["episodes"], sorted(proof["beliefs"]), sorted(proof["keys"])) == (
        "eve-a", ["eve-a"], ["eve-b1", "eve-top"], ["belief:eve-b1", "belief:eve-top", "episode:eve-a"])
    # On the log the episodes were sealed from the start; eve-a's key is gone, so its record, read raw
    # from the broker by a reader with the master keys, is its erasure; eve-b's still opens.
    raw = run(_events(s, s.topic_episodes, lambda seen: any(b"EpisodeRetracted" in v and b'"eve-a"' in v
                                                            for v in seen), raw=True))
    assert not any(b"SECRET-4242" in value for value in raw)
    recorded = [v for v in raw if b'"EpisodeRecorded"' in v and b'"eve"' in v]
    episodes = {r.episode_id: r for r in run(opened(recorded, s))}
    assert isinstance(episodes["eve-a"], EpisodeRetracted) and episodes["eve-a"].reason == "erasure"
    assert (type(episodes["eve-b"]), episodes["eve-b"].text) == (EpisodeRecorded, "eve b")
    beliefs = run(_events(s, s.topic_reflections, lambda seen: any(b"ErasureCompleted" in v for v in seen), raw=True))
    assert not any(b"SECRET-4242" in value for value in beliefs)  # sealed, and their keys gone now
    taken = [v for v in beliefs if b"ReflectionCreated" in v and b'"eve-b1"' in v]
    assert taken and run(opened(taken, s)) == [None] * len(taken)
    [logged] = [e for e in map(orjson.loads, beliefs) if e["type"] == "ErasureCompleted"]
    assert logged["erasure_id"] == erasure and sorted(logged["beliefs"]) == ["eve-b1", "eve-top"]
    shown = subprocess.run([sys.executable, "-m", "streams.cli", "explain", "--user", "eve", "--erasure", erasure,
                            "--api", w.client.api], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "beliefs invalidated, text gone: 2: eve-b1, eve-top" in shown.stdout, shown
    assert w.get("/v1/users/eve/erasures/no-such-erasure")["status"] == 404
    assert w.get(f"/v1/users/gil/erasures/{erasure}")["status"] == 404  # another user's: not found

    held = w.get(f"/v1/users/eve/beliefs?as_of={before}")["beliefs"]
    assert {b["reflection_id"]: b["status"] for b in held} == {"eve-b1": "live", "eve-top": "live"}  # held then
    assert w.get("/v1/users/eve/beliefs")["beliefs"] == []  # not now
    served = [w.get("/v1/users/eve/episodes/eve-a"), w.get("/v1/users/eve/beliefs"),
              w.get(f"/v1/users/eve/beliefs?as_of={before}"), explain(w, "eve", "eve-b1"),
              explain(w, "eve", "eve-top"), w.get("/v1/users/eve/stats")]
    assert all(served) and "SECRET-4242" not in orjson.dumps(served).decode()
    assert w.get("/v1/users/eve/beliefs?as_of=yesterday")["error"]["field"] == "as_of"
