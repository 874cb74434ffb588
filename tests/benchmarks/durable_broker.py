"""Which broker can keep `reflect up`'s log: Tansu (memory) against noida-db (a file).

    python tests/benchmarks/durable_broker.py [--messages 50000] [--steps 4] [--only start,rates,growth,crash,group]

Not a test, and not part of `reflect bench`: the measurement behind the
embedded broker's choice (issue 30, item 8). Both brokers run as
`streams/broker.py` starts them, on loopback, in the same run, so each noida
figure is printed beside Tansu's with their ratio. Messages are ~280 bytes,
keyed over 50 users, on a 4-partition topic, as Reflect's episodes are.

- start: seconds from launch to a metadata answer, empty broker (median of 3).
- rates: aiokafka produce (linger 20 ms, and one record a batch as the worker
  produces) and consume from the beginning.
- growth (noida): the log grown step by step to --messages; after each step
  the store's size, the produce rate of the step, the clean stop (its last
  save), the restart to a metadata answer and to a full read of the log.
- crash (noida): a steady producer, then SIGKILL, or SIGTERM, of the broker;
  acknowledged messages against those the restarted broker holds.
- idle: the CPU an idle consumer takes (noida-db answers an empty fetch at
  once), without and with `honour_fetch_wait()`; an idle `reflect up` on an
  external Tansu against one on its embedded noida-db.
- group: a consumer-group member with Faust's settings as `reflect up` sets
  them (session 6 s, heartbeat 1 s, rebalance 60 s) in a child process is
  killed with SIGKILL; how long until a new member is assigned the
  partitions: on the same broker, with a static group instance id, and across
  a broker restart (what `reflect up` does: the broker is its child).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402
from aiokafka.errors import KafkaError  # noqa: E402

from streams.broker import EmbeddedBroker, free_port  # noqa: E402

TOPIC, PARTITIONS, VALUE = "episodes", 4, b"x" * 280
KINDS = ("tansu", "noida")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def row(what: str, tansu: float | None, noida: float, unit: str) -> None:
    base = f"{tansu:,.2f} {unit}" if tansu is not None else "-"
    print(f"  {what:<44} tansu {base:>16}   noida {noida:>12,.2f} {unit}   noida/tansu "
          f"{ratio(noida, tansu) if tansu else '-'}", flush=True)


def broker(kind: str, data_dir: str | None = None, port: int | None = None) -> EmbeddedBroker:
    return EmbeddedBroker(kind=kind, data_dir=data_dir, port=port, ready_timeout=120)


def timed_start(b: EmbeddedBroker) -> float:
    started = time.monotonic()
    b.start()
    return time.monotonic() - started


async def create_topic(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    finally:
        await admin.close()


async def produce(bootstrap: str, n: int, start: int = 0, **options) -> float:
    """Seconds to have `n` messages acknowledged."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, **options)
    await producer.start()
    try:
        began = time.monotonic()
        pending = [await producer.send(TOPIC, VALUE, key=f"user-{i % 50}".encode()) for i in range(start, start + n)]
        await asyncio.gather(*pending)
        return time.monotonic() - began
    finally:
        await producer.stop()


async def consume_all(bootstrap: str, n: int, timeout: float = 120) -> float:
    """Seconds to read `n` messages from the beginning of every partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                                fetch_max_wait_ms=100)
    await consumer.start()
    try:
        began, seen = time.monotonic(), 0
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        while seen < n and time.monotonic() - began < timeout:
            batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
            seen += sum(len(b) for b in batches.values())
        if seen < n:
            raise RuntimeError(f"read {seen} of {n} messages in {timeout} s")
        return time.monotonic() - began
    finally:
        await consumer.stop()


async def held(bootstrap: str) -> int:
    """Messages the broker holds: the sum of the partitions' end offsets (right on noida, not on Tansu)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        if TOPIC not in await consumer.topics():
            return 0
        return sum((await consumer.end_offsets([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])).values())
    finally:
        await consumer.stop()


def rss_mib(b: EmbeddedBroker) -> float:
    """Resident memory of the broker's process (the server, not a launcher)."""
    children = subprocess.run(["pgrep", "-P", str(b.process.pid)], capture_output=True, text=True, check=False)
    pids = [b.process.pid] + [int(p) for p in children.stdout.split()]
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def store_mib(data_dir: str) -> float:
    return sum(f.stat().st_size for f in Path(data_dir).rglob("*") if f.is_file()) / 2**20


def measure_start() -> None:
    print("start, empty broker (median of 3):")
    figures = {}
    for kind in KINDS:
        times = []
        for _ in range(3):
            with tempfile.TemporaryDirectory() as tmp:
                b = broker(kind, data_dir=tmp if kind == "noida" else None)
                times.append(timed_start(b))
                b.stop()
        figures[kind] = statistics.median(times)
    row("launch → metadata answered", figures["tansu"], figures["noida"], "s")


