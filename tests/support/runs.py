"""Runs of real workers on a broker: deterministic users and episodes, a
feed that publishes them under load, the stand-in model that records every
call, workers a test starts and kills, and what their views hold afterwards
(compared without transaction times). The crash, outage, soak, chaos and
determinism suites share them."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import threading
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from processors.embedders import HashingEmbedder
from schemas import EpisodeRecorded
from streams.adapters.view.edge import EdgeView
from streams.broker import BROKER_KINDS, EmbeddedBroker, free_port
from streams.producer import Publisher
from streams.settings import Settings
from streams.worker.ownership import partition_of
from support.broker import TEST_BROKER, read_opened
from support.harness import Worker, shared_ring
from support.messages_api import MessagesServer, OfflineModel

# Statement texts share terms, so the offline model finds themes citing ≥ 2 of
# them. "[u12]" names the user in every statement without becoming a term
# (terms have ≥ 4 characters), so the model server can tell whose cycle it is.
TEXTS = ("[{u}] revert of PR {n}: the auth middleware broke login",
         "[{u}] revert of PR {n}: auth token refresh failed in staging",
         "[{u}] logs first, then retry the deploy job {n}",
         "[{u}] the retry of deploy job {n} waited for logs",
         "[{u}] a failing test came before the fix of bug {n}",
         "[{u}] lunch today was pasta number {n}")
IMPORTANCE = (0.6, 0.7, 0.8, 0.9, 0.5)  # 3.5 per five episodes
USER_TAG = re.compile(r"\[(u\d+)\]")
# Seconds. Session: Kafka's default group.min.session.timeout.ms, the least
# brokers accept. Rebalance: what a restart after a SIGKILL may wait.
SHORT_GROUP_TIMEOUTS = dict(session_timeout=6.0, rebalance_timeout=15.0)


def users_by_partition(per_partition: int, partitions: int) -> list[str]:
    """`per_partition` user names on each partition (keys hash as the producers' do)."""
    picked = collections.defaultdict(list)
    for i in range(10_000):
        name = f"u{i}"
        p = partition_of(name, partitions)
        if len(picked[p]) < per_partition:
            picked[p].append(name)
        if all(len(picked[q]) == per_partition for q in range(partitions)):
            return [u for q in range(partitions) for u in picked[q]]
    raise AssertionError("not enough user names")


def episode_stream(users, per_user: int, start: int = 0) -> list[EpisodeRecorded]:
    """Deterministic episodes, user by user interleaved; valid times one minute apart."""
    return [EpisodeRecorded(user_id=u, episode_id=f"{u}-{i}", text=TEXTS[i % len(TEXTS)].format(u=u, n=i),
                            importance=IMPORTANCE[i % len(IMPORTANCE)],
                            occurred_at=f"2026-06-01T{9 + i // 60:02d}:{i % 60:02d}:00Z")
            for i in range(start, start + per_user) for u in users]


def make_settings(broker_url: str, data_dir: Path, **overrides) -> Settings:
    tag = uuid.uuid4().hex[:8]
    values = dict(env={}, broker=broker_url, app_id=f"reflect-fault-{tag}", topic_episodes=f"episodes-{tag}",
                  topic_requests=f"reflection-requests-{tag}", topic_reflections=f"reflections-{tag}",
                  data_dir=str(data_dir), web_port=free_port(), master_keys=shared_ring(Path(data_dir).parent))
    return Settings.load(**{**values, **overrides})


class Workers:
    """Workers a test starts, each stopped at the end whatever happened (a
    worker whose start timed out is still a running process)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.started = tmp, []

    def start(self, settings: Settings, env: dict[str, str] | None = None, name: str | None = None) -> Worker:
        worker = Worker(settings, self.tmp / f"{name or f'worker-{len(self.started)}'}.log", env)
        self.started.append(worker)
        return worker.start()

    def stop_all(self) -> None:
        for worker in self.started:
            if worker.process is not None:
                worker.stop()


def kill(worker: Worker) -> None:
    """SIGKILL by pid, reaped within a bound."""
    worker.process.kill()
    worker.process.wait(10)
    worker.log.close()


def proc_cpu_seconds(pid: int) -> float:
    fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def read_events(settings: Settings, topic: str) -> list[dict]:
    """Every event of a topic as a dict, sealed texts opened (support/broker.py)."""
    return asyncio.run(read_opened(settings, topic))


class Feed:
    """Publishes episodes in order at a steady rate (None: at once) from its own
    thread (its own event loop and producer); remembers which the broker
    acknowledged, and when its producer was ready (`ready_at`)."""

    def __init__(self, settings: Settings, episodes, rate: float | None) -> None:
        self.settings, self.episodes, self.rate = settings, list(episodes), rate
        self.acked: list[EpisodeRecorded] = []
        self.errors: list[str] = []
        self.ready_at: float | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> "Feed":
        self.thread.start()
        return self

    async def _run(self) -> None:
        async with Publisher(self.settings) as publisher:
            self.ready_at = time.monotonic()
            if self.rate is None:  # as fast as the producer goes: batched, acknowledged at the flush
                for episode in self.episodes:
                    await publisher.publish(episode, wait=False)
                await publisher.flush()
                self.acked.extend(self.episodes)
                return
            started = time.monotonic()
            for n, episode in enumerate(self.episodes):
                await asyncio.sleep(max(0.0, started + n / self.rate - time.monotonic()))  # pacing, not a sync
                try:
                    await publisher.publish(episode)
                    self.acked.append(episode)
                except Exception as exc:  # reported by the test
                    self.errors.append(f"{episode.episode_id}: {exc!r}")

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the feed did not finish"
        assert not self.errors, self.errors[:5]


class Model:
    """The Messages API server answering as the offline model, recording each
    request (tool, user, and what it read) and what it answered; `hold` blocks the first request
    it matches until released; `before_answer` runs just before an answer."""

    def __init__(self) -> None:
        self.offline, self.lock = OfflineModel(), threading.Lock()
        self.asked: list[tuple[str, str]] = []
        self.read: list[tuple[str, str, str]] = []  # (tool, user, what the request showed the model)
        self.answered: list[tuple[str, str]] = []
        self.hold = None  # a tool name: the first such request blocks
        self.held, self.release = threading.Event(), threading.Event()
        self.before_answer = None  # (tool name, fn): fn runs once before the first such answer
        self.server = MessagesServer(self)
        self.url, self.port = self.server.url, self.server.httpd.server_address[1]

    def __call__(self, body: dict):
        tool = body["tool_choice"]["name"]
        found = USER_TAG.search(body["messages"][0]["content"])
        key = (tool, found.group(1) if found else "?")
        with self.lock:
            self.asked.append(key)
            self.read.append((*key, body["messages"][0]["content"]))
            hold = self.hold == tool and not self.held.is_set()
            if hold:
                self.held.set()
            hook, self.before_answer = (self.before_answer, None) if self.before_answer and \
                self.before_answer[0] == tool else (None, self.before_answer)
        if hold:
            self.release.wait(60)
        answer = self.offline(body)
        if hook:
            hook[1]()
        with self.lock:
            self.answered.append(key)
        return answer

    def close(self) -> None:
        self.release.set()
        self.server.close()


def worker_env(model: Model) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": model.url}


def visible_episodes(worker: Worker, users) -> int:
    return sum(worker.stats(u).get("episodes", 0) for u in users)


TRANSACTION_TIME = ("recorded_at", "created_at", "history", "reinforced_at", "weakened_at", "expired_at")


def points_of(view, users) -> dict[str, dict[str, dict]]:
    """{user: {point id: payload}} of a view, without transaction times (when
    a run happened, not what it decided)."""
    return {u: {pid: {k: v for k, v in p.items() if k not in TRANSACTION_TIME}
                for pid, p in view.scroll(u)} for u in users}


def view_snapshot(settings: Settings, users) -> dict[str, dict[str, dict]]:
    """`points_of` a stopped worker's view, read from its data dir."""
    view = EdgeView(settings.view_dir, settings.view, HashingEmbedder().dim)
    try:
        return points_of(view, users)
    finally:
        view.close()


def episodes_of(snapshot: dict) -> dict[str, dict]:
    return {u: {p["episode_id"]: p for p in points.values() if p["kind"] == "episode"}
            for u, points in snapshot.items()}


def beliefs_of(snapshot: dict) -> dict[str, dict]:
    return {u: {p["reflection_id"]: p for p in points.values() if p["kind"] == "reflection"}
            for u, points in snapshot.items()}


def own_broker_for(request, tmp_path_factory, name: str):
    """A broker of the caller's own (it gets paused); for a broker kind that
    is not embedded (a container), the session's, which pauses as well."""
    if TEST_BROKER not in BROKER_KINDS:
        yield request.getfixturevalue("broker")
        return
    log = tmp_path_factory.mktemp(name) / f"{TEST_BROKER}.log"
    with EmbeddedBroker(kind=TEST_BROKER, log_path=str(log), ready_timeout=60) as b:
        yield b


# noida-db 0.2.3 (the latest) never completes a rebalance after a member died
# without leaving: once the rebalance timeout passes, JoinGroup answers the
# survivor with generation 2 and the dead member as leader, so its SyncGroup
# waits for an assignment nobody sends, fails with RebalanceInProgress after
# the session timeout, and the join repeats forever. Seen with two plain
# aiokafka consumers as well; Tansu and Apache Kafka hand the partitions over.
after_a_dead_member = pytest.mark.skipif(
    TEST_BROKER == "noida", reason="noida-db 0.2.3 names a dead member the group leader after a SIGKILL, "
                                   "so no worker ever rejoins (a broker bug; see the comment above)")


ASSIGNED = re.compile(r"^\|\s*(\S+)\s*\|\s*\{([0-9,\-]*)\}\s*\|", re.M)


def assigned_partitions(worker: Worker, topic: str) -> set[int]:
    """The partitions of `topic` in the worker's last "Setting newly assigned
    partitions" table (Faust logs one at every rebalance)."""
    text = worker.log_path.read_text(errors="replace")
    last = text.rfind("Setting newly assigned partitions")
    if last < 0:
        return set()
    table = text[last:text.find("for group", last)]
    for name, ranges in ASSIGNED.findall(table):
        if name == topic:
            found = set()
            for part in filter(None, ranges.split(",")):
                low, _, high = part.partition("-")
                found.update(range(int(low), int(high or low) + 1))
            return found
    return set()


def committed_to_end(settings: Settings, topic: str) -> bool:
    """Whether the app's consumer group has committed `topic` to its end (the
    worker produces one record per batch, so Tansu's end offsets are right)."""
    async def check() -> bool:
        consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, group_id=settings.app_id,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
            ends = await consumer.end_offsets(tps)
            return all([(await consumer.committed(tp) or 0) >= ends[tp] for tp in tps])
        finally:
            await consumer.stop()
    return asyncio.run(check())


async def publish(settings, events) -> None:
    async with Publisher(settings) as publisher:
        for event in events:
            await publisher.publish(event, wait=False)
        await publisher.flush()
