"""The pipelines' `handle()` without a broker: ordering, state written only
after its effects, and the error policy, in-process over the real Qdrant Edge
view, the hashing embedder and the offline reasoner (tests/support/memory_worker.py).
The broker and the worker process stay with the integration tests
(test_determinism.py, test_faults_view.py); this is what their history shows
in seconds.

Every run here is checked by a `Witness`: at each table write, the state
written counts only what the view and the log already hold.

    python -m pytest tests/pipeline/test_pipeline_memory.py -q
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from pathlib import Path

import pytest

from processors.embedders import HashingEmbedder
from processors.projector import point_id
from processors.reasoners import OfflineReasoner
from streams.adapters.view.edge import EdgeView
from streams.adapters.view.shared import SharedView
from schemas import (EpisodeRecorded, EpisodeRetracted, ErasureCompleted, GateRequested, InvalidationRequested,
                     ReflectionChallenged, ReflectionCreated, ReflectionCycleCompleted, UserForgotten, decode)
from streams.settings import Settings
from streams.worker.pipeline.policy import PROBE_USER, Backoff
from streams.worker.runtime import Runtime
from support.history import MIN_EPISODES, THRESHOLD, as_set, differences, erasing, history
from support.memory_worker import MemoryWorker, memory_runtime
from support.runs import beliefs_of, episodes_of, points_of, users_by_partition

USERS = users_by_partition(1, 4)  # one a partition of the default four
# Several cycles a user, beliefs over beliefs, a retraction ("incorrect") of
# each user's episode 6 mid-stream and an erasure of its episode 12 near the end.
EVENTS = erasing(history(USERS), USERS)
TINY = Backoff(first=0.001, cap=0.01)  # the policy's retries, in milliseconds


class FaultyView:
    """The view, each call of which `down(name, args, kwargs)` may fail the way
    an engine that is down fails: with its own error, not one the policy knows
    as transient (so the policy's probe decides)."""

    def __init__(self, view) -> None:
        self._view = view
        self.down = lambda name, args, kwargs: False

    def __getattr__(self, name: str):
        attribute = getattr(self._view, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            if self.down(name, args, kwargs):
                raise RuntimeError("injected: the view is down")
            return attribute(*args, **kwargs)
        return call


class Witness:
    """The pipeline's promise, checked at every table write: the state written
    counts only effects already in the view and the log; a cycle's outcome is
    stored before it reaches the log. What breaks it is
    kept for the test to assert on (raising here would reach the error policy)."""

    def __init__(self, view, runtime: Runtime) -> None:
        self.view, self.outlets, self.broken = view, runtime.outlets, []
        # Every table named, so that a new or renamed one is not let through unchecked.
        # Spend is not checked: tokens are charged once the reasoner answered,
        # spent whether or not the cycle's events reach the log.
        self.checks = {"accumulators": self.counted_in_view, "invalidator": self.gone_in_view,
                       "requests-done": self.answered_in_log, "reasoner-spend": lambda key, value: None,
                       "last-cycle": self.completed_in_log, "cycle-outcomes": self.not_yet_in_log,
                       "gates": self.undone_in_log}
        self.gates: dict[str, dict] = {}  # user → the gates' state last written
        runtime.app.on_write = self

    def __call__(self, table: str, key: str, value) -> None:
        if table in self.checks and not value:  # cleared (a forget): it counts nothing
            return
        problem = self.checks.get(table, lambda key, value: "the witness knew the table")(key, value)
        if problem:
            self.broken.append(f"{table}[{key}] written before {problem}")

    def counted_in_view(self, user: str, accumulator: dict):
        ids = {point_id("episode", user, r["id"]): r["id"] for r in accumulator["recent"] if r["kind"] == "episode"}
        held = self.view.get(list(ids))
        return [f"episode {i} was in the view" for pid, i in ids.items() if pid not in held]

    def gone_in_view(self, user: str, state: dict):
        def shown(gone: str) -> bool:  # a retracted episode, or an invalid belief
            pids = {point_id("episode", user, gone): "retracted", point_id("reflection", user, gone): "invalid"}
            return any(p.get("status") == pids[pid] for pid, p in self.view.get(list(pids)).items())
        return [f"{gone} was gone in the view" for gone in state["gone"] if not shown(gone)]

    def completed_in_log(self, user: str, note: dict):
        """A cycle's note for stats: its ReflectionCycleCompleted on the log first."""
        if not any(isinstance(e, ReflectionCycleCompleted) and e.cycle_id == note["cycle_id"]
                   for e in self.outlets.reflections.events()):
            return f"cycle {note['cycle_id']} was completed on the log"

    def not_yet_in_log(self, user: str, outcome: dict):
        """A cycle's outcome is stored before any of it is published (and once)."""
        if any(isinstance(e, ReflectionCycleCompleted) and e.cycle_id == outcome["cycle_id"]
               for e in self.outlets.reflections.events()):
            return f"cycle {outcome['cycle_id']} was completed on the log (stored after its publish, or twice)"

    def undone_in_log(self, user: str, gates: dict):
        """The gates' outbox holds only challenges not yet run: each is taken
        out once done; a gate request is done once judged to its end with
        nothing left to do, and marked so in the write that ends it."""
        last = self.gates.get(user)
        if last is not None and {**last, "done": 0} == {**gates, "done": 0}:  # one write per decision
            return [f"(again, only to mark run {gates['sequence']} done: one write would do)"]
        done = {e.cycle_id for e in self.outlets.reflections.events() if isinstance(e, ReflectionChallenged)}
        problems = [f"challenge {e['cycle_id']} was not yet completed on the log" for e in gates["outbox"]
                    if e["type"] == "ChallengeRequested" and e["cycle_id"] in done]
        if gates["done"] > self.gates.get(user, {}).get("done", 0):
            [run] = [e for e in self.outlets.requests.events()
                     if isinstance(e, GateRequested) and e.user_id == user and e.sequence == gates["done"]]
            if (gates["sequence"], gates["judged"], gates["outbox"]) != (gates["done"], len(run.episodes), []):
                problems.append(f"gate request {gates['done']} was judged to its end and what it asked done")
        self.gates[user] = gates
        return problems

    def answered_in_log(self, user: str, sequence: int):
        """The user's requests up to `sequence` are done: this one's cycle
        completed on the log (or its request dead-lettered), its beliefs in the view."""
        asked = [e for e in self.outlets.requests.events()  # gate runs are numbered apart (see undone_in_log)
                 if e.user_id == user and e.sequence == sequence and not isinstance(e, GateRequested)]
        if asked and isinstance(asked[0], InvalidationRequested):  # its decisions: see gone_in_view
            return self.gone_in_view(user, {"gone": [asked[0].episode_id]})
        if asked and isinstance(asked[0], UserForgotten):  # its proof on the log
            if not any(isinstance(e, ErasureCompleted) and e.erasure_id == asked[0].event_id
                       for e in self.outlets.reflections.events()):
                return f"forget {asked[0].event_id} was proved on the log"
            return None
        cycles = [e.cycle_id for e in asked]
        if not cycles:
            return f"request {sequence} was on the requests topic"
        made = [e for e in self.outlets.reflections.events() if getattr(e, "cycle_id", None) == cycles[0]]
        dead = [v for _, v, _ in self.outlets.dlq[self.outlets.requests.name].records
                if getattr(decode(v), "cycle_id", None) == cycles[0]]
        beliefs = [point_id("reflection", user, e.reflection_id) for e in made if isinstance(e, ReflectionCreated)]
        held = self.view.get(beliefs)
        # A challenge cycle's audit record is its ReflectionChallenged.
        if not dead and not any(isinstance(e, (ReflectionCycleCompleted, ReflectionChallenged)) for e in made):
            return f"cycle {cycles[0]} was completed on the log"
        return [f"belief {pid} of cycle {cycles[0]} was in the view" for pid in beliefs if pid not in held]


@dataclass
class Run:
    runtime: Runtime
    worker: MemoryWorker
    view: SharedView  # as the worker opens it, without the faults
    faulty: FaultyView  # what the pipelines and the policy call
    witness: Witness

    def dead_letters(self) -> list:
        outlets = self.runtime.outlets
        return [r for topic in {t.name: t for t in outlets.dlq.values()}.values() for r in topic.records]

    def outcome(self) -> dict:
        snapshot = points_of(self.view, USERS)
        return {"beliefs": {u: {r: as_set(p) for r, p in b.items()} for u, b in beliefs_of(snapshot).items()},
                "episodes": episodes_of(snapshot)}


def start(tmp: Path, batch: int = 256, embedder=None) -> Run:
    """A memory worker over a fresh Edge view in `tmp`; build it inside the
    event loop that runs it (the runtime's locks belong to one loop)."""
    settings = Settings.load(env={}, data_dir=str(tmp), threshold=THRESHOLD, min_episodes=MIN_EPISODES,
                             projector_batch=batch, challenge="on")  # the contradiction gate in every run
    view = SharedView(EdgeView(settings.view_dir, settings.view, HashingEmbedder().dim))
    faulty = FaultyView(view)
    runtime = memory_runtime(settings, faulty, embedder or HashingEmbedder(), OfflineReasoner(), TINY)
    return Run(runtime, MemoryWorker(runtime), view, faulty, Witness(view, runtime))


def history_run(tmp: Path, batch: int = 256) -> Run:
    async def whole():
        run = start(tmp, batch)
        await run.worker.run(EVENTS)
        return run
    return asyncio.run(whole())


@pytest.fixture(scope="module")
def calm(tmp_path_factory) -> dict:
    """The history at once, in batches of 256, without a fault: what the others must end with."""
    run = history_run(tmp_path_factory.mktemp("calm"))
    assert not run.witness.broken and not run.dead_letters()
    return run.outcome()


def test_the_same_history_in_batches_of_256_and_of_3_gives_the_same_beliefs(calm, tmp_path):
    small = history_run(tmp_path, batch=3)
    beliefs = calm["beliefs"]
    assert sum(map(len, beliefs.values())) >= 4 * 3, "too few beliefs for the comparison to mean much"
    assert any(p["depth"] == 2 for b in beliefs.values() for p in b.values()), "no belief over beliefs"
    assert any(p["status"] != "live" or p.get("lost_evidence_ids") for b in beliefs.values() for p in b.values()), \
        "the retraction changed no belief"
    assert not small.witness.broken
    assert not small.dead_letters()
    again = small.outcome()
    for user, held in beliefs.items():
        diff = differences(held, again["beliefs"][user])
        assert not diff, "\n".join([user, *(f"{rid}: {d}" for rid, d in diff.items())])
    assert again["episodes"] == calm["episodes"]


class Outage:
    """The view down for its next `calls` calls (the policy's probes among
    them); at each, what `/healthz` would say and how many table writes there
    had been."""

    def __init__(self, runtime: Runtime, calls: int) -> None:
        self.runtime, self.left = runtime, calls
        self.seen: list[tuple[set[str], int]] = []

    def writes(self) -> int:
        return sum(len(table.changelog) for table in self.runtime.app.tables.values())

    def __call__(self, name, args, kwargs) -> bool:
        if not self.left:
            return False
        self.left -= 1
        self.seen.append((set(self.runtime.health.stalled), self.writes()))
        return True


def test_a_view_down_mid_stream_is_waited_out_and_nothing_is_lost_or_written_early(calm, tmp_path):
    async def outage():
        run = start(tmp_path)
        half = len(EVENTS) // 2
        await run.worker.run(EVENTS[:half])
        run.faulty.down = down = Outage(run.runtime, calls=12)
        await run.worker.run(EVENTS[half:])  # its first batch meets the outage
        return run, down

    run, down = asyncio.run(outage())
    assert down.left == 0 and len(down.seen) == 12
    assert any("project" in stalled for stalled, _ in down.seen), "the stall was never reported"
    assert run.runtime.health.stalled == {}, "still reported stalled after the view came back"
    assert len({writes for _, writes in down.seen}) == 1, "a table was written while its batch waited"
    assert not run.witness.broken
    assert not run.dead_letters()
    assert run.outcome() == calm


class DownFromFirstSearch(Outage):
    """The view down from a cycle's first evidence search on, for `calls` calls."""

    searching = False

    def __call__(self, name, args, kwargs) -> bool:
        self.searching = self.searching or name in ("search_many", "search_hybrid")
        return self.searching and super().__call__(name, args, kwargs)


def test_a_view_down_during_a_cycle_retries_the_cycle_instead_of_failing_it(calm, tmp_path):
    async def outage():
        run = start(tmp_path)
        run.faulty.down = down = DownFromFirstSearch(run.runtime, calls=6)
        await run.worker.run(EVENTS)
        return run, down

    run, down = asyncio.run(outage())
    assert down.left == 0 and any("reflect" in stalled for stalled, _ in down.seen)
    outcomes = {e.outcome for e in run.runtime.outlets.reflections.events() if isinstance(e, ReflectionCycleCompleted)}
    assert outcomes <= {"ok", "empty"}, outcomes  # not "failed": the view's fault is not the reasoner's
    assert not run.dead_letters()
    assert run.outcome() == calm


class Poisoned:
    """The embedder, failing every batch that holds `text`: one record that
    fails alone, whatever the view does."""

    def __init__(self, embedder, text: str) -> None:
        self.embedder, self.text = embedder, text
        self.name, self.dim = embedder.name, embedder.dim

    def embed(self, texts):
        if self.text in texts:
            raise ValueError("injected: this text cannot be embedded")
        return self.embedder.embed(texts)


def test_an_episode_that_fails_alone_is_dead_lettered_with_its_bytes_and_its_batch_applied(tmp_path):
    poison = next(e for e in EVENTS if isinstance(e, EpisodeRecorded) and e.episode_id == f"{USERS[0]}-30")

    async def poisoned():
        run = start(tmp_path, embedder=Poisoned(HashingEmbedder(), poison.text))
        await run.worker.run(EVENTS)
        return run

    run = asyncio.run(poisoned())
    outlets = run.runtime.outlets
    offset = next(i for i, (_, value, _) in enumerate(outlets.episodes.records) if value == poison.encode())
    [(key, value, headers)] = run.dead_letters()
    headers = {k: v.decode() for k, v in headers}
    assert (key, value) == (poison.user_id.encode(), poison.encode())
    assert headers["__connect.errors.stage"] == "project"
    assert headers["__connect.errors.exception.class.name"] == "ValueError"
    assert (headers["__connect.errors.topic"], headers["__connect.errors.offset"]) == ("episodes", str(offset))
    batch = [decode(v) for _, v, _ in outlets.episodes.records[offset // 256 * 256:][:256]]
    expected = {e.episode_id for e in batch if isinstance(e, EpisodeRecorded) and e.user_id == poison.user_id}
    held = episodes_of(points_of(run.view, [poison.user_id]))[poison.user_id]
    assert expected - held.keys() == {poison.episode_id}, "the rest of its batch was not applied"
    assert not any(poison.episode_id in (r["id"] for r in value["recent"])
                   for _, _, value in run.runtime.tables.accumulators.changelog), "the accumulator counted it"
    assert run.runtime.health.stalled == {} and not run.witness.broken


class MidWalk:
    """The view down in the middle of the walk of `episode`'s erasure: once
    the walk has written its first belief, every call on the beliefs the
    erasure reaches (and the policy's probe) fails, until the walk has been
    retried twice. Records the user's invalidator state at the first fault."""

    def __init__(self, runtime: Runtime, user: str, episode: str, reached: set[str]) -> None:
        self.runtime, self.user, self.episode, self.reached = runtime, user, episode, reached
        self.walking, self.written, self.over, self.faults = False, 0, False, 0
        self.state_at_fault = None

    def retried_twice(self) -> bool:
        stall = self.runtime.health.stalled.get("invalidate")
        self.over = self.over or (stall is not None and stall.attempts >= 2)
        return self.over

    def __call__(self, name, args, kwargs) -> bool:
        on_walk = kwargs.get("evidence_ids") == self.episode or \
            (name in ("get", "strip", "patch") and bool(self.reached & set(args[0])))
        self.walking = self.walking or kwargs.get("evidence_ids") == self.episode
        if not self.walking or self.retried_twice():
            return False
        if not self.written:
            self.written += on_walk and name in ("strip", "patch")
            return False
        if not (on_walk or (name == "count" and args[0] == PROBE_USER)):
            return False
        if not self.faults:
            self.state_at_fault = copy.deepcopy(self.runtime.tables.provenance.get(self.user))
        self.faults += 1
        return True


def test_an_erasure_walk_cut_midway_is_walked_again_to_the_end(calm, tmp_path):
    user = USERS[0]
    erased = f"{user}-12"
    reached = {point_id("reflection", user, rid) for rid, p in calm["beliefs"][user].items()
               if p.get("invalidated_by") == erased}
    assert len(reached) >= 2, "the erasure must reach two beliefs or more to be cut between them"

    async def cut():
        run = start(tmp_path)
        run.faulty.down = walk = MidWalk(run.runtime, user, erased, reached)
        await run.worker.run(EVENTS)
        return run, walk

    run, walk = asyncio.run(cut())
    assert walk.written == 1 and walk.faults >= 4 and walk.over, "the walk was not cut after its first write"
    assert not walk.state_at_fault["gone"].get(erased, {}).get("erasure"), \
        "the erasure was decided in the state before its beliefs were in the view"
    beliefs = run.outcome()["beliefs"][user]
    assert all(beliefs[rid]["status"] == "invalid" and "text" not in beliefs[rid]
               for rid, p in calm["beliefs"][user].items() if p.get("invalidated_by") == erased)
    assert run.runtime.tables.provenance.get(user)["gone"][erased]["erasure"]
    assert run.outcome() == calm
    assert run.runtime.health.stalled == {} and not run.witness.broken and not run.dead_letters()


def everything(run: Run) -> dict:
    """The whole view with its transaction times, every topic's records and every table."""
    return {"view": {u: dict(run.view.scroll(u)) for u in USERS},
            "records": {name: len(topic.records) for name, topic in run.runtime.app.topics.items()},
            "tables": {name: copy.deepcopy(table.data) for name, table in run.runtime.app.tables.items()}}


def test_a_redelivered_tail_of_every_topic_changes_nothing(tmp_path):
    async def redelivered():
        run = start(tmp_path)
        await run.worker.run(EVENTS)
        before, outlets = everything(run), run.runtime.outlets
        first_erasure = next(i for i, e in enumerate(outlets.episodes.events())
                             if isinstance(e, EpisodeRetracted) and e.reason == "erasure")
        # A crash redelivers what came after the last commit, a tail: here the
        # erasures and what followed (within the accumulator's window, which is
        # what keeps an episode from being counted twice), and every request and
        # belief event, each of which must be skipped or change nothing.
        run.worker.redeliver(outlets.episodes, first_erasure)
        run.worker.redeliver(outlets.requests, 0)
        run.worker.redeliver(outlets.reflections, 0)
        await run.worker.drain()
        return run, before

    run, before = asyncio.run(redelivered())
    after = everything(run)
    assert after["records"] == before["records"], "a redelivery published again (a cycle run twice?)"
    assert after["view"] == before["view"]
    assert after["tables"] == before["tables"]
    assert not run.witness.broken


def test_a_forget_drops_one_users_points_once_and_keeps_what_they_say_after(calm, tmp_path):
    gone, other = USERS[0], USERS[1]
    anew = EpisodeRecorded(user_id=gone, episode_id="anew", text="said after the forget", importance=0.5)

    async def forgotten():
        run = start(tmp_path)
        await run.worker.run([*EVENTS, UserForgotten(user_id=gone), anew])
        outlets = run.runtime.outlets
        forward = next(i for i, e in enumerate(outlets.requests.events()) if isinstance(e, UserForgotten))
        proofs = [e for e in outlets.reflections.events() if isinstance(e, ErasureCompleted) and e.scope == "user"]
        # A crash once its points were dropped, before it was marked done: the forget is read again.
        run.runtime.tables.requests_done.data[gone] = outlets.requests.events()[forward].sequence - 1
        run.worker.redeliver(outlets.requests, forward)
        await run.worker.drain()
        again = [e for e in outlets.reflections.events() if isinstance(e, ErasureCompleted) and e.scope == "user"]
        return run, proofs, again

    run, proofs, again = asyncio.run(forgotten())
    assert len(proofs) == 1 and proofs[0].points >= len(calm["episodes"][gone])
    assert {p["episode_id"] for _, p in run.view.scroll(gone, kind="episode")} == {"anew"}  # not dropped again
    assert run.view.count(gone, kind="reflection") == run.view.count(gone, kind="cycle") == 0
    assert again[-1].points == proofs[0].points and again[-1].event_id == proofs[0].event_id
    assert run.outcome()["beliefs"][other] == calm["beliefs"][other]
    assert run.outcome()["episodes"][other] == calm["episodes"][other]
    assert not run.witness.broken and not run.dead_letters()
