"""Fixtures: a real broker per test session, real workers as child processes.

The broker is a test setting: REFLECT_TEST_BROKER=tansu (default) or noida.
Each test gets its own topics and consumer group, so tests share one broker
without sharing state.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Callable

import orjson
import pytest

from streams.broker import EmbeddedBroker, free_port
from streams.settings import Settings

TEST_BROKER = os.environ.get("REFLECT_TEST_BROKER", "tansu")


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


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    log = tmp_path_factory.mktemp("broker") / f"{TEST_BROKER}.log"
    with EmbeddedBroker(kind=TEST_BROKER, log_path=str(log), ready_timeout=60) as b:
        yield b


@pytest.fixture
def settings(broker, tmp_path) -> Settings:
    """Settings of one test: its own topics, group and data dir on the session broker."""
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
    )


def settings_env(settings: Settings) -> dict[str, str]:
    return settings.child_env()


class Worker:
    """`reflect worker` as a child process, reached over its HTTP routes."""

    def __init__(self, settings: Settings, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.settings, self.env = settings, env or {}
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> "Worker":
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "worker"], env={**settings_env(self.settings), **self.env},
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(lambda: self.alive() and (self.get("/healthz") or {}).get("status") == "ok", 60,
                 "worker /healthz ok (partitions assigned, tables recovered)")
        return self

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"worker exited with {self.process.returncode}: {self.tail()}")
        return True

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def get(self, path: str):
        url = f"http://127.0.0.1:{self.settings.web_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return orjson.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, **orjson.loads(exc.read() or b"{}")}
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

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
