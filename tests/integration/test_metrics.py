"""Metrics, logs and tracing hooks: the registry and its text format on their
own, then a real `reflect worker` scraped after real work (episodes, a dead
letter, a cycle through the Anthropic reasoner over HTTP, a retraction), and
its JSON log lines."""

from __future__ import annotations

import json
import math
import re
import sys
import urllib.request
from collections import namedtuple
from dataclasses import replace

import orjson
import pytest

from streams.settings import Settings, SettingsError
from streams.worker import metrics
from support.harness import run, wait_for

# --- a strict reader of the text exposition format 0.0.4 ----------------------

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse(text: str) -> tuple[dict[str, str], dict[tuple[str, frozenset], float]]:
    """({family: type}, {(sample name, labels): value}); fails on any line that
    is not valid exposition text, a sample before its family's TYPE, or a repeat."""
    assert text.endswith("\n"), "the exposition ends with a line feed"
    types: dict[str, str] = {}
    helps: set[str] = set()
    samples: dict[tuple[str, frozenset], float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        where = f"line {number}: {line!r}"
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert name not in helps, where
            helps.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in _TYPES and name not in types, where
            types[name] = kind
        else:
            match = _SAMPLE.fullmatch(line)
            assert match, where
            name, labels, value = match.groups()
            pairs = _PAIR.findall(labels or "")
            assert ",".join(f'{k}="{v}"' for k, v in pairs) == (labels or ""), where
            assert len({k for k, _ in pairs}) == len(pairs), where
            family = next((f for f in (name, re.sub(r"_(bucket|sum|count)$", "", name)) if f in types), None)
            assert family, f"{where}: no TYPE before it"
            if types[family] != "histogram":
                assert name == family, where
            key = (name, frozenset(pairs))
            assert key not in samples, f"{where}: repeated"
            samples[key] = float(value)  # float() reads +Inf, -Inf and NaN as the format writes them
    assert helps == set(types), "every family has HELP and TYPE"
    return types, samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)


