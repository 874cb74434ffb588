"""`reflect dlq replay`: the selection without a broker, then the replay end to
end — dead letters planted as the worker writes them, a real worker, the CLI."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from processors.dlq import dead_letter_headers
from schemas import ContractError
from streams.cli.main import main
from streams.cli.dlq_replay import (FILTERED, FOREIGN, REPLAY, REPLAYED_FROM, DeadLetter, Selection, SelectionError,
                                    check, instant, judge, summary)
from streams.settings import Settings
from streams.topics import ensure_topics, read_to_end
from support.broker import committed_offsets
from support.harness import run, settings_env, wait_for

FAILED_AT = datetime(2025, 6, 1, 10, 0, tzinfo=timezone.utc)  # the past outage
EARLIER = datetime(2025, 5, 1, 10, 0, tzinfo=timezone.utc)  # outside the replayed range


def letter(source="episodes", stage="project", at=FAILED_AT, error=None) -> DeadLetter:
    """A dead letter as the worker writes it (its headers from processors.dlq)."""
    headers = dead_letter_headers(source, 1, 17, error or RuntimeError("view unavailable"), stage)
    record = SimpleNamespace(topic="episodes.dlq", partition=0, offset=3, timestamp=int(at.timestamp() * 1000),
                             key=b"dana", value=b"{}", headers=headers)
    return DeadLetter.of(record)


# The selection, pure.

def test_a_dead_letter_reads_its_source_and_stage_from_the_worker_s_headers():
    dead = letter(stage="decode", error=ContractError("importance", "must be at most 1"))
    assert (dead.source, dead.stage, dead.where) == ("episodes", "decode", "episodes.dlq[0]@3")
    assert dead.describe() == ("episodes.dlq[0]@3 2025-06-01T10:00:00.000Z from episodes[1]@17 key=dana "
                               "stage=decode ContractError: importance: must be at most 1")


def test_a_dead_letters_headers_never_quote_the_records_text():
    """What an erasure must reach is the record itself, not copies in its headers."""
    quoting = ContractError("text", "must be at most 16000 characters (got 'SECRET-4242 sits in the payroll')")
    headers = dict(dead_letter_headers("episodes", 1, 17, quoting, "decode"))
    assert headers["__connect.errors.exception.message"] == b"text: must be at most 16000 characters"
    long = dict(dead_letter_headers("episodes", 1, 17, RuntimeError("x" * 5000), "project"))
    assert len(long["__connect.errors.exception.message"]) <= 504


def test_rfc3339_times_need_an_offset():
    assert instant("2025-06-01T09:00:00Z") == datetime(2025, 6, 1, 9, tzinfo=timezone.utc)
    assert instant("2025-06-01T11:00:00+02:00") == datetime(2025, 6, 1, 9, tzinfo=timezone.utc)
    for bad, says in (("2025-06-01", "no offset"), ("2025-06-01T09:00:00", "no offset"),
                      ("yesterday", "not an RFC 3339 time"), ("2025-13-01T00:00:00Z", "not an RFC 3339 time")):
        with pytest.raises(ValueError, match=says):
            instant(bad)


def test_selection_by_source_topic_stage_and_half_open_time_range():
    since, until = instant("2025-06-01T00:00:00Z"), instant("2025-06-02T00:00:00Z")
    assert Selection().takes(letter())
    assert Selection(topics=frozenset({"episodes"})).takes(letter())
    assert not Selection(topics=frozenset({"reflections"})).takes(letter())
    assert Selection(stages=frozenset({"project", "invalidate"})).takes(letter())
    assert not Selection(stages=frozenset({"decode"})).takes(letter())
    window = Selection(since=since, until=until)
    assert window.takes(letter(at=since)) and window.takes(letter())
    assert not window.takes(letter(at=until)) and not window.takes(letter(at=EARLIER))


def test_a_source_that_is_not_reflect_s_is_foreign_only_when_selected():
    ours = ("episodes", "reflections", "reflection-requests")
    assert judge(letter(), Selection(), ours) == REPLAY
    assert judge(letter(source="billing"), Selection(), ours) == FOREIGN
    assert judge(letter(source=""), Selection(), ours) == FOREIGN  # no headers: never guessed
    assert judge(letter(source="billing"), Selection(stages=frozenset({"decode"})), ours) == FILTERED


def test_flags_that_cannot_match_are_refused_naming_the_flag():
    settings = Settings.load(env={})
    with pytest.raises(SelectionError, match="--topic billing: not one of Reflect's topics"):
        check(Selection(topics=frozenset({"billing", "episodes"})), settings)
    with pytest.raises(SelectionError, match="--since must be before --until"):
        check(Selection(since=FAILED_AT, until=EARLIER), settings)


def test_summary_counts_by_outcome_then_topic_and_stage():
    counts = Counter({(REPLAY, "episodes", "project"): 2, (FILTERED, "episodes", "invalidate"): 1,
                      (FOREIGN, "billing", "project"): 1})
    assert summary(counts, "replayed") == [
        "replayed 2, skipped 1 by filter, 1 from a topic that is not Reflect's",
        "  filtered       episodes stage=invalidate: 1",
        "  foreign        billing stage=project: 1",
        "  replayed       episodes stage=project: 2",
    ]


def test_bad_flags_are_usage_errors_and_an_absent_broker_is_a_broker_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["dlq", "replay", "--since", "last week"])
    assert exit_.value.code == 2 and "argument --since: 'last week' is not an RFC 3339 time" in capsys.readouterr().err
    assert main(["dlq", "replay", "--topic", "billing", "--broker", "127.0.0.1:1"]) == 2
    assert "--topic billing" in capsys.readouterr().err
    assert main(["dlq", "list", "--broker", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert "REFLECT_BROKER" in err and "Traceback" not in err


# End to end: a real broker and a real worker.

async def _plant(settings: Settings, letters: list[tuple[bytes, bytes, list, datetime]]) -> None:
    """Dead letters as the worker writes them, dated when the failure was."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap)
    await producer.start()
    try:
        for key, value, headers, at in letters:
            await producer.send_and_wait(settings.dlq_episodes, value, key=key, headers=headers,
                                         timestamp_ms=int(at.timestamp() * 1000))
    finally:
        await producer.stop()


