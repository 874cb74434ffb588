"""Fixtures: a real broker per test session, real workers as child processes.

The broker is a test setting: REFLECT_TEST_BROKER=tansu (default), noida, or
kafka (Apache Kafka from testcontainers); REFLECT_TEST_QDRANT=server puts the
view on a Qdrant server from testcontainers instead of Edge. Each test gets its
own topics, consumer group and view, so tests share one broker without sharing
state.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from streams.broker import BrokerError, EmbeddedBroker, free_port, wait_until_ready
from streams.client import ReflectClient, ReflectUnreachable
from streams.settings import Settings

TEST_BROKER = os.environ.get("REFLECT_TEST_BROKER", "tansu")
# A test that starts `reflect up` (its own embedded broker, whatever the test
# broker is) runs the same in every stage: the first stage runs it.
OWN_BROKER = pytest.mark.skipif(TEST_BROKER != "tansu", reason="`reflect up` starts its own broker: the first "
                                "CI stage runs this")
TEST_QDRANT = os.environ.get("REFLECT_TEST_QDRANT", "edge")
KAFKA_IMAGE = "apache/kafka:3.9.1"  # the images of deploy/compose.yaml
QDRANT_IMAGE = "qdrant/qdrant:v1.16.2"


def wait_for(condition: Callable[[], object], timeout: float, what: str, every: float = 0.1):
    """Poll `condition` until it returns something truthy, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")



async def until(condition: Callable[[], object], what: str, timeout: float = 30, every: float = 0.05) -> None:
    """`wait_for` inside an event loop: the loop runs while it polls."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(every)


def one_partition_app(settings: Settings, name: str, topic: str):
    """A bare Faust app on the test broker whose `topic` is a pipeline topic
    (read from its start, streams/patches.py): for tests that drive Faust's
    consumer directly."""
    import faust

    app = faust.App(name, broker=settings.broker, web_enabled=False, store="memory://", autodiscover=False,
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


def http_client(api: str) -> ReflectClient:
    """The shipped client as the tests' HTTP helper, so they exercise it: 5 s
    a request, and no credential from this process's environment (a test that
    sets REFLECT_API_TOKEN for a command must not change what a helper sends)."""
    return ReflectClient(api, env={}, timeout=5)


def http_status(base: str, path: str) -> int | None:
    """The status a GET of `path` answers at `base` (any server's: Qdrant's /readyz), None when none does."""
    with http_client(base) as client:
        try:
            return client.request("GET", path).status
        except ReflectUnreachable:
            return None


def answered(client: ReflectClient, path: str) -> Any:
    """A GET's JSON body; an error's with its status merged in, under the body's
    own `status` if it has one (/healthz while starting); None when nothing answers."""
    try:
        answer = client.request("GET", path)
    except ReflectUnreachable:
        return None
    return answer.body if answer.ok else {"status": answer.status, **(answer.body or {})}


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


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    log = tmp_path_factory.mktemp("broker") / f"{TEST_BROKER}.log"
    if TEST_BROKER == "kafka":
        with KafkaContainerBroker(docker_containers("REFLECT_TEST_BROKER=kafka"), log) as b:
            yield b
        return
    with EmbeddedBroker(kind=TEST_BROKER, log_path=str(log), ready_timeout=60) as b:
        yield b


@pytest.fixture(scope="session")
def qdrant_url():
    """None (each test's Edge view in its data dir), or a Qdrant server's URL."""
    if TEST_QDRANT == "edge":
        yield None
        return
    if TEST_QDRANT != "server":
        pytest.fail(f"REFLECT_TEST_QDRANT={TEST_QDRANT!r}: expected edge or server", pytrace=False)
    with docker_containers("REFLECT_TEST_QDRANT=server")(QDRANT_IMAGE).with_exposed_ports(6333) as qdrant:
        url = f"http://{qdrant.get_container_host_ip()}:{qdrant.get_exposed_port(6333)}"
        wait_for(lambda: http_status(url, "/readyz") == 200, 60, f"Qdrant ({QDRANT_IMAGE}) /readyz")
        yield url


@pytest.fixture
def settings(qdrant_url, broker, tmp_path) -> Settings:
    """Settings of one test: its own topics, group, data dir and view on the session broker."""
    tag = uuid.uuid4().hex[:8]
    return Settings.load(
        env={},
        broker=broker.url,
        app_id=f"reflect-test-{tag}",
        topic_episodes=f"episodes-{tag}",
        topic_requests=f"reflection-requests-{tag}",
        topic_reflections=f"reflections-{tag}",
        data_dir=str(tmp_path / "data"),
        web_port=free_port(),
        # A shared server needs a view (alias) per test; Edge keeps the default name.
        qdrant_url=qdrant_url,
        view=f"reflect-{tag}" if qdrant_url else None,
    )


def settings_env(settings: Settings) -> dict[str, str]:
    return settings.child_env()


class Worker:
    """`reflect worker` as a child process, reached over its HTTP routes."""

    def __init__(self, settings: Settings, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.settings, self.env = settings, env or {}
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self._client: ReflectClient | None = None

    @property
    def client(self) -> ReflectClient:
        """The client of this worker's API, made on first use (again after stop())."""
        if self._client is None:
            self._client = http_client(f"http://127.0.0.1:{self.settings.web_port}")
        return self._client

    def launch(self) -> "Worker":
        """The process, not waiting for it to be ready (or to be refused)."""
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "worker"], env={**settings_env(self.settings), **self.env},
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def start(self, timeout: float = 60, every: float = 0.1) -> "Worker":
        self.launch()
        wait_for(lambda: self.alive() and (self.get("/healthz") or {}).get("status") == "ok", timeout,
                 "worker /healthz ok (partitions assigned, tables recovered)", every=every)
        return self

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"worker exited with {self.process.returncode}: {self.tail()}")
        return True

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def get(self, path: str):
        return answered(self.client, path)

    def stats(self, user: str) -> dict:
        return self.get(f"/v1/users/{user}/stats") or {}

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL by pid: a Faust worker may ignore SIGTERM while stopping."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()
        if self._client is not None:
            self._client.close()
            self._client = None


@pytest.fixture
def worker(settings, tmp_path):
    started: list[Worker] = []

    def start(s: Settings = settings, env: dict[str, str] | None = None) -> Worker:
        w = Worker(s, tmp_path / f"worker-{len(started)}.log", env).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


def run(coro):
    return asyncio.run(coro)


async def read_topic(settings: Settings, topic: str, parse=lambda record: record, timeout: float = 30.0) -> list:
    """Every record of a topic, parsed, read to each partition's fetch high
    watermark: Tansu's ListOffsets is wrong after a multi-record batch (which
    producers other than the worker's send), the fetch's high watermark is right."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, enable_auto_commit=False,
                                max_partition_fetch_bytes=4_000_000, fetch_max_bytes=16_000_000)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                out.extend(parse(r) for r in records)
            marks = [consumer.highwater(tp) for tp in tps]
            if None not in marks and all([await consumer.position(tp) >= m for tp, m in zip(tps, marks)]):
                return out
        raise AssertionError(f"could not read {topic} to its end in {timeout:g} s")
    finally:
        await consumer.stop()


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
