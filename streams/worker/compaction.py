"""Compaction: an optimized copy of a live-grown Qdrant Edge view, swapped in.

Why. A view that only grows live keeps its points in appendable segments,
where the BM25 half of a filtered query walks every tenant's postings: at
100 users × 5,000 episodes a pattern recall over HTTP took p95 14.5–17.8 ms
grown live, 10.2 ms just compacted and 7.0 ms a third grown since
(tests/benchmarks/read_latency.py --optimized 0 | 1 | 0.67). Edge's
optimize holds the GIL for its whole run, so it never runs in the worker.

How. When the view has grown by `REFLECT_COMPACT_GROWTH` past its size when
last optimized (and holds at least `REFLECT_COMPACT_MIN_POINTS`), the worker
copies the shard's files with its writes held (reads go on; 2.6 s at 500k
points), noting first the watermarks up to which the copy holds each
topic-partition. Then, as a rebuild does (streams/worker/rebuild.py): the log after
those watermarks is replayed into the copy, the copy is optimized in a child
process, and with the live projectors paused the rest is replayed and the
copy swapped in. Unlike a rebuild, nothing before the watermarks is read or
embedded again. If the worker's partitions changed meanwhile (a rebalance),
the copy no longer stands in for the view: the compaction is abandoned, and
the next check starts over.

A scrub is the same flow after an erasure or a forget, its copy written
point by point (EdgeView.rewritten) rather than its files copied, and with
writes going on: an erased text stays in a shard's WAL and payload pages
until the shard is dropped, and is in none of the copy's files.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import TopicPartition

from streams.worker.rebuild import Abandoned, Progress, refresh

log = logging.getLogger("reflect")


def due(points: int, optimized: int, growth: float, min_points: int) -> bool:
    """Whether a view of `points`, `optimized` of them when last optimized (0:
    never), has grown enough to compact (growth 0: never)."""
    return growth > 0 and points >= min_points and points > optimized * (1 + growth)


def held_spans(held: dict[TopicPartition, int], partitions: set[int],
               topics: tuple[str, ...]) -> dict[TopicPartition, int]:
    """Where to replay from, for both topics of every partition the worker
    owns: the copy's watermark, or the beginning where it has none (no event
    of that topic-partition was in the view when it was copied)."""
    return {TopicPartition(t, p): held.get(TopicPartition(t, p), 0) for t in topics for p in sorted(partitions)}


async def compact(runtime, progress: Progress, rewrite: bool = False) -> None:
    """`rewrite`: the copy written point by point (a scrub), not its files copied."""
    ownership = runtime.ownership
    owned: set[int] = set()  # the partitions whose log the copy is brought up to date with

    def copy():
        if rewrite:  # writes going on between its chunks: what they change is replayed (below)
            return runtime.view.rewritten(runtime.view.writes_paused)
        with runtime.view.writes_held() as view:
            return view.copy()

    async def copied():
        progress.state = "copying"
        owned.update(ownership.whole)
        # Read before the copy (and on the loop, which advances them): every
        # effect below a watermark is in the view, so in the copy; what the
        # copy holds past one is applied again by the replay, idempotently.
        held = ownership.watermarks.of(runtime.view.name)
        fresh = await asyncio.to_thread(copy)
        return fresh, held_spans(held, owned, ownership.topics)

    def still_fits() -> None:
        if set(ownership.whole) != owned or not ownership.settled():
            raise Abandoned(f"the worker's partitions changed meanwhile: {sorted(owned)} → "
                            f"{sorted(ownership.whole)}")

    await refresh(runtime, runtime.projection_lock, progress, copied, still_fits)


async def scrub(runtime, progress: Progress) -> None:
    """Compactions whose copy is written point by point, while an erasure
    or a forget has asked for one since the last began: afterwards no file
    of the view holds what they took (streams/worker/pipeline/requests.py)."""
    while runtime.scrub_asked:
        runtime.scrub_asked = False
        await compact(runtime, progress, rewrite=True)
        if progress.state == "failed":
            runtime.scrub_asked = True  # asked again by the next batch's check, not in a loop here
            return


async def check(runtime) -> None:
    """After each batch the worker projects: start a scrub when an erasure
    asked for one, else a compaction when the view is due one (counting its
    points costs ~0.07 ms at 500k), and nothing else rebuilds it. Only a
    worker's own Edge view (a Qdrant server optimizes its segments itself)
    and only in a worker on a broker (the replay reads the log)."""
    settings, slot, ownership = runtime.settings, runtime.rebuilding, runtime.ownership
    if not (ownership.local_view and ownership.installed) or slot.busy() or not ownership.settled():
        return
    if runtime.scrub_asked and settings.scrub == "on":
        log.warning("scrubbing the view after an erasure: every point written into a fresh shard")
        slot.start(Progress(kind="scrub"), lambda progress: scrub(runtime, progress))
        return
    if not settings.compact_growth:
        return
    # Under the error policy: a view that does not answer is waited for here as by every stage.
    points, optimized = await runtime.policy.until_done("compaction-check",
                                                        lambda: asyncio.to_thread(runtime.view.growth))
    if due(points, optimized, settings.compact_growth, settings.compact_min_points):
        log.warning("compacting the view: %d points, %d when last optimized", points, optimized)
        slot.start(Progress(kind="compaction"), lambda progress: compact(runtime, progress))
