"""Topic creation: every Reflect topic exists, with the configured partitions,
before anything is produced (a topic auto-created by a first produce gets the
broker's default partition count, and Faust then stops with PartitionsMismatch).

`episodes` and `reflections` are topics of record: a rebuild of the view
(`reflect rebuild`, streams/worker/rebuild.py) replays them from offset 0, so they
keep everything — `retention.ms=-1`, `retention.bytes=-1`,
`cleanup.policy=delete`, never compaction (they are keyed by user: compaction
would keep one event per user). At start, `check_retention` reads their live
configs back and refuses a broker that would delete from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import AsyncIterator, Iterable, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from streams.security import client_options
from streams.settings import Settings, SettingsError

KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
# The reflection-requests topic is derived (the accumulator writes it from
# `episodes`; a rebuild never reads it) and consumed within seconds: a week
# covers an outage of the whole group, and is Kafka's own default, said here so
# a cluster with a shorter default does not drop requests a stopped group has
# yet to read.
REQUESTS_RETENTION_MS = str(7 * 24 * 3600 * 1000)
# The key topic of crypto-shredding (streams/keys.py): compacted, so a
# destroyed key's wrapped record leaves the log once compacted (its
# destruction marker, the key's last record, stays), and every key kept
# forever otherwise. A segment rolls daily, so the cleaner can reach a
# destroyed key's record within a day or so of its marker.
KEY_TOPIC = {"cleanup.policy": "compact", "retention.ms": "-1", "segment.ms": str(24 * 3600 * 1000)}
OVERRIDE = "REFLECT_ALLOW_FINITE_RETENTION=true (--allow-finite-retention)"


class TopicError(SettingsError):
    """The cluster's topics disagree with the settings: refused at start like a
    wrong setting (one line, exit status 2), since starting would lose data or
    put keys on other partitions."""


def of_record(settings: Settings) -> tuple[str, ...]:
    """The topics a rebuild replays from the start (streams/worker/rebuild.py)."""
    return settings.topic_episodes, settings.topic_reflections


def dead_letters(settings: Settings) -> tuple[str, ...]:
    return settings.dlq_episodes, settings.dlq_reflections


def topic_configs(name: str, settings: Settings) -> dict[str, str]:
    """The configs `name` is created with.

    Dead-letter topics keep everything too: they hold only what failed (small),
    and `reflect dlq replay` after a fix needs it whenever the fix comes; one
    expiring silently would lose events no other topic holds in usable form.
    """
    durable = {"min.insync.replicas": str(settings.min_insync_replicas)}
    if name in of_record(settings) or name in dead_letters(settings):
        return {**KEEP_FOREVER, **durable}
    if name == settings.topic_requests:
        return {"retention.ms": REQUESTS_RETENTION_MS, "cleanup.policy": "delete", **durable}
    if name == settings.topic_revocations:  # one record per token id is all a worker needs
        return {"cleanup.policy": "compact", **durable}
    if name == settings.topic_keys:
        return {**KEY_TOPIC, **durable}
    return durable


@contextlib.asynccontextmanager
async def _admin(settings: Settings) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=10000)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def ensure_topics(settings: Settings) -> dict[str, str]:
    """Create missing topics; returns {topic: 'created' | 'exists' | 'exists, …'}.

    Idempotent. An existing topic with a different partition count is an error
    (see `existing`); one with another replication factor says so in its
    outcome. An existing topic's configs are not altered: `check_retention`
    judges them.
    """
    async with _admin(settings) as admin:
        shapes = await _shapes(admin)
        outcome: dict[str, str] = {}
        for name in settings.topics:
            if name in shapes:
                outcome[name] = existing(name, *shapes[name], settings)
                continue
            try:
                await admin.create_topics([NewTopic(name, settings.partitions, settings.replication_factor,
                                                    topic_configs=topic_configs(name, settings))])
                outcome[name] = "created"
            except TopicAlreadyExistsError:  # a concurrent creator won
                outcome[name] = "exists"
        return outcome


async def ensure_key_topic(settings: Settings, name: str) -> str:
    """A key topic of another name than the settings' (tests, tools)."""
    configs = {**KEY_TOPIC, "min.insync.replicas": str(settings.min_insync_replicas)}
    async with _admin(settings) as admin:
        if name in await _shapes(admin):
            return "exists"
        try:
            await admin.create_topics([NewTopic(name, settings.partitions, settings.replication_factor,
                                                topic_configs=configs)])
        except TopicAlreadyExistsError:
            return "exists"
        return "created"


