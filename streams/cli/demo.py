"""`reflect demo`: the whole loop on a bundled three-month history, scored.

It runs `reflect up` as a child process on an embedded broker, streams the
sample history (streams/cli/sample.py) into the episodes topic, follows the
reflections topic as any downstream subscriber would, and when every cycle
the stream asked for has completed and been projected, reads the beliefs
through the HTTP API and scores them against the planted patterns.
"""

from __future__ import annotations

import argparse
import collections
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


from processors.accumulator import Accumulator, Trigger, admit
from schemas import ContractError, ReflectionChallenged, ReflectionCreated, ReflectionCycleCompleted, decode
from streams.cli.sample import History, history
from streams.cli.score import ABOUT, MIN_CITED, MIN_PRECISION, score
from streams.client import ReflectClient, ReflectError
from streams.security import client_options
from streams.settings import Settings

TIMEOUT = 170.0  # seconds; the issue's bound for the whole demo is 3 minutes


def expected_cycles(hist: History, settings: Settings) -> int:
    """How many cycles the accumulator will ask for: the same pure fold, run here."""
    from streams.producer import make_episode

    acc, trigger, cycles = Accumulator(), Trigger.from_settings(settings), 0
    for e in hist.episodes:
        acc, request = admit(acc, make_episode(hist.user_id, e.text, e.importance, episode_id=e.episode_id,
                                               occurred_at=e.occurred_at), trigger)
        cycles += request is not None
    return cycles


class Progress:
    def __init__(self, stream=sys.stderr) -> None:
        self.stream, self.last, self.finished = stream, "", set()

    def show(self, label: str, done: int, total: int) -> None:
        if label in self.finished:
            return
        width = 30
        filled = width * done // max(total, 1)
        line = f"\r{label:<11} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        if line != self.last:
            if done >= total:
                self.finished.add(label)
                line += "\n"
            self.stream.write(line)
            self.stream.flush()
            self.last = line


@dataclasses.dataclass
class Followed:
    """What the reflections topic said, as a downstream subscriber sees it."""
    cycles: set[str] = dataclasses.field(default_factory=set)
    created: set[str] = dataclasses.field(default_factory=set)
    kept: int = 0
    reinforced: int = 0
    dropped: int = 0
    questions: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    outcomes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    usage: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    challenged: set[str] = dataclasses.field(default_factory=set)  # challenge cycles (not known ahead)
    verdicts: collections.Counter = dataclasses.field(default_factory=collections.Counter)


async def _follow(settings: Settings, seen: Followed) -> None:
    """Collect cycle and belief events from the reflections topic."""
    from aiokafka import AIOKafkaConsumer

    from streams.shredding import Sealing

    consumer = AIOKafkaConsumer(settings.topic_reflections, **client_options(settings),
                                auto_offset_reset="earliest", enable_auto_commit=False)
    sealing = Sealing(settings)  # a cycle's questions are sealed on the log (streams/shredding.py)
    await consumer.start()
    try:
        async for message in consumer:
            with contextlib.suppress(ContractError):
                event = decode(message.value)
                event = (await sealing.opener([event]))(event) or event
                if isinstance(event, ReflectionCycleCompleted) and event.cycle_id not in seen.cycles:
                    seen.cycles.add(event.cycle_id)
                    seen.kept += event.kept
                    seen.reinforced += event.reinforced or 0
                    seen.dropped += event.dropped
                    seen.questions.update(event.questions)
                    seen.outcomes[event.outcome] += 1
                    seen.usage["cycle_ms"] += event.duration_ms
                    seen.usage.update({k: v for k, v in event.usage.items() if isinstance(v, (int, float))})
                elif isinstance(event, ReflectionCreated):
                    seen.created.add(event.reflection_id)
                elif isinstance(event, ReflectionChallenged) and event.cycle_id not in seen.challenged:
                    seen.challenged.add(event.cycle_id)
                    seen.verdicts[event.verdict or event.outcome] += 1
    finally:
        await consumer.stop()
        await sealing.close()


