"""What the tests drive Reflect with: polling, the HTTP helpers, and `reflect
worker` as a child process reached over its routes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from streams.client import ReflectClient, ReflectUnreachable
from streams.settings import Settings


def shared_ring(folder: Path) -> str:
    """A master key ring in `folder`, made once, for every worker of a test
    (each on a data dir of its own would make a ring of its own)."""
    from streams.adapters.sealing import KeyRing

    path = Path(folder) / "master.keys"
    KeyRing.load(path, create=True)
    return str(path)


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


def run(coro):
    return asyncio.run(coro)


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
