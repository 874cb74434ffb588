"""`reflect up`: the whole stack in one process.

An embedded noida-db broker unless a broker is given (flag or REFLECT_BROKER),
the topics, the worker with every processor, the view (Qdrant Edge under
--data-dir unless --qdrant-url) and the HTTP API on --port. The embedded
log is a file under --data-dir (`log/`), so the log, the view and the tables
(restored from their changelog topics) are all kept: restarted on the same
directory, after a clean stop or a SIGKILL, `up` goes on where it was.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

from streams.settings import SPECS, UP_PORT, Settings, SettingsError
from streams.worker import logs

API_ROUTES = (
    "POST /v1/users/{user}/episodes",
    "POST /v1/users/{user}/episodes/{episode_id}/retract",
    "POST /v1/users/{user}/reflect",
    "GET  /v1/users/{user}/beliefs",
    "GET  /v1/users/{user}/stats",
    "GET  /healthz",
)


def stack_settings(args: argparse.Namespace, env=os.environ) -> tuple[Settings, bool]:
    """Settings of `up`/`demo`, and whether the broker is the embedded one.

    The embedder defaults to MiniLM here (belief quality needs a semantic
    embedder) when the `minilm` extra is installed.
    """
    given = {spec.name: getattr(args, spec.name, None) for spec in SPECS}
    embedded = given["broker"] is None and not env.get("REFLECT_BROKER")
    # --port, else --web-port (the worker's name for it), else up's own default.
    port = getattr(args, "port", None)
    given["web_port"] = port if port is not None else given["web_port"] if given["web_port"] is not None else UP_PORT
    if given["embedder"] is None and not env.get("REFLECT_EMBEDDER"):
        given["embedder"] = "minilm" if importlib.util.find_spec("onnxruntime") else "hashing"
    return Settings.load(env=env, **given), embedded


def log_dir(settings: Settings) -> Path:
    """Where the embedded broker keeps its log: beside the view, under --data-dir."""
    return Path(settings.data_dir) / "log"


def refuse_foreign_view(settings: Settings) -> None:
    """A view the embedded log did not build (no log beside it: the directory of a
    run with --broker, or of `reflect worker`) would answer for events the log
    does not hold, and its watermarks would skip the log's own."""
    if settings.qdrant_url is None and settings.view_dir.exists() and any(settings.view_dir.iterdir()) \
            and not (log_dir(settings) / "kafka.json").exists():
        raise SettingsError(f"{settings.view_dir} holds a view but {log_dir(settings)} no embedded log: the view "
                            "was built from another log (--broker?). Give that broker again, or another --data-dir")


def refuse_taken_port(settings: Settings, flag: str) -> None:
    """One line, before a broker, topic or view is made, when the API's port is taken."""
    from streams.broker import port_taken

    why = port_taken(settings.web_host, settings.web_port)
    if why:
        raise SettingsError(f"the API cannot listen on {settings.web_host}:{settings.web_port} ({why}; "
                            f"another reflect up or worker?): choose another with {flag}")


def differences(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(variable, value shown) of each setting `up` and `demo` use differently
    from the plain resolution (`reflect settings` reports both)."""
    plain = Settings.load(**{spec.name: getattr(args, spec.name, None) for spec in SPECS})
    stacked, embedded = stack_settings(args)
    out = [(spec.env, repr(getattr(stacked, spec.name))) for spec in SPECS
           if getattr(plain, spec.name) != getattr(stacked, spec.name)]
    broker = "(embedded, on a free port: noida-db, its log in data_dir/log; the demo: Tansu)"
    return [("REFLECT_BROKER", broker)] + out if embedded else out


def up(args: argparse.Namespace) -> int:
    import faust

    from streams.broker import BrokerError, EmbeddedBroker
    from streams.topics import create_topics, with_broker_errors
    from streams.worker.app import create_app

    settings, embedded = stack_settings(args)
    refuse_taken_port(settings, "--port")
    with contextlib.ExitStack() as stack:
        broker = None
        if embedded:
            refuse_foreign_view(settings)
            log_dir(settings).mkdir(parents=True, exist_ok=True)
            try:
                broker = stack.enter_context(EmbeddedBroker(kind="noida", data_dir=str(log_dir(settings)),
                                                            log_path=str(log_dir(settings) / "noida.log"),
                                                            ready_timeout=120))
            except BrokerError as exc:
                print(f"reflect: error: the embedded broker did not start: {exc}", file=sys.stderr)
                return 1
            settings = dataclasses.replace(settings, broker=broker.url)
        with contextlib.redirect_stdout(sys.stderr):  # topic lines are not the announcement
            if with_broker_errors(settings, create_topics(settings)) != 0:
                return 1
        runtime = create_app(settings)
        app = runtime.app

        @app.task
        async def announce() -> None:
            while app.rebalancing or not app.tables.recovery.completed.is_set():
                await asyncio.sleep(0.1)
            base = f"http://127.0.0.1:{settings.web_port}"
            where = (f"embedded noida-db at {broker.bootstrap} (log in {log_dir(settings)}: kept across restarts)"
                     if broker else settings.bootstrap)
            view = settings.qdrant_url or f"Qdrant Edge in {settings.view_dir}"
            # The CLI's reads and the client look at up's default port unless told.
            elsewhere = "" if settings.web_port == UP_PORT else \
                f"           (not the default port: export REFLECT_API={base} for the CLI's reads and the client)\n"
            print(f"Reflect is up.\n  API      {base}\n{elsewhere}  broker   {where}\n  view     {view}\n"
                  f"  reasoner {settings.reasoner}, embedder {settings.embedder}\n  routes   "
                  + "\n           ".join(API_ROUTES) + "\nCtrl-C or SIGTERM stops it.", flush=True)

        # Quiet by default (the announcement above is the interface); JSON logs when asked.
        options = logs.worker_options(settings) if settings.log_format == "json" else \
            {"loglevel": "warning", "quiet": True}
        worker = faust.Worker(app, redirect_stdouts=False, **options)
        worker.spinner = None  # its terminal codes would garble the announcement
        worker.execute_from_commandline()
    return 0
