"""The app factory: the Faust app, the runtime a worker holds, its pipeline
and HTTP routes.

The pipeline (streams/worker/pipeline/) is one agent per input topic that decodes
each event once and runs the roles in a fixed order; the routes
(streams/http/routes/) read the view and the tables. This module only wires them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import faust

from processors import router
from processors.ports import EmbedderMismatch
from streams.adapters.factory import make_embedder, make_reasoner, open_view
from streams.adapters.sealing import KeyRing, SealingError
from streams.adapters.view.edge import stop_optimizing
from streams.broker import honour_fetch_wait
from streams.http import forwarding
from streams.http.routes import install
from streams.http.routes.common import keys_for, web_options
from streams.http.routes.common import install_forwarding
from streams.security import faust_credentials
from streams.settings import Settings, SettingsError
from streams.shredding import Sealing
from streams.worker import metrics, pipeline
from streams.worker.broker_watch import PROBE_INTERVAL, BrokerProbe, BrokerWatch, report
from streams.worker.commits import Commits
from streams.worker.group_watch import GroupWatch
from streams.worker.on_log import Log
from streams.worker.patches import (patch_fetch_wait, patch_flow_control_resume, patch_perform_seek,
                                    patch_recovery_seek_floor)
from streams.worker.read_order import ReadOrder
from streams.worker.revocations import RevocationWatch
from streams.worker.runtime import Runtime

log = logging.getLogger("reflect")


def faust_app(settings: Settings) -> faust.App:
    patch_fetch_wait()
    # A broker that answers an empty fetch at once (noida-db) made idle consumers
    # spin (0.7–0.9 core a worker); one that holds it (Kafka, Tansu) waits no longer.
    honour_fetch_wait()
    patch_flow_control_resume()
    patch_perform_seek()
    patch_recovery_seek_floor()
    keys = keys_for(settings)  # its revocations are filled by the RevocationWatch
    try:
        web_tls = forwarding.server_ssl(settings)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
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
        # TLS when REFLECT_WEB_TLS_CERT_FILE is set: canonical_url is https then.
        web_ssl_context=web_tls,
        # Where the other workers forward a user's reads (streams/worker/ownership.py).
        canonical_url=settings.canonical_url,
        web_application_options=web_options(settings, keys),
        web_in_thread=False,
    )
    app.keys = keys
    try:  # forwarded reads: signed with the cluster key, over TLS when configured (streams/http/forwarding.py)
        install_forwarding(app.web.web_app, settings, str(app.conf.canonical_url))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    app.fetch_wait_ms = round(settings.fetch_wait * 1000)
    # The pipeline's topics: a partition of them with no commit is read from its start, and every record of
    # them reaches its runner in order (patch_perform_seek, streams/worker/read_order.py).
    app.read_from_start = frozenset((settings.topic_episodes, settings.topic_requests, settings.topic_reflections))
    return app


def create_app(settings: Settings) -> Runtime:
    app = faust_app(settings)
    metrics.configure_tracing(settings, app)
    embedder = make_embedder(settings.embedder)
    try:
        reasoner = make_reasoner(settings, embedder)
    except ValueError as exc:
        raise SettingsError(f"invalid setting reasoner ({exc})") from None
    try:
        view = open_view(settings, embedder.dim)
    except EmbedderMismatch as exc:  # a setting that does not fit the view: said in one line, no traceback
        raise SettingsError(f"invalid setting embedder ({exc})") from None
    runtime = Runtime.build(settings, app, view, embedder, reasoner)
    runtime.sealing = runtime.outlets.sealing = Sealing(settings)
    if settings.seal == "on":  # a ring that cannot be read is said now, not at the first episode
        try:
            KeyRing.load(settings.master_keys_path, create=not settings.master_keys)
        except SealingError as exc:
            raise SettingsError(f"invalid setting master_keys ({exc})") from None
    pipeline.install(runtime)
    runtime.ownership.install(app)
    runtime.commits = Commits(app)
    runtime.read_order = app.read_order = ReadOrder(app)
    runtime.log = Log(settings, app)
    runtime.commits.install(app)
    watch_broker(runtime)
    app.add_dependency(GroupWatch(app, settings))
    app.revocation_watch = app.add_dependency(RevocationWatch(app.keys.revoked, settings))

    @app.on_before_shutdown.connect
    async def close_view(app, **kwargs) -> None:
        await runtime.commits.handed_over()  # the batches in hand, done or given up, and their commits
        stop_optimizing()  # a rebuild's or compaction's child: minutes at 500k points
        if runtime.replays is not None:
            await runtime.replays.close()  # side workers: streams/worker/replay.py
        view.close()
        await runtime.sealing.close()

    install(runtime)

    @app.task
    async def train_router() -> None:
        """Recall's router, trained now rather than on the first auto read.
        The worker is not ready until it is (/healthz): its training embeds
        hundreds of questions, which took the cores from an import started
        at the first ready (~5 s of CPU, a quarter of 929 REALTALK turns').
        A replay's side worker answers no recall (streams/worker/replay.py): none."""
        if settings.replay:
            runtime.router_ready = True
            return
        try:
            await asyncio.to_thread(router.trained, embedder)
        except Exception:  # the first auto read trains it again, and says why it cannot
            log.exception("recall's router could not be trained at start")
        runtime.router_ready = True
    return runtime


def watch_broker(runtime: Runtime) -> None:
    """One log line when the broker stops answering and one when it is back."""
    settings = runtime.settings
    watch, probe = BrokerWatch(last_answer=time.monotonic()), BrokerProbe(settings)

    @runtime.app.timer(PROBE_INTERVAL)
    async def probe_broker() -> None:
        report(watch, await probe.answers(), time.monotonic(), settings.bootstrap)

    @runtime.app.on_before_shutdown.connect
    async def close_probe(app, **kwargs) -> None:
        await probe.close()