def measure_rates(n: int) -> None:
    print(f"rates, {n:,} messages of {len(VALUE)} bytes:")
    figures: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        with tempfile.TemporaryDirectory() as tmp, broker(kind, data_dir=tmp if kind == "noida" else None) as b:
            asyncio.run(create_topic(b.bootstrap))
            f = figures[kind] = {}
            f["produce"] = n / asyncio.run(produce(b.bootstrap, n))
            f["consume"] = n / asyncio.run(consume_all(b.bootstrap, n))
            small = max(n // 10, 1000)
            f["produce1"] = small / asyncio.run(produce(b.bootstrap, small, start=n, max_batch_size=1))
            f["rss"] = rss_mib(b)
    row("aiokafka produce, linger 20 ms", figures["tansu"]["produce"], figures["noida"]["produce"], "msg/s")
    row("aiokafka produce, one record a batch", figures["tansu"]["produce1"], figures["noida"]["produce1"], "msg/s")
    row("aiokafka consume from the beginning", figures["tansu"]["consume"], figures["noida"]["consume"], "msg/s")
    row("broker RSS after it all", figures["tansu"]["rss"], figures["noida"]["rss"], "MiB")


async def trickle_cpu(b: EmbeddedBroker, rate: int = 20, seconds: float = 6.0) -> float:
    """Share of a core the broker takes while `rate` msg/s trickle in (noida
    rewrites its whole file, back to back, while anything changes)."""
    producer = AIOKafkaProducer(bootstrap_servers=b.bootstrap, linger_ms=0)
    await producer.start()
    try:
        began, cpu = time.monotonic(), cpu_seconds(b.process.pid)
        while time.monotonic() - began < seconds:
            await (await producer.send(TOPIC, VALUE, key=b"user-0"))
            await asyncio.sleep(1 / rate)
        return (cpu_seconds(b.process.pid) - cpu) / (time.monotonic() - began)
    finally:
        await producer.stop()


def measure_growth(total: int, steps: int) -> None:
    print(f"growth of noida's one-file store, {steps} steps to {total:,} messages (restart = clean stop + start):")
    step = total // steps
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        b = broker("noida", data_dir=tmp, port=port).start()
        asyncio.run(create_topic(b.bootstrap))
        # Tansu's figure at the first step, the baseline for the produce rate.
        with broker("tansu") as t:
            asyncio.run(create_topic(t.bootstrap))
            tansu_rate = step / asyncio.run(produce(t.bootstrap, step))
        print(f"  (tansu produces the first step at {tansu_rate:,.0f} msg/s)")
        first = None
        for k in range(1, steps + 1):
            rate = step / asyncio.run(produce(b.bootstrap, step, start=(k - 1) * step))
            rss = rss_mib(b)
            time.sleep(2)  # its saves of the burst done
            busy = asyncio.run(trickle_cpu(b))
            began = time.monotonic()
            b.stop()
            stop = time.monotonic() - began
            size = store_mib(tmp)
            b = broker("noida", data_dir=tmp, port=port)
            start = timed_start(b)
            read = asyncio.run(consume_all(b.bootstrap, k * step))
            first = first or (rate, start, size)
            print(f"  {k * step:>7,} messages: store {size:7.1f} MiB ({size * 2**20 / (k * step):,.0f} B/msg), "
                  f"RSS {rss:6.1f} MiB, produce {rate:8,.0f} msg/s ({ratio(rate, tansu_rate)} of tansu), "
                  f"stop {stop:5.2f} s, restart {start:5.2f} s ({ratio(start, first[1])}× the first), "
                  f"full read {read:5.2f} s; under 20 msg/s noida takes {busy:.2f} core", flush=True)
        b.stop()


def measure_crash(before: tuple[int, ...], rate: int = 2000, seconds: float = 3.0) -> None:
    print(f"crash of noida under a steady producer (~{rate} msg/s for {seconds} s, then the signal):")
    for sig, prefill in [(s, n) for n in before for s in (signal.SIGKILL, signal.SIGTERM)]:
        with tempfile.TemporaryDirectory() as tmp:
            port = free_port()
            b = broker("noida", data_dir=tmp, port=port).start()
            asyncio.run(create_topic(b.bootstrap))
            asyncio.run(produce(b.bootstrap, prefill))
            acked = prefill + asyncio.run(steady(b, rate, seconds, sig))
            b.stop()
            b = broker("noida", data_dir=tmp, port=port).start()
            kept = asyncio.run(held(b.bootstrap))
            b.stop()
            print(f"  {sig.name:<8} log of {prefill:6,} before: acknowledged {acked:6,}, "
                  f"held after restart {kept:6,}, lost {acked - kept:5,} "
                  f"(~{(acked - kept) / rate:.2f} s of writes)", flush=True)


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie (whose cmdline is empty)."""
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


PARENT = """
import signal, sys
sys.path.insert(0, {root!r})
from streams.broker import EmbeddedBroker
b = EmbeddedBroker("noida", data_dir={data_dir!r}, port={port}).start()
print(b.process.pid, flush=True)
signal.pause()  # until the measurement kills it
"""


def measure_parent_killed(prefill: int, rate: int = 2000, seconds: float = 3.0) -> None:
    """As `reflect up` runs it: the broker is the child of a process that gets SIGKILL."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        parent = subprocess.Popen([sys.executable, "-c", PARENT.format(root=str(Path(__file__).resolve().parents[2]),
                                                                       data_dir=tmp, port=port)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            server = int(parent.stdout.readline())
            b = broker("noida", data_dir=tmp, port=port)
            asyncio.run(create_topic(b.bootstrap))
            asyncio.run(produce(b.bootstrap, prefill))

            class Parent:  # what steady() signals and waits for: the parent, not the broker
                process, bootstrap = parent, b.bootstrap
            acked = prefill + asyncio.run(steady(Parent, rate, seconds, signal.SIGKILL))
        finally:
            parent.kill()  # its broker goes with it (SIGTERM, its death signal)
            parent.wait(10)
        began = time.monotonic()
        while alive(server) and time.monotonic() - began < 60:  # a bounded wait on the condition (zombies: alive)
            time.sleep(0.02)
        gone = time.monotonic() - began
        b.start()
        kept = asyncio.run(held(b.bootstrap))
        b.stop()
        print(f"  parent SIGKILL, log of {prefill:6,} before: acknowledged {acked:6,}, held after restart {kept:6,}, "
              f"lost {acked - kept:5,}; the broker saved and exited {gone:.2f} s after its parent died", flush=True)


