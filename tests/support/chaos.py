"""The chaos suite's machinery (tests/faults/test_chaos.py, and the benchmark
tests/benchmarks/chaos.py): the run shapes, the history, the model's calls
named by what they ask, what a run left and the check against the reference,
the seeded schedule of faults, and `Chaos`, which runs it all against a broker."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import random
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from processors.accumulator import Accumulator, Trigger, admit
from schemas import EpisodeRecorded, EpisodeRetracted, ReflectionRequested
from streams.adapters.anthropic import found_of
from streams.broker import free_port
from streams.settings import Settings
from streams.topics import ensure_topics
from streams.worker.ownership import partition_of
from support.broker import TEST_BROKER, opened_values, read_topic
from support.harness import Worker, answered, shared_ring, wait_for
from support.history import cited_by_then
from support.messages_api import _numbered
from support.runs import (SHORT_GROUP_TIMEOUTS, Feed, Model, episode_stream, kill, read_events, users_by_partition,
                          view_snapshot, worker_env)

SEED = os.environ.get("REFLECT_CHAOS_SEED")  # the first run's seed; run i has seed + i


@dataclass(frozen=True)
class Shape:
    """How big a chaos run is."""
    users_per_partition: int  # users on each of the 4 partitions
    per_user: int  # episodes of each user
    threshold: float  # the trigger: importance 3.5 per five episodes
    min_episodes: int
    rate: float  # events/s the feed publishes: faults land while it flows
    workers: int  # started before the feed
    most: int  # workers there can be (a join starts one more, on its own data dir)
    faults: tuple[int, int]  # faults a run, at least and at most (each kill and SIGTERM restarts)
    challenge: str = "off"  # the contradiction gate
    settle: float = 60.0  # seconds a run may take to settle after the feed (a correct one: ~10)


# The smallest shape that still makes each user's cycles cite beliefs (depth
# 2), retract cited episodes, and hand partitions over: 4 users × 32 episodes
# in ~2.3 s, a cycle every ~10 episodes (3 a user, a manual one and the
# revalidations of two retractions), 2 workers and room for a third, 2–3
# faults each, one kill -9 always.
SHORT = Shape(users_per_partition=1, per_user=32, threshold=7.0, min_episodes=6, rate=60.0, workers=2, most=3,
              faults=(2, 3))
# The benchmark's: twice the users, more episodes and faults, the gate on.
FULL = Shape(users_per_partition=2, per_user=60, threshold=7.0, min_episodes=6, rate=60.0, workers=2, most=3,
             faults=(3, 5), challenge="on", settle=120.0)
SHAPES = {"short": SHORT, "full": FULL}


# ---------------------------------------------------------------- the history

def at(i: int, second: int) -> str:
    """A valid time `second` seconds into the minute of a user's episode `i` (episode_stream's clock)."""
    return f"2026-06-01T{9 + i // 60:02d}:{i % 60:02d}:{second:02d}Z"


def chaos_history(users, per_user: int, settings: Settings) -> list:
    """Each user's episodes; at half of them a retraction of an episode a
    belief cites, at three quarters a manual cycle and then a retraction of
    an episode a belief cites once the first is gone (support.history's
    history and its `cited_by_then`, at any size; the offline reasoner
    there, which the stand-in answers as)."""
    stream, n = episode_stream(users, per_user), len(users)
    half, late = per_user // 2, per_user * 3 // 4
    settings = replace(settings, reasoner="offline")
    cited = cited_by_then(stream[:half * n], settings, users)
    gone = set(cited.values())
    again = cited_by_then([e for e in stream[:late * n] if e.episode_id not in gone], settings, users)
    first = [EpisodeRetracted(user_id=u, episode_id=cited[u], occurred_at=at(half - 1, 30)) for u in users]
    asked = [ReflectionRequested(event_id=f"request:{u}:manual:m1", user_id=u, why="manual",
                                 cycle_id=f"{u}:manual:m1", occurred_at=at(late - 1, 30)) for u in users]
    second = [EpisodeRetracted(user_id=u, episode_id=again[u], occurred_at=at(late - 1, 40)) for u in users]
    return stream[:half * n] + first + stream[half * n:late * n] + asked + second + stream[late * n:]


def expected_counts(events, settings: Settings, users) -> dict[str, dict]:
    """What a settled view and accumulator say of each user: episodes
    recorded and retracted, recorded episodes folded in, threshold cycles."""
    trigger, accs = Trigger(settings.threshold, settings.min_episodes), {u: Accumulator() for u in users}
    for e in events:
        accs[e.user_id], _ = admit(accs[e.user_id], e, trigger)
    retracted = {u: {e.episode_id for e in events if isinstance(e, EpisodeRetracted) and e.user_id == u}
                 for u in users}
    recorded = collections.Counter(e.user_id for e in events if isinstance(e, EpisodeRecorded))
    return {u: {"episodes": recorded[u] - len(retracted[u]), "retracted": len(retracted[u]), "folded": recorded[u],
                "cycles": accs[u].cycles} for u in users}


# ---------------------------------------------------------------- the model's calls

@dataclass(frozen=True)
class Call:
    at: float  # wall clock (s) when the stand-in received it
    tool: str
    user: str
    key: str  # what it asks, whatever the order of its statements


NUMBERED = re.compile(r"^\d+\. ")


def call_key(body: dict) -> str:
    """A call named by what it asks: the tool, and the prompt's lines as a
    set, with each question's found statements as texts rather than numbers
    (statements of equal rerank score may come in another order)."""
    data = body["messages"][0]["content"]
    statements = _numbered("statements", data)
    lines = []
    for line in data.split("\n"):
        line = NUMBERED.sub("", line)
        question, found = found_of(line)
        if found is not None:
            line = question + " ⟨" + " | ".join(sorted(statements[k - 1] for k in found
                                                          if 0 < k <= len(statements))) + "⟩"
        lines.append(line)
    raw = orjson.dumps([body["tool_choice"]["name"], sorted(lines)])
    return hashlib.sha256(raw).hexdigest()[:20]


class CountingModel(Model):
    """The stand-in model, recording each call's time and key."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []

    def __call__(self, body: dict):
        found = re.search(r"\[(u\d+)\]", body["messages"][0]["content"])
        call = Call(time.time(), body["tool_choice"]["name"], found.group(1) if found else "?", call_key(body))
        with self.lock:
            self.calls.append(call)
        return super().__call__(body)