async def _stream(settings: Settings, hist: History, api: ReflectClient, expected: int, deadline: float,
                  timeout: float = TIMEOUT) -> Followed:
    from streams.producer import Publisher, make_episode

    seen = Followed()
    follower = asyncio.create_task(_follow(settings, seen))
    progress = Progress()
    try:
        async with Publisher(settings) as publisher:
            for e in hist.episodes:
                await publisher.publish(make_episode(hist.user_id, e.text, e.importance, episode_id=e.episode_id,
                                                     occurred_at=e.occurred_at, source=e.source))
            await publisher.flush()
        total = len(hist.episodes)
        while True:
            stats = await asyncio.to_thread(api.stats, hist.user_id)
            progress.show("projecting", min(stats.episodes, total), total)
            if stats.episodes >= total:
                progress.show("reflecting", len(seen.cycles), expected)
                # Challenge cycles are not known ahead: done when every request asked is done, and the
                # closing event of every cycle asked (a cycle's or a challenge's) has reached this subscriber.
                asked = sum(stats.cycles_by_kind.values())
                if len(seen.cycles) >= expected and stats.reflections >= len(seen.created) and \
                        stats.raw["requests_done"] >= stats.raw["requests"] and \
                        len(seen.cycles) + len(seen.challenged) >= asked:
                    return seen
            if time.monotonic() > deadline:
                raise TimeoutError(f"demo not finished in {timeout:.0f} s: {stats}, "
                                   f"{len(seen.cycles)}/{expected} cycles completed")
            await asyncio.sleep(0.2)
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower


# The demo replays three months of one user in minutes, all of it charged to
# today: a day's per-user token budget (REFLECT_USER_DAILY_TOKENS, 200,000)
# would refuse its last cycles on the Anthropic path (~200,000 tokens for the
# 2,100 episodes against the stand-in server). Unless set, the demo allows this.
DEMO_USER_TOKENS = 1_000_000


def demo_budget(settings: Settings, args: argparse.Namespace, env) -> Settings:
    if getattr(args, "user_daily_tokens", None) is None and not env.get("REFLECT_USER_DAILY_TOKENS"):
        return dataclasses.replace(settings, user_daily_tokens=DEMO_USER_TOKENS)
    return settings


def run_demo(args: argparse.Namespace, hist: History) -> dict[str, Any]:
    from streams.broker import EmbeddedBroker, free_port
    from streams.cli.stack import stack_settings

    started, timeout = time.monotonic(), getattr(args, "timeout", None) or TIMEOUT
    args.port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REFLECT_BROKER"}
    settings = demo_budget(stack_settings(args, env=env)[0], args, env)
    expected = expected_cycles(hist, settings)
    with tempfile.TemporaryDirectory(prefix="reflect-demo-") as tmp, EmbeddedBroker(kind="tansu") as broker:
        settings = dataclasses.replace(settings, broker=broker.url, data_dir=tmp, app_id="reflect-demo")
        log = Path(tmp) / "up.log"
        child = subprocess.Popen([sys.executable, "-m", "streams.cli", "up", "--port", str(args.port)],
                                 env=settings.child_env(), stdout=subprocess.PIPE,
                                 stderr=open(log, "w"), stdin=subprocess.DEVNULL, text=True)
        try:
            first = child.stdout.readline()  # blocks until `up` announces itself, or exits
            if not first.startswith("Reflect is up."):
                raise RuntimeError(f"`reflect up` did not start:\n{log.read_text()[-3000:]}")
            print(f"Streaming {len(hist.episodes)} episodes of user {hist.user_id} "
                  f"({hist.episodes[0].occurred_at[:10]} to {hist.episodes[-1].occurred_at[:10]}, "
                  f"seed {args.seed}); reasoner {settings.reasoner}, embedder {settings.embedder}",
                  file=sys.stderr, flush=True)
            with ReflectClient(f"http://127.0.0.1:{args.port}") as api:
                seen = asyncio.run(_stream(settings, hist, api, expected, started + timeout, timeout))
                beliefs = api.beliefs(hist.user_id, limit=1000).raw["beliefs"]
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(10)
    from streams.adapters.factory import make_embedder

    scored = score(hist, beliefs, make_embedder(settings.embedder))
    return {"user_id": hist.user_id, "episodes": len(hist.episodes), "cycles": expected,
            "questions": dict(seen.questions.most_common(20)),
            "insights": {"created": seen.kept, "reinforced": seen.reinforced, "dropped": seen.dropped},
            "outcomes": dict(seen.outcomes), "usage": dict(seen.usage),
            "challenges": {"cycles": len(seen.challenged), "verdicts": dict(seen.verdicts)},
            "reasoner": settings.reasoner, "embedder": settings.embedder, "beliefs": beliefs,
            "patterns": scored.pop("patterns"), "score": scored,
            "seconds": round(time.monotonic() - started, 1)}


