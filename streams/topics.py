"""Topic creation: every Reflect topic exists, with the configured partitions,
before anything is produced (a topic auto-created by a first produce gets the
broker's default partition count, and Faust then stops with PartitionsMismatch)."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.security import client_options
from streams.settings import Settings


class TopicError(RuntimeError):
    pass


async def ensure_topics(settings: Settings) -> dict[str, str]:
    """Create missing topics; returns {topic: 'created' | 'exists'}.

    Idempotent. An existing topic with a different partition count is an error:
    keys would hash to other partitions than the tables are co-partitioned with.
    """
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=10000)
    await admin.start()
    try:
        existing = await _partition_counts(admin)
        outcome: dict[str, str] = {}
        for name in settings.topics:
            if name in existing:
                if existing[name] != settings.partitions:
                    raise TopicError(
                        f"topic {name!r} has {existing[name]} partitions, settings say "
                        f"{settings.partitions} (REFLECT_PARTITIONS): repartitioning is an operator decision"
                    )
                outcome[name] = "exists"
                continue
            try:
                await admin.create_topics([NewTopic(name, settings.partitions, settings.replication_factor)])
                outcome[name] = "created"
            except TopicAlreadyExistsError:  # a concurrent creator won
                outcome[name] = "exists"
        return outcome
    finally:
        await admin.close()


async def _partition_counts(admin: AIOKafkaAdminClient) -> dict[str, int]:
    names = await admin.list_topics()
    if not names:
        return {}
    described = await admin.describe_topics(list(names))
    return {t["topic"]: len(t["partitions"]) for t in described if not t.get("error_code")}
