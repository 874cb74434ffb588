"""The rebuild: replay `episodes` and `reflections` into a fresh view, then swap.

Reflect's REFRESH MATERIALIZED VIEW CONCURRENTLY. It runs inside the worker
that owns the view (a Qdrant Edge shard has one owner), on its own consumer
outside the group, so the live projectors go on writing the old view and reads
go on answering from it. The replay reads every partition to its end; then,
with the live projectors paused, it reads to the end again (what arrived
meanwhile), swaps the view in, and lets them go on — into the new view.
Nothing published is missed: what the paused projectors have not applied is
before that end. (With several workers on one Qdrant server, the others'
projectors are not paused: run the rebuild while they are stopped, or accept
that what they apply during the last read may miss the new collection.) Beliefs come
from their recorded events: the reasoner is never called. A compaction
(streams/worker/compaction.py) is the same flow starting from a copy of the view:
only the log after the copy's watermarks is read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from processors.projector import EPISODE_TYPES, REFLECTION_TYPES, EpisodeProjector, ReflectionProjector
from processors.dlq import carried
from streams.security import client_options
from streams.shredding import read_records

log = logging.getLogger("reflect")


@dataclass
class Progress:
    kind: str = "rebuild"  # rebuild | compaction | scrub (streams/worker/compaction.py)
    state: str = "idle"  # idle | copying | running | optimizing | swapping | done | failed
    events: int = 0
    total: int = 0
    started: float = 0.0
    seconds: float = 0.0
    old_view: str | None = None
    new_view: str | None = None
    error: str | None = None
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        elapsed = self.seconds or (time.monotonic() - self.started if self.started else 0.0)
        return {"kind": self.kind, "state": self.state, "events": self.events, "total": self.total,
                "seconds": round(elapsed, 3), "rate": round(self.events / elapsed, 1) if elapsed else 0.0,
                "old_view": self.old_view, "new_view": self.new_view, "error": self.error,
                "skipped": len(self.skipped)}


@dataclass
class Rebuilding:
    """The one rebuild or compaction a worker may run: its progress and its task."""
    progress: Progress | None = None
    task: asyncio.Future | None = None

    def busy(self) -> bool:
        return self.task is not None and not self.task.done()

    def start(self, progress: Progress, run) -> None:
        """Run `run(progress)` in the background, following it here."""
        self.progress = progress
        self.task = asyncio.ensure_future(run(progress))


async def _replay(consumer: AIOKafkaConsumer, parts, floor: dict, projectors, read,
                  progress: Progress) -> None:
    """Apply every event to the end of each partition: at least `floor` (the
    end offsets), and on to the high watermark the fetches report — Tansu's
    ListOffsets answers one past the last batch's base offset, so end
    offsets alone would stop short of a tail published in one batch."""
    while True:
        batches = await consumer.getmany(*parts, timeout_ms=200, max_records=2000)
        for tp, messages in batches.items():
            kept, refused = await read(messages)
            # What was refused went to a dead-letter topic when it was first read.
            progress.skipped += [f"{tp.topic}[{tp.partition}]@{m.offset}" for m in refused]
            kept = [(r, m) for r, m in kept if isinstance(r, EPISODE_TYPES + REFLECTION_TYPES)]
            records = [r for r, _ in kept]
            positions = [m.offset for _, m in kept]  # where the live path put them (processors/ports.py, POSITION)
            # Off the event loop: embedding and upserts take the time, and the
            # worker's heartbeats, agents and API go on meanwhile.
            await asyncio.to_thread(projectors[tp.topic], records, positions)
            progress.events += len(messages)
        if not any(batches.values()):
            ends = {tp: max(floor[tp], consumer.highwater(tp) or 0) for tp in parts}
            behind = [tp for tp in parts if await consumer.position(tp) < ends[tp]]
            progress.total = max(progress.total, progress.events + len(behind))
            if not behind:
                return


async def held_to(watermarks, consumer: AIOKafkaConsumer, parts, view: str, old_view: str) -> None:
    """The new view holds every partition up to where the replay stopped
    (an Edge view's watermarks, streams/worker/ownership.py; None with a server)."""
    if watermarks is not None:
        held = {tp: await consumer.position(tp) for tp in parts}
        await asyncio.to_thread(watermarks.advance, view, held)
        watermarks.forget(old_view)


async def rebuild(runtime, projection_lock: asyncio.Lock, progress: Progress) -> None:
    """Every partition from its beginning into an empty successor."""
    async def empty():
        return await asyncio.to_thread(runtime.view.successor), None
    await refresh(runtime, projection_lock, progress, empty)


class Abandoned(Exception):
    """The successor can no longer stand in for the view (streams/worker/compaction.py)."""


async def refresh(runtime, projection_lock: asyncio.Lock, progress: Progress, start, still_fits=None) -> None:
    """Fill a successor from the log, optimize it, and swap it in. `start()`
    returns the successor and where it holds the log ({topic-partition:
    offset}; None: nothing, every partition from its beginning);
    `still_fits()`, checked with the live projectors paused, raises
    `Abandoned` when it may no longer be swapped in."""
    settings, embedder = runtime.settings, runtime.embedder
    progress.started, old_view = time.monotonic(), runtime.view.name
    progress.old_view = old_view
    try:
        fresh, held = await start()
    except Exception as exc:
        _failed(progress, exc)
        return
    progress.state, progress.new_view = "running", fresh.name
    episodes, reflections = EpisodeProjector(fresh, embedder), ReflectionProjector(fresh, embedder)
    projectors = {settings.topic_episodes: episodes.apply, settings.topic_reflections: reflections.apply}
    carries = carried(settings)  # what the live path dead-lettered, the replay skips

    def read(messages):
        return read_records(messages, carries, runtime.sealing)
    consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False,
                                auto_offset_reset="earliest", fetch_max_wait_ms=100)
    await consumer.start()
    try:
        parts = [TopicPartition(t, p) for t in projectors for p in range(settings.partitions)] \
            if held is None else sorted(held)
        consumer.assign(parts)
        if held is None:
            held = await consumer.beginning_offsets(parts)
        for tp in parts:
            consumer.seek(tp, held[tp])
        until = await consumer.end_offsets(parts)
        progress.total = sum(max(0, until[tp] - held[tp]) for tp in parts)  # a lower bound on Tansu
        await _replay(consumer, parts, until, projectors, read, progress)
        # Reads of a grown, unoptimized Edge shard slow down (streams/adapters/view/edge.py,
        # EdgeView.optimize): the successor serves no one yet, so it is optimized
        # now, in a child process, while the live path goes on; then what
        # arrived meanwhile, so that little is left for the pause.
        progress.state = "optimizing"
        await asyncio.to_thread(fresh.optimize)
        progress.state = "running"
        await _replay(consumer, parts, await consumer.end_offsets(parts), projectors, read, progress)
        async with projection_lock:  # the live projectors wait here, briefly
            progress.state = "swapping"
            if still_fits is not None:
                still_fits()
            # A writer outside the lock puts its events on the log, then in the view (a cycle's beliefs):
            # one whose write came after this last read of the log, but went to the old view, would be
            # in neither view. Its write waits for the swap instead, and goes to the new view.
            pausing = asyncio.ensure_future(asyncio.to_thread(runtime.view.pause_writes))
            try:
                await asyncio.shield(pausing)
                await _replay(consumer, parts, await consumer.end_offsets(parts), projectors, read, progress)
                await asyncio.to_thread(fresh.promote)
                # In a thread: the swap waits for the reads in flight on the old view.
                old = await asyncio.to_thread(runtime.view.swap, fresh)
            finally:  # resumed once paused, even when cancelled while the pause waited for a write to end
                pausing.add_done_callback(lambda _: runtime.view.resume_writes())
            await held_to(runtime.ownership.watermarks, consumer, parts, fresh.name, old_view)
        await asyncio.to_thread(old.drop)
        progress.state, progress.seconds = "done", time.monotonic() - progress.started
        log.warning("%s: %d events into %s in %.1f s; %s dropped", progress.kind, progress.events, fresh.name,
                    progress.seconds, old_view)
    except Exception as exc:
        _failed(progress, exc)
        await asyncio.to_thread(fresh.drop)
    finally:
        await consumer.stop()


def _failed(progress: Progress, exc: Exception) -> None:
    progress.state, progress.error = "failed", f"{type(exc).__name__}: {exc}"
    progress.seconds = time.monotonic() - progress.started
    if isinstance(exc, Abandoned):
        log.warning("%s abandoned (%s); the old view keeps serving", progress.kind, exc)
    else:
        log.exception("%s failed; the old view keeps serving", progress.kind, exc_info=exc)