def render(result: dict[str, Any], hist: History, shown: int = 10, per_belief: int = 4) -> str:
    texts = {e.episode_id: (e.occurred_at[:10], e.text) for e in hist.episodes}
    beliefs = result["beliefs"]
    texts.update({b["reflection_id"]: ("belief", b["text"]) for b in beliefs})
    depths = sorted({b["depth"] for b in beliefs})
    lines = [f"\n{len(beliefs)} live beliefs (" + ", ".join(
        f"depth {d}: {sum(b['depth'] == d for b in beliefs)}" for d in depths) +
        f") from {result['cycles']} cycles; insights created {result['insights']['created']}, "
        f"reinforcing a belief {result['insights']['reinforced']}, dropped {result['insights']['dropped']}.\n"]
    matched = {p["belief"]: p for p in result["patterns"] if p["belief"]}
    for n, b in enumerate(beliefs[:shown], start=1):
        p = matched.get(b["reflection_id"])
        about = f"; matches {p['pattern']}" + ("" if p["found"] else " (not found: see below)") if p else ""
        lines.append(f"{n:2}. {b['text']}\n    confidence {b['confidence']}, depth {b['depth']}, "
                     f"cites {len(b['evidence_ids'])}{about}:")
        for eid in b["evidence_ids"][:per_belief]:
            when, text = texts.get(eid, ("?", "(not in the sample)"))
            lines.append(f"      - {when}  {text[:110]}")
        if len(b["evidence_ids"]) > per_belief:
            lines.append(f"      … and {len(b['evidence_ids']) - per_belief} more")
    if len(beliefs) > shown:
        lines.append(f"    … and {len(beliefs) - shown} more beliefs (--json prints all)")
    lines.append(f"\nPlanted patterns (found = a live belief cites ≥ {MIN_CITED} of its episodes, precision "
                 f"≥ {MIN_PRECISION}, and says it: cosine to the description ≥ {ABOUT} with MiniLM):")
    for s in result["patterns"]:
        mark = "found  " if s["found"] else "MISSED "
        lines.append(f"  {mark}{s['pattern']:<20} best belief cites {s['cited']:>2} of its {s['episodes']} "
                     f"episodes, precision {s['precision']:.2f}, about it {s['about']:.2f}")
    if result["usage"].get("calls"):
        used = result["usage"]
        lines.append(f"\nReasoner: {used['calls']} calls, {used.get('input_tokens', 0)} input / "
                     f"{used.get('output_tokens', 0)} output / {used.get('cached_tokens', 0)} cached tokens, "
                     f"about ${used.get('cost_usd', 0):.4f}; cycles by outcome {result['outcomes']}.")
    score_ = result["score"]
    lines.append(f"\nScore: {score_['found']}/{score_['of']} patterns found; {score_['beliefs']} live beliefs, "
                 f"{score_['noise']} noise (resting mostly on background), {score_['duplicates']} duplicates; "
                 f"in {result['seconds']} s.")
    return "\n".join(lines)


def demo(args: argparse.Namespace) -> int:
    hist = history(seed=args.seed, episodes=args.episodes)
    try:
        result = run_demo(args, hist)
    except (RuntimeError, TimeoutError, OSError, ReflectError) as exc:
        print(f"reflect: error: demo failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else render(result, hist))
    return 0