# ---------------------------------------------------------------- what a run left, and the check

AUDITS = ("ReflectionCycleCompleted", "ReflectionChallenged")  # a cycle's completion, by kind
REQUESTS = ("ReflectionRequested", "ChallengeRequested")  # requests that name a cycle
BELIEF_EVENTS = ("ReflectionCreated", "ReflectionReinforced")  # a cycle's published outcome, besides its audit
BELIEF_FIELDS = ("text", "evidence_ids", "lost_evidence_ids", "status", "depth", "confidence", "support",
                 "importance", "question", "cycle_id", "occurred_at")
EPISODE_FIELDS = ("text", "status", "importance", "occurred_at")
STAT_FIELDS = ("episodes", "folded", "retracted", "reflections", "pending_importance", "high_salience", "cycles",
               "cycles_by_kind", "requests", "requests_done")


@dataclass
class Outcome:
    """What a run left: read from the owners' views, the topics and the stand-in."""
    users: list[str]
    acked: dict[str, list[str]]  # user → episode ids the broker acknowledged to the feed
    episodes: dict[str, dict[str, dict]]  # user → episode id → its point's payload
    beliefs: dict[str, dict[str, dict]]  # user → reflection id → its point's payload
    stats: dict[str, dict]  # user → GET …/stats
    requests: list[dict]  # the requests topic
    reflections: list[dict]  # the reflections topic, each record with its timestamp (ms) as "_ts"
    calls: list[Call]
    notes: list[str] = field(default_factory=list)  # what went wrong in the run itself (did not settle, …)
    dead_letters: list[dict] = field(default_factory=list)  # their headers: the history holds no bad input
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)  # seconds of each part: workers ready, fed, settled, stopped


@dataclass
class Reference:
    """The uninterrupted run, and which cycle asked each call it made."""
    outcome: Outcome
    cycle_of: dict[str, str]  # call key → cycle id
    calls: collections.Counter  # call key → times asked

    @classmethod
    def of(cls, outcome: Outcome) -> "Reference":
        return cls(outcome, attribute(outcome), collections.Counter(c.key for c in outcome.calls))


