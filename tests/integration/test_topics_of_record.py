"""Topics of record (`episodes`, `reflections`) keep everything, and a worker
refuses a broker that would delete from them (issue 30, item 6).

The judging is pure and tested without a broker; the rest against the real
one (Tansu by default, noida-db with REFLECT_TEST_BROKER=noida): what the
topics are created with, read back through DescribeConfigs, and the start
refusing a topic of record pre-created with a week's retention. Tansu does
not support AlterConfigs, so the bad topic is created with its config.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.settings import Settings, SettingsError
from streams.topics import (TopicError, check_retention, dead_letters, deleting, described, ensure_topics, judge,
                            of_record, topic_configs)
from support.harness import run

WEEK_MS = "604800000"
KEPT = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}


def plain(**overrides) -> Settings:
    return Settings.load(env={}, **overrides)


def everything_kept(settings: Settings, **changed) -> dict[str, dict[str, str]]:
    """Live configs as a broker reports them for topics created right, with `changed` topics' configs merged in."""
    return {name: {**KEPT, **changed.get(name, {})} for name in (*of_record(settings), *dead_letters(settings))}


# --- fast tier: the pure parts ---------------------------------------------------

@pytest.mark.parametrize("configs, found", [
    (KEPT, []),
    ({"retention.ms": WEEK_MS, "retention.bytes": "-1", "cleanup.policy": "delete"}, [f"retention.ms={WEEK_MS}"]),
    ({"retention.ms": "-1", "retention.bytes": "1073741824"}, ["retention.bytes=1073741824"]),
    ({"cleanup.policy": "compact"}, ["cleanup.policy=compact"]),
    ({"retention.ms": "-1", "cleanup.policy": "compact,delete"}, ["cleanup.policy=compact,delete"]),
    ({}, []),  # nothing reported: unknown, not deleting (judge says so)
])
def test_deleting_names_each_config_under_which_records_go(configs, found):
    assert deleting(configs) == found


def test_topics_of_record_and_dead_letters_are_created_to_keep_everything():
    s = plain(min_insync_replicas=1)
    assert of_record(s) == ("episodes", "reflections")  # what streams/worker/rebuild.py replays
    for name in (*of_record(s), *dead_letters(s)):
        assert topic_configs(name, s) == {**KEPT, "min.insync.replicas": "1"}, name
    requests = topic_configs(s.topic_requests, s)
    assert requests["cleanup.policy"] == "delete" and requests["retention.ms"] == WEEK_MS
    assert topic_configs("episodes", plain(replication_factor=3, min_insync_replicas=2))["min.insync.replicas"] == "2"


def test_a_topic_of_record_that_deletes_is_refused_in_one_line_naming_it_and_what_to_change():
    s = plain()
    refusal, notes = judge(everything_kept(s, episodes={"retention.ms": WEEK_MS}), s)
    assert refusal and "\n" not in refusal and notes == []
    assert f"'episodes' has retention.ms={WEEK_MS}" in refusal
    assert "retention.ms=-1" in refusal and "REFLECT_ALLOW_FINITE_RETENTION=true" in refusal
    assert "reflections" not in refusal
    refusal, _ = judge(everything_kept(s, reflections={"cleanup.policy": "compact"}), s)
    assert "'reflections' has cleanup.policy=compact" in refusal


def test_the_override_starts_anyway_and_says_so():
    s = plain(allow_finite_retention=True)
    refusal, notes = judge(everything_kept(s, episodes={"retention.ms": WEEK_MS}), s)
    assert refusal is None
    assert len(notes) == 1 and "'episodes'" in notes[0] and "REFLECT_ALLOW_FINITE_RETENTION" in notes[0]


def test_a_dead_letter_topic_that_deletes_is_logged_not_refused():
    s = plain()
    refusal, notes = judge(everything_kept(s, **{s.dlq_episodes: {"retention.ms": WEEK_MS}}), s)
    assert refusal is None and len(notes) == 1 and f"'{s.dlq_episodes}' has retention.ms={WEEK_MS}" in notes[0]


def test_what_the_broker_does_not_say_is_logged_not_refused():
    s = plain()
    kept = everything_kept(s)
    refusal, notes = judge({**kept, "episodes": None, "reflections": {}}, s)
    assert refusal is None
    assert any("'episodes'" in n and "not checked" in n for n in notes)
    assert any("'reflections'" in n and "does not report retention.ms" in n for n in notes)
    assert judge(kept, s) == (None, [])