def _episode(episode_id: str, user: str = "dana") -> bytes:
    return orjson.dumps({"type": "EpisodeRecorded", "schema_version": 1, "event_id": f"e-{episode_id}",
                         "user_id": user, "occurred_at": "2025-06-01T09:00:00Z",
                         "recorded_at": "2025-06-01T09:00:00Z", "episode_id": episode_id,
                         "text": f"episode {episode_id}", "importance": 0.4})


def _reflect(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "streams.cli", "dlq", *args], env=settings_env(settings),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def _read(settings: Settings, topic: str) -> list:
    return run(read_to_end(settings, [topic]))


def _wait_consumed(settings: Settings) -> None:
    """Until the worker's group has committed past the end of `episodes`: every
    agent reading it is done, and what it dead-lettered is flushed (Faust
    flushes its producer before it commits)."""
    ends = Counter()
    for record in _read(settings, settings.topic_episodes):
        tp = TopicPartition(record.topic, record.partition)
        ends[tp] = max(ends[tp], record.offset + 1)
    wait_for(lambda: all((got or 0) >= ends[tp] for tp, got in run(committed_offsets(settings, list(ends))).items()),
             30, "the worker's group to commit past the replayed events", every=0.3)


def _recent() -> tuple[datetime, datetime, list[str]]:
    """An outage an hour ago, a failure two days before it, and the replayed
    range around the outage: dead letters dated within the broker's retention
    (noida-db, like Kafka, deletes records older than retention.ms by their
    timestamp — letters dated 2025 were gone before the replay read them)."""
    failed_at = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    def rfc3339(at: datetime) -> str:
        return at.isoformat().replace("+00:00", "Z")
    half_hour = timedelta(minutes=30)
    window = ["--since", rfc3339(failed_at - half_hour), "--until", rfc3339(failed_at + half_hour)]
    return failed_at, failed_at - timedelta(days=2), window


def _failure(source: str, stage: str, error: Exception) -> list:
    return dead_letter_headers(source, 0, 5, error, stage)