async def steady(b: EmbeddedBroker, rate: int, seconds: float, sig: int) -> int:
    """Produce ~`rate` msg/s for `seconds`, signal the broker right after an acknowledgement; return the acked count."""
    producer = AIOKafkaProducer(bootstrap_servers=b.bootstrap, linger_ms=5)
    await producer.start()
    acked, chunk = 0, rate // 20
    try:
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            pending = [await producer.send(TOPIC, VALUE, key=f"user-{i % 50}".encode()) for i in range(chunk)]
            await asyncio.gather(*pending)
            acked += chunk
            await asyncio.sleep(0.05)
        os.killpg(b.process.pid, sig) if sig != signal.SIGKILL or b.process.pid == os.getpgid(b.process.pid) \
            else b.process.kill()
        await asyncio.to_thread(b.process.wait, 30)
    finally:
        with contextlib.suppress(TimeoutError, KafkaError):  # its broker is gone
            await asyncio.wait_for(producer.stop(), 5)
    return acked


MEMBER = """
import asyncio, sys
from aiokafka import AIOKafkaConsumer
async def main():
    c = AIOKafkaConsumer("{topic}", bootstrap_servers="{bootstrap}", group_id="g", session_timeout_ms=6000,
                         heartbeat_interval_ms=1000, rebalance_timeout_ms=60000, max_poll_interval_ms=300000,
                         group_instance_id={instance!r}, enable_auto_commit=True, auto_offset_reset="earliest")
    await c.start()
    while not c.assignment():
        await c.getmany(timeout_ms=100)
    print("assigned", flush=True)
    while True:
        await c.getmany(timeout_ms=100)
asyncio.run(main())
"""


def member(bootstrap: str, instance: str | None, timeout: float = 150.0) -> tuple[subprocess.Popen, float]:
    """A group member in a child process, and the seconds until it is assigned
    partitions (inf when not within `timeout`: the child is killed)."""
    began = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", MEMBER.format(topic=TOPIC, bootstrap=bootstrap, instance=instance)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    line = child.stdout.readline() if ready else ""
    if line.strip() != "assigned":
        kill(child)
        return child, float("inf")
    return child, time.monotonic() - began


def kill(child: subprocess.Popen) -> None:
    child.kill()
    child.wait(10)


def rejoin(kind: str, instance: str | None, restart: bool) -> tuple[float, float]:
    """On a fresh broker: a member joins and is killed with SIGKILL (the broker
    restarted after, or not); the seconds of the first join and of the next member's."""
    with tempfile.TemporaryDirectory() as tmp:
        b = broker(kind, data_dir=tmp if kind == "noida" else None, port=free_port()).start()
        try:
            asyncio.run(create_topic(b.bootstrap))
            child, first = member(b.bootstrap, instance)
            kill(child)
            if restart:
                b.stop()
                b.start()
            child, second = member(b.bootstrap, instance)
            kill(child)
            return first, second
        finally:
            b.stop()