def test_replication_and_min_insync_replicas_are_settings():
    s = plain()
    assert (s.replication_factor, s.min_insync_replicas, s.allow_finite_retention) == (1, 1, False)
    s = Settings.load(env={"REFLECT_REPLICATION_FACTOR": "3", "REFLECT_MIN_INSYNC_REPLICAS": "2",
                           "REFLECT_ALLOW_FINITE_RETENTION": "1"})
    assert (s.replication_factor, s.min_insync_replicas, s.allow_finite_retention) == (3, 2, True)
    with pytest.raises(SettingsError, match="REFLECT_MIN_INSYNC_REPLICAS.*more than.*REFLECT_REPLICATION_FACTOR"):
        Settings.load(env={"REFLECT_MIN_INSYNC_REPLICAS": "2"})


# --- against the real broker ------------------------------------------------------

async def _live_configs(settings: Settings, names) -> dict[str, dict[str, str] | None]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
    await admin.start()
    try:
        return described(await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]))
    finally:
        await admin.close()


async def _create(settings: Settings, name: str, configs: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, settings.partitions, 1, topic_configs=configs)])
    finally:
        await admin.close()


def _reflect(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streams.cli", *args], env={**settings.child_env(), **env},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.integration
@pytest.mark.broker
def test_topics_are_created_with_their_configs_and_read_back(settings):
    run(ensure_topics(settings))
    live = run(_live_configs(settings, settings.topics))
    for name in (*of_record(settings), *dead_letters(settings)):
        assert {k: live[name].get(k) for k in KEPT} == KEPT, (name, live[name])
    assert live[settings.topic_requests]["retention.ms"] == WEEK_MS
    assert live[settings.topic_requests]["cleanup.policy"] == "delete"
    assert all(live[name]["min.insync.replicas"] == "1" for name in settings.topics)
    assert run(check_retention(settings)) == []  # nothing to say: every config reported and kept


@pytest.mark.integration
@pytest.mark.broker
def test_a_topic_of_record_with_a_weeks_retention_stops_the_start_unless_allowed(settings):
    run(_create(settings, settings.topic_episodes, {"retention.ms": WEEK_MS}))
    with pytest.raises(TopicError, match=f"'{settings.topic_episodes}' has retention.ms={WEEK_MS}"):
        run(_topics_then_check(settings))

    # The worker refuses before it starts anything: one line, exit status 2.
    refused = _reflect(settings, "worker")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("reflect: error: topic of record") and f"retention.ms={WEEK_MS}" in line
    assert settings.topic_episodes in line and "REFLECT_ALLOW_FINITE_RETENTION" in line

    allowed = _reflect(settings, "topics", "create", REFLECT_ALLOW_FINITE_RETENTION="true")
    assert allowed.returncode == 0, allowed.stderr
    assert f"'{settings.topic_episodes}' has retention.ms={WEEK_MS}: started anyway" in allowed.stdout
    assert run(check_retention(replace(settings, allow_finite_retention=True)))


async def _topics_then_check(settings: Settings) -> list[str]:
    await ensure_topics(settings)
    return await check_retention(settings)


@pytest.mark.integration
@pytest.mark.broker
def test_a_compacted_topic_of_record_is_refused(settings):
    run(_create(settings, settings.topic_reflections, {"cleanup.policy": "compact", "retention.ms": "-1"}))
    with pytest.raises(TopicError, match=f"'{settings.topic_reflections}' has cleanup.policy=compact"):
        run(_topics_then_check(settings))


@pytest.mark.integration
@pytest.mark.broker
def test_a_topic_the_broker_cannot_describe_is_said_not_refused(settings):
    """The real broker's answer for a topic it does not have: an error (noida-db,
    like Kafka) or no configs at all (Tansu); either is a note, never a refusal."""
    missing = f"{settings.topic_episodes}-absent"
    live = run(_live_configs(settings, [missing]))
    assert live[missing] in (None, {})
    s = replace(settings, topic_episodes=missing)
    refusal, notes = judge({**everything_kept(s), missing: live[missing]}, s)
    assert refusal is None and any(f"'{missing}'" in n for n in notes)
