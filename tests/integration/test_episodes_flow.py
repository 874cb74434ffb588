"""Episodes end to end: real broker, real `reflect worker`, real Qdrant Edge view."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from streams.producer import Publisher
from streams.topics import TopicError, ensure_topics
from support.broker import opened_values
from support.harness import run, settings_env, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.broker]


async def _publish_many(settings, episodes):
    async with Publisher(settings) as p:
        return [await p.publish_episode(user, text, imp, episode_id=eid, wait=False)
                for user, eid, text, imp in episodes]


async def _produce_raw(settings, values, key=b"mallory"):
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(settings.topic_episodes, value, key=key)
    finally:
        await producer.stop()


async def _read_all(settings, topic, expected, timeout=30.0):
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    got = []
    try:
        import asyncio

        async def drain():
            async for message in consumer:
                got.append(message)
                if len(got) >= expected:
                    return
        await asyncio.wait_for(drain(), timeout)
    finally:
        await consumer.stop()
    return got


def test_topics_create_is_idempotent_with_configured_partitions(settings):
    first = run(ensure_topics(settings))
    again = run(ensure_topics(settings))
    assert set(first.values()) == {"created"} and set(again.values()) == {"exists"}

    async def partitions():
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
        await admin.start()
        try:
            return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(list(settings.topics))}
        finally:
            await admin.close()
    assert run(partitions()) == {t: settings.partitions for t in settings.topics}


def test_existing_topic_with_other_partition_count_is_refused(settings):
    run(ensure_topics(settings))
    with pytest.raises(TopicError, match="REFLECT_PARTITIONS"):
        run(ensure_topics(replace(settings, partitions=settings.partitions + 1)))


def test_existing_topic_with_other_replication_factor_is_reported(settings):
    run(ensure_topics(settings))
    wider = replace(settings, replication_factor=settings.replication_factor + 1)
    outcomes = run(ensure_topics(wider))
    assert set(outcomes) == set(settings.topics)
    assert all(outcome.startswith(f"exists, replication factor {settings.replication_factor} where settings say "
                                  f"{wider.replication_factor} (REFLECT_REPLICATION_FACTOR)")
               for outcome in outcomes.values()), outcomes


def test_cli_send_reaches_the_view(settings, worker):
    w = worker()
    env = settings_env(settings)
    out = subprocess.run([sys.executable, "-m", "streams.cli", "send", "--user", "alice",
                          "--text", "the deploy failed because the auth token expired",
                          "--importance", "0.8", "--episode-id", "ep-1"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ep-1"
    point = wait_for(lambda: (p := w.get("/v1/users/alice/episodes/ep-1")) and "text" in p and p,
                     30, "ep-1 in the view")
    assert point["text"] == "the deploy failed because the auth token expired"
    assert point["importance"] == 0.8 and point["status"] == "recorded" and point["depth"] == 0
    assert point["kind"] == "episode" and point["user_id"] == "alice"
    # Scoped to its user: another user asking for the same id sees nothing.
    assert w.get("/v1/users/bob/episodes/ep-1")["status"] == 404


def test_many_users_projected_then_replayed_without_change(settings, worker):
    run(ensure_topics(settings))
    episodes = [(f"user-{i % 5}", f"ep-{i}", f"episode number {i} about topic {i % 7}", (i % 10) / 10)
                for i in range(200)]
    run(_publish_many(settings, episodes))
    w = worker()
    wait_for(lambda: sum(w.stats(f"user-{u}").get("episodes", 0) for u in range(5)) == 200,
             60, "200 episodes in the view")
    # The same events again (a producer retry, a replay): the view is unchanged.
    run(_publish_many(settings, episodes[:100]))
    run(_publish_many(settings, [("user-0", "marker", "last one", 0.1)]))
    wait_for(lambda: w.get("/v1/users/user-0/episodes/marker").get("text") == "last one", 30, "marker")
    assert [w.stats(f"user-{u}")["episodes"] for u in range(5)] == [40 + 1, 40, 40, 40, 40]


def test_retraction_removes_text_and_vector_and_is_terminal(settings, worker):
    run(ensure_topics(settings))
    w = worker()

    async def scenario():
        async with Publisher(settings) as p:
            await p.publish_episode("carol", "carol prefers logs before a retry", 0.6, episode_id="keep")
            await p.publish_episode("carol", "carol said the office is in Paris", 0.6, episode_id="wrong")
            await p.retract_episode("carol", "wrong", "incorrect")
            # A redelivered EpisodeRecorded after the retraction must not resurrect it,
            # and a retraction of an episode never seen leaves a tombstone.
            await p.publish_episode("carol", "carol said the office is in Paris", 0.6, episode_id="wrong")
            await p.retract_episode("carol", "never-seen", "erasure")
            await p.publish_episode("carol", "text that must never appear", 0.5, episode_id="never-seen")
            await p.publish_episode("carol", "marker", 0.1, episode_id="marker")
    run(scenario())
    wait_for(lambda: w.get("/v1/users/carol/episodes/marker").get("text") == "marker", 30, "marker")
    for eid in ("wrong", "never-seen"):
        point = w.get(f"/v1/users/carol/episodes/{eid}")
        assert point["status"] == "retracted" and "text" not in point, point
    assert w.get("/v1/users/carol/episodes/never-seen")["retraction_reason"] == "erasure"
    stats = w.stats("carol")
    assert (stats["episodes"], stats["retracted"], stats["reflections"]) == (2, 2, 0)


def test_bad_input_goes_to_the_dlq_and_the_worker_keeps_going(settings, worker):
    run(ensure_topics(settings))
    w = worker()
    good = {"type": "EpisodeRecorded", "schema_version": 1, "event_id": "g1", "user_id": "mallory",
            "occurred_at": "2026-12-01T10:00:00Z", "recorded_at": "2026-12-01T10:00:00Z",
            "episode_id": "fine", "text": "fine", "importance": 0.5}
    bad = [
        b'{"type": "EpisodeRecorded", "user_id": ',                    # truncated JSON
        orjson.dumps({**good, "importance": 3}),                        # out of range
        orjson.dumps({**good, "schema_version": 9}),                    # future version
        orjson.dumps({**good, "type": "SomethingElse"}),                # unknown type
        orjson.dumps(good).replace(b'"text":"fine"', b'"text":"\xff\xfe"'),  # non-UTF-8 text
        orjson.dumps({**good, "type": "ReflectionRequested", "cycle_id": "c", "why": "revalidation"}),
    ]
    run(_produce_raw(settings, [*bad, orjson.dumps(good)]))
    wait_for(lambda: w.get("/v1/users/mallory/episodes/fine").get("text") == "fine", 30, "the good event")
    assert b"\xff" in bad[4]
    letters = run(_read_all(settings, settings.dlq_episodes, len(bad)))
    assert sorted(m.value for m in letters) == sorted(bad)  # original bytes, each exactly once
    fields = sorted(dict(m.headers)["reflect.errors.field"].decode() for m in letters)
    assert fields == sorted(["(payload)", "importance", "schema_version", "type", "text", "why"])
    for m in letters:
        headers = dict(m.headers)
        assert headers["__connect.errors.topic"].decode() == settings.topic_episodes
        assert int(headers["__connect.errors.offset"]) >= 0
        assert headers["__connect.errors.exception.message"]
    assert w.alive()


def test_reflection_cycle_forms_cited_beliefs_scoped_to_the_user(settings, worker):
    s = replace(settings, threshold=2.0, min_episodes=4)
    run(ensure_topics(s))
    w = worker(s)
    texts = ["revert of PR {n}: the auth middleware broke login",
             "revert of PR {n}: auth token refresh failed in staging",
             "revert of PR {n}: auth session cookie expired early",
             "revert of PR {n}: auth scopes missing after deploy"]
    run(_publish_many(s, [(user, f"{user}-{i}", texts[i].format(n=i), 0.6)
                          for user in ("dana", "erin") for i in range(4)]))
    wait_for(lambda: w.stats("dana").get("reflections", 0) > 0 and w.stats("erin").get("reflections", 0) > 0,
             60, "beliefs for both users")
    created = [m for m in run(_read_until_cycles(s, 2)) if m["type"] == "ReflectionCreated"]
    assert created
    for belief in created:
        assert len(belief["evidence_ids"]) >= 2 and belief["depth"] == 1 and belief["reasoner"] == "offline-extractive"
        assert all(e.startswith(belief["user_id"] + "-") for e in belief["evidence_ids"])


async def _read_until_cycles(settings, cycles, timeout=30.0):
    import asyncio

    consumer = AIOKafkaConsumer(settings.topic_reflections, bootstrap_servers=settings.bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    events = []

    async def drain():
        async for message in consumer:
            events.append(message.value)
            if sum(b'"ReflectionCycleCompleted"' in v for v in events) >= cycles:
                return
    try:
        await asyncio.wait_for(drain(), timeout)
    finally:
        await consumer.stop()
    return await opened_values(settings, events)  # their sealed texts opened


def test_worker_restart_mid_stream_continues_the_accumulator(settings, worker):
    s = replace(settings, threshold=30.0, min_episodes=1)
    run(ensure_topics(s))
    first = worker(s)
    run(_publish_many(s, [("fay", f"fay-{i}", f"note {i}", 0.5) for i in range(30)]))
    wait_for(lambda: first.stats("fay").get("pending_importance") == 15.0, 60, "15.0 pending")
    first.stop()
    second = worker(s)  # same group, same data dir: recovers the table from its changelog
    assert second.stats("fay")["pending_importance"] == 15.0 and second.stats("fay")["cycles"] == 0
    run(_publish_many(s, [("fay", f"fay-{i}", f"note {i}", 0.5) for i in range(30, 60)]))
    wait_for(lambda: second.stats("fay").get("cycles") == 1, 60, "exactly one cycle at 30.0")
    assert second.stats("fay")["pending_importance"] == 0.0 and second.stats("fay")["high_salience"] == 60


def test_no_cycle_below_the_floor_then_exactly_one_and_a_manual_one(settings, worker):
    s = replace(settings, threshold=3.0, min_episodes=8, salience_cut=0.5)
    run(ensure_topics(s))
    w = worker(s)
    texts = ["the auth deploy needed logs first ({n})", "logs before the auth retry ({n})"]
    # 7 high-salience episodes: the sum (6.3) is past the threshold, the floor (8) is not.
    run(_publish_many(s, [("gus", f"gus-{i}", texts[i % 2].format(n=i), 0.9) for i in range(7)]))
    wait_for(lambda: w.stats("gus").get("high_salience") == 7, 30, "7 episodes admitted")
    assert w.stats("gus")["cycles"] == 0 and w.stats("gus")["pending_importance"] == 6.3
    run(_publish_many(s, [("gus", "gus-7", texts[1].format(n=7), 0.9)]))  # the floor is reached
    wait_for(lambda: w.stats("gus").get("high_salience") == 8, 30, "8th episode admitted")
    assert w.stats("gus")["cycles"] == 1 and w.stats("gus")["pending_importance"] == 0.0
    [audit] = [e for e in run(_read_until_cycles(s, 1)) if e["type"] == "ReflectionCycleCompleted"]
    assert (audit["cycle_id"], audit["why"], audit["outcome"]) == ("gus:1", "threshold", "ok")

    answer = _post(s, "/v1/users/gus/reflect")
    assert answer["cycle_id"].startswith("gus:manual:")
    cycles = [e for e in run(_read_until_cycles(s, 2)) if e["type"] == "ReflectionCycleCompleted"]
    assert cycles[-1]["cycle_id"] == answer["cycle_id"] and cycles[-1]["why"] == "manual"
    assert w.stats("gus")["cycles"] == 1  # a manual cycle leaves the threshold accumulator alone


def _post(settings, path):
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{settings.web_port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 202
        return orjson.loads(answer.read())


def test_a_failed_cycle_still_resets_the_accumulator_and_is_not_retried_in_a_loop(settings, worker):
    from support.messages_api import MessagesServer, error

    api = MessagesServer([error(500)])  # the reasoner's API is down
    try:
        s = replace(settings, threshold=2.0, min_episodes=2, reasoner="anthropic", reasoner_retries=1,
                    reasoner_timeout=5.0)
        run(ensure_topics(s))
        w = worker(s, env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})
        run(_publish_many(s, [("hal", f"hal-{i}", f"auth deploy note {i}", 0.8) for i in range(3)]))
        [audit] = [e for e in run(_read_until_cycles(s, 1)) if e["type"] == "ReflectionCycleCompleted"]
        assert audit["outcome"] == "unavailable" and audit["reasoner"] == "anthropic" and "500" in audit["error"]
        assert w.stats("hal")["cycles"] == 1 and w.stats("hal")["pending_importance"] == 0.0  # reset, though it failed
        assert len(api.requests) == 2  # one call, one retry: then the cycle gave up
        run(_publish_many(s, [("hal", f"hal-{i}", f"auth deploy note {i}", 0.8) for i in range(3, 6)]))
        wait_for(lambda: w.stats("hal").get("cycles") == 2, 30, "the next crossing asks again")
        cycles = [e for e in run(_read_until_cycles(s, 2)) if e["type"] == "ReflectionCycleCompleted"]
        assert [c["outcome"] for c in cycles] == ["unavailable", "unavailable"] and len(api.requests) == 4
        assert w.stats("hal")["episodes"] == 6  # ingestion went on
    finally:
        api.close()


def test_only_grounded_insights_of_a_model_answer_are_persisted(settings, worker):
    from support.messages_api import MessagesServer, tool_answer

    from streams.adapters.anthropic import PROMPT_VERSION

    api = MessagesServer({
        "record_questions": tool_answer("record_questions", {"questions": ["What goes wrong with auth deploys?"]}),
        "record_insights": tool_answer("record_insights", {"insights": [
            {"question": 1, "text": "Auth deploys fail on tokens", "citations": [1, 2, 2]},
            {"question": 1, "text": "Cite everything", "citations": [0, -1, 99, 100]},
            {"question": 1, "text": "Only one", "citations": [3]},
            {"question": 1, "text": "Out of range but two valid: auth deploy tokens failed", "citations": [1, 3, 57]},
            # cites two valid statements, but says nothing they support (the grounding check)
            {"question": 1, "text": "Ungrounded: the user collects stamps", "citations": [2, 3]}]})})
    try:
        s = replace(settings, threshold=2.0, min_episodes=3, reasoner="anthropic")
        run(ensure_topics(s))
        worker(s, env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})
        run(_publish_many(s, [(user, f"{user}-{i}", f"auth deploy failed: token {i}", 0.8)
                              for user in ("ivy", "jon") for i in range(3)]))
        events = run(_read_until_cycles(s, 2))
        for user in ("ivy", "jon"):
            created = [e for e in events if e["type"] == "ReflectionCreated" and e["user_id"] == user]
            assert sorted(e["text"] for e in created) == ["Auth deploys fail on tokens",
                                                          "Out of range but two valid: auth deploy tokens failed"]
            assert all(len(e["evidence_ids"]) == 2 and all(i.startswith(f"{user}-") for i in e["evidence_ids"])
                       and e["reasoner"] == "anthropic" and e["prompt_version"] == PROMPT_VERSION for e in created)
            [audit] = [e for e in events if e["type"] == "ReflectionCycleCompleted" and e["user_id"] == user]
            assert [d["text"] for d in audit["drops"] if d["reason"].startswith("not grounded")] == [
                "Ungrounded: the user collects stamps"]
            assert audit["dropped"] == len(audit["drops"]) == 3
            assert audit["usage"]["calls"] == 2 and audit["usage"]["input_tokens"] == 200
    finally:
        api.close()


def test_a_spent_budget_and_an_outage_refuse_cycles_without_calling_the_api(settings, worker):
    from support.messages_api import MessagesServer, OfflineModel, error

    api = MessagesServer(OfflineModel())
    try:
        s = replace(settings, threshold=100.0, reasoner="anthropic", reasoner_retries=0, user_daily_tokens=1,
                    breaker_failures=2, breaker_cooldown=600.0)
        run(ensure_topics(s))
        w = worker(s, env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})
        run(_publish_many(s, [(u, f"{u}-{i}", f"auth deploy failed: token {i}", 0.8)
                              for u in ("kim", "lou") for i in range(4)]))
        wait_for(lambda: w.stats("kim").get("episodes") == 4 and w.stats("lou").get("episodes") == 4, 30, "episodes")
        _post(s, "/v1/users/kim/reflect")  # under budget: runs, and spends past the 1-token budget
        wait_for(lambda: w.stats("kim")["tokens_today"] > 0, 30, "kim's first cycle charged")
        calls = len(api.requests)
        _post(s, "/v1/users/kim/reflect")
        cycles = [e for e in run(_read_until_cycles(s, 2)) if e["type"] == "ReflectionCycleCompleted"]
        assert [c["outcome"] for c in cycles] == ["ok", "refused"] and "budget" in cycles[1]["error"]
        assert cycles[0]["usage"]["calls"] == calls == 2 and len(api.requests) == calls  # refused: no call

        api.answers = lambda body: error(500)  # the API goes down
        for _ in range(4):
            _post(s, "/v1/users/lou/reflect")
        # By user, not by position: kim and lou may sit on different partitions,
        # and a reader sees partitions in whatever order the broker serves them.
        lou = [c for c in run(_read_until_cycles(s, 6))
               if c["type"] == "ReflectionCycleCompleted" and c["user_id"] == "lou"]
        assert [c["outcome"] for c in lou] == ["unavailable", "unavailable", "refused", "refused"]
        assert "breaker open" in lou[2]["error"] and len(api.requests) == calls + 2  # open: fail fast, no call
        state = w.get("/v1/reasoner")
        assert state["breaker"]["state"] == "open" and state["cycles"] == {"ok": 1, "refused": 3, "unavailable": 2}
        assert state["tokens"] == w.stats("kim")["tokens_today"] and state["cost_usd"] > 0
        assert w.stats("lou")["episodes"] == 4  # the pipeline went on
    finally:
        api.close()
