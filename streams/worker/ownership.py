"""Which worker answers a user's reads, and when its answer is whole.

Every topic is keyed by user and co-partitioned, so one worker owns a user:
the one assigned the user's partition number. It alone holds the user's
table state (accumulator, requests done) and, with the embedded Qdrant Edge
view, the only copy of the user's points. So a read of a user's state goes to
the owner: another worker forwards it there (streams/http/routes/common.py,
`owned`), using the group's own map of who holds which partition (Faust's
assignor, `app.router.external_topics_metadata()`).

The owner answers only when its answer is whole: its tables recovered, and
— with Edge — its view holding every event on the partition's log when it
was gained. A worker that gains a partition in a rebalance lacks what the
previous owner projected, so it first replays that span of `episodes` and
`reflections` into its own view (`catch_up`); the pipeline's agents wait for
it before handling the partition, and reads meanwhile answer 503. The same
replay notes which cycles the log has completed (`on_log`): a worker whose
own state lacks them (a fresh app id on the same topics, a state written
after its events were published and lost in a crash) adopts them, with their
beliefs now in its view, and runs no cycle twice. What the
view holds is recorded per topic-partition as a watermark (`Watermarks`),
advanced after each batch whose effects are in the view; a restart over the
same data directory therefore replays nothing.

A partition lost is released (`_release`): once the group names another
owner and that owner answers /healthz ok (its view caught up), the
partition's watermarks go back to 0 and its users' points leave this
worker's view, so no copy of a user outlives the ownership (an erasure
needs to reach only the owner's). Gained back before then, nothing is
dropped; gained back after, the catch-up replays it from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path
from typing import Iterable, Mapping

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from processors.dlq import carried
from processors.projector import EPISODE_TYPES, REFLECTION_TYPES, EpisodeProjector, ReflectionProjector
from processors.ports import NO_USER, ViewPoint
from schemas import ReflectionChallenged, ReflectionCycleCompleted
from streams.http import forwarding
from streams.security import client_options
from streams.shredding import read_records

log = logging.getLogger("reflect")
_PARTITIONER = DefaultPartitioner()
BROKER_CALL_TIMEOUT = 15.0  # seconds a catch-up waits for the broker's answer to one call
RELEASE_POLL = 2.0  # seconds between looks at whether a lost partition's new owner has caught up
AUDITS = (ReflectionCycleCompleted, ReflectionChallenged)  # the last event a cycle (a challenge) publishes


def partition_of(user_id: str, partitions: int) -> int:
    """The partition of a user's events: Kafka's default partitioner over the
    user id, as every producer of the topics keys them."""
    every = list(range(partitions))
    return _PARTITIONER(user_id.encode(), every, every)


def owner_in(distribution: Mapping[str, Mapping[str, Iterable[int]]], topic: str, partition: int) -> str | None:
    """The URL of the worker the group assigned `partition` of `topic`, None if none is."""
    for url, topics in distribution.items():
        if partition in topics.get(topic, ()):
            return url
    return None


WATERMARKS = str(uuid.uuid5(uuid.NAMESPACE_URL, "urn:reflect:view-watermarks"))  # the point that holds them


class Watermarks:
    """Per view and topic-partition, the offset below which every event is in
    the view. Kept inside the view, as one point of no user written after
    each batch's own points: the shard's write-ahead log holds it in order
    with them, so whatever a crash or a power loss leaves of that log, the
    watermark claims no event whose points it lost, and a catch-up replays
    from it. (A file beside the shard, replaced without fsync while the shard
    was flushed only at shutdown, could claim a span the shard had lost.) A
    view from before reads the old file, `legacy`, until it writes its own.
    Blocking calls (the view's): off the event loop."""

    def __init__(self, view, legacy: Path | None = None) -> None:
        self.view, self.legacy = view, legacy
        self._data: dict[str, dict[str, int]] = {}

    def get(self, view: str, tp) -> int:
        return self._held(view).get(f"{tp.topic}:{tp.partition}", 0)

    def advance(self, view: str, offsets: Mapping) -> None:
        held = self._held(view)
        changed = False
        for tp, offset in offsets.items():
            key = f"{tp.topic}:{tp.partition}"
            if offset > held.get(key, 0):
                held[key], changed = offset, True
        if changed and view == self.view.name:
            self.view.upsert([ViewPoint(WATERMARKS, None, {"user_id": NO_USER, "kind": "watermarks",
                                                          "offsets": dict(held)})])

    def of(self, view: str) -> dict[TopicPartition, int]:
        """Every topic-partition the view holds, with its watermark."""
        return {TopicPartition(topic, int(partition)): offset for key, offset in self._held(view).items()
                for topic, _, partition in [key.rpartition(":")]}

    def forget(self, view: str) -> None:
        self._data.pop(view, None)  # its point goes with the view

    def reset(self, view: str, partition: int) -> None:
        """The view holds nothing of `partition` any more: a catch-up replays it from the start."""
        held = self._held(view)
        for key in [k for k in held if k.rpartition(":")[2] == str(partition)]:
            del held[key]
        self.view.upsert([ViewPoint(WATERMARKS, None, {"user_id": NO_USER, "kind": "watermarks",
                                                      "offsets": dict(held)})])

    def _held(self, view: str) -> dict[str, int]:
        if view not in self._data:
            found = self.view.get([WATERMARKS]).get(WATERMARKS) if view == self.view.name else None
            if found is not None:
                self._data[view] = dict(found["offsets"])
            elif self.legacy is not None and self.legacy.exists():
                self._data[view] = dict(orjson.loads(self.legacy.read_bytes()).get(view, {}))
            else:
                self._data[view] = {}
        return self._data[view]


class Ownership:
    """The worker's side of it: which partitions it owns and whether each is
    whole, the catch-ups that make them so, and the watermarks."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        settings = runtime.settings
        self.topics = (settings.topic_episodes, settings.topic_reflections)
        # Only an Edge view is the worker's own; a Qdrant server's is shared and whole.
        self.local_view = settings.qdrant_url is None
        self.watermarks = Watermarks(runtime.view, settings.view_dir / "offsets.json") if self.local_view else None
        self.whole: dict[int, asyncio.Event] = {}  # partition → its view holds the log as it was gained
        self._catching: dict[int, asyncio.Task] = {}
        self._releasing: dict[int, asyncio.Task] = {}  # partition lost → its release, under way
        self._client_ssl = None  # made at the first release: it reads the cluster's CA file
        self.completed: dict[int, set[str]] = {}  # partition → cycle ids its log completed, as gained
        self.installed = False

    def settled(self) -> bool:
        """No catch-up is running: the partitions the view holds change only by one."""
        return not self._catching

    def install(self, app) -> None:
        """Follow the group's assignments (Faust's `on_partitions_assigned`)."""
        self.installed = True

        @app.on_partitions_assigned.connect
        async def assigned(app, assigned, **kwargs) -> None:
            self.assigned({tp.partition for tp in assigned if tp.topic == self.topics[0]})

    def assigned(self, partitions: set[int]) -> None:
        """Start a catch-up for each partition gained; forget those lost.
        Returns at once: the rebalance must not wait on a replay."""
        for p in set(self.whole) - partitions:
            task = self._catching.pop(p, None)
            if task is not None:
                task.cancel()
            del self.whole[p]
            self.completed.pop(p, None)
            if self.local_view and not self.runtime.settings.replay:
                self._releasing[p] = asyncio.ensure_future(self._release(p))
        for p in partitions - set(self.whole):
            self.whole[p] = asyncio.Event()
            if self.local_view and not self.runtime.settings.replay:
                self._catching[p] = asyncio.ensure_future(self._catch_up(p))
            else:  # a server's view is shared and whole; a replay's side view is its pipeline's alone
                self.whole[p].set()

    def catching_up(self) -> list[int]:
        """The partitions this worker owns whose view is not whole yet."""
        return sorted(p for p, event in self.whole.items() if not event.is_set())

    def on_log(self, user_id: str, cycle_id: str) -> bool:
        """The cycle's audit event was on the log the catch-up replayed (an
        Edge view: a server's view has no catch-up, and nothing is noted)."""
        return cycle_id in self.completed.get(partition_of(user_id, self.runtime.settings.partitions), ())

    def owner(self, user_id: str) -> str | None:
        """The URL of the worker that owns the user, None during a rebalance."""
        app = self.runtime.app
        p = partition_of(user_id, self.runtime.settings.partitions)
        return owner_in(app.router.external_topics_metadata(), self.topics[0], p)

    def ready(self, user_id: str) -> bool:
        """This worker can answer for the user now: its partition assigned,
        the tables recovered, the view whole."""
        app = self.runtime.app
        event = self.whole.get(partition_of(user_id, self.runtime.settings.partitions))
        return (event is not None and event.is_set() and not app.rebalancing
                and app.tables.recovery.completed.is_set())

    async def wait_whole(self, events) -> None:
        """Before a batch is handled: the view of each of its partitions is whole."""
        if not self.installed:
            return
        for p in {e.message.partition for e in events}:
            event = self.whole.get(p)
            if event is not None:
                await event.wait()

    async def applied(self, events) -> None:
        """After a batch's effects are in the view: its offsets are held."""
        if self.watermarks is None:
            return
        offsets: dict[TopicPartition, int] = {}
        for e in events:
            if self.installed and e.message.partition not in self.whole:
                continue  # lost meanwhile: a release may have reset it, and a late batch must not claim it
            tp = TopicPartition(e.message.topic, e.message.partition)
            offsets[tp] = max(offsets.get(tp, 0), e.message.offset + 1)
        # A view write like the batch's own: a transient fault is retried, never a crash of the runner.
        await self.runtime.policy.until_done(
            "watermarks", lambda: asyncio.to_thread(self.watermarks.advance, self.runtime.view.name, offsets))

    async def _catch_up(self, p: int) -> None:
        """Transient failures are retried (and reported as a stalled stage);
        a deterministic one leaves the partition not whole — its reads 503 and
        /healthz names it — rather than answer from a view that lacks events."""
        release = self._releasing.pop(p, None)
        if release is not None:  # gained back: keep what the view holds; a drop under way ends first
            release.cancel()
            await asyncio.wait([release])
        try:
            await self.runtime.policy.until_done(f"catch-up[{p}]", lambda: self._replay(p))
        except Exception:
            log.exception("catching up partition %d failed: its reads answer 503 until a restart", p)
            return
        finally:
            self._catching.pop(p, None)
        event = self.whole.get(p)
        if event is not None:
            event.set()

    async def _replay(self, p: int) -> None:
        """Project into the view every event of partition `p` between its
        watermark and the end of the log as the partition is gained: past
        the group's committed offset too, since the previous owner's
        requests agent may have acted on events (a cycle's beliefs, the
        episodes of its window) that its other agents had not committed yet,
        and the next request's cycle must find them in this view."""
        settings, runtime = self.runtime.settings, self.runtime
        consumer = AIOKafkaConsumer(**client_options(settings), group_id=settings.app_id,
                                    enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100)
        try:
            # Bounded: seen hanging after a SIGKILL's rebalance; a timeout is
            # transient, so the policy retries with a fresh consumer.
            await asyncio.wait_for(consumer.start(), BROKER_CALL_TIMEOUT)
            view = runtime.view.name
            tps = [TopicPartition(t, p) for t in self.topics]
            marks = await asyncio.to_thread(self.watermarks.of, view)
            # To the log's end (ListOffsets), and at least the commit. Tansu's ListOffsets is short when the
            # last batch holds several records, never past the end: `_project` reads on to what a fetch sees.
            ends = await asyncio.wait_for(consumer.end_offsets(tps), BROKER_CALL_TIMEOUT)
            spans = {tp: (marks.get(tp, 0),
                          max(ends.get(tp) or 0,
                              await asyncio.wait_for(consumer.committed(tp), BROKER_CALL_TIMEOUT) or 0)) for tp in tps}
            spans = {tp: span for tp, span in spans.items() if span[0] < span[1]}
            if not spans:
                return
            started = asyncio.get_running_loop().time()
            carries = carried(settings)
            events, reached = await _project(consumer, spans, self._projectors(p),
                                             lambda ms: read_records(ms, carries, runtime.sealing),
                                             runtime.projection_lock)
            await asyncio.to_thread(self.watermarks.advance, view, reached)
            if not events:
                return
            log.warning("caught up partition %d: %d events into the view in %.1f s", p, events,
                        asyncio.get_running_loop().time() - started)
        finally:
            await consumer.stop()

    async def _release(self, p: int) -> None:
        """Drop a lost partition's users from this worker's view once its new
        owner has caught up; nothing if it comes back first."""
        try:
            owner = await self._caught_up_elsewhere(p)
        except asyncio.CancelledError:
            return  # gained back before: the view keeps it
        drop = asyncio.ensure_future(self._drop(p, owner))
        try:
            await asyncio.shield(drop)
        except asyncio.CancelledError:
            await asyncio.wait([drop])  # begun: it ends, and a catch-up of p waits for it
        finally:
            if self._releasing.get(p) is asyncio.current_task():
                del self._releasing[p]

    async def _caught_up_elsewhere(self, p: int) -> str:
        """The URL of the partition's new owner, once it answers /healthz ok:
        its tables recovered and its view caught up (a remote state, looked at
        every RELEASE_POLL seconds: nothing here is told when it changes)."""
        app, me = self.runtime.app, self.runtime.settings.canonical_url
        if self._client_ssl is None:
            self._client_ssl = forwarding.client_ssl(self.runtime.settings)
        while True:
            owner = owner_in(app.router.external_topics_metadata(), self.topics[0], p)
            if owner is not None and owner.rstrip("/") != me.rstrip("/"):
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with app.http_client.get(f"{owner.rstrip('/')}/healthz", ssl=self._client_ssl,
                                                   timeout=aiohttp.ClientTimeout(total=5)) as answer:
                        if answer.status == 200:
                            return owner
            await asyncio.sleep(RELEASE_POLL)

    async def _drop(self, p: int, owner: str) -> None:
        view, partitions = self.runtime.view, self.runtime.settings.partitions

        def drop() -> int:
            # Watermarks first: a crash between the two leaves points a catch-up rewrites, never a
            # watermark claiming points that are gone.
            self.watermarks.reset(view.name, p)
            users = [u for u in view.users() if partition_of(u, partitions) == p]
            view.forget(users)
            return len(users)

        async with self.runtime.projection_lock:  # as the projectors: never beside a batch's writes
            if p in self.whole:
                return  # gained back meanwhile
            try:
                dropped = await self.runtime.policy.until_done(f"release[{p}]", lambda: asyncio.to_thread(drop))
            except Exception:
                log.exception("releasing partition %d failed: its users' points stay in this view", p)
                return
        log.info("partition %d released: %d user(s) left this worker's view, %s owns them and has caught up",
                 p, dropped, owner)

    def _projectors(self, p: int):
        """Per topic: what projects its events, their types, and what notes each event read."""
        view, embedder = self.runtime.view, self.runtime.embedder
        completed = self.completed.setdefault(p, set())

        def note(record) -> None:
            if isinstance(record, AUDITS):
                completed.add(record.cycle_id)
        return {self.topics[0]: (EpisodeProjector(view, embedder).apply, EPISODE_TYPES, None),
                self.topics[1]: (ReflectionProjector(view, embedder).apply, REFLECTION_TYPES, note)}