def measure_group() -> None:
    print("consumer group (session 6 s, rebalance 60 s): a member killed with SIGKILL, then a new one "
          "(inf: not assigned within 150 s):")
    for kind in KINDS:
        first, again = rejoin(kind, None, restart=False)
        print(f"  {kind:<6} first join {first:6.2f} s; next member, same broker {again:6.2f} s", flush=True)
        first, again = rejoin(kind, "reflect-up", restart=False)
        print(f"  {kind:<6} static member (group.instance.id): first join {first:6.2f} s; rejoin {again:6.2f} s",
              flush=True)
    first, again = rejoin("noida", None, restart=True)
    print(f"  noida  broker restarted between them (as `reflect up` restarts it): next member {again:6.2f} s",
          flush=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def idle_consumer_cpu(bootstrap: str, seconds: float = 5.0) -> float:
    """Share of a core an idle consumer (Faust's fetch wait, 50 ms) takes, caught up on an empty topic."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=50, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        await consumer.getmany(timeout_ms=500)
        began, cpu = time.monotonic(), cpu_seconds(os.getpid())
        while time.monotonic() - began < seconds:
            await consumer.getmany(timeout_ms=1000)
        return (cpu_seconds(os.getpid()) - cpu) / (time.monotonic() - began)
    finally:
        await consumer.stop()


def idle_up(extra: list[str], seconds: float = 20.0, writes: int = 20) -> tuple[float, float]:
    """An idle `reflect up`: the share of a core it takes (its own process, not
    its broker's), then the median seconds from an episode's 202 to its read."""
    from streams.client import ReflectClient

    with tempfile.TemporaryDirectory() as tmp:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("REFLECT_")}, "REFLECT_EMBEDDER": "hashing"}
        port = free_port()
        up = subprocess.Popen([sys.executable, "-m", "streams.cli", "up", "--port", str(port),
                               "--data-dir", tmp, *extra], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
        try:
            if not up.stdout.readline().startswith("Reflect is up."):
                raise RuntimeError("reflect up did not start")
            time.sleep(3)  # past its start-up work
            began, cpu = time.monotonic(), cpu_seconds(up.pid)
            time.sleep(seconds)
            share = (cpu_seconds(up.pid) - cpu) / (time.monotonic() - began)
            visible = []
            with ReflectClient(f"http://127.0.0.1:{port}", env={}) as api:
                for i in range(writes):
                    began = time.monotonic()
                    api.request("POST", "/v1/users/ann/episodes",
                                body={"text": f"note {i}", "importance": 0.3, "episode_id": f"e{i}"})
                    while api.request("GET", f"/v1/users/ann/episodes/e{i}").status != 200:  # bounded below
                        if time.monotonic() - began > 30:
                            raise TimeoutError(f"episode e{i} not visible within 30 s")
                        time.sleep(0.005)
                    visible.append(time.monotonic() - began)
                    time.sleep(0.3)  # idle again between writes
            return share, statistics.median(visible)
        finally:
            up.terminate()
            up.wait(60)


def measure_idle() -> None:
    from streams.broker import honour_fetch_wait

    print("idle CPU, share of one core (noida-db answers an empty fetch at once, whatever fetch_max_wait_ms says):")
    figures = {}
    for patched in (False, True):
        if patched:
            honour_fetch_wait()
        for kind in KINDS:
            with tempfile.TemporaryDirectory() as tmp, broker(kind, data_dir=tmp if kind == "noida" else None) as b:
                asyncio.run(create_topic(b.bootstrap))
                figures[kind, patched] = asyncio.run(idle_consumer_cpu(b.bootstrap))
        row("idle consumer" + (", honour_fetch_wait()" if patched else ""), figures["tansu", patched],
            figures["noida", patched], "core")
    with broker("tansu") as t:
        on_tansu = idle_up(["--broker", t.url])
    on_noida = idle_up([])
    row("idle reflect up (on its noida: with the patch)", on_tansu[0], on_noida[0], "core")
    row("  then an episode's 202 → readable, median", on_tansu[1] * 1000, on_noida[1] * 1000, "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--only", default="start,rates,growth,crash,group,idle")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if "start" in only:
        measure_start()
    if "rates" in only:
        measure_rates(args.messages)
    if "growth" in only:
        measure_growth(args.messages, args.steps)
    if "crash" in only:
        measure_crash((0, args.messages))
        for prefill in (0, args.messages):
            measure_parent_killed(prefill)
    if "group" in only:
        measure_group()
    if "idle" in only:
        measure_idle()


if __name__ == "__main__":
    main()