def attribute(outcome: Outcome) -> dict[str, str]:
    """Call key → cycle id, in a run where each user's cycles ran one after
    another: the user's calls in time order, taken by the user's audit events
    in log order, each as many as its `usage.calls`."""
    out = {}
    for u in outcome.users:
        calls = iter(sorted((c for c in outcome.calls if c.user == u), key=lambda c: c.at))
        for audit in (e for e in outcome.reflections if e["type"] in AUDITS and e["user_id"] == u):
            for _ in range(audit.get("usage", {}).get("calls", 0)):
                call = next(calls, None)
                assert call is not None, f"{u}: fewer model calls than its audit events count"
                assert out.get(call.key, audit["cycle_id"]) == audit["cycle_id"], \
                    f"{u}: one call asked by two cycles ({out[call.key]}, {audit['cycle_id']})"
                out[call.key] = audit["cycle_id"]
        left = list(calls)
        assert not left, f"{u}: {len(left)} model calls no audit event counts"
    unknown = [c for c in outcome.calls if c.user not in outcome.users]
    assert not unknown, f"model calls that name no user: {unknown[:3]}"
    return out


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str


KINDS = ("episode_missing", "episode_extra", "episode_differs", "count_differs",  # (a)
         "completion_missing", "completion_duplicated", "outcome_duplicated", "requests_differ",  # (b)
         "model_call_repeated", "model_call_unmatched",  # (c)
         "belief_differs",  # (d)
         "dead_lettered",  # a fault taken for bad input: the history holds none
         "run")  # the run itself: did not settle, a worker died


def as_set(payload: dict, names) -> dict:
    return {k: sorted(payload.get(k) or ()) if k.endswith("evidence_ids") else payload.get(k) for k in names}


def check(run: Outcome, reference: Reference) -> tuple[list[Violation], dict]:
    """The violations of `run` against the reference, and figures (counted, not violations)."""
    ref = reference.outcome
    found = [Violation("run", note) for note in run.notes]
    found += check_episodes(run, ref) + check_completions(run, ref) + check_beliefs(run, ref)
    found += [Violation("dead_lettered", f"{len(run.dead_letters)} record(s), e.g. {run.dead_letters[:3]}")
              ] if run.dead_letters else []
    calls, figures = check_calls(run, reference)
    return found + calls, figures


def check_episodes(run: Outcome, ref: Outcome) -> list[Violation]:
    out = []
    for u in ref.users:
        acked, held = set(run.acked.get(u, ())), run.episodes.get(u, {})
        if missing := acked - held.keys():
            out.append(Violation("episode_missing", f"{u}: {len(missing)} acknowledged, not in the view: "
                                                    f"{sorted(missing)[:10]}"))
        if extra := held.keys() - acked:
            out.append(Violation("episode_extra", f"{u}: in the view, never acknowledged: {sorted(extra)[:10]}"))
        differ = {e: (as_set(held[e], EPISODE_FIELDS), as_set(ref.episodes[u].get(e, {}), EPISODE_FIELDS))
                  for e in sorted(acked & held.keys())
                  if as_set(held[e], EPISODE_FIELDS) != as_set(ref.episodes[u].get(e, {}), EPISODE_FIELDS)}
        if differ:
            out.append(Violation("episode_differs", f"{u}: {len(differ)} episodes, e.g. {next(iter(differ.items()))}"))
        mine, theirs = run.stats.get(u, {}), ref.stats.get(u, {})
        if counts := {k: (mine.get(k), theirs.get(k)) for k in STAT_FIELDS if mine.get(k) != theirs.get(k)}:
            out.append(Violation("count_differs", f"{u}: (here, reference) {counts}"))
    return out


def cycle_ids(events, types) -> collections.Counter:
    return collections.Counter(e["cycle_id"] for e in events if e["type"] in types and e.get("cycle_id"))


def check_completions(run: Outcome, ref: Outcome) -> list[Violation]:
    out = []
    asked, completed = set(cycle_ids(run.requests, REQUESTS)), cycle_ids(run.reflections, AUDITS)
    if asked != set(cycle_ids(ref.requests, REQUESTS)):
        theirs = set(cycle_ids(ref.requests, REQUESTS))
        out.append(Violation("requests_differ", f"asked here only {sorted(asked - theirs)}, "
                                                f"in the reference only {sorted(theirs - asked)}"))
    if missing := sorted(asked - completed.keys()):
        out.append(Violation("completion_missing", f"{len(missing)} requests never completed: {missing[:10]}"))
    for cycle, n in sorted(completed.items()):
        if n > 1:
            ids = {e["event_id"] for e in run.reflections if e["type"] in AUDITS and e.get("cycle_id") == cycle}
            out.append(Violation("completion_duplicated", f"{cycle} completed {n} times under {len(ids)} event "
                                 f"id(s){' (the same record again)' if len(ids) == 1 else ''}"))
    published = collections.Counter((e["cycle_id"], e["type"], e.get("reflection_id")) for e in run.reflections
                                    if e["type"] in BELIEF_EVENTS)
    for (cycle, kind, rid), n in sorted(published.items()):
        if n > 1:
            out.append(Violation("outcome_duplicated", f"{cycle}: {kind} of {rid} published {n} times"))
    return out


