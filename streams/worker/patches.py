"""Patches of Faust and mode internals, each pinned: pyproject bounds the
versions, and tests/integration/test_patches.py fails when one stops applying."""

from __future__ import annotations


def patch_fetch_wait() -> None:
    """Let an app set its worker consumer's fetch wait (`app.fetch_wait_ms`).

    Faust hard-codes fetch_max_wait_ms=1500. Tansu holds a fetch that long
    even when records arrive meanwhile (a Kafka broker answers at once), so
    every hop between agents cost ~0.6 s: the demo took 71 s instead of 41.
    """
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    create = AIOKafkaConsumerThread._create_worker_consumer
    if getattr(create, "patched", False):
        return

    def create_worker_consumer(self, transport):
        consumer = create(self, transport)
        wait = getattr(self.app, "fetch_wait_ms", None)
        if wait is not None:
            consumer._fetch_max_wait_ms = wait  # read by the consumer's start()
        return consumer

    create_worker_consumer.patched = True
    AIOKafkaConsumerThread._create_worker_consumer = create_worker_consumer


def patch_flow_control_resume() -> None:
    """Resume flow control only when it is suspended (a resume of an active
    flow is a no-op).

    mode's FlowControlEvent.resume() also clears every channel queue, and
    Faust 0.15.3's recovery resumes twice: before reading the changelogs and
    again when they are read — after the stream partitions were resumed and
    their records fetched. The second resume dropped those records from the
    agents' queues while the consumer's position was already past them: a
    worker restarted with a backlog (after a SIGKILL) ran one cycle and then
    sat idle, with requests and episodes never processed until the next
    restart (tests/faults/test_faults_crash.py). Resuming a suspended flow still
    clears what was queued before the rebalance.
    """
    from mode.utils.queues import FlowControlEvent

    resume = FlowControlEvent.resume
    if getattr(resume, "patched", False):
        return

    def resume_if_suspended(self) -> None:
        if not self.is_active():
            resume(self)

    resume_if_suspended.patched = True
    FlowControlEvent.resume = resume_if_suspended


def patch_perform_seek() -> None:
    """After Faust seeks its stream partitions to their commits (at every
    assignment, once the tables are recovered), seek each one that has no
    commit to its beginning, and tell the app's `read_order` where each
    pipeline partition now reads from (streams/worker/read_order.py).

    aiokafka's seek_to_committed leaves a partition with no commit (or a
    commit at 0) where its position is. Records fetched there before the seek
    and dropped on their way to the agents (Faust skips what comes while the
    flow is stopped, and a resume clears the queues) were then never read
    again, while the next records were handled and committed past them: the
    chaos suite lost a partition's first request (tests/faults/test_chaos.py,
    tests/integration/test_patches.py). A partition with no commit is read from its
    start: what no commit means.
    """
    from faust.transport.consumer import Consumer

    perform_seek = Consumer.perform_seek
    if getattr(perform_seek, "patched", False):
        return

    async def perform_seek_and_report(self) -> None:
        await perform_seek(self)
        pipeline = [tp for tp in self.assignment() if tp.topic in getattr(self.app, "read_from_start", ())]
        # _committed_offset: what perform_seek just read (None: no commit, or 0). Not the consumer's
        # position: the fetcher runs meanwhile, and may have moved it past records not yet delivered.
        targets = {tp: self._committed_offset.get(tp) for tp in pipeline}
        uncommitted = [tp for tp, offset in targets.items() if not offset]
        if uncommitted:
            earliest = await self.earliest_offsets(*uncommitted)
            for tp in uncommitted:
                targets[tp] = earliest.get(tp) or 0
                await self.seek(tp, targets[tp])
        order = getattr(self.app, "read_order", None)
        if order is not None:
            order.sought(targets)

    perform_seek_and_report.patched = True
    Consumer.perform_seek = perform_seek_and_report


def patch_recovery_seek_floor() -> None:
    """Seek a changelog partition to 0, never below, as table recovery starts.

    Faust's recovery seeks each changelog partition to one before the first
    offset it has to read, and maps only -1 to 0 (recovery._seek_offsets,
    "FIXME ... offset-1 discrepancy"). Seen under the chaos suite: a worker
    that joined and was handed a second assignment 2 s later got a lower
    offset for a changelog partition just created, aiokafka refused the seek
    ("Offset must be a positive integer") and Faust crashed the worker; in
    another run a standby partition's offset was None, with the same end.
    Below 0, or None, means what -1 means: nothing of the partition read yet.
    """
    from collections import Counter

    from faust.tables.recovery import Recovery

    seek_offsets = Recovery._seek_offsets
    if getattr(seek_offsets, "patched", False):
        return

    async def seek_offsets_from_zero(self, consumer, tps, offsets, title) -> None:
        floored = Counter({tp: max(-1 if offsets[tp] is None else offsets[tp], -1) for tp in tps})
        await seek_offsets(self, consumer, tps, floored, title)

    seek_offsets_from_zero.patched = True
    Recovery._seek_offsets = seek_offsets_from_zero
