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
    """Create missing topics; returns {topic: 'created' | 'exists' | 'exists, …'}.

    Idempotent. An existing topic with a different partition count is an error
    (see `existing`); one with another replication factor says so in its outcome.
    """
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=10000)
    await admin.start()
    try:
        shapes = await _shapes(admin)
        outcome: dict[str, str] = {}
        for name in settings.topics:
            if name in shapes:
                outcome[name] = existing(name, *shapes[name], settings)
                continue
            try:
                await admin.create_topics([NewTopic(name, settings.partitions, settings.replication_factor)])
                outcome[name] = "created"
            except TopicAlreadyExistsError:  # a concurrent creator won
                outcome[name] = "exists"
        return outcome
    finally:
        await admin.close()


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