def check_calls(run: Outcome, reference: Reference) -> tuple[list[Violation], dict]:
    out, repaid = [], 0
    outcome_at = {}  # cycle id → when its first outcome record reached the log (s)
    for e in run.reflections:
        if e.get("cycle_id") and (e["type"] in AUDITS or e["type"] in BELIEF_EVENTS):
            outcome_at[e["cycle_id"]] = min(outcome_at.get(e["cycle_id"], float("inf")), e["_ts"] / 1000)
    by_key = collections.defaultdict(list)
    for c in run.calls:
        by_key[c.key].append(c)
    unmatched = [c for c in run.calls if c.key not in reference.cycle_of]
    if unmatched:
        out.append(Violation("model_call_unmatched", f"{len(unmatched)} calls the reference never made, e.g. "
                                                     f"{[(c.tool, c.user) for c in unmatched[:5]]}"))
    for key, calls in sorted(by_key.items()):
        cycle = reference.cycle_of.get(key)
        if cycle is None or cycle not in outcome_at:
            continue
        for c in sorted(calls, key=lambda c: c.at)[reference.calls[key]:]:  # beyond what the reference asked
            if c.at > outcome_at[cycle]:
                out.append(Violation("model_call_repeated", f"{cycle}: {c.tool} asked again "
                                     f"{c.at - outcome_at[cycle]:.2f} s after its outcome was on the log"))
            else:
                repaid += 1
    return out, {"model_calls": len(run.calls), "repaid_before_log": repaid}


def check_beliefs(run: Outcome, ref: Outcome) -> list[Violation]:
    out = []
    for u in ref.users:
        mine = {rid: as_set(p, BELIEF_FIELDS) for rid, p in run.beliefs.get(u, {}).items()}
        theirs = {rid: as_set(p, BELIEF_FIELDS) for rid, p in ref.beliefs.get(u, {}).items()}
        fields_ = {rid: {k: (mine[rid][k], theirs[rid][k]) for k in BELIEF_FIELDS if mine[rid][k] != theirs[rid][k]}
                   for rid in mine.keys() & theirs.keys() if mine[rid] != theirs[rid]}
        if mine.keys() ^ theirs.keys() or fields_:
            cycles = {b["cycle_id"] for rid in mine.keys() ^ theirs.keys() for b in [mine.get(rid) or theirs[rid]]}
            cycles |= {mine[rid]["cycle_id"] for rid in fields_}
            logged = {e["reflection_id"] for e in run.reflections if e["type"] == "ReflectionCreated"}
            out.append(Violation("belief_differs", f"{u}: only here {said_beliefs(mine, mine.keys() - theirs.keys())}"
                                 f"; only in the reference {said_beliefs(theirs, theirs.keys() - mine.keys())}"
                                 f" (of those, on this run's log: "
                                 f"{sorted(r[:8] for r in (theirs.keys() - mine.keys()) & logged)})"
                                 f"; fields (here, reference) {fields_}; their cycles (here | reference): "
                                 + "; ".join(f"{c}: {said_audit(run, c)} | {said_audit(ref, c)}"
                                             for c in sorted(cycles))))
    return out


def said_audit(outcome: Outcome, cycle: str) -> str:
    """A cycle's audit events, short: outcome, insights kept/reinforced/dropped, model calls."""
    return ", ".join(f"{e['outcome']} {e.get('kept')}/{e.get('reinforced')}/{e.get('dropped')} "
                     f"calls {e.get('usage', {}).get('calls')}" for e in outcome.reflections
                     if e["type"] in AUDITS and e.get("cycle_id") == cycle) or "no audit"


def said_beliefs(beliefs: dict, ids) -> list[str]:
    return [f"{rid[:8]} ({b['cycle_id']}, depth {b['depth']}, {b['status']}, cites {len(b['evidence_ids'])}: "
            f"{str(b['text'])[:50]!r})" for rid in sorted(ids) for b in [beliefs[rid]]]


# ---------------------------------------------------------------- the schedule

