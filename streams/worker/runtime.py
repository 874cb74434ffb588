"""What a worker holds while it runs: the Faust app, its tables and topics, the
view, the embedder and reasoner, and the error policy. Built once by
`streams.worker.app.create_app`; the pipeline's agents and the HTTP routes read it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Iterable

import faust

from processors.dlq import ON_REFLECTIONS, dead_letter_headers, redacted
from processors.guard import Breaker, Budget, Tally
from processors.ports import Embedder, Reasoner, VectorStore
from schemas import (ChallengeRequested, Event, GateRequested, InvalidationRequested, ReflectionRequested,
                     UserForgotten)
from streams.settings import Settings
from streams.worker import metrics
from streams.worker.ownership import Ownership
from streams.worker.pipeline.policy import Backoff, Health, Policy
from streams.worker.rebuild import Rebuilding

log = logging.getLogger("reflect")
USER_LOCKS = 64  # stripes: two users rarely share one, and the map never grows


@dataclass(frozen=True)
class Tables:
    """Per-user state, changelogged, co-partitioned with the topics (a user's
    events and state live on one partition number, so one worker owns both)."""

    accumulators: Any  # user → Accumulator.to_dict(): the trigger and the recent window
    provenance: Any  # user → the invalidator's state (processors/invalidator.py)
    spend: Any  # "user:<id>" / "partition:<n>" / "tenant:<n>:<tenant>" → Spend.to_dict(): tokens spent today
    requests_done: Any  # user → the sequence number of the last request whose cycle is done and in the view
    last_cycle: Any  # user → what their last cycle made, or why nothing (streams/worker/cycle_notes.py), for stats
    outcomes: Any  # user → the last cycle decided, stored before it is published: {"cycle_id", "events"}
    gates: Any  # user → processors/gate.Gates.to_dict(): the contradiction and staleness gates' state

    @classmethod
    def of(cls, app: faust.App, partitions: int) -> "Tables":
        # Plain JSON keys and values (the app's serializers): value_type=dict broke
        # changelog recovery ("dict has no from_data"), and raw keys came back as bytes.
        return cls(app.Table("accumulators", default=dict, partitions=partitions),
                   app.Table("invalidator", default=dict, partitions=partitions),
                   app.Table("reasoner-spend", default=dict, partitions=partitions),
                   app.Table("requests-done", default=int, partitions=partitions),
                   app.Table("last-cycle", default=dict, partitions=partitions),
                   app.Table("cycle-outcomes", default=dict, partitions=partitions),
                   app.Table("gates", default=dict, partitions=partitions))


def write(table, partition: int, key: str, value: Any) -> asyncio.Future:
    """As `table[key] = value` would, but to the partition of the user's own
    events: the agents read other topics than the one a key was last set from.
    Awaited, once the broker has the changelog record."""
    table.data[key] = value
    return table.send_changelog(partition, key, value)


class Outlets:
    """The topics the pipeline writes: each event to the topic of its type, a
    dead letter beside the topic it came from."""

    def __init__(self, app: faust.App, settings: Settings) -> None:
        def raw(name: str):
            # acks=False: Faust commits no offset of these; Reflect does (streams/worker/commits.py).
            return app.topic(name, value_serializer="raw", key_serializer="raw", partitions=settings.partitions,
                             acks=False)

        self.episodes, self.requests = raw(settings.topic_episodes), raw(settings.topic_requests)
        self.reflections = raw(settings.topic_reflections)
        self.replay = settings.replay
        self.sealing = None  # streams/shredding.Sealing: a belief's text goes on the log sealed (a worker's)
        self.dlq = {settings.topic_episodes: raw(settings.dlq_episodes),
                    settings.topic_reflections: raw(settings.dlq_reflections),
                    settings.topic_requests: raw(settings.dlq_reflections)}

    def topic_of(self, event: Event):
        if isinstance(event, (ReflectionRequested, ChallengeRequested, InvalidationRequested, GateRequested,
                              UserForgotten)):  # forwarded: only the accumulator publishes these
            return self.requests
        return self.reflections if isinstance(event, ON_REFLECTIONS) else self.episodes

    async def publish(self, events: Iterable[Event]) -> None:
        """Send and wait for the broker's acknowledgement of every one: a batch
        is acknowledged upstream only once what it caused is in the log."""
        if self.replay and any(self.topic_of(e) is self.episodes for e in events):
            raise RuntimeError(f"replay {self.replay}'s side worker would write the live episodes log")
        sent = [await self.topic_of(e).send(key=e.user_id.encode(), value=e.encode())
                for e in await self.sealed(events)]
        await asyncio.gather(*sent)

    async def sealed(self, events: Iterable[Event]) -> list[Event]:
        """The events as they go on the log: a belief's or a cycle's text
        sealed (streams/shredding.py), their keys acknowledged together."""
        if not self.sealing:
            return list(events)
        sealing = [await self.sealing.sealing(e) for e in events]
        await asyncio.gather(*(acked for _, acked in sealing if acked is not None))
        return [sealed for sealed, _ in sealing]

    async def dead_letter(self, message, error: BaseException, stage: str) -> None:
        log.warning("dead-lettered %s[%s]@%s at %s: %s", message.topic, message.partition, message.offset, stage,
                    redacted(error), extra={"topic": message.topic, "partition": message.partition,
                                            "offset": message.offset, "stage": stage,
                                            "error_class": type(error).__name__})
        metrics.dead_letter(message.topic, stage)
        sent = await self.dlq[message.topic].send(key=message.key, value=message.value, headers=dead_letter_headers(
            message.topic, message.partition, message.offset, error, stage))
        await sent


@dataclass
class Runtime:
    settings: Settings
    app: faust.App
    view: VectorStore
    embedder: Embedder
    reasoner: Reasoner
    breaker: Breaker
    budget: Budget
    tally: Tally
    tables: Tables
    outlets: Outlets
    health: Health
    policy: Policy
    # Held by the live projectors while they apply and by a rebuild while it swaps.
    projection_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    running: dict = dataclasses.field(default_factory=dict)  # user → the cycle id the reflector is on
    # Notified whenever a cycle is marked done: a retraction waits on it (streams/worker/pipeline/episodes.py).
    cycle_done: asyncio.Condition = dataclasses.field(default_factory=asyncio.Condition)
    _locks: list = dataclasses.field(default_factory=lambda: [asyncio.Lock() for _ in range(USER_LOCKS)])
    ownership: Any = None  # streams/worker/ownership.Ownership: which partitions are this worker's, and whole
    commits: Any = None  # streams/worker/commits.Commits (a worker's; None in the tests' in-memory one)
    read_order: Any = None  # streams/worker/read_order.ReadOrder (a worker's; None in the in-memory one)
    log: Any = None  # streams/worker/on_log.Log: what the log holds, asked before a rerun publishes again
    rebuilding: Rebuilding = dataclasses.field(default_factory=Rebuilding)  # one rebuild or compaction at a time
    scrub_asked: bool = False  # an erasure or a forget since the last scrub began (streams/worker/compaction.py)
    router_ready: bool = False  # recall's router trained (streams/worker/app.py): readiness waits for it
    replays: Any = None  # streams/worker/replay.Replays: the side workers this worker runs (made on first use)
    sealing: Any = None  # streams/shredding.Sealing: a worker's keys (None in the tests' in-memory one)

    @classmethod
    def build(cls, settings: Settings, app, view: VectorStore, embedder: Embedder, reasoner: Reasoner,
              backoff: Backoff = Backoff()) -> "Runtime":
        """The runtime over an app (Faust's, or the tests' in-memory one): its
        tables and topics declared, the guards and the error policy."""
        outlets, health = Outlets(app, settings), Health()
        runtime = cls(settings, app, view, embedder, reasoner,
                      Breaker(settings.breaker_failures, settings.breaker_cooldown), Budget.from_settings(settings),
                      Tally(), Tables.of(app, settings.partitions), outlets, health,
                      Policy(view, outlets.dead_letter, health, backoff))
        runtime.ownership = Ownership(runtime)
        return runtime

    def handing_over(self) -> bool:
        """The worker is stopping, or a rebalance is revoking its partitions:
        Faust has stopped the flow of events (its streams skip what still
        comes) and waits for those in hand, so a batch waiting on another
        agent (a cycle to be done) would wait for a request that is no longer
        coming. Not `app.rebalancing`: that stays set while the flow resumes,
        until the worker is ready."""
        flow = getattr(self.app, "flow_control", None)  # None: the tests' in-memory app
        return bool(getattr(self.app, "should_stop", False)) or (flow is not None and not flow.is_active())

    def still_owns(self, message) -> bool:
        """Whether the worker may still publish for the message's partition:
        it is not handing its partitions over, and the message was read in
        the group's current generation (a worker expelled from the group
        learns it at its next heartbeat: until then, only transactions would
        fence it — deploy/README.md, Delivery)."""
        return not self.handing_over() and (self.commits is None or self.commits.current(message))

    def user_lock(self, user_id: str) -> asyncio.Lock:
        """Held while a user's invalidator state is read, changed and written:
        the episodes and the reflections pipelines both change it."""
        return self._locks[hash(user_id) % USER_LOCKS]