async def _project(consumer: AIOKafkaConsumer, spans: dict, projectors: dict, read,
                   lock: asyncio.Lock) -> tuple[int, dict]:
    """Apply each topic-partition's events from `start` to the end of its
    log, and at least up to `until` (exclusive), in order: how many, and the
    offset each topic-partition was applied up to. The end is the highwater
    the first fetch reports, if higher than `until` (see `_replay`); what
    comes after it is left to the pipeline."""
    consumer.assign(list(spans))
    for tp, (start, _) in spans.items():
        consumer.seek(tp, start)
    left, applied, reached, ends = dict(spans), 0, {}, {}
    while left:
        batches = await consumer.getmany(*left, timeout_ms=200, max_records=1000)
        for tp, messages in batches.items():
            apply, kinds, note = projectors[tp.topic]
            kept, _ = await read(messages)  # what is refused was dead-lettered when first read
            for record, _m in kept:
                if note is not None:
                    note(record)
            kept = [(r, m) for r, m in kept if isinstance(r, kinds)]
            records = [r for r, _ in kept]
            positions = [m.offset for _, m in kept]  # as the live path (processors/ports.py, POSITION)
            async with lock:  # as the live projectors: a rebuild swaps views between batches only
                await asyncio.to_thread(apply, records, positions)
            applied += len(records)
        for tp in list(left):  # by position, not the last record: a span may end at a gap
            if tp not in ends and consumer.highwater(tp) is not None:  # the log's end as first seen
                ends[tp] = max(spans[tp][1], consumer.highwater(tp))
            position = await consumer.position(tp)
            if tp in ends and position >= ends[tp]:
                reached[tp] = position
                left.pop(tp)
    return applied, reached