@dataclass(frozen=True)
class Action:
    at: float  # seconds after the feed started
    what: str  # kill9 | sigterm | leave | join | restart
    worker: str


def make_schedule(seed: int, shape: Shape, span: float) -> list[Action]:
    """2–3 (or the shape's) faults at random times while the feed runs: a
    SIGKILL or a SIGTERM of a running worker, restarted on its data dir
    after 0–2 s; a worker leaving (SIGTERM, not back); a worker joining (one
    never started, or one that left, on its data dir). One fault is always a
    SIGKILL. Workers are w0, w1, … (w0 and w1 start before the feed)."""
    rng = random.Random(seed)
    names = [f"w{i}" for i in range(shape.most)]
    up, out, back = set(names[:shape.workers]), set(names[shape.workers:]), {}
    n = rng.randint(*shape.faults)
    forced = rng.randrange(n)
    plan = []
    for i, t in enumerate(sorted(round(rng.uniform(0.2, span), 2) for _ in range(n))):
        up |= {w for w, when in back.items() if when <= t}
        back = {w: when for w, when in back.items() if when > t}
        if not up:  # every worker is down until a restart: this fault waits for the first one back
            w, t = min(back.items(), key=lambda kv: kv[1])
            up.add(w)
            del back[w]
        kinds = ["kill9", "sigterm"] + (["leave"] if len(up) > 1 else []) + (["join"] if out else [])
        what = "kill9" if i == forced else rng.choice(kinds)
        if what == "join":
            w = rng.choice(sorted(out))
            out.discard(w)
            up.add(w)
            plan.append(Action(t, "join", w))
            continue
        w = rng.choice(sorted(up))
        up.discard(w)
        plan.append(Action(t, what, w))
        if what == "leave":
            out.add(w)
        else:
            back[w] = round(t + rng.uniform(0.0, 2.0), 2)
            plan.append(Action(back[w], "restart", w))
    return sorted(plan, key=lambda a: a.at)


def said(schedule) -> str:
    return "; ".join(f"+{a.at:.2f}s {a.what} {a.worker}" for a in schedule) or "(none)"


def dead_letters(settings: Settings) -> list[dict]:
    """Every dead letter's headers (stage, exception, where it was read), of both dead-letter topics."""
    def headers(record) -> dict:
        return {k.removeprefix("__connect.errors."): v.decode(errors="replace") for k, v in record.headers}
    return [letter for topic in (settings.dlq_episodes, settings.dlq_reflections)
            for letter in asyncio.run(read_topic(settings, topic, headers))]


# ---------------------------------------------------------------- running it

@dataclass
class Result:
    seed: int
    schedule: list[Action]  # as planned
    ran: list[str]  # as it ran: each action with the time it was done
    violations: list[Violation]
    figures: dict
    seconds: float
    traces: list[str] = field(default_factory=list)  # what the workers logged of what went wrong

    def report(self) -> str:
        lines = [f"chaos run seed={self.seed} ({self.seconds:.1f} s): "
                 f"{len(self.violations)} violation(s)  [again: REFLECT_CHAOS_SEED={self.seed} "
                 f"REFLECT_CHAOS_RUNS=1 python -m pytest -m chaos -s]",
                 f"  schedule: {said(self.schedule)}", f"  as run:   {'; '.join(self.ran) or '(none)'}",
                 f"  figures:  {self.figures}"]
        lines += [f"  {v.kind}: {v.detail}" for v in self.violations]
        lines += [f"  log: {line}" for line in self.traces]
        return "\n".join(lines)


# What a worker logs when a batch or a request goes by unhandled: with the lines naming a request never
# completed or a user whose counts differ, the trail a violation is diagnosed from once the run's directory
# is gone (CI prints the report).
TRAIL = re.compile(r"given up|dropped|adopted|decided before|revoked|assigned partitions|redelivered|logged again|"
                   r"read again|sought|Traceback|Error")


def traces(logs: list[Path], names: list[str], most: int = 60) -> list[str]:
    """Each worker log's lines naming one of `names` (a request, or a user),
    or on `TRAIL`, if any is named (the last `most` of each; HTTP access
    lines left out): empty when nothing is."""
    if not names:
        return []
    named = re.compile("|".join(rf"(?<![\w:-]){re.escape(m)}(?![\w:])" if ":" in m  # u1:1, not u1:10
                                else rf"(?<![\w/-]){re.escape(m)}(?!\w)" for m in names))  # u0, u0:3: not /u0/
    out = []
    for path in sorted(logs):
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        kept = [line for line in lines if "HTTP Request" not in line and (named.search(line) or TRAIL.search(line))]
        out += [f"{path.stem} {line[:300]}" for line in kept[-most:]]
    return out