def existing(name: str, partitions: int, replication: int, settings: Settings) -> str:
    """The outcome for a topic that is already there with this shape.

    Another partition count is refused: keys would hash to other partitions
    than the tables are co-partitioned with. Another replication factor is
    only reported: it changes durability, not what is computed, and raising it
    is a reassignment the operator runs on the cluster.
    """
    if partitions != settings.partitions:
        raise TopicError(
            f"topic {name!r} has {partitions} partitions, settings say "
            f"{settings.partitions} (REFLECT_PARTITIONS): repartitioning is an operator decision"
        )
    if replication != settings.replication_factor:
        return (f"exists, replication factor {replication} where settings say {settings.replication_factor} "
                "(REFLECT_REPLICATION_FACTOR): reassign its partitions to change it")
    return "exists"


async def _shapes(admin: AIOKafkaAdminClient) -> dict[str, tuple[int, int]]:
    """{topic: (partitions, replication factor)}; the factor is the fewest
    replicas any partition has, the one that bounds durability."""
    names = await admin.list_topics()
    if not names:
        return {}
    described = await admin.describe_topics(list(names))
    return {t["topic"]: (len(t["partitions"]), min((len(p["replicas"]) for p in t["partitions"]), default=0))
            for t in described if not t.get("error_code")}


# --- the start check ------------------------------------------------------------

def deleting(configs: Mapping[str, str]) -> list[str]:
    """The configs (`name=value`) under which the broker deletes records of a
    topic: a finite retention by time or size, or compaction."""
    found = [f"{key}={configs[key]}" for key in ("retention.ms", "retention.bytes")
             if key in configs and configs[key].strip() != "-1"]
    policy = configs.get("cleanup.policy", "")
    return found + ([f"cleanup.policy={policy}"] if "compact" in policy else [])


def judge(described: Mapping[str, Mapping[str, str] | None], settings: Settings) -> tuple[str | None, list[str]]:
    """(the refusal, or None; lines to log) for the live configs of Reflect's
    topics ({topic: {config: value}}, None where the broker could not say).
    The refusal is one line: the topics, the configs found, what to set."""
    refused, notes = [], []
    for name in (*of_record(settings), *dead_letters(settings)):
        found, said = _verdict(name, described.get(name), settings)
        notes += said
        if found:
            refused.append((name, found))
    if not refused:
        return None, notes
    said = "; ".join(f"topic of record {name!r} has {', '.join(found)}" for name, found in refused)
    return (f"{said}: a rebuild replays the topics of record from the start, so set retention.ms=-1, "
            f"retention.bytes=-1, cleanup.policy=delete on {', '.join(name for name, _ in refused)} "
            f"(kafka-configs.sh --alter --add-config), or start anyway with {OVERRIDE}"), notes


