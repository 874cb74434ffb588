"""Fixtures: a real broker per test session, real workers as child processes.

The broker is a test setting: REFLECT_TEST_BROKER=tansu (default), noida, or
kafka (Apache Kafka from testcontainers); REFLECT_TEST_QDRANT=server puts the
view on a Qdrant server from testcontainers instead of Edge. Each test gets its
own topics, consumer group and view, so tests share one broker without sharing
state. The fixtures serve every tier; the helpers they use, and the tests
share, are in tests/support/.
"""

from __future__ import annotations

import uuid

import pytest

from streams.broker import EmbeddedBroker, free_port
from streams.settings import Settings
from support.broker import QDRANT_IMAGE, TEST_BROKER, TEST_QDRANT, KafkaContainerBroker, docker_containers
from support.harness import Worker, http_status, shared_ring, wait_for


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
        master_keys=shared_ring(tmp_path),  # one ring for every worker a test starts, whatever its data dir
        web_port=free_port(),
        # A shared server needs a view (alias) per test; Edge keeps the default name.
        qdrant_url=qdrant_url,
        view=f"reflect-{tag}" if qdrant_url else None,
    )


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
