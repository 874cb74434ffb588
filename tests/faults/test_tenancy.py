"""Fault suite, tenancy (issue 8): no read, retrieval or citation crosses users.

A seeded random history — 20 users, 400 episodes over a small vocabulary (so
texts overlap heavily and many are identical across users), and episode ids
that every user reuses (e0..e15) — runs through a real worker with reflection
cycles, then retractions of ids other users hold too (one an erasure of a
text another user holds verbatim, one of an id only another user has).

Then, for every user, every read route (episodes, beliefs, beliefs as_of,
explain, recall in each mode, stats) must return exactly that user's data, as
the topics say it should be; another user's belief id under this user's path
is a 404; every belief's evidence is the user's own; a retraction invalidated
only its own user's beliefs. Last, with the worker stopped, the view itself:
every point's payload belongs to the user its id was written for, and there is
no other point.
"""

from __future__ import annotations

import random
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field, replace

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from processors.embedders import HashingEmbedder
from processors.projector import point_id
from streams.adapters.view.edge import EdgeView
from schemas import now
from streams.topics import ensure_topics
from streams.worker.ownership import NO_USER, WATERMARKS
from support.broker import committed_offsets, read_opened, read_topic
from support.harness import run, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.broker]
USERS = [f"t{i:02d}" for i in range(20)]
SHARED_IDS = [f"e{i}" for i in range(16)]  # every user has these ids
THEMES = ["auth deploy", "flaky test", "database migration", "code review", "on-call page", "release notes"]
DETAILS = ["needed the logs first", "was retried twice", "broke staging", "waited for a review", "was rolled back"]
COMMON = [f"{t} {d}" for t in THEMES[:2] for d in DETAILS]  # held verbatim by many users


def history(seed: int = 20261203) -> dict[str, list[tuple[str, str, float]]]:
    """user → [(episode id, text, importance)] in the order the user wrote them."""
    rng = random.Random(seed)
    out = {}
    for u in USERS:
        ids = SHARED_IDS + [f"{u}.only.{j}" for j in range(4)]
        rng.shuffle(ids)
        out[u] = [(eid, rng.choice(COMMON) if rng.random() < 0.35 else
                   f"{rng.choice(THEMES)} {rng.choice(DETAILS)} ({rng.choice(['ticket', 'note', 'run'])} "
                   f"{rng.randrange(40)})", round(rng.uniform(0.5, 1.0), 2)) for eid in ids]
    for u in USERS[:10]:  # one id with one text and top importance for half the users
        out[u] = [(eid, COMMON[0], 1.0) if eid == "e0" else item for item in out[u] for eid in [item[0]]]
    return out


@dataclass
class Expected:
    """What each user's view must hold, from the history and the reflections topic."""
    texts: dict[str, dict[str, str]]  # user → episode id → text
    retracted: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    created: dict[str, dict[str, dict]] = field(default_factory=lambda: defaultdict(dict))  # user → id → event
    invalid: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def read(self, events: list[dict]) -> "Expected":
        for e in events:
            if e["type"] == "ReflectionCreated":
                self.created[e["user_id"]][e["reflection_id"]] = e
            elif e["type"] == "ReflectionInvalidated" and e["status"] == "invalid":
                self.invalid[e["user_id"]].add(e["reflection_id"])
        return self

    def own(self, u: str) -> set[str]:
        return set(self.texts[u]) | set(self.created[u])

    def live(self, u: str) -> set[str]:
        return set(self.created[u]) - self.invalid[u]