def _verdict(name: str, configs: Mapping[str, str] | None, settings: Settings) -> tuple[list[str], list[str]]:
    """(the configs of `name` to refuse, lines to log).

    A topic of record that deletes is refused unless `allow_finite_retention`;
    then, and for a dead-letter topic that deletes, it is logged, never
    silent. A config the broker does not report (Tansu reports only what a
    topic was created with) is unknown: logged.
    """
    if configs is None:
        return [], [f"topic {name!r}: the broker did not describe its configs; its retention is not checked"]
    unknown = [k for k in KEEP_FOREVER if k not in configs]
    notes = [f"topic {name!r}: the broker does not report {', '.join(unknown)}; its defaults apply there, "
             "unchecked"] if unknown else []
    found = deleting(configs)
    if not found:
        return [], notes
    if name in dead_letters(settings):
        return [], notes + [f"dead-letter topic {name!r} has {', '.join(found)}: dead letters older than that "
                            "are deleted before anyone replays them"]
    if settings.allow_finite_retention:
        return [], notes + [f"topic of record {name!r} has {', '.join(found)}: started anyway "
                            "(REFLECT_ALLOW_FINITE_RETENTION); a rebuild can replay only what the broker keeps"]
    return found, notes


async def check_retention(settings: Settings) -> list[str]:
    """Read the live configs of the topics of record and the dead-letter topics
    (DescribeConfigs) and judge them: raises TopicError with the refusal,
    returns the lines to log. A broker that cannot answer DescribeConfigs is
    logged and the check goes on without it: it cannot be told anything."""
    names = [*of_record(settings), *dead_letters(settings)]
    try:
        async with _admin(settings) as admin:
            answers = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name) for name in names])
    except KafkaConnectionError:  # the broker is not there: the caller's error, not this check's
        raise
    except KafkaError as exc:
        return [f"the broker cannot describe topic configs ({type(exc).__name__}: {exc}); "
                "the retention of the topics of record is not checked"]
    refusal, notes = judge(described(answers), settings)
    if refusal:
        raise TopicError(refusal)
    return notes


def described(answers) -> dict[str, dict[str, str] | None]:
    """{topic: {config: value}} from DescribeConfigs responses; None for a
    resource the broker answered with an error."""
    out: dict[str, dict[str, str] | None] = {}
    for answer in answers:
        for resource in answer.to_object()["resources"]:
            entries = resource["config_entries"]
            # aiokafka's schema calls an entry's name `config_names`.
            out[resource["resource_name"]] = None if resource["error_code"] else {
                e["config_names"]: e["config_value"] for e in entries if e["config_value"] is not None}
    return out


def with_broker_errors(settings: Settings, coro) -> int:
    """`coro` run to its exit status; a broker that cannot be reached is a line and status 1."""
    try:
        return asyncio.run(coro)
    except (KafkaConnectionError, KafkaError, OSError) as exc:
        print(f"reflect: error: broker {settings.broker} (REFLECT_BROKER): {exc}", file=sys.stderr)
        return 1


async def create_topics(settings: Settings, say=print) -> int:
    """Every topic made if missing (a line each), then the topics of record's
    live configs read back: every start (worker, up, demo, topics create)
    does this, and a refusal raises TopicError, a SettingsError (exit 2)."""
    for name, outcome in (await ensure_topics(settings)).items():
        say(f"{name}\t{outcome}\tpartitions={settings.partitions}")
    for note in await check_retention(settings):
        say(note)
    return 0


class UnreadLog(TimeoutError):
    """A log could not be read to its end in time: the broker is away or
    slow, which a caller retries (an HTTP route answers 503)."""


async def read_to_end(settings: Settings, topics: Iterable[str], timeout: float = 30.0) -> list:
    """Every record of these topics, read to each partition's fetch high
    watermark within `timeout` seconds; a topic that does not exist has none.

    Not to ListOffsets' end offsets: Tansu answers one past the last
    batch's base offset, short of a batch of several records (measured:
    1 after records 0–2 in one batch)."""
    consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        await consumer.start()
        existing = await consumer.topics()
        tps = [TopicPartition(t, p) for t in topics if t in existing for p in consumer.partitions_for_topic(t)]
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                out.extend(records)
            marks = [consumer.highwater(tp) for tp in tps]
            if None not in marks and all([await consumer.position(tp) >= m for tp, m in zip(tps, marks)]):
                return out
        raise UnreadLog(f"could not read {', '.join(sorted(set(topics)))} to the end in {timeout:g} s")
    finally:
        await consumer.stop()