@pytest.mark.integration
def test_replay_publishes_the_selected_dead_letters_once_in_effect(settings, worker):
    run(ensure_topics(settings))
    episodes, outage = settings.topic_episodes, RuntimeError("view unavailable")
    failed_at, earlier, in_range = _recent()
    planted = [
        (b"dana", _episode("ep-1"), _failure(episodes, "project", outage), failed_at),
        (b"dana", _episode("ep-2"), _failure(episodes, "project", outage), failed_at),
        (b"dana", _episode("ep-3"), _failure(episodes, "invalidate", outage), failed_at),  # another stage
        (b"dana", _episode("ep-4"), _failure(episodes, "project", outage), earlier),  # outside the range
        (b"dana", _episode("ep-5"), _failure("billing", "project", outage), failed_at),  # not Reflect's
    ]
    run(_plant(settings, planted))
    w = worker()

    out = _reflect(settings, "replay", "--stage", "project", *in_range)
    assert "replayed 2, skipped 2 by filter, 1 from a topic that is not Reflect's" in out.stdout
    assert "its source topic 'billing' is not one of Reflect's" in out.stdout
    for episode in ("ep-1", "ep-2"):
        wait_for(lambda: "text" in w.get(f"/v1/users/dana/episodes/{episode}"), 30, f"{episode} in the view")
    _wait_consumed(settings)
    for episode in ("ep-3", "ep-4", "ep-5"):
        assert w.get(f"/v1/users/dana/episodes/{episode}")["status"] == 404
    stats = w.stats("dana")
    assert stats["episodes"] == 2
    replayed = _read(settings, episodes)
    letters = _read(settings, settings.dlq_episodes)
    origin = {f"{m.topic}[{m.partition}]@{m.offset}": (m.key, m.value) for m in letters}
    assert [(m.key, m.value) for m in replayed] == [(b"dana", _episode("ep-1")), (b"dana", _episode("ep-2"))]
    assert [origin[dict(m.headers)[REPLAYED_FROM].decode()] for m in replayed] == [(m.key, m.value) for m in replayed]

    # A dry run publishes nothing; a second replay changes nothing downstream.
    assert "would replay 2" in _reflect(settings, "replay", "--dry-run", "--stage", "project", *in_range).stdout
    assert len(_read(settings, episodes)) == 2
    _reflect(settings, "replay", "--stage", "project", *in_range)
    assert len(_read(settings, episodes)) == 4
    _wait_consumed(settings)
    assert w.stats("dana") == stats
    assert len(_read(settings, settings.dlq_episodes)) == len(planted)  # nothing new dead-lettered
    assert w.alive()


@pytest.mark.integration
def test_a_malformed_dead_letter_replayed_is_dead_lettered_again_with_its_reason(settings, worker):
    run(ensure_topics(settings))
    malformed = b'{"type": "EpisodeRecorded", "user_id": '
    failed_at = _recent()[0]
    planted = [
        (b"mallory", malformed, _failure(settings.topic_episodes, "decode", ContractError("(payload)", "not JSON")),
         failed_at),
        # Refused before a fix of the contract, accepted now: replayed, it is projected.
        (b"mallory", _episode("fixed", "mallory"),
         _failure(settings.topic_episodes, "decode", ContractError("schema_version", "unsupported")), failed_at),
    ]
    run(_plant(settings, planted))
    w = worker()

    _reflect(settings, "replay", "--topic", settings.topic_episodes, "--stage", "decode")
    wait_for(lambda: "text" in w.get("/v1/users/mallory/episodes/fixed"), 30, "the fixed episode in the view")
    again = wait_for(lambda: _read(settings, settings.dlq_episodes)[len(planted):], 30, "a new dead letter")
    [source] = [m for m in _read(settings, settings.topic_episodes) if m.value == malformed]
    assert [(m.key, m.value) for m in again] == [(b"mallory", malformed)]
    headers = {k: v.decode() for k, v in again[0].headers}
    assert headers["__connect.errors.topic"] == settings.topic_episodes
    assert (headers["__connect.errors.partition"], headers["__connect.errors.offset"]) == (
        str(source.partition), str(source.offset))
    assert headers["__connect.errors.stage"] == "decode"
    assert headers["__connect.errors.exception.class.name"] == "ContractError"
    assert headers["reflect.errors.field"] == "(payload)" and headers["__connect.errors.exception.message"]
    assert w.alive() and w.get("/healthz")["status"] == "ok"