async def _behind(settings, tps) -> list:
    """Partitions whose messages the worker's group has not all committed (so
    some agent is not done with them); the ends of the topics it writes are exact."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, group_id=settings.app_id,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        end = await consumer.end_offsets(tps)
        return [tp for tp in tps if (await consumer.committed(tp) or 0) < end[tp]]
    finally:
        await consumer.stop()


def settle(s, w, episodes_end: dict) -> list[dict]:
    """Wait until the worker is done: every agent past every event, every cycle
    asked for completed, every belief of the reflections topic in the view."""
    written = [TopicPartition(t, p) for t in (s.topic_reflections, s.topic_requests) for p in range(s.partitions)]

    def done():
        # The episodes first: once they are committed, what their batches forwarded (a retraction's
        # walk, a request) is on the topics below, whose ends are read after.
        ours = run(committed_offsets(s, list(episodes_end)))
        if any((ours[tp] or 0) < end for tp, end in episodes_end.items()) or run(_behind(s, written)):
            return None
        events = run(read_opened(s, s.topic_reflections))
        requests = run(read_topic(s, s.topic_requests, lambda r: orjson.loads(r.value)))
        asked = {r["cycle_id"] for r in requests if "cycle_id" in r}  # a forwarded retraction is no cycle
        # Completed: those asked, and the revalidation cycles a walk runs within it.
        completed = {e["cycle_id"] for e in events if e["type"] == "ReflectionCycleCompleted"}
        beliefs = Expected({}).read(events).created
        in_view = all(w.stats(u).get("reflections") == len(beliefs[u]) for u in USERS)
        return events if asked <= completed and in_view else None
    return wait_for(done, 90, "every event consumed, every cycle completed, every belief in the view", every=0.5)


def ends(events) -> dict:
    out: dict = {}
    for metadata in events:
        tp = TopicPartition(metadata.topic, metadata.partition)
        out[tp] = max(out.get(tp, 0), metadata.offset + 1)
    return out


async def _produce(settings, events):
    """Publish keyed by user; the broker's (partition, offset) of each."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(settings.topic_episodes, e.encode(), key=e.user_id.encode()) for e in events]
        return [await f for f in futures]
    finally:
        await producer.stop()


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def nodes(tree: dict):
    yield tree
    for child in tree.get("evidence", ()):
        yield from nodes(child)


def check_reads(w, exp: Expected, u: str, as_of_mid: str, held_mid: set[str]) -> int:
    """Every read route of user u answers u's data only, exactly; returns the requests made."""
    calls = 0

    def get(path):
        nonlocal calls
        calls += 1
        return w.get(f"/v1/users/{u}/{path}")

    for eid, text in exp.texts[u].items():
        p = get(f"episodes/{q(eid)}")
        assert (p["user_id"], p["episode_id"]) == (u, eid), p
        if eid in exp.retracted[u]:
            assert p["status"] == "retracted" and "text" not in p, p
        else:
            assert (p["status"], p["text"]) == ("recorded", text), (u, eid, p)
    others = [v for v in USERS if v != u]
    for v in others[:3]:  # another user's own ids, and beliefs, are not found under u
        if f"{v}.only.0" not in exp.texts[u]:  # (not the tombstone x's retraction left)
            assert get(f"episodes/{q(f'{v}.only.0')}")["status"] == 404
        for rid in sorted(exp.created[v])[:3]:
            assert get(f"reflections/{rid}")["status"] == 404

    stats = get("stats")
    assert (stats["episodes"], stats["retracted"], stats["reflections"]) == (
        len(exp.texts[u]) - len(exp.retracted[u]), len(exp.retracted[u]), len(exp.created[u])), stats

    for path, expected in (("beliefs?limit=1000", exp.live(u)),
                           (f"beliefs?limit=1000&as_of={q(now())}", exp.live(u)),
                           (f"beliefs?limit=1000&as_of={q(as_of_mid)}", held_mid),
                           ("beliefs?limit=1000&as_of=2000-01-01T00:00:00Z", set())):
        served = get(path)["beliefs"]
        assert {b["reflection_id"] for b in served} == expected, (u, path)
        for b in served:  # (an erased belief, served as of before its erasure, has no text: nor on the log)
            assert b.get("text") == exp.created[u][b["reflection_id"]].get("text"), (u, b)
            assert set(b["evidence_ids"]) <= exp.own(u), (u, b)

    for rid, event in exp.created[u].items():
        answer = get(f"reflections/{rid}")
        assert answer["belief"]["reflection_id"] == rid and answer["user_id"] == u
        for node in nodes(answer["provenance"]):
            assert node["id"] in exp.own(u) and node["status"] != "unknown", (u, node)
            if node["kind"] == "episode" and "text" in node:
                assert node["text"] == exp.texts[u][node["id"]], (u, node)
            elif "text" in node:
                assert node["text"] == exp.created[u][node["id"]].get("text"), (u, node)

    for query, mode in (("how does the user usually handle an auth deploy?", "auto"),
                        ("which flaky test was retried twice?", "instance"),
                        ("code review waited", "pattern")):
        answer = get(f"recall?{urllib.parse.urlencode({'q': query, 'mode': mode, 'k': 20})}")
        assert answer["user_id"] == u and answer["results"], (u, query)
        for r in answer["results"]:
            if r["kind"] == "episode":
                assert r["text"] == exp.texts[u][r["id"]] and r["id"] not in exp.retracted[u], (u, r)
            else:
                assert r["id"] in exp.live(u) and r["text"] == exp.created[u][r["id"]]["text"], (u, r)
                assert set(r["evidence_ids"]) <= exp.own(u)
                assert all(x["text"] == exp.texts[u].get(x["id"], exp.created[u].get(x["id"], {}).get("text"))
                           for x in r["evidence"]), (u, r)
    return calls


