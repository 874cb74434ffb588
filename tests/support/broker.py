"""The test broker and view, as the environment selects them
(REFLECT_TEST_BROKER=tansu, noida or kafka; REFLECT_TEST_QDRANT=edge or
server), Apache Kafka in a container, and reading a topic or a group's
commits straight from the broker."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from streams.broker import BrokerError, free_port, wait_until_ready
from streams.settings import Settings

TEST_BROKER = os.environ.get("REFLECT_TEST_BROKER", "tansu")
# A test that starts `reflect up` (its own embedded broker, whatever the test
# broker is) runs the same in every stage: the first stage runs it.
OWN_BROKER = pytest.mark.skipif(TEST_BROKER != "tansu", reason="`reflect up` starts its own broker: the first "
                                "CI stage runs this")
TEST_QDRANT = os.environ.get("REFLECT_TEST_QDRANT", "edge")
KAFKA_IMAGE = "apache/kafka:3.9.1"  # the images of deploy/compose.yaml
QDRANT_IMAGE = "qdrant/qdrant:v1.16.2"


def one_partition_app(settings: Settings, name: str, topic: str, data_dir: Path):
    """A bare Faust app on the test broker whose `topic` is a pipeline topic
    (read from its start, streams/worker/patches.py): for tests that drive Faust's
    consumer directly. Its data directory is made under `data_dir` (a test's
    tmp_path), not in the current directory."""
    import faust

    app = faust.App(name, broker=settings.broker, web_enabled=False, store="memory://", autodiscover=False,
                    datadir=data_dir / f"{name}-data",
                    topic_partitions=1, broker_session_timeout=settings.session_timeout,
                    broker_heartbeat_interval=settings.session_timeout / 6,
                    broker_rebalance_timeout=settings.rebalance_timeout)
    app.read_from_start = frozenset({topic})
    return app


def docker_containers(selection: str):
    """testcontainers' DockerContainer, once a Docker engine answers.

    Otherwise every test that needs `selection` is skipped with the reason:
    falling back to Tansu or Edge would pass without testing what was asked.
    Imported here, not at the top: the default run needs neither testcontainers
    nor Docker."""
    reason = f"{selection} needs a Docker engine"
    try:
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.docker_client import DockerClient
    except ImportError as exc:
        pytest.skip(f"{reason}: testcontainers is not installed ({exc}; pip install -e '.[test]')")
    try:
        DockerClient().client.ping()
    except Exception as exc:  # docker's DockerException: no socket, refused, no permission
        pytest.skip(f"{reason}: {exc}")
    return DockerContainer


class KafkaContainerBroker:
    """Apache Kafka (KRaft, one node) in a container, used like EmbeddedBroker.

    Not testcontainers' KafkaContainer: it drives the start scripts of
    Confluent's cp-kafka image, which apache/kafka does not have. Clients dial
    the advertised listener, so the host port is chosen first and bound to the
    same port in the container."""

    kind = "kafka"

    def __init__(self, container_class, log_path: Path) -> None:
        from testcontainers.core.docker_client import DockerClient

        self.host, self.port, self.log_path = DockerClient().host(), free_port(), log_path
        self.container = container_class(KAFKA_IMAGE).with_bind_ports(self.port, self.port)
        for name, value in {
            "KAFKA_NODE_ID": "1",
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_LISTENERS": f"PLAINTEXT://:{self.port},CONTROLLER://:9093",
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{self.host}:{self.port}",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            # One node: the internal topics (offsets, transactions) get one replica.
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
            "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        }.items():
            self.container.with_env(name, value)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def __enter__(self) -> "KafkaContainerBroker":
        self.container.start()
        try:
            asyncio.run(wait_until_ready(self.bootstrap, timeout=120))
        except BrokerError:
            self.__exit__()
            raise BrokerError(f"Apache Kafka ({KAFKA_IMAGE}) did not answer; see {self.log_path}") from None
        return self

    def __exit__(self, *exc) -> None:
        out, err = self.container.get_logs()
        self.log_path.write_bytes(out + err)
        self.container.stop()

    def pause(self) -> None:
        self.container.get_wrapped_container().pause()

    def resume(self) -> None:
        self.container.get_wrapped_container().unpause()


async def read_topic(settings: Settings, topic: str, parse=lambda record: record, timeout: float = 30.0) -> list:
    """Every record of a topic, parsed, read to each partition's fetch high
    watermark (`read_to_end`: Tansu's ListOffsets is wrong after a
    multi-record batch, which producers other than the worker's send)."""
    from streams.topics import read_to_end

    return [parse(r) for r in await read_to_end(settings, [topic], timeout)]


async def read_opened(settings: Settings, topic: str, timeout: float = 30.0) -> list[dict]:
    """Every event of a topic as a dict, its sealed texts opened (`opened_values`)."""
    values = await read_topic(settings, topic, lambda r: r.value, timeout)
    return await opened_values(settings, values)


async def opened_values(settings: Settings, values: list[bytes]) -> list[dict]:
    """Each raw event as a dict, its sealed texts opened with the settings'
    key ring (streams/shredding.py): an erased episode reads as its
    EpisodeRetracted, a belief an erasure took without text, marked erased."""
    import orjson

    from schemas import decode
    from streams.shredding import Sealing

    events = [orjson.loads(v) for v in values]
    sealed = [i for i, e in enumerate(events) if isinstance(e, dict) and "sealed" in e]
    if sealed:
        sealing = Sealing(settings)
        try:
            records = [decode(values[i]) for i in sealed]
            open_one = await sealing.opener(records)
            for i, record in zip(sealed, records):
                opened = open_one(record)
                # A belief an erasure took: its ids and counts as logged, no text (it has none left).
                events[i] = opened.to_dict() if opened is not None else \
                    {k: v for k, v in events[i].items() if k != "sealed"} | {"erased": True}
        finally:
            await sealing.close()
    return events


async def committed_offsets(settings: Settings, tps) -> dict:
    """The worker group's committed offset per partition (None: nothing yet)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, group_id=settings.app_id,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        return {tp: await consumer.committed(tp) for tp in tps}
    finally:
        await consumer.stop()
