"""Patches of Faust and mode internals, each pinned: pyproject bounds the
versions, and tests/test_patches.py fails when one stops applying."""

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
    restart (tests/test_faults_crash.py). Resuming a suspended flow still
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


def release(app, message) -> None:
    """Let a stopping or revoked consumer go on without `message`, left
    unacknowledged on purpose (a batch given up: streams/pipeline/runner.py),
    and never commit past it until the partitions are assigned again (the
    consumer then reads from the last commit).

    Faust's handover waits until every message it delivered is acknowledged
    or no longer held (`_unacked_messages` is a WeakSet), and its stream
    iterator holds the last message it delivered until the next one comes,
    which it never does once the flow is stopped: without this the handover
    waited for that message forever. And Faust acknowledges, as skipped, the
    messages its streams meet while the flow is stopped; its commit stops at
    a gap only once a partition has a commit above 0, and not at a gap of
    one message, so those later offsets could be committed past the message
    given up (`patch_commit_floor` stops that).
    """
    from mode.utils.futures import notify

    consumer = getattr(app, "consumer", None)
    if consumer is None:
        return
    floors = consumer.__dict__.setdefault("reflect_given_up", {})
    floors[message.tp] = min(floors.get(message.tp, message.offset), message.offset)
    consumer._unacked_messages.discard(message)
    notify(consumer._waiting_for_ack)  # as an ack does: the handover looks again now, not in a second


def patch_commit_floor() -> None:
    """A consumer commits no partition past a message given up (`release`)
    until `forget_given_up`."""
    from faust.transport.consumer import Consumer

    new_offset = Consumer._new_offset
    if getattr(new_offset, "patched", False):
        return

    def floored(self, tp):
        offset = new_offset(self, tp)
        floor = self.__dict__.get("reflect_given_up", {}).get(tp)
        return offset if floor is None or offset is None else min(offset, floor)

    floored.patched = True
    Consumer._new_offset = floored


def forget_given_up(app) -> None:
    """At an assignment: the consumer reads again from the last commit."""
    app.consumer.__dict__.pop("reflect_given_up", None)