def test_every_read_and_every_citation_stays_within_its_user(settings, worker):
    from schemas import EpisodeRecorded, EpisodeRetracted

    s = replace(settings, threshold=4.0, min_episodes=5)
    run(ensure_topics(s))
    w = worker(s)
    data = history()
    exp = Expected({u: {eid: text for eid, text, _ in data[u]} for u in USERS})
    recorded = [EpisodeRecorded(user_id=u, episode_id=eid, text=text, importance=imp, event_id=f"{u}:{eid}",
                                occurred_at=f"2026-06-01T{9 + i // 60:02d}:{i % 60:02d}:00Z")
                for i in range(20) for u in USERS for eid, text, imp in [data[u][i]]]  # round-robin over users
    episodes_end = ends(run(_produce(s, recorded)))
    events = settle(s, w, episodes_end)
    exp.read(events)
    as_of_mid = now()
    held_mid = {u: set(exp.created[u]) for u in USERS}
    assert sum(map(len, held_mid.values())) >= 40, "too few beliefs to check tenancy with"

    # Retractions of ids other users hold too.
    citing = defaultdict(set)  # (user, episode id) → that user's beliefs citing it
    for u in USERS:
        for rid, e in exp.created[u].items():
            for eid in e["evidence_ids"]:
                citing[u, eid].add(rid)
    # 1. An erasure by x of an id y's belief cites, whose text y holds verbatim
    #    (and, if any, one that x's beliefs cite too: their invalidation shows it was applied).
    y, x, erased = max(((y, x, eid) for (y, eid) in sorted(citing) if eid in SHARED_IDS for x in USERS if x != y),
                       key=lambda c: (exp.texts[c[1]][c[2]] == exp.texts[c[0]][c[2]], (c[1], c[2]) in citing))
    assert exp.texts[x][erased] == exp.texts[y][erased] and (x, erased) in citing
    # 2. An "incorrect" retraction by a third user of an id its beliefs cite (y's too, if any).
    x2, wrong = max(((x2, eid) for (x2, eid) in sorted(citing) if x2 not in (x, y) and eid in SHARED_IDS
                     and eid != erased), key=lambda c: (y, c[1]) in citing)
    # 3. A retraction by x of an id only y has: a tombstone for x, nothing for y.
    foreign = f"{y}.only.0"
    retractions = [EpisodeRetracted(user_id=x, episode_id=erased, reason="erasure"),
                   EpisodeRetracted(user_id=x2, episode_id=wrong, reason="incorrect"),
                   EpisodeRetracted(user_id=x, episode_id=foreign, reason="incorrect")]
    exp.retracted[x] |= {erased, foreign}
    exp.retracted[x2].add(wrong)
    exp.texts[x][foreign] = ""  # x now has a (tombstone) point of that id
    episodes_end.update(ends(run(_produce(s, retractions))))
    events = settle(s, w, episodes_end)
    exp.read(events)

    invalidated = [e for e in events if e["type"] == "ReflectionInvalidated"]
    assert invalidated, "the retractions should have invalidated beliefs of x and x2"
    for e in invalidated:  # only the retracting users' beliefs, caused by their own retraction
        # (or by one of their beliefs it invalidated, which a later belief cited)
        u = e["user_id"]
        assert u in (x, x2) and e["cause"] in exp.retracted[u] | exp.invalid[u], e
        assert e["reflection_id"] in exp.created[u] and set(e["path"]) <= exp.own(u), e
    assert citing[y, erased] and not (citing[y, erased] | citing[y, wrong]) & exp.invalid[y]
    assert w.get(f"/v1/users/{y}/episodes/{erased}")["text"] == exp.texts[y][erased]  # the same text, y's: kept
    assert w.get(f"/v1/users/{y}/episodes/{q(foreign)}")["status"] == "recorded"

    for u in USERS:  # beliefs rest on the user's own records, which occurred before them
        for e in exp.created[u].values():
            assert set(e["evidence_ids"]) <= exp.own(u) and e["user_id"] == u
    calls = sum(check_reads(w, exp, u, as_of_mid, held_mid[u]) for u in USERS)
    assert not [r for t in (s.dlq_episodes, s.dlq_reflections) for r in run(read_topic(s, t, lambda r: r.value))]
    assert "Crashed reason" not in w.log_path.read_text(errors="replace")
    assert w.alive()
    print(f"\ntenancy: {len(recorded)} episodes of {len(USERS)} users, "
          f"{len({e['cycle_id'] for e in events if e['type'] == 'ReflectionCycleCompleted'})} cycles, "
          f"{sum(map(len, exp.created.values()))} beliefs, {len(invalidated)} invalidations "
          f"({x} erased {erased}, {x2} retracted {wrong}, {x} retracted {foreign}), {calls} reads checked")

    # The view itself, with the worker stopped (one process owns a shard).
    w.stop()
    view = EdgeView(s.view_dir, s.view, HashingEmbedder().dim)
    try:
        expected_points = {}
        for u in USERS:
            expected_points.update({point_id("episode", u, eid): (u, "episode", eid) for eid in exp.texts[u]})
            expected_points.update({point_id("reflection", u, rid): (u, "reflection", rid) for rid in exp.created[u]})
            for pid, p in view.scroll(u):
                if p["kind"] == "erasure":  # an erasure's proof: of the user's own retraction, under its own id
                    assert p["episode_id"] in exp.retracted[u] and pid == point_id("erasure", u, p["erasure_id"]), p
                    expected_points[pid] = (u, "erasure", p["episode_id"])
                    continue
                if p["kind"] == "cycle":  # what a cycle read: the user's own records only
                    assert set(p["read_ids"]) <= exp.own(u) and pid == point_id("cycle", u, p["cycle_id"]), p
                    expected_points[pid] = (u, "cycle", p["cycle_id"])
                    continue
                assert expected_points.get(pid) == (u, p["kind"], p.get("episode_id") or p["reflection_id"]), p
        every, offset = {}, None
        while True:  # every point, no filter: nothing else is there but the watermarks
            records, offset = view._shard.scroll(view._q.ScrollRequest(offset=offset, limit=512, with_payload=True))
            every.update((str(r.id), dict(r.payload)) for r in records)
            if offset is None:
                break
        assert every.pop(WATERMARKS)["user_id"] == NO_USER  # the view's own watermarks, of no user
        assert set(every) == set(expected_points)
        for pid, p in every.items():
            named = p.get("episode_id") or p.get("reflection_id") or p["cycle_id"]
            assert expected_points[pid] == (p["user_id"], p["kind"], named)
    finally:
        view.close()


