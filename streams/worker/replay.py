"""Replay lab (I/O): each replay is a side worker, run by the worker that was
asked for it, re-deriving beliefs from the live `episodes` log into a side
view. The pure parts (what is kept, estimates, the diff) are in
processors/replay.py.

The side worker is `reflect worker` itself, with settings of its own: its
consumer group, requests, reflections and dead-letter topics, and changelogs
(all named with `.replay.NAME`), its data directory (`data_dir/replays/NAME`,
which holds the side view), its reasoner, a token budget, and `REFLECT_REPLAY`
set, so it takes no writes. It reads the live `episodes` log up to where it
ended when the replay was asked (`ends`), so it replays a fixed history
whatever is logged meanwhile, with the very pipeline the live worker runs:
the same log and reasoner give the same beliefs. It is stopped once it has
handled all of it: every pipeline's commits at the end of its topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from processors.accumulator import Trigger
from processors.dlq import accept, carried
from processors.replay import LIVE, Diff, Estimate, ReplayError, ReplaySpec, diff, estimate, promotion
from schemas import ContractError, ReflectionInvalidated, now
from streams.adapters import prompt_sets
from streams.topics import read_to_end
from streams.producer import Publisher
from streams.security import client_options
from streams.settings import Settings
from streams.shredding import read_records

log = logging.getLogger("reflect")
FOLDER = "replays"  # under data_dir
STATE_FILE = "replay.json"  # in a replay's folder: its spec, where the log ended, its state
STOP_WAIT = 30.0  # seconds a side worker gets to stop before it is killed
PROMOTE_WAIT = 120.0  # seconds a promotion waits for the live worker to project what it published
OUTPUT_SHARE = 0.1  # of a cycle's tokens that are the model's output, for the cost estimate


def replay_dir(settings: Settings, name: str) -> Path:
    return Path(settings.data_dir) / FOLDER / name


def side_settings(settings: Settings, spec: ReplaySpec, port: int, prompts: str | None = None) -> Settings:
    """The side worker's settings: the live worker's, with names, data, reasoner and budget of its own."""
    suffix = f".replay.{spec.name}"
    return dataclasses.replace(
        settings, replay=spec.name, app_id=settings.app_id + suffix,
        topic_requests=settings.topic_requests + suffix, topic_reflections=settings.topic_reflections + suffix,
        data_dir=str(replay_dir(settings, spec.name)), view=f"{settings.view}-replay-{spec.name}",
        reasoner=spec.reasoner, prompts=prompts or settings.prompts,
        master_keys=str(settings.master_keys_path),  # the live data's ring: it opens the live log
        web_host="127.0.0.1", web_port=port, advertised_url=None,
        # A replay runs months of cycles in minutes: the live per-day limits would stop it at random
        # users; its own budget is all it may spend.
        daily_tokens=spec.budget_tokens, user_daily_tokens=0, tenant_daily_tokens=0)


@dataclass(frozen=True)
class SideRun:
    """What a side worker replays: its spec and where the live log ended when it was asked."""
    spec: ReplaySpec
    ends: dict[int, int]

    @classmethod
    def of(cls, settings: Settings) -> "SideRun | None":
        if not settings.replay:
            return None
        state = read_state(Path(settings.data_dir))
        return cls(ReplaySpec.from_dict(state["spec"]), {int(p): e for p, e in state["ends"].items()})

    def keeps(self, record, message) -> bool:
        """Whether a record of `episodes` is part of the replayed history."""
        return message.offset < self.ends.get(message.partition, 0) and \
            self.spec.keeps(record.user_id, message.timestamp)


def read_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / STATE_FILE).read_text())


def bytes_under(folder: Path) -> int:
    """The size of a folder that a running side worker writes to: a file or
    folder it removes meanwhile (a WAL segment, the state's temporary file)
    counts as gone, not as an error (os.walk skips what it cannot list)."""
    size = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                size += os.stat(os.path.join(root, name)).st_size
    return size


def write_state(folder: Path, state: dict[str, Any]) -> None:
    tmp = folder / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, folder / STATE_FILE)  # a reader sees the old state or the new one


async def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        return {tp.partition: end for tp, end in (await consumer.end_offsets(partitions)).items()}
    finally:
        await consumer.stop()


async def read_log(settings: Settings, ends: dict[int, int], sealing=None) -> list[tuple[Any, float | None]]:
    """(record, logged at) of every event of `episodes` before `ends`, per
    partition in order, opened (streams/shredding.py); undecodable ones
    skipped (they are dead letters)."""
    topic, carries = settings.topic_episodes, carried(settings)
    wanted = {TopicPartition(topic, p): end for p, end in ends.items() if end > 0}
    out: list[tuple[Any, float | None]] = []
    if not wanted:  # (and aiokafka's consumer, stopped before it was assigned anything, raises CancelledError)
        return out
    consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign(list(wanted))
        await consumer.seek_to_beginning(*wanted)
        while wanted:
            for tp, messages in (await consumer.getmany(timeout_ms=1000)).items():
                kept, _ = await read_records([m for m in messages if m.offset < wanted.get(tp, 0)], carries, sealing)
                out += [(r, m.timestamp / 1000 if m.timestamp else None) for r, m in kept]
                if (await consumer.position(tp)) >= wanted.get(tp, 0):
                    wanted.pop(tp, None)
        return out
    finally:
        await consumer.stop()


def cost_of(settings: Settings, tokens: int) -> float | None:
    """USD a replay's estimated tokens would cost at the model's price, if known."""
    from streams.adapters.anthropic import price_of

    price = price_of(settings.anthropic_model, settings.anthropic_price)
    if not price:
        return None
    return tokens * ((1 - OUTPUT_SHARE) * price[0] + OUTPUT_SHARE * price[1]) / 1e6


@dataclass
class Replay:
    """One replay as its worker knows it: the state file, and its side worker while it runs."""
    folder: Path
    process: subprocess.Popen
    watch: asyncio.Task | None = None

    @property
    def state(self) -> dict[str, Any]:
        return read_state(self.folder)

    def update(self, **changes: Any) -> None:
        write_state(self.folder, self.state | changes)


class Replays:
    """The replays of this worker's data directory: start, follow, stop, drop, diff."""

    def __init__(self, settings: Settings, view, dim: int, sealing=None) -> None:
        self.settings, self.view, self.dim, self.sealing = settings, view, dim, sealing
        self.running: dict[str, Replay] = {}
        self.starting = asyncio.Lock()

    def folder(self, name: str) -> Path:
        return replay_dir(self.settings, name)

    def listed(self) -> list[dict[str, Any]]:
        root = Path(self.settings.data_dir) / FOLDER
        out = []
        for folder in sorted(root.iterdir()) if root.exists() else ():
            if (folder / STATE_FILE).exists():
                out.append(self.summary(folder.name))
        return out

    def summary(self, name: str) -> dict[str, Any]:
        folder = self.folder(name)
        if not (folder / STATE_FILE).exists():
            raise ReplayError(f"no replay named {name}")
        state = read_state(folder)
        if state["state"] == "running" and name not in self.running:  # its worker stopped meanwhile
            state["state"] = "interrupted"
        return {**state, "bytes": bytes_under(folder), "age_s": round(time.time() - state["created"], 1)}

    def cost(self, spec: ReplaySpec, tokens: int) -> float | None:
        return cost_of(self.settings, tokens) if spec.reasoner == "anthropic" else 0.0

    def prompts(self, spec: ReplaySpec) -> dict[str, str] | None:
        """The prompt set a replay asked for, as version and folder."""
        if spec.prompt_version is None:
            return None
        try:
            version, folder = prompt_sets.chosen(self.settings, spec.prompt_version)
        except prompt_sets.PromptSetError as exc:
            raise ReplayError(str(exc)) from None
        return {"version": version, "folder": str(folder.resolve())}

    async def plan(self, spec: ReplaySpec) -> tuple[dict[int, int], Estimate]:
        """Where the log ends now, and what replaying it up to there would take."""
        ends = await end_offsets(self.settings, self.settings.topic_episodes)
        records = await read_log(self.settings, ends, self.sealing)
        return ends, estimate(spec, records, Trigger.from_settings(self.settings))

    async def start(self, spec: ReplaySpec) -> dict[str, Any]:
        async with self.starting:  # two asked at once: the second sees the first running
            return await self._start(spec)

    async def _start(self, spec: ReplaySpec) -> dict[str, Any]:
        from streams.broker import free_port
        from streams.topics import ensure_topics

        folder = self.folder(spec.name)
        if self.running:  # a side worker takes a worker's share of the cores: one at a time
            raise ReplayError(f"replay {next(iter(self.running))} is running: one replay at a time")
        if spec.reasoner == "anthropic" and not os.environ.get("ANTHROPIC_API_KEY"):
            raise ReplayError("the anthropic reasoner needs ANTHROPIC_API_KEY in this worker's environment")
        if (folder / STATE_FILE).exists():
            raise ReplayError(f"a replay named {spec.name} exists: drop it first (reflect replay --drop "
                              f"{spec.name})")
        prompts = self.prompts(spec)
        ends, planned = await self.plan(spec)
        cost = self.cost(spec, planned.tokens)
        side = side_settings(self.settings, spec, free_port(), prompts and prompts["folder"])
        folder.mkdir(parents=True)
        write_state(folder, {"spec": spec.to_dict(), "prompts": prompts,
                             "ends": {str(p): e for p, e in ends.items()}, "estimate": planned.to_dict(),
                             "estimated_cost_usd": cost, "created": time.time(),
                             "state": "running", "group": side.app_id,
                             "topics": [side.topic_requests, side.topic_reflections, side.dlq_episodes,
                                        side.dlq_reflections],
                             "view": side.view})
        await ensure_topics(side)
        with open(folder / "worker.log", "ab") as out:
            process = subprocess.Popen([sys.executable, "-m", "streams.cli", "worker"], env=side.child_env(),
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        replay = self.running[spec.name] = Replay(folder, process)
        replay.update(pid=process.pid)
        replay.watch = asyncio.ensure_future(self.follow(spec.name, side))
        log.info("replay %s started: %d episode(s) of %d user(s), %d cycle(s) expected, side worker pid %d",
                 spec.name, planned.episodes, len(planned.users), planned.cycles, replay.process.pid)
        return self.summary(spec.name)

    async def follow(self, name: str, side: Settings) -> None:
        """Progress into the state file until the side worker has handled the
        whole replayed log; then it is stopped, and the state says how it ended."""
        replay, started = self.running[name], time.monotonic()
        ends = {int(p): e for p, e in replay.state["ends"].items()}
        # One consumer for the whole replay: one made at each look cost the live worker's loop a
        # bootstrap and its connections every half second, which its reads waited behind.
        commits = AIOKafkaConsumer(**client_options(side), group_id=side.app_id, enable_auto_commit=False)
        last, moved, waited = None, time.monotonic(), kept_waiting(replay.process.pid)
        try:
            await commits.start()
            while True:
                if replay.process.poll() is not None:
                    raise RuntimeError(f"the side worker exited with {replay.process.returncode} "
                                       f"(its log: {replay.folder / 'worker.log'})")
                progress = await handled(commits, side, ends)
                # Off the loop: the live reads it serves meanwhile wait behind no file write.
                await asyncio.to_thread(replay.update, progress=progress,
                                        seconds=round(time.monotonic() - started, 1))
                if progress["done"]:
                    break
                if progress != last:
                    last, moved, waited = progress, time.monotonic(), kept_waiting(replay.process.pid)
                elif stalled(time.monotonic() - moved, kept_waiting(replay.process.pid) - waited,
                             self.settings.replay_stall):
                    raise RuntimeError(f"no progress for {self.settings.replay_stall:.0f} s "
                                       f"(REFLECT_REPLAY_STALL): the side worker is stuck (its log: "
                                       f"{replay.folder / 'worker.log'})")
                await asyncio.sleep(0.5)  # the interval of a progress display, not a synchronization
            await stopped(replay.process)
            replay.update(state="done")
            log.info("replay %s done in %.1f s", name, time.monotonic() - started)
        except asyncio.CancelledError:
            await stopped(replay.process)
            raise
        except Exception as exc:
            await stopped(replay.process)
            replay.update(state="failed", error=str(exc))
            log.warning("replay %s failed: %s", name, exc)
        finally:
            await commits.stop()
            self.running.pop(name, None)  # only now: until the state says how it ended, it is running

    async def close(self) -> None:
        """Every side worker stopped: the worker that runs them stops."""
        for replay in list(self.running.values()):
            replay.watch.cancel()
            await stopped(replay.process)

    async def drop(self, name: str) -> None:
        """The replay gone: its side worker, topics, changelogs and folder."""
        state = self.summary(name)
        replay = self.running.get(name)
        if replay is not None:
            replay.watch.cancel()
            await stopped(replay.process)
        await delete_topics(self.settings, state["topics"], prefix=f"{state['group']}-")
        if self.settings.qdrant_url:
            view = self.side_view(name)
            view.drop()
            view.close()
        shutil.rmtree(self.folder(name))

    async def promote(self, name: str, timeout: float = PROMOTE_WAIT) -> dict[str, Any]:
        """The side view's beliefs made the live ones, through the live log:
        what `promotion` says is published to the live reflections topic,
        then projected by the live worker (a rebuild from the log gives the
        same). A replay that left episodes out (`without`, `until`) is
        refused: its view rests on a history the live log does not have."""
        state = self.summary(name)
        spec = ReplaySpec.from_dict(state["spec"])
        if state["state"] != "done":
            raise ReplayError(f"replay {name} is {state['state']}: a replay is promoted once it is done")
        if spec.without or spec.until:
            raise ReplayError("a replay without episodes or until a time rests on another history than the live "
                              "log's: retract those episodes instead (reflect retract), and their walks make the "
                              "change on the log")
        users = state["estimate"]["users"]
        side = await asyncio.to_thread(self.beliefs, name, users)
        live = await asyncio.to_thread(beliefs_in, self.view, users)
        side_topic = state["topics"][1]
        carries = carried(dataclasses.replace(self.settings, topic_reflections=side_topic))
        logged = []
        for record in await read_to_end(self.settings, [side_topic]):  # bounded, to the fetch's high watermark
            with contextlib.suppress(ContractError):
                logged.append(accept(record, carries))
        events = promotion(name, live, side, logged, now())
        async with Publisher(self.settings) as publisher:
            for event in events:
                await publisher.publish(event, topic=self.settings.topic_reflections)
        wanted = {(b["user_id"], b["reflection_id"]): b["status"] for b in side}

        def projected() -> bool:
            held = {(b["user_id"], b["reflection_id"]): b["status"] for b in beliefs_in(self.view, users)}
            return all(held.get(k) == v for k, v in wanted.items()) and \
                not {k for k, v in held.items() if v in LIVE} - wanted.keys()
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(projected):
            if time.monotonic() > deadline:
                raise ReplayError(f"published {len(events)} event(s), but the live view did not show them within "
                                  f"{timeout:.0f} s: is the worker behind? (GET /healthz)")
            await asyncio.sleep(0.2)  # polling the view for the worker's own projection
        done = {"published": len(events), "invalidated": sum(isinstance(e, ReflectionInvalidated) for e in events),
                "promoted_at": time.time()}
        write_state(self.folder(name), read_state(self.folder(name)) | {"promoted": done})
        return done

    def side_view(self, name: str):
        from streams.adapters.factory import open_view

        side = dataclasses.replace(self.settings, data_dir=str(self.folder(name)), view=self.summary(name)["view"])
        return open_view(side, self.dim)

    def beliefs(self, name: str, users: list[str]) -> list[dict[str, Any]]:
        """Every belief of `users` in a side view (`live`: this worker's own)."""
        if name == "live":
            return beliefs_in(self.view, users)
        state = self.summary(name)
        if state["state"] != "done":
            raise ReplayError(f"replay {name} is {state['state']}: its view is compared once it is done")
        view = self.side_view(name)
        try:
            return beliefs_in(view, users)
        finally:
            view.close()

    def diff(self, name: str, against: str = "live", users: list[str] | None = None) -> Diff:
        """Replay `name`'s beliefs against `against`'s (live, or another replay)."""
        state = self.summary(name)
        wanted = users or state["estimate"]["users"]
        return diff(self.beliefs(against, wanted), self.beliefs(name, wanted))


def kept_waiting(pid: int) -> float:
    """Seconds the process's main thread (its event loop, where the
    pipelines run) has spent runnable but kept off the cores, as the kernel
    counts it (/proc/<pid>/schedstat: run time, run-queue wait, slices in
    ns); 0 where that is not known."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def stalled(seconds: float, kept_off: float, bound: float) -> bool:
    """No progress for `bound` seconds that the side worker could have run:
    the time it waited for a core (`kept_off`) does not count. Its scheduling
    group runs at nice 19 (streams/cli/main.py, `background`), so on a busy
    box it may wait long for the live worker's share; a hung one (stopped,
    or blocked) waits for no core."""
    return seconds - kept_off > bound


async def stopped(process: subprocess.Popen) -> None:
    """A side worker stopped: SIGTERM, then SIGKILL after STOP_WAIT (a Faust
    worker may ignore SIGTERM while it stops); waited for off the event loop,
    which goes on serving."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
        os.killpg(process.pid, signal.SIGCONT)  # a stopped one acts on it too
    try:
        await asyncio.wait_for(asyncio.to_thread(process.wait), STOP_WAIT)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await asyncio.to_thread(process.wait)


def beliefs_in(view, users: list[str]) -> list[dict[str, Any]]:
    return [p for user in users for _, p in view.scroll(user, kind="reflection")]


async def handled(consumer: AIOKafkaConsumer, side: Settings, ends: dict[int, int]) -> dict[str, Any]:
    """How far the side worker has gone: its commits on `episodes` against
    the replayed log's ends, then on its requests and reflections against
    theirs. Done when every one is at its end: a pipeline commits a record
    once its effects are on the log, so the requests asked, the beliefs
    published, and the view are all there. `consumer` reads the side
    group's commits and joins no group."""
    async def at(topic: str, partitions) -> dict[int, int]:
        return {p: await consumer.committed(TopicPartition(topic, p)) or 0 for p in partitions}

    done = await at(side.topic_episodes, ends)
    out: dict[str, Any] = {"episodes": sum(min(done[p], end) for p, end in ends.items()),
                           "episodes_total": sum(ends.values())}
    finished = out["episodes"] >= out["episodes_total"]
    for key, topic in (("requests", side.topic_requests), ("reflections", side.topic_reflections)):
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        topic_ends = {tp.partition: end for tp, end in (await consumer.end_offsets(partitions)).items()}
        done = await at(topic, topic_ends)
        out[key], out[f"{key}_total"] = sum(done.values()), sum(topic_ends.values())
        finished = finished and out[key] >= out[f"{key}_total"]
    out["done"] = finished
    return out


async def delete_topics(settings: Settings, topics: list[str], prefix: str) -> None:
    """`topics` and every topic named with `prefix` (a side group's changelogs)."""
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=10000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = sorted({t for t in topics if t in existing} | {t for t in existing if t.startswith(prefix)})
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()