def total(samples, name: str, **labels) -> float:
    """Sum over the series of `name` whose labels include these."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


# --- the registry, without a worker -----------------------------------------

def test_the_registry_renders_valid_exposition_text():
    registry = metrics.Registry()
    events = registry.add(metrics.Counter("t_events_total", 'Events with "quotes" and a \\ backslash.',
                                          ("topic", "outcome"), initial=[{"topic": "e", "outcome": "ok"}]))
    lag = registry.add(metrics.Gauge("t_lag", "Lag.", ("topic", "partition")))
    seconds = registry.add(metrics.Histogram("t_seconds", "Durations.", ("kind",), buckets=(0.1, 1)))
    registry.add(metrics.Counter("t_plain_total", "No labels."))
    events.inc(topic='we"ird\\to\npic', outcome="ok")
    events.inc(2, topic="e", outcome="ok")
    lag.replace({("e", 0): 5, ("e", 1): 0})
    for v in (0.05, 0.5, 3.0):
        seconds.observe(v, kind="episode")
    types, samples = parse(registry.render())
    assert types == {"t_events_total": "counter", "t_lag": "gauge", "t_seconds": "histogram",
                     "t_plain_total": "counter"}
    assert value(samples, "t_events_total", topic="e", outcome="ok") == 2
    assert value(samples, "t_events_total", topic='we\\"ird\\\\to\\npic', outcome="ok") == 1  # escaped
    assert value(samples, "t_plain_total") == 0  # shown before its first event
    assert value(samples, "t_lag", topic="e", partition=0) == 5
    buckets = [value(samples, "t_seconds_bucket", kind="episode", le=le) for le in ("0.1", "1", "+Inf")]
    assert buckets == [1, 2, 3]  # cumulative, +Inf is the count
    assert value(samples, "t_seconds_count", kind="episode") == 3
    assert math.isclose(value(samples, "t_seconds_sum", kind="episode"), 3.55)
    lag.replace({("e", 1): 2})  # a partition no longer assigned disappears
    assert not any(n == "t_lag" and ("partition", "0") in ls for n, ls in parse(registry.render())[1])
    with pytest.raises(ValueError):
        events.inc(-1, topic="e", outcome="ok")
    with pytest.raises(ValueError, match="labels"):
        events.inc(topic="e")


@pytest.mark.parametrize("label", ["user", "user_id"])
def test_a_per_user_label_is_refused(label):
    with pytest.raises(ValueError, match="per-user"):
        metrics.Counter("t_total", "x", ("topic", label))


def test_the_type_label_stays_bounded_whatever_bytes_arrive():
    assert metrics._event_type(b"\xff not json") == "unknown"
    assert metrics._event_type(b'{"type": "DropTable"}') == "unknown"
    assert metrics._event_type(b"[1]") == "unknown"
    assert metrics._event_type(b'{"type": "EpisodeRecorded", "text": 5}') == "EpisodeRecorded"


def test_lag_is_highwater_minus_committed_for_the_topics_read():
    TP = namedtuple("TP", "topic partition")
    assigned = [TP("episodes", 0), TP("episodes", 1), TP("episodes", 2), TP("app-accumulators-changelog", 0)]
    highwater = {TP("episodes", 0): 10, TP("episodes", 1): 4, TP("app-accumulators-changelog", 0): 99}.get
    committed = {TP("episodes", 0): 7}
    assert metrics.lag_of(assigned, highwater, committed, ["episodes"]) == {
        ("episodes", "0"): 3,   # 10 − 7
        ("episodes", "1"): 4,   # never committed: from offset 0
    }                           # partition 2 not fetched yet; the changelog is not a topic read


def test_projector_timing_skips_empty_batches():
    before = metrics.UPSERT_SECONDS.count(kind="reflection")
    applied = []
    timed = metrics.timed_apply(applied.append, "reflection")
    timed([])
    timed(["r1", "r2"])
    assert applied == [[], ["r1", "r2"]] and metrics.UPSERT_SECONDS.count(kind="reflection") == before + 1


def test_tracing_on_needs_opentelemetry_and_wraps_cycles(monkeypatch):
    def run_cycle(request, *rest):
        return [type("Done", (), {"outcome": "ok"})()]

    request = type("Request", (), {"cycle_id": "c:1", "why": "manual"})()
    metrics.configure_tracing(Settings.load(env={}))
    assert metrics.traced_cycle(run_cycle) is run_cycle  # off: nothing in the way
    on = Settings.load(env={"REFLECT_TRACING": "on"})
    try:
        pytest.importorskip("opentelemetry.trace")
        metrics.configure_tracing(on)
        traced = metrics.traced_cycle(run_cycle)
        assert traced is not run_cycle and traced(request)[0].outcome == "ok"
        monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if it were not installed
        with pytest.raises(SettingsError, match="REFLECT_TRACING=on.*opentelemetry-api"):
            metrics.configure_tracing(on)
    finally:
        monkeypatch.undo()
        metrics.configure_tracing(Settings.load(env={}))


# --- a real worker ------------------------------------------------------------

def scrape(port: int) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read().decode()


async def _produce_raw(settings, values, key=b"mallory"):
    from aiokafka import AIOKafkaProducer

    from streams.security import client_options

    producer = AIOKafkaProducer(**client_options(settings))
    await producer.start()
    try:
        return [await producer.send_and_wait(settings.topic_episodes, v, key=key) for v in values]
    finally:
        await producer.stop()


def post(port: int, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST",
                                     data=orjson.dumps(body) if body is not None else b"")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


@pytest.mark.integration
def test_metrics_count_what_the_worker_did(settings, worker):
    from support.messages_api import MessagesServer, OfflineModel

    server = MessagesServer(OfflineModel())
    try:
        s = replace(settings, threshold=1000.0, reasoner="anthropic", reasoner_batch="per-question")
        w = worker(s, env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": server.url})
        port, episodes, requests = s.web_port, s.topic_episodes, s.topic_requests
        for i, text in enumerate(["revert of PR 1 broke auth login", "revert of PR 2: auth token expired",
                                  "revert of PR 3: auth cookie lost"]):
            post(port, "/v1/users/ann/episodes", {"text": text, "importance": 0.8, "episode_id": f"e{i}"})
        run(_produce_raw(s, [b"not an event at all"]))
        wait_for(lambda: w.stats("ann").get("episodes") == 3, 30, "3 episodes in the view")
        post(port, "/v1/users/ann/reflect")
        wait_for(lambda: (w.get("/v1/reasoner") or {}).get("cycles"), 30, "the manual cycle")

        def created_and_projected():
            samples = parse(scrape(port)[1])[1]
            created = value(samples, "reflect_events_total", topic=s.topic_reflections, type="ReflectionCreated",
                            outcome="ok")
            beliefs = w.get("/v1/users/ann/beliefs")["beliefs"]
            # The cycle's audit event follows its beliefs on the topic: wait for it too.
            completed = value(samples, "reflect_events_total", topic=s.topic_reflections,
                              type="ReflectionCycleCompleted", outcome="ok")
            # Counted as read (the runner reads a batch ahead), projected after: wait for the projection too.
            projected = value(samples, "reflect_projector_upsert_seconds_count", kind="reflection")
            return created and completed and projected and len(beliefs) == created and (samples, beliefs)
        samples, beliefs = wait_for(created_and_projected, 30, "every belief created projected")

        content_type, text = scrape(port)
        assert content_type == "text/plain; version=0.0.4; charset=utf-8"
        types, _ = parse(text)
        for name in ("reflect_events_total", "reflect_dlq_events_total", "reflect_cycles_total",
                     "reflect_cycle_duration_seconds", "reflect_reasoner_calls_total",
                     "reflect_reasoner_tokens_total", "reflect_reasoner_errors_total",
                     "reflect_projector_upsert_seconds", "reflect_invalidations_total", "reflect_consumer_lag",
                     "reflect_broker_reachable"):
            assert name in types, name
        assert value(samples, "reflect_broker_reachable") == 1  # its 0 is tests/faults/test_faults_outage.py's
        assert all(n.startswith("reflect_") and (t != "counter" or n.endswith("_total")) for n, t in types.items())
        assert not {k for _, labels in samples for k, _ in labels} & {"user", "user_id"}

        assert value(samples, "reflect_events_total", topic=episodes, type="EpisodeRecorded", outcome="ok") == 3
        assert value(samples, "reflect_events_total", topic=episodes, type="unknown", outcome="dead_lettered") == 1
        assert value(samples, "reflect_dlq_events_total", topic=episodes, stage="decode") == 1
        assert value(samples, "reflect_events_total", topic=requests, type="ReflectionRequested", outcome="ok") == 1
        assert value(samples, "reflect_events_total", topic=s.topic_reflections, type="ReflectionCycleCompleted",
                     outcome="ok") == 1
        assert value(samples, "reflect_cycles_total", outcome="ok") == 1
        assert total(samples, "reflect_cycles_total") == 1
        assert value(samples, "reflect_cycle_duration_seconds_count") == 1
        assert value(samples, "reflect_cycle_duration_seconds_sum") > 0
        reasoner = w.get("/v1/reasoner")
        assert value(samples, "reflect_reasoner_calls_total") == reasoner["calls"] == len(server.requests) >= 2
        assert total(samples, "reflect_reasoner_tokens_total") == reasoner["tokens"]
        assert value(samples, "reflect_reasoner_tokens_total", kind="input") > 0
        assert value(samples, "reflect_reasoner_tokens_total", kind="output") > 0
        assert value(samples, "reflect_reasoner_errors_total") == 0
        for kind in ("episode", "reflection"):
            assert value(samples, "reflect_projector_upsert_seconds_count", kind=kind) >= 1, kind
            assert value(samples, "reflect_projector_upsert_seconds_bucket", kind=kind, le="+Inf") == value(
                samples, "reflect_projector_upsert_seconds_count", kind=kind)
        assert total(samples, "reflect_invalidations_total") == 0

        # Everything read is committed in time: lag 0 on each of the episodes topic's partitions.
        def caught_up():
            lag = {dict(ls)["partition"]: v for (n, ls), v in parse(scrape(port)[1])[1].items()
                   if n == "reflect_consumer_lag" and dict(ls)["topic"] == episodes}
            return set(lag) == {str(p) for p in range(s.partitions)} and not any(lag.values()) and lag
        wait_for(caught_up, 30, "consumer lag 0 on every episodes partition")

        # A retraction: one invalidation per belief citing the episode, each
        # invalid below the citation floor, else weakened.
        gone = "e0"
        citing = [b for b in beliefs if gone in b["evidence_ids"]]
        assert citing, beliefs
        expected = {"invalid": 0, "weakened": 0}
        for b in citing:
            expected["invalid" if len(b["evidence_ids"]) - 1 < s.citation_floor else "weakened"] += 1
        post(port, f"/v1/users/ann/episodes/{gone}/retract", {"reason": "incorrect"})
        wait_for(lambda: total(parse(scrape(port)[1])[1], "reflect_invalidations_total") >= len(citing), 30,
                 "the invalidations counted")
        after = parse(scrape(port)[1])[1]
        assert {k: value(after, "reflect_invalidations_total", status=k) for k in expected} == expected
        assert value(after, "reflect_events_total", topic=episodes, type="EpisodeRetracted", outcome="ok") == 1
    finally:
        server.close()


@pytest.mark.integration
def test_json_logs_are_one_object_a_line_with_the_dead_letters_place(settings, worker):
    w = worker(env={"REFLECT_LOG_FORMAT": "json"})
    # Valid envelope, text over the schema's limit: the contract error quotes
    # the start of the text, which must not reach the log.
    bad = orjson.dumps({"type": "EpisodeRecorded", "schema_version": 1, "event_id": "bad-1", "user_id": "mallory",
                        "occurred_at": "2026-01-01T00:00:00Z", "recorded_at": "2026-01-01T00:00:00Z",
                        "episode_id": "x", "text": "PRIVATE-MARKER " + "y" * 17000, "importance": 0.5})
    [sent] = run(_produce_raw(settings, [bad]))

    def lines():
        return [json.loads(line) for line in w.log_path.read_text().splitlines() if line.strip()]

    def dead_letter_line():
        return next((line for line in lines() if line["message"].startswith("dead-lettered")), None)
    found = wait_for(dead_letter_line, 30, "the dead-letter log line")
    w.stop()  # its shutdown lines are JSON too

    assert (found["topic"], found["partition"], found["offset"]) == (settings.topic_episodes, sent.partition,
                                                                    sent.offset)
    assert (found["level"], found["stage"], found["error_class"], found["logger"]) == (
        "warning", "decode", "ContractError", "reflect")
    every = lines()  # json.loads above fails on any line that is not one JSON object
    assert len(every) > 20 and all({"time", "level", "logger", "message"} <= set(line) for line in every)
    assert "PRIVATE-MARKER" not in w.log_path.read_text()
