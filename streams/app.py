"""The Faust application: topics, agents and the worker's HTTP routes.

Agents are thin: decode at the edge (bad input → dead-letter topic with the
reason), then hand validated records to a processor's pure core.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from dataclasses import dataclass

import faust

from processors.dlq import accept, carried, dead_letter_headers
from processors.embedders import Embedder, make_embedder
from processors.accumulator import Accumulator, Trigger, admit
from processors.freshness import cycle_number
from processors.guard import Breaker, Budget, Spend, Tally, day_of, tokens_of
from processors.invalidator import Invalidator, empty_state
from processors.projector import (REFLECTION_TYPES, EpisodeProjector, ReflectionProjector,
                                  point_id)
from processors.reasoners import Reasoner, make_reasoner
from processors.reflector import CycleConfig, refused, run_cycle, window_records, window_refs
from processors.view import VectorStore, open_view
from schemas import (ContractError, EpisodeRetracted, ReflectionCreated, ReflectionReinforced,
                     ReflectionRequested)
from streams import api, metrics
from streams.broker_watch import PROBE_INTERVAL, BrokerProbe, BrokerWatch, report
from streams.group_watch import GroupWatch
from streams.logs import redacted
from streams.security import faust_credentials
from streams.settings import Settings, SettingsError

log = logging.getLogger("reflect")


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
    # Held by the live projectors while they apply and by a rebuild while it swaps.
    projection_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    running: dict = dataclasses.field(default_factory=dict)  # user → the cycle id the reflector is on


def _patch_fetch_wait() -> None:
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


def _patch_flow_control_resume() -> None:
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


def faust_app(settings: Settings) -> faust.App:
    _patch_fetch_wait()
    _patch_flow_control_resume()
    app = faust.App(
        settings.app_id,
        broker=settings.broker,
        autodiscover=False,
        store="memory://",
        datadir=str(Path(settings.data_dir) / "faust"),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        # at_least_once by default (every effect is idempotent); exactly_once
        # needs Apache Kafka: it fails on Tansu (InitProducerId).
        processing_guarantee=settings.processing_guarantee,
        broker_credentials=faust_credentials(settings),
        # Tansu misreports a partition's end offset when the last batch holds
        # more than one record, and changelog recovery then skips the tail;
        # one record per batch keeps recovery exact.
        producer_max_batch_size=1,
        # Tansu holds the first JoinGroup for half the session timeout.
        broker_session_timeout=settings.session_timeout,
        broker_heartbeat_interval=settings.session_timeout / 6,
        broker_rebalance_timeout=settings.rebalance_timeout,
        consumer_auto_offset_reset="earliest",
        key_serializer="json",
        value_serializer="json",
        # web_bind is what the server listens on (Faust's default: every
        # interface); web_host only names it in URLs Faust generates.
        web_host=settings.web_host,
        web_bind=settings.web_host,
        web_port=settings.web_port,
        web_application_options=api.web_options(settings),
        web_in_thread=False,
    )
    app.fetch_wait_ms = round(settings.fetch_wait * 1000)
    return app


def create_app(settings: Settings) -> Runtime:
    app = faust_app(settings)
    metrics.configure_tracing(settings, app)
    embedder = make_embedder(settings.embedder)
    view = open_view(settings, embedder.dim)
    projector = EpisodeProjector(view, embedder)

    def raw_topic(*names: str):
        return app.topic(*names, value_serializer="raw", key_serializer="raw", partitions=settings.partitions)

    episodes, reflections = raw_topic(settings.topic_episodes), raw_topic(settings.topic_reflections)
    requests = raw_topic(settings.topic_requests)
    dlq = {settings.topic_episodes: raw_topic(settings.dlq_episodes),
           settings.topic_reflections: raw_topic(settings.dlq_reflections),
           settings.topic_requests: raw_topic(settings.dlq_reflections)}
    # Plain JSON keys and values (the app's serializers): value_type=dict broke
    # changelog recovery ("dict has no from_data"), and raw keys came back as bytes.
    accumulators = app.Table("accumulators", default=dict, partitions=settings.partitions)
    trigger, cycle_config = Trigger.from_settings(settings), CycleConfig.from_settings(settings)
    try:
        reasoner = make_reasoner(settings)
    except ValueError as exc:
        raise SettingsError(f"invalid setting reasoner ({exc})") from None
    reflection_projector = ReflectionProjector(view, embedder)
    runtime = Runtime(settings, app, view, embedder, reasoner,
                      Breaker(settings.breaker_failures, settings.breaker_cooldown), Budget.from_settings(settings),
                      Tally())
    # Tokens spent today, by "user:<id>" and "partition:<n>" (of the requests
    # topic): written only while handling that partition's requests, so each
    # key has one writer and its changelog partition.
    spend = app.Table("reasoner-spend", default=dict, partitions=settings.partitions)
    # The last threshold cycle per user whose events are in the view: what a
    # blocking read compares with the accumulator's count of cycles asked.
    cycles_done = app.Table("cycles-done", default=int, partitions=settings.partitions)

    async def dead_letter(message, error: Exception, stage: str) -> None:
        log.warning("dead-lettered %s[%s]@%s at %s: %s", message.topic, message.partition, message.offset, stage,
                    redacted(error), extra={"topic": message.topic, "partition": message.partition,
                                            "offset": message.offset, "stage": stage,
                                            "error_class": type(error).__name__})
        metrics.dead_letter(message.topic, stage)
        await dlq[message.topic].send(key=message.key, value=message.value, headers=dead_letter_headers(
            message.topic, message.partition, message.offset, error, stage))

    belongs = carried(settings)

    async def admitted(batch):
        """Accepted records (see `accept`); the rest dead-lettered."""
        out = []
        for event in batch:
            try:
                record = accept(event.message, belongs)
            except ContractError as error:
                metrics.event(event.message, "dead_lettered")
                await dead_letter(event.message, error, "decode")
                continue
            metrics.event(event.message, "ok", record.TYPE)
            out.append((record, event.message))
        return out

    @app.agent(episodes, name="projector")
    async def project(stream):
        async for batch in stream.take_events(settings.projector_batch, within=settings.projector_within):
            records = await admitted(batch)
            async with runtime.projection_lock:
                await apply_or_dead_letter(metrics.timed_apply(projector.apply, "episode"), records, dead_letter)

    @app.agent(reflections, name="reflection-projector")
    async def project_reflections(stream):
        async for batch in stream.take_events(settings.projector_batch, within=settings.projector_within):
            # Invalidations and audit events are valid here; only these change the view yet.
            records = [(r, m) for r, m in await admitted(batch) if isinstance(r, REFLECTION_TYPES)]
            async with runtime.projection_lock:
                await apply_or_dead_letter(metrics.timed_apply(reflection_projector.apply, "reflection"), records,
                                           dead_letter)

    @app.agent(raw_topic(settings.topic_episodes, settings.topic_reflections), name="accumulator")
    async def accumulate(stream):
        async for batch in stream.take_events(settings.projector_batch, within=settings.projector_within):
            changed: dict[str, tuple[int, Accumulator]] = {}
            for event in batch:
                try:
                    record = accept(event.message, belongs)
                except ContractError:
                    continue  # dead letters are the projectors' job; here a bad event is only skipped
                user = record.user_id
                before = changed[user][1] if user in changed else Accumulator.from_dict(accumulators[user])
                acc, request = admit(before, record, trigger)
                changed[user] = (event.message.partition, acc)
                if request is not None:
                    await requests.send(key=user.encode(), value=request.encode())
            # One changelog record per user and batch, not per event: each is a
            # produce request (producer_max_batch_size=1), and per event they
            # capped ingest at ~370 episodes/s. Written as Table.__setitem__
            # would, but to the partition of the user's own events.
            for user, (partition, acc) in changed.items():
                state = accumulators.data[user] = acc.to_dict()
                accumulators.send_changelog(partition, user, state)

    invalidator = Invalidator(view, settings.citation_floor, settings.max_depth)
    # What the invalidator knows is gone, per user (see processors/invalidator.py).
    provenance = app.Table("invalidator", default=dict, partitions=settings.partitions)

    @app.agent(raw_topic(settings.topic_episodes, settings.topic_reflections), name="invalidator")
    async def invalidate(stream):
        # In batches: most events (every EpisodeRecorded) concern it not at all.
        async for batch in stream.take_events(settings.projector_batch, within=settings.projector_within):
            for event in batch:
                try:
                    record = accept(event.message, belongs)
                except ContractError:
                    continue  # dead letters are the projectors' job
                if isinstance(record, (EpisodeRetracted, ReflectionCreated, ReflectionReinforced)):
                    await invalidate_one(record, event.message)

    async def invalidate_one(record, message) -> None:
        try:
            state = provenance[record.user_id] or empty_state()
            if isinstance(record, EpisodeRetracted):
                out, known = invalidator.on_retracted(record, state)
                if not known:
                    log.info("retraction of episode %s of user %s, which the view never held: "
                             "a tombstone, nothing to invalidate", record.episode_id, record.user_id)
            else:
                out = invalidator.on_belief(record, state)
            for made in out:
                topic = requests if isinstance(made, ReflectionRequested) else reflections
                await topic.send(key=made.user_id.encode(), value=made.encode())
            metrics.invalidations(out)
            # As Table.__setitem__ would, but to the partition of this user's event.
            provenance.data[record.user_id] = state
            provenance.send_changelog(message.partition, record.user_id, state)
        except Exception as error:  # a crashed agent would skip the retraction silently
            log.exception("invalidation after %s failed", record.event_id, extra={"event_id": record.event_id})
            await dead_letter(message, error, "invalidate")

    async def visible(events, timeout: float = 10.0) -> None:
        """Wait (bounded) until these records are in the view: the projectors are
        other agents, and a cycle must see what triggered it and what the user's
        previous cycle concluded (or it would repeat a belief, or overwrite a
        reinforcement it never saw)."""
        expected = {}
        for e in events:
            if isinstance(e, ReflectionReinforced):
                expected[point_id("reflection", e.user_id, e.reflection_id)] = list(e.evidence_ids)
            elif isinstance(e, ReflectionCreated):
                expected.setdefault(point_id("reflection", e.user_id, e.reflection_id), None)
            elif isinstance(e, dict):  # a window record
                expected[point_id(e["kind"], e["user_id"], e["id"])] = None
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            seen = view.get(list(expected))
            if all(pid in seen and (ids is None or seen[pid].get("evidence_ids") == ids)
                   for pid, ids in expected.items()):
                return
            await asyncio.sleep(0.05)
        log.warning("view still behind after %.0f s; the cycle goes on with what it sees", timeout)

    async def cycle(request: ReflectionRequested, partition: int) -> list:
        """One cycle's events: refused when a budget is spent or the breaker is
        open; else run off the event loop (a reasoner call can take seconds, and
        the loop must keep heartbeats, projectors and the API going)."""
        user, day, clock = request.user_id, day_of(now_utc()), asyncio.get_running_loop().time
        keys = (f"user:{user}", f"partition:{partition}")
        spent = [Spend.from_dict(spend[k]) for k in keys]
        reason = runtime.budget.refusal(*(s.today(day) for s in spent)) or runtime.breaker.refusal(clock())
        if reason:
            return [refused(request, reasoner, reason)]
        refs = window_refs(request, Accumulator.from_dict(accumulators[user]).recent)
        await visible([{"kind": kind, "id": rid, "user_id": user} for kind, rid in refs])
        window = window_records(view, user, refs)
        made = await asyncio.to_thread(metrics.traced_cycle(run_cycle), request, window, view, embedder, reasoner,
                                       cycle_config)
        completed = made[-1]
        runtime.breaker.record(completed.outcome == "unavailable", clock())
        for key, s in zip(keys, spent):
            spend[key] = s.charged(day, tokens_of(completed.usage)).to_dict()
        return made

    @app.agent(requests, name="reflector")
    async def reflect(stream):
        async for event in stream.events():
            for request, message in await admitted([event]):
                runtime.running[request.user_id] = request.cycle_id
                try:
                    made = await cycle(request, message.partition)
                    for out in made:
                        await reflections.send(key=out.user_id.encode(), value=out.encode())
                    runtime.tally.add(made[-1])
                    metrics.cycle(made[-1])
                    if made[-1].outcome in ("failed", "unavailable", "refused"):
                        log.warning("cycle %s %s: %s", request.cycle_id, made[-1].outcome, made[-1].error,
                                    extra={"cycle_id": request.cycle_id, "event_id": request.event_id,
                                           "outcome": made[-1].outcome})
                    await visible(made)
                except Exception as error:  # a crashed agent would skip the request silently
                    log.exception("cycle %s failed outside the reasoner", request.cycle_id,
                                  extra={"cycle_id": request.cycle_id, "event_id": request.event_id})
                    await dead_letter(message, error, "reflect")
                finally:
                    runtime.running.pop(request.user_id, None)
                    number = cycle_number(request.cycle_id, request.user_id)
                    if number is not None and number > cycles_done[request.user_id]:
                        cycles_done[request.user_id] = number

    watch, probe = BrokerWatch(last_answer=time.monotonic()), BrokerProbe(settings)
    app.add_dependency(GroupWatch(app, settings))

    @app.timer(PROBE_INTERVAL)
    async def watch_broker() -> None:
        report(watch, await probe.answers(), time.monotonic(), settings.bootstrap)

    @app.on_before_shutdown.connect
    async def close_view(app, **kwargs) -> None:
        await probe.close()
        view.close()

    api.install(runtime, api.Tables(accumulators, spend, cycles_done), episodes, requests)
    return runtime


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


async def apply_or_dead_letter(apply, admitted, dead_letter, attempts: int = 3) -> None:
    """Apply a batch; never let one failure lose events or kill the agent.

    A crashed Faust agent is restarted in-process with its offsets moved past
    the batch it was handling (seen here: the batch never reached the view),
    so failures stay inside this function: retry with backoff, then apply one
    by one and dead-letter only what still fails alone (stage "project"),
    keeping its original bytes for a replay.
    """
    records = [record for record, _ in admitted]
    for attempt in range(attempts):
        try:
            # Off the event loop: embedding is the projector's cost (MiniLM's ONNX
            # runtime releases the GIL), and fetching, the other agents and the
            # API go on meanwhile. The view is Serialized, so threads are safe.
            await asyncio.to_thread(apply, records)
            return
        except Exception:
            log.exception("applying %d events failed (attempt %d/%d)", len(records), attempt + 1, attempts)
            await asyncio.sleep(0.1 * 2**attempt)
    for record, message in admitted:
        try:
            await asyncio.to_thread(apply, [record])
        except Exception as error:
            await dead_letter(message, error, "project")