def named_in(violations: list[Violation], missing: list[str]) -> list[str]:
    """What a report's trail follows: the requests never completed, and the users whose counts differ."""
    return missing + sorted({v.detail.split(":", 1)[0] for v in violations if v.kind == "count_differs"})


class Chaos:
    """One broker, one history and one reference run; chaos runs by seed,
    each on topics, a group and data dirs of its own."""

    def __init__(self, broker, tmp: Path, shape: Shape = SHORT) -> None:
        self.broker, self.tmp, self.shape = broker, tmp, shape
        self.users = users_by_partition(shape.users_per_partition, self.settings(tmp / "probe").partitions)
        self.events = chaos_history(self.users, shape.per_user, self.settings(tmp / "probe"))
        self.expected = expected_counts(self.events, self.settings(tmp / "probe"), self.users)
        self._reference: Reference | None = None

    def settings(self, data_dir: Path) -> Settings:
        tag = uuid.uuid4().hex[:8]
        timeouts = dict(SHORT_GROUP_TIMEOUTS)
        if TEST_BROKER == "tansu":  # it takes 3 s; Kafka refuses less than 6 (test_faults_crash.crash_settings)
            timeouts["session_timeout"] = 3.0
        return Settings.load(env={}, broker=self.broker.url, app_id=f"reflect-chaos-{tag}",
                             topic_episodes=f"episodes-{tag}", topic_requests=f"reflection-requests-{tag}",
                             topic_reflections=f"reflections-{tag}", data_dir=str(data_dir), web_port=free_port(),
                             master_keys=shared_ring(Path(data_dir).parent),
                             threshold=self.shape.threshold, min_episodes=self.shape.min_episodes,
                             reasoner="anthropic", reasoner_retries=0, challenge=self.shape.challenge, **timeouts)

    @property
    def reference(self) -> Reference:
        """One worker, no fault, the history published at once."""
        if self._reference is None:
            outcome = self._run("reference", [], rate=None, workers=1)
            assert not outcome.notes, f"the reference run did not settle: {outcome.notes}"
            assert sum(len(b) for b in outcome.beliefs.values()) >= len(self.users), "too few beliefs"
            assert any(p["depth"] >= 2 for b in outcome.beliefs.values() for p in b.values()), \
                "no belief over beliefs in the reference"
            assert any(p["status"] != "live" or p.get("lost_evidence_ids") for b in outcome.beliefs.values()
                       for p in b.values()), "the retractions changed no belief in the reference"
            self._reference = Reference.of(outcome)
        return self._reference

    def run(self, seed: int, faults: bool = True) -> Result:
        """One chaos run; without `faults`, the same run with an empty
        schedule (a control: the workers, the feed and the check alone)."""
        reference = self.reference
        schedule = make_schedule(seed, self.shape, len(self.events) / self.shape.rate) if faults else []
        ran: list[str] = []
        outcome = self._run(f"seed-{seed}", schedule, rate=self.shape.rate, workers=self.shape.workers, ran=ran)
        violations, figures = check(outcome, reference)
        missing = sorted(set(cycle_ids(outcome.requests, REQUESTS)) - cycle_ids(outcome.reflections, AUDITS).keys())
        return Result(seed, schedule, ran, violations, {**figures, "phases": outcome.phases}, outcome.seconds,
                      traces(list((self.tmp / f"seed-{seed}").glob("w*.log")), named_in(violations, missing)))

    def _run(self, name: str, schedule: list[Action], rate: float | None, workers: int,
             ran: list[str] | None = None) -> Outcome:
        """Workers started, the history fed while `schedule` plays, settled;
        then every worker SIGKILLed (what is compared is in the views'
        write-ahead logs and on the topics already, and a graceful stop
        takes seconds a worker) and what the run left read."""
        phases, notes = {"start": time.monotonic()}, []
        tmp = self.tmp / name
        tmp.mkdir(parents=True, exist_ok=True)
        base = self.settings(tmp / "data")
        asyncio.run(ensure_topics(base))
        model = CountingModel()
        group = {f"w{i}": Worker(replace(base, data_dir=str(tmp / f"data-w{i}"), web_port=free_port()),
                                 tmp / f"w{i}.log", worker_env(model)) for i in range(max(workers, self.shape.most))}
        try:
            feed = self._play(name, base, group, schedule, rate, workers, ran if ran is not None else [], phases)
            up = [w for w in group.values() if w.process is not None and w.process.poll() is None]
            # A process ends by the schedule's hand only (kill and stop close its log): any other end is news.
            notes += [f"{n} exited by itself ({w.process.returncode}): {w.tail(5)}" for n, w in group.items()
                      if w.process is not None and w.process.poll() is not None and not w.log.closed]
            stats = self.settle(name, base, up, notes)
            phases["settled"] = time.monotonic()
            owners = owners_of(up, base, self.users, notes)
        finally:
            for w in group.values():
                if w.process is not None and w.process.poll() is None:
                    kill(w)
            model.close()
        phases["stopped"] = time.monotonic()
        return self._left(base, feed, owners, stats, model.calls, notes, phases)

    def _play(self, name: str, base: Settings, group: dict, schedule: list[Action], rate: float | None,
              workers: int, ran: list[str], phases: dict) -> Feed:
        """The first `workers` started, then the feed, and the schedule's
        actions at their times while it flows; the feed once it is done."""
        first = [group[f"w{i}"].launch() for i in range(workers)]
        wait_for(lambda: all(healthy(w) for w in first), 90, f"{name}: the first workers ready")
        phases["ready"] = time.monotonic()
        feed = Feed(base, self.events, rate).start()
        t0 = time.monotonic()
        for action in schedule:
            time.sleep(max(0.0, t0 + action.at - time.monotonic()))  # the schedule's pace, not a sync
            begun = time.monotonic() - t0
            ran.append(f"+{begun:.2f}s {act(group[action.worker], action.what)} {action.worker}")
        for label, w in group.items():
            if getattr(w, "sigterm_at", None) is not None:
                ran.append(f"{label} {finish_stop(w)}")
        feed.join(120)
        phases["fed"] = time.monotonic()
        return feed

    def _left(self, base: Settings, feed: Feed, owners: dict, stats: dict, calls: list[Call], notes: list[str],
              phases: dict) -> Outcome:
        """What a stopped run left: the owners' views, the topics, the stand-in's calls."""
        acked = collections.defaultdict(list)
        for e in feed.acked:
            if isinstance(e, EpisodeRecorded):
                acked[e.user_id].append(e.episode_id)
        snapshot = {}
        for w, users in owners.items():
            snapshot.update(view_snapshot(w.settings, users))
        stamped = lambda r: {**orjson.loads(r.value), "_ts": r.timestamp}  # noqa: E731
        logged = asyncio.run(read_topic(base, base.topic_reflections, lambda r: (r.value, r.timestamp)))
        opened = asyncio.run(opened_values(base, [value for value, _ in logged]))  # sealed texts opened
        return Outcome(
            users=self.users, acked=dict(acked),
            episodes={u: {p["episode_id"]: p for p in points.values() if p["kind"] == "episode"}
                      for u, points in snapshot.items()},
            beliefs={u: {p["reflection_id"]: p for p in points.values() if p["kind"] == "reflection"}
                     for u, points in snapshot.items()},
            stats=stats,
            requests=asyncio.run(read_topic(base, base.topic_requests, stamped)),
            reflections=[{**e, "_ts": ts} for e, (_, ts) in zip(opened, logged)],
            calls=list(calls), notes=notes, dead_letters=dead_letters(base),
            seconds=time.monotonic() - phases["start"],
            phases={k: round(phases[k] - phases[j], 1) for j, k in zip(phases, list(phases)[1:])})

    def settle(self, name: str, settings: Settings, up: list[Worker], notes: list[str]) -> dict:
        """Waits (bounded) until every worker up is ready and every user's
        counts are the history's, every request asked is done and every
        request on the log has its audit event; the users' stats then."""
        last = {}

        def done() -> bool:
            if not all(healthy(w) for w in up):
                last["why"] = "a worker is not ready"
                return False
            for u in self.users:
                stats = answered(up[0].client, f"/v1/users/{u}/stats") or {}
                seen = {k: stats.get(k) for k in self.expected[u]}
                if seen != self.expected[u] or stats.get("requests") != stats.get("requests_done"):
                    last["why"] = f"{u}: {seen}, requests {stats.get('requests')} done {stats.get('requests_done')}"
                    return False
            asked = set(cycle_ids(read_events(settings, settings.topic_requests), REQUESTS))
            completed = set(cycle_ids(read_events(settings, settings.topic_reflections), AUDITS))
            last["why"] = f"requests not completed: {sorted(asked - completed)[:5]}"
            return asked <= completed
        try:
            wait_for(done, self.shape.settle, f"{name}: settled")
        except AssertionError:
            notes.append(f"did not settle in {self.shape.settle:g} s: {last.get('why')}; the group's commits "
                         f"(committed/end by partition) {asyncio.run(commits(settings))}; /healthz "
                         f"{[(w.get('/healthz') or {}).get('status') for w in up]}")
        return {u: answered(up[0].client, f"/v1/users/{u}/stats") or {} for u in self.users} if up else {}