def test_a_user_id_with_a_colon_shares_no_point_with_another_user(settings, worker):
    from schemas import EpisodeRecorded, EpisodeRetracted

    run(ensure_topics(settings))
    w = worker(settings)
    victim = EpisodeRecorded(user_id="acme:bob", episode_id="e1", text="bob's private note", importance=0.5)
    run(_produce(settings, [victim]))
    wait_for(lambda: w.get("/v1/users/acme%3Abob/episodes/e1").get("text") == victim.text, 30, "bob's episode")
    intruder = EpisodeRecorded(user_id="acme", episode_id="bob:e1", text="acme's own note", importance=0.5)
    run(_produce(settings, [intruder, EpisodeRetracted(user_id="acme", episode_id="bob:e1", reason="erasure"),
                            EpisodeRecorded(user_id="acme", episode_id="marker", text="marker", importance=0.1)]))
    wait_for(lambda: w.get("/v1/users/acme/episodes/marker").get("text") == "marker", 30, "acme's marker")
    assert w.get("/v1/users/acme/episodes/bob%3Ae1")["status"] == "retracted"
    answer = w.get("/v1/users/acme%3Abob/episodes/e1")
    assert (answer.get("status"), answer.get("text")) == ("recorded", victim.text), answer
    assert w.stats("acme%3Abob")["episodes"] == 1
