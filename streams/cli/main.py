"""`reflect` — the command line.

Every setting of streams/settings.py is a flag of every command (and a
REFLECT_* variable); flags win over the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path

from schemas import ContractError
from streams.settings import SPECS, TABLE_DOC, UP_API, UP_PORT, Settings, SettingsError

READS = ("explain", "rebuild", "recall", "beliefs", "stats", "replay", "diff", "promote")  # against a running API


SETTINGS_EPILOG = ("Every setting is also accepted as a flag (and a REFLECT_* variable); "
                   "`reflect settings --help` lists them, `reflect settings` prints their values.")


def _settings_flags(listed: bool) -> argparse.ArgumentParser:
    """Every setting as a flag; listed in the help of `reflect settings` only,
    so each other command's help shows its own options."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("settings (each also a REFLECT_* environment variable)") if listed else common
    for spec in SPECS:
        shape = {"action": "store_const", "const": "true"} if spec.switch else {"metavar": spec.name.upper()}
        group.add_argument(spec.flag, dest=spec.name, default=None, **shape,
                           help=f"{spec.doc} [{spec.env}, default {spec.default!r}]" if listed else argparse.SUPPRESS)
    return common


def build_parser() -> argparse.ArgumentParser:
    settings_options = {"parents": [_settings_flags(listed=False)], "epilog": SETTINGS_EPILOG}
    parser = argparse.ArgumentParser(
        prog="reflect",
        description="Reflect: episodes in Kafka become beliefs that cite their evidence.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    broker = commands.add_parser("broker", help="run an embedded Kafka-protocol broker (Tansu) in the foreground")
    broker.add_argument("--port", type=int, default=9092, help="loopback port (default 9092; 0 picks a free one)")
    broker.add_argument("--kind", choices=("tansu", "noida"), default="tansu",
                        help="tansu (memory-only, default) or noida (noida-db, persistent; test extra)")

    topics = commands.add_parser("topics", help="manage Reflect's topics")
    topics_cmd = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    topics_cmd.add_parser("create", **settings_options,
                          help="create every topic with the configured partitions (idempotent)")

    send = commands.add_parser("send", **settings_options, help="publish an EpisodeRecorded")
    send.add_argument("--user", required=True, help="user_id (the partition key)")
    send.add_argument("--text", required=True)
    send.add_argument("--importance", required=True, type=float, help="0..1")
    send.add_argument("--episode-id", default=None, help="default: a new random id")
    send.add_argument("--occurred-at", default=None, help="RFC 3339; default: now")
    send.add_argument("--source", default=None)
    send.add_argument("--metadata", type=_json_object, default=None, help='free-form JSON object, e.g. \'{"pr": 7}\'')

    retract = commands.add_parser("retract", **settings_options, help="publish an EpisodeRetracted")
    retract.add_argument("--user", required=True)
    retract.add_argument("--episode-id", required=True)
    retract.add_argument("--reason", default="incorrect",
                         help="incorrect, erasure, duplicate, superseded or other")

    forget = commands.add_parser("forget", **settings_options, help=(
        "publish a UserForgotten: every key of the user destroyed, so all they said reads as erased everywhere"))
    forget.add_argument("--user", required=True)

    commands.add_parser("worker", **settings_options,
                        help="run the stream worker (every processor and the HTTP API) in the foreground")
    up = commands.add_parser("up", **settings_options, help=(
        "run the whole stack in one process: embedded broker (unless --broker), topics, "
        "every processor, the view and the HTTP API"))
    up.add_argument("--port", type=int, default=None, help=f"HTTP API port (default {UP_PORT}; --web-port too)")
    demo = commands.add_parser("demo", **settings_options, help=(
        "stream a bundled three-month history through the whole stack and score the beliefs it forms"))
    demo.add_argument("--json", action="store_true", help="print the result as one JSON document")
    demo.add_argument("--seed", type=int, default=7, help="seed of the sample history (default 7)")
    demo.add_argument("--episodes", type=int, default=2100, help="episodes in the history (default 2100)")
    demo.add_argument("--timeout", type=float, default=None, help=(
        "seconds the whole demo may take before it fails (default 170)"))
    explain = commands.add_parser("explain", help="show a belief's provenance down to the episodes, with statuses")
    explain.add_argument("--user", required=True)
    shown = explain.add_mutually_exclusive_group(required=True)
    shown.add_argument("--reflection-id", help="a belief, with its provenance")
    shown.add_argument("--erasure", metavar="ID", help=(
        "an erasure (its retraction's or forget's event id): what it took the text of, the keys destroyed"))
    explain.add_argument("--json", action="store_true", help="print the API's answer as JSON")
    rebuild = commands.add_parser("rebuild", help=(
        "replay episodes and reflections into a fresh view in the running worker, then swap it in"))
    rebuild.add_argument("--timeout", type=float, default=3600.0, help="seconds to follow it (default 3600)")
    recall = commands.add_parser("recall", help="answer a question from episodes or beliefs (typed recall)")
    recall.add_argument("--user", required=True)
    recall.add_argument("query")
    recall.add_argument("--mode", choices=("auto", "instance", "pattern"), default="auto")
    recall.add_argument("--k", type=int, default=10)
    beliefs = commands.add_parser("beliefs", help="the user's pinned beliefs, as JSON or as a system-prompt block")
    beliefs.add_argument("--user", required=True)
    beliefs.add_argument("--limit", type=int, default=50)
    beliefs.add_argument("--format", choices=("json", "prompt"), default="json")
    beliefs.add_argument("--budget", type=int, default=500, help="token budget of --format prompt (default 500)")
    beliefs.add_argument("--as-of", default=None, help="what was believed at this RFC 3339 time")
    for reader in (recall, beliefs):
        reader.add_argument("--refresh", choices=("concurrent", "blocking"), default=None,
                            help="wait for a due cycle (blocking) or not (concurrent, the server's default)")
        reader.add_argument("--json", action="store_true", help="print the API's answer as JSON")
    stats = commands.add_parser("stats", help="a user's figures: episodes, beliefs, cycles, tokens today")
    stats.add_argument("--user", required=True)
    replay = commands.add_parser("replay", help=(
        "re-derive beliefs from the log into side view NAME, in the running worker, under another reasoner or "
        "history; never touches the live topics, view or budgets"))
    replay.add_argument("name", nargs="?", help="the side view's name (a-z 0-9 _ -)")
    replay.add_argument("--user", action="append", default=[], help="only this user (repeatable)")
    replay.add_argument("--reasoner", choices=("offline", "anthropic"), default="offline")
    replay.add_argument("--prompt-version", default=None, metavar="V", help=(
        "the anthropic reasoner's prompt set: a version, or a folder of the worker's prompt library"))
    replay.add_argument("--without", action="append", default=[], metavar="EPISODE_ID",
                        help="as if this episode's words had never been read (repeatable)")
    replay.add_argument("--until", default=None, help="the log as it stood at this RFC 3339 time")
    replay.add_argument("--budget-tokens", type=int, default=0, help="tokens the replay may spend (0: no limit)")
    replay.add_argument("--yes", action="store_true", help="start without asking, whatever the estimate")
    replay.add_argument("--timeout", type=float, default=3600.0, help="seconds to follow it (default 3600)")
    replay.add_argument("--list", action="store_true", help="list the side views, with their size and age")
    replay.add_argument("--drop", metavar="NAME", default=None, help="remove a side view, its worker and topics")
    diff = commands.add_parser("diff", help="compare a replay's beliefs with the live view's or another replay's")
    diff.add_argument("name")
    diff.add_argument("--against", default="live", help="live (default) or another replay's name")
    diff.add_argument("--user", action="append", default=[], help="only this user (repeatable)")
    diff.add_argument("--json", action="store_true",
                      help='print {"added", "dropped", "changed", "same"} as JSON')
    promote = commands.add_parser("promote", help=(
        "make a done replay's beliefs the live ones, by publishing what the live reflections log needs"))
    promote.add_argument("name")
    for reader in (explain, rebuild, recall, beliefs, stats, replay, diff, promote):
        reader.add_argument("--api", default=None, help=(
            f"a running Reflect API (default: REFLECT_API, else reflect up's {UP_API})"))
    mcp_about = ("serve Reflect as MCP tools over a running API: on stdio with the launching user's "
                 "REFLECT_API_TOKEN, or on streamable HTTP where every request brings its own bearer token, "
                 "passed on to the API unchanged")
    mcp = commands.add_parser("mcp", help=mcp_about, description=mcp_about + ".")
    mcp.add_argument("--api", default=None, help=f"the Reflect API (default: REFLECT_API, else reflect up's {UP_API})")
    mcp.add_argument("--user", default=None, help=(
        "act for this user only (default: REFLECT_MCP_USER; unset: every call names its user_id)"))
    mcp.add_argument("--transport", choices=("stdio", "http"), default="stdio", help=(
        "stdio (launched by the MCP client, the default) or streamable HTTP at /mcp: a request without "
        "Authorization: Bearer is refused (401); REFLECT_AUTH_SECRET, REFLECT_AUTH_PUBLIC_KEY_FILE or "
        "REFLECT_API_TOKEN, if set, verify bearers here too, and are never sent for a caller"))
    mcp.add_argument("--host", default="127.0.0.1", help=(
        "interface of --transport http (default 127.0.0.1); any other refuses to start without the keys above"))
    mcp.add_argument("--port", type=int, default=8765, help="port of --transport http (default 8765)")
    mcp.add_argument("--insecure-no-auth", action="store_true", help=(
        "knowingly serve a non-loopback --host without verifying bearers here (REFLECT_INSECURE_NO_AUTH=true); "
        "the API still verifies each one"))
    bench = commands.add_parser("bench", help=(
        "run every benchmark, each figure beside a baseline measured in the same run (from a source checkout)"))
    bench.add_argument("--quick", action="store_true", help="smaller sizes, under 5 minutes")
    bench.add_argument("--json", action="store_true", help="print one JSON document (progress goes to stderr)")
    bench.add_argument("--only", default=None, help=(
        "comma-separated: ingest,cycle,read,invalidation,rebuild,sealing,retrieval,public; "
        "opt-in, run only when named: "
        "import (REALTALK over HTTP), chaos (kill -9, SIGTERM, joins and leaves against a reference), "
        "beliefs (reflect demo --json over many seeds, scored)"))
    bench.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots and bench.json there")
    bench.add_argument("--seeds", default=None, help=(
        "beliefs: N report seeds (100, 101, …), a comma list (7, for seed 7 alone), or dev (the development "
        "seeds 7, 8, 11, 12)"))
    bench.add_argument("--stub", action="store_true", help="beliefs: the stub baseline on the same seeds too")
    settings = commands.add_parser("settings", parents=[_settings_flags(listed=True)], help=(
        "print the resolved settings, and what reflect up and reflect demo use where they differ"))
    settings.add_argument("--port", type=int, default=None, help="the --port reflect up would be given")
    settings.add_argument("--markdown", nargs="?", const="-", default=None, metavar="FILE", help=(
        f"print the settings as the Markdown table of {TABLE_DOC} instead; with FILE, rewrite the table "
        "between its settings markers in place"))
    token = commands.add_parser("token", help="per-user API tokens (JWT) for the HTTP API")
    token_cmd = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    mint = token_cmd.add_parser("mint", **settings_options, help=(
        "print a signed token: HS256 with REFLECT_AUTH_SECRET, or RS256/ES256 with --private-key"))
    mint.add_argument("--users", required=True, help="comma-separated user ids or prefix* patterns ('*': every user)")
    mint.add_argument("--scope", required=True, help='space-separated: read, write, admin (e.g. "read write")')
    mint.add_argument("--ttl", default="1h", help="lifetime: 90s, 15m, 1h, 30d (default 1h)")
    mint.add_argument("--subject", default="", help="who the token is for (the sub claim, shown in logs)")
    mint.add_argument("--private-key", default=None, metavar="PEM",
                      help="RSA or EC P-256 private key file (the workers hold its public key)")
    revoke = token_cmd.add_parser("revoke", help=(
        "revoke a token before it expires, through a running API (admin): every worker refuses it once read"))
    revoke.add_argument("token", metavar="TOKEN_OR_JTI", help="the token itself, or its jti claim")
    revoke.add_argument("--expires-at", default=None, help=(
        "RFC 3339 time the token expires (default: its exp when a token is given, else now + REFLECT_AUTH_MAX_TTL)"))
    revoke.add_argument("--api", default=None, help=f"a running Reflect API (default: REFLECT_API, else {UP_API})")
    dlq = commands.add_parser("dlq", help="the dead letters: list them, replay them after a fix")
    dlq_cmd = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    dlq_list = dlq_cmd.add_parser("list", **settings_options, help="print the dead letters the filters select")
    dlq_replay = dlq_cmd.add_parser("replay", **settings_options, help=(
        "publish the selected dead letters again to the topic they came from (original key and bytes, "
        "plus a reflect.replayed-from header); safe to repeat: every effect is idempotent by event id, "
        "so a second replay leaves the view unchanged, and what fails again is dead-lettered again"))
    dlq_replay.add_argument("--dry-run", action="store_true", help="print what would be replayed, publish nothing")
    for action in (dlq_list, dlq_replay):
        action.add_argument("--topic", action="append", default=[], help="source topic (repeatable; default any)")
        action.add_argument("--stage", action="append", default=[],
                            help="stage that refused it: decode, project, invalidate, reflect… (repeatable)")
        action.add_argument("--since", type=_instant, help="dead-lettered at or after this RFC 3339 time")
        action.add_argument("--until", type=_instant, help="dead-lettered before this RFC 3339 time")
        action.add_argument("--timeout", type=float, default=30.0,
                            help="seconds to read the dead-letter topics to their end (default 30)")
    return parser


def _json_object(raw: str) -> dict:
    import json

    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _instant(raw: str):
    from streams.cli.dlq_replay import instant

    try:
        return instant(raw)
    except ValueError as exc:  # argparse names the flag with this message
        raise argparse.ArgumentTypeError(str(exc)) from None


def _load(args: argparse.Namespace) -> Settings:
    return Settings.load(**{spec.name: getattr(args, spec.name, None) for spec in SPECS})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (SettingsError, ContractError) as exc:
        print(f"reflect: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "broker":
        return _broker(args)
    if args.command == "up":
        from streams.cli.stack import up

        return up(args)
    if args.command == "demo":
        from streams.cli.demo import demo

        return demo(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "mcp":
        import os

        try:
            from streams.client.mcp_server import serve
            import mcp  # noqa: F401  (the extra; imported late by the server)
        except ImportError:
            print("reflect: error: reflect mcp needs the mcp extra: pip install 'reflect-stream[mcp]'", file=sys.stderr)
            return 2
        return serve(args.api, args.user or os.environ.get("REFLECT_MCP_USER") or None, args.transport,
                     args.host, args.port, args.insecure_no_auth)
    if args.command in READS:
        return _read(args)
    if args.command == "settings" and args.markdown:  # what the code defines, whatever this environment sets
        return _markdown(args.markdown)
    settings = _load(args)
    if args.command == "settings":
        return _print_settings(settings, args)
    from streams.topics import create_topics, with_broker_errors  # aiokafka: only for what needs the broker

    if args.command == "topics":
        return with_broker_errors(settings, create_topics(settings))
    if args.command == "send":
        return with_broker_errors(settings, _send(settings, args))
    if args.command == "retract":
        return with_broker_errors(settings, _retract(settings, args))
    if args.command == "forget":
        return with_broker_errors(settings, _forget(settings, args))
    if args.command == "worker":
        return _worker(settings)
    if args.command == "dlq":
        return _dlq(settings, args)
    if args.command == "token":
        return _mint(settings, args) if args.token_command == "mint" else _revoke(args)
    raise AssertionError(args.command)


def _read(args: argparse.Namespace) -> int:
    """A command against a running API (--api, else REFLECT_API, else `reflect up`'s port)."""
    from streams.cli.reads import COMMANDS
    from streams.client import ReflectClient, ReflectError

    try:
        with ReflectClient(args.api) as client:
            return COMMANDS[args.command](client, args)
    except (ReflectError, RuntimeError) as exc:
        print(f"reflect: error: {exc}", file=sys.stderr)
        return 1


def _print_settings(settings: Settings, args: argparse.Namespace) -> int:
    from streams.cli.stack import differences

    for spec in SPECS:
        print(f"{spec.env:28} {getattr(settings, spec.name)!r}")
    changed = differences(args)
    if changed:
        print("\nreflect up uses instead (reflect demo too, with a free port):")
        for env, shown in changed:
            print(f"{env:28} {shown}")
    return 0


def _markdown(target: str) -> int:
    """The settings table on stdout (target '-'), or written between the markers of the doc at target."""
    from streams.settings import markdown_table, with_markdown_table

    if target == "-":
        print(markdown_table(), end="")
        return 0
    try:
        before = Path(target).read_text("utf-8")
        after = with_markdown_table(before, markdown_table())
    except (OSError, ValueError) as exc:
        print(f"reflect: error: {target}: {exc}", file=sys.stderr)
        return 2
    if after != before:
        Path(target).write_text(after, "utf-8")
    print(f"{target}: settings table {'rewritten' if after != before else 'already up to date'}")
    return 0


async def _send(settings: Settings, args: argparse.Namespace) -> int:
    from streams.producer import publish_episode

    event = await publish_episode(settings, args.user, args.text, args.importance,
                                  episode_id=args.episode_id, occurred_at=args.occurred_at,
                                  source=args.source, metadata=args.metadata)
    print(event.episode_id)
    return 0


async def _retract(settings: Settings, args: argparse.Namespace) -> int:
    from streams.producer import retract_episode

    event = await retract_episode(settings, args.user, args.episode_id, args.reason)
    print(event.event_id)
    return 0


async def _forget(settings: Settings, args: argparse.Namespace) -> int:
    from streams.producer import forget_user

    event = await forget_user(settings, args.user)
    print(event.event_id)
    print(f"carried out once the worker reaches it: reflect explain --user {args.user} --erasure {event.event_id}",
          file=sys.stderr)
    return 0


def _dlq(settings: Settings, args: argparse.Namespace) -> int:
    from streams.cli.dlq_replay import Selection, SelectionError, replay
    from streams.topics import UnreadLog
    from streams.topics import with_broker_errors

    selection = Selection(frozenset(args.topic), frozenset(args.stage), args.since, args.until)
    publish = args.dlq_command == "replay" and not args.dry_run
    verb = "replayed" if publish else "would replay" if args.dlq_command == "replay" else "listed"

    async def run() -> int:
        await replay(settings, selection, publish=publish, verb=verb, timeout=args.timeout)
        return 0

    try:
        return with_broker_errors(settings, run())
    except (SelectionError, UnreadLog) as exc:
        print(f"reflect: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, SelectionError) else 1


def _mint(settings: Settings, args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from streams import auth

    try:
        claims = auth.claims_for(args.users.split(","), args.scope, auth.seconds_of(args.ttl), time.time(),
                                 args.subject, settings.auth_max_ttl, settings.auth_audience, settings.auth_issuer)
        pem = Path(args.private_key).read_bytes() if args.private_key else None
        print(auth.mint(claims, settings.auth_secret, pem))
    except (OSError, ValueError, TypeError) as exc:
        print(f"reflect: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from streams.auth import revocation_of
    from streams.client import ReflectClient, ReflectError

    try:
        body = revocation_of(args.token, args.expires_at)
    except ValueError as exc:
        print(f"reflect: error: {exc}", file=sys.stderr)
        return 2
    try:
        with ReflectClient(args.api) as client:
            answer = client.request("POST", "/v1/admin/revocations", body=body)
    except ReflectError as exc:
        print(f"reflect: error: {exc}", file=sys.stderr)
        return 1
    if answer.status != 202:
        print(f"reflect: error: {answer.status} {answer.body}", file=sys.stderr)
        return 1
    print(f"revoked {answer.body['jti']} until {answer.body['expires_at']}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    # The benchmarks live with the tests (they use the test fixtures' worker
    # harness), so they run from a source checkout, not from an installed wheel.
    from pathlib import Path

    suite = Path(__file__).resolve().parents[2] / "tests" / "benchmarks" / "suite.py"
    if not suite.exists():
        print(f"reflect: error: reflect bench runs from a source checkout ({suite} not found)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(suite.parent))
    import suite as bench_suite

    forwarded = [flag for flag, on in (("--quick", args.quick), ("--json", args.json), ("--stub", args.stub)) if on]
    for flag, value in (("--only", args.only), ("--plots", args.plots), ("--seeds", args.seeds)):
        forwarded += [flag, value] if value else []
    return bench_suite.main(forwarded)


def _broker(args: argparse.Namespace) -> int:
    from streams.broker import EmbeddedBroker

    broker = EmbeddedBroker(kind=args.kind, port=args.port or None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the finally below
    with broker:
        print(f"{broker.kind} broker ready: {broker.bootstrap}  (REFLECT_BROKER={broker.url})", flush=True)
        print("Tansu keeps topics in memory only: they are gone when it stops." if broker.kind == "tansu"
              else f"data in {broker.data_dir}", flush=True)
        try:
            broker.process.wait()
        finally:
            broker.stop()
    return 0


AUTOGROUP = Path("/proc/self/autogroup")


def background() -> None:
    """This process, and the threads it starts from now on, run only on
    cores nothing else wants (SCHED_IDLE; where there is none, nice 19).

    A policy orders threads within their scheduling group only. With Linux's
    autogroups on (`kernel.sched_autogroup_enabled`), a process in a session
    of its own, as a side worker is, is a group of its own, weighted as the
    live worker's whatever its threads' policy; so the group is made nice 19
    too. Live recall p95 during a replay over alone: median 1.51x before,
    1.14x after (docs/decisions/0020-side-worker-autogroup-nice-19.md)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
    with contextlib.suppress(OSError):  # no autogroups (or not Linux): the policy is all there is
        AUTOGROUP.write_text("19")


async def _check_ring(settings: Settings) -> int:
    """The master key ring opens the keys already on the key topic (streams/shredding.py)."""
    from streams.adapters.sealing import SealingError
    from streams.shredding import Sealing

    sealing = Sealing(settings)
    try:
        await sealing.check()
    except SealingError as exc:
        raise SettingsError(f"invalid setting master_keys ({exc})") from None
    finally:
        await sealing.close()
    return 0


def _worker(settings: Settings) -> int:
    import logging

    import faust

    from streams.topics import create_topics, with_broker_errors
    from streams.worker.app import create_app
    from streams.worker.logs import configure, worker_options

    from streams.auth import exposure_problem

    if exposure_problem(settings):  # before anything touches the broker
        raise SettingsError(exposure_problem(settings))
    from streams.cli.stack import refuse_taken_port

    refuse_taken_port(settings, "--web-port (REFLECT_WEB_PORT)")
    if settings.replay:  # a replay's side worker: streams/worker/replay.py
        from streams.adapters.optimize import die_with_parent

        die_with_parent()  # it ends with the worker that runs it, even one killed outright
        background()  # and leaves the cores to that worker's live reads and ingest first
    configure(settings)  # until the worker applies the same configuration itself
    # JSON logs: the topic lines are log lines too, not bare text between them.
    say = print if settings.log_format == "text" else logging.getLogger("reflect").info
    if with_broker_errors(settings, create_topics(settings, say)) != 0:
        return 1
    if with_broker_errors(settings, _check_ring(settings)) != 0:
        return 1
    runtime = create_app(settings)
    worker = faust.Worker(runtime.app, **worker_options(settings))
    worker.execute_from_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