async def commits(settings: Settings) -> dict[str, str]:
    """Per input topic, each partition's committed offset against its end (what a stalled group left)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, group_id=settings.app_id,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        out = {}
        for topic in (settings.topic_episodes, settings.topic_requests, settings.topic_reflections):
            tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
            ends = await consumer.end_offsets(tps)
            held = [f"{tp.partition}:{await consumer.committed(tp)}/{ends[tp]}" for tp in tps]
            out[topic.rsplit("-", 1)[0]] = " ".join(held)
        return out
    finally:
        await consumer.stop()


def healthy(worker: Worker) -> bool:
    if worker.process.poll() is not None:
        return False
    return (worker.get("/healthz") or {}).get("status") == "ok"


def act(worker: Worker, what: str) -> str:
    """Does one action of the schedule without waiting for it (a SIGTERMed
    worker exits while the schedule goes on: `finish_stop`); what was done."""
    stopping = getattr(worker, "sigterm_at", None) is not None
    running = worker.process is not None and worker.process.poll() is None
    if what == "kill9":
        if not running:
            return "kill9 (not running)"
        worker.sigterm_at = None
        kill(worker)
        return "kill9 (while it stopped)" if stopping else "kill9"
    if what in ("sigterm", "leave"):
        if not running or stopping:
            return f"{what} (not running)"
        worker.process.send_signal(signal.SIGTERM)
        worker.sigterm_at = time.monotonic()
        return what
    exited = f" ({finish_stop(worker)})" if stopping else ""
    if worker.process is not None and worker.process.poll() is None:
        return f"{what} (already running)"
    worker.launch()
    return what + exited


def finish_stop(worker: Worker, bound: float = 15.0) -> str:
    """A SIGTERMed worker's exit, SIGKILLed `bound` s after the SIGTERM; how it went."""
    process, sent, worker.sigterm_at = worker.process, worker.sigterm_at, None
    try:
        process.wait(max(0.0, sent + bound - time.monotonic()))
        said = f"exited {time.monotonic() - sent:.1f} s after its SIGTERM"
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        said = f"SIGKILLed, still running {bound:g} s after its SIGTERM"
    if not worker.log.closed:
        worker.log.close()
    return said


ASSIGNED = re.compile(r"^\|\s*(\S+)\s*\|\s*\{([0-9, \-]*)\}\s*\|", re.M)


def assigned(worker: Worker, topic: str) -> set[int]:
    """The partitions of `topic` in the worker's last "Setting newly assigned
    partitions" table (support.runs.assigned_partitions, read with the
    spaces Faust puts in a set that is not one range: `{1, 3}`)."""
    text = worker.log_path.read_text(errors="replace")
    last = text.rfind("Setting newly assigned partitions")
    if last < 0:
        return set()
    found = set()
    for name, ranges in ASSIGNED.findall(text[last:text.find("for group", last)]):
        if name == topic:
            for part in filter(None, (p.strip() for p in ranges.split(","))):
                low, _, high = part.partition("-")
                found.update(range(int(low), int(high or low) + 1))
    return found


def owners_of(up: list[Worker], settings: Settings, users, notes: list[str]) -> dict:
    """The worker that owns each user at the end (its last assignment), as {worker: users}."""
    sets = {w: assigned(w, settings.topic_episodes) for w in up}
    out = collections.defaultdict(list)
    for u in users:
        p = partition_of(u, settings.partitions)
        holders = [w for w, held in sets.items() if p in held]
        if len(holders) != 1:
            notes.append(f"partition {p} ({u}) is held by {len(holders)} workers at the end")
        if holders:
            out[holders[0]].append(u)
    return out


def seeds(runs: int, seed: str | None = SEED) -> list[int]:
    first = int(seed) if seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    return [first + i for i in range(runs)]
