"""Crash faults: a `reflect worker` SIGKILLed mid-stream, then restarted with the
same settings (app id, topics, data dir), ends with the view, the accumulators
and the beliefs of a run that never crashed.

Kill points: during projection (some episodes visible), during a reflection
cycle (the Messages API server holds the model call, so a cycle is known to be
in flight), and between the model's answer and the publish (the server pauses
the broker before it answers, so the worker has the answer and cannot get its
events acknowledged). The reasoner is `--reasoner anthropic` against
tests/support/messages_api.py's OfflineModel, which answers from the request alone, so
a cycle that runs twice asks and answers the same.

The same file holds the two-worker cases (issue 9: two workers of one consumer
group split the partitions; one of them SIGKILLed, the other takes over). The
helpers it shares with the outage, soak and chaos tests are in
tests/support/runs.py.

    python -m pytest tests/faults/test_faults_crash.py -s
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson
import pytest

from processors.embedders import HashingEmbedder
from processors.projector import EpisodeProjector, ReflectionProjector
from processors.reasoners import OfflineReasoner
from processors.reflector import CycleConfig, run_cycle, window_records
from streams.adapters.view.edge import EdgeView
from schemas import EpisodeRecorded, ReflectionCreated, ReflectionRequested
from streams.broker import free_port
from streams.settings import Settings
from streams.topics import ensure_topics
from streams.worker.ownership import partition_of
from support.broker import read_topic
from support.harness import Worker, wait_for
from support.runs import (SHORT_GROUP_TIMEOUTS, Feed, Model, Workers, after_a_dead_member, assigned_partitions,
                          beliefs_of, committed_to_end, episode_stream, episodes_of, kill, make_settings,
                          own_broker_for, read_events, users_by_partition, view_snapshot, visible_episodes, worker_env)

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.broker]

# ---------------------------------------------------------------- helpers


def open_client_sockets(port: int) -> int:
    """Client-side TCP sockets to 127.0.0.1:`port` still open (established, or
    the peer closed and this side has not yet read to the end and closed)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        columns = line.split()
        if int(columns[2].split(":")[1], 16) == port and columns[3] in ("01", "08"):
            count += 1
    return count


def read_topics(run, snapshot, settings, started: float):
    """Finish a run's record: the view it left and the three topics, as read afterwards."""
    run.snapshot = snapshot
    run.reflections = read_events(settings, settings.topic_reflections)
    run.requests = read_events(settings, settings.topic_requests)
    run.episodes_topic = read_events(settings, settings.topic_episodes)
    run.seconds = time.monotonic() - started
    return run


def unsettled(worker: Worker, users, per_user: int, cycles: int) -> dict:
    """What is not there yet: users whose episodes are not all visible, or whose
    cycles are not all asked for, done and in the view ({} when settled)."""
    missing = {}
    for u in users:
        stats = worker.stats(u)
        fresh = (worker.get(f"/v1/users/{u}/beliefs?limit=1") or {}).get("freshness", {})
        if stats.get("episodes") != per_user or stats.get("cycles") != cycles or not fresh.get("fresh"):
            missing[u] = {"episodes": stats.get("episodes"), "cycles": stats.get("cycles"),
                          "cycles_behind": fresh.get("cycles_behind")}
    return missing


def wait_settled(worker: Worker, users, per_user: int, cycles: int, timeout: float, what: str) -> None:
    last = {}

    def done() -> bool:
        last["missing"] = unsettled(worker, users, per_user, cycles)
        return not last["missing"]
    try:
        wait_for(done, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; not settled: {last.get('missing')}; worker log: {worker.tail(15)}") from None


def topic_duplicates(events: list[dict]) -> int:
    """Records beyond the first of each event id: at-least-once redeliveries."""
    return len(events) - len({e["event_id"] for e in events})


def assert_no_duplicate_beliefs(reflections: list[dict], snapshot: dict) -> dict:
    """No belief twice under two ids: on the topic, one reflection id per
    (user, cycle, text); in the view, one point per (user, cycle, text).
    Redelivered records are allowed only with the same ids."""
    created = [e for e in reflections if e["type"] == "ReflectionCreated"]
    ids_by_belief = collections.defaultdict(set)
    for e in created:
        ids_by_belief[(e["user_id"], e["cycle_id"], e["text"])].add(e["reflection_id"])
    twice = {k: v for k, v in ids_by_belief.items() if len(v) > 1}
    assert not twice, f"one belief published under several ids: {twice}"
    in_view = collections.Counter((p["user_id"], p["cycle_id"], p["text"])
                                  for beliefs in beliefs_of(snapshot).values() for p in beliefs.values())
    assert all(n == 1 for n in in_view.values()), [k for k, n in in_view.items() if n > 1]
    by_id = collections.Counter(e["reflection_id"] for e in created)
    return {"created_records": len(created), "created_distinct": len(by_id),
            "reflections_topic_duplicates": topic_duplicates(reflections)}


# ---------------------------------------------------------------- the crash scenario

PER_USER = 40
# 3.5 importance per five episodes: the 22nd episode of a user reaches 15.3 and
# fires its one cycle; the 18 after it sum to 12.6 and fire none. One cycle a
# user, on purpose: a cycle's window also holds the beliefs the accumulator
# has read from the reflections topic by then, and where a belief lands among
# the episodes of another topic depends on timing — after a restart, the
# accumulator may race through the backlog before a re-run cycle republishes.
# A second cycle per user would make the comparison with the no-crash run
# depend on that race, not on Reflect's correctness.
THRESHOLD, MIN_EPISODES, CYCLES_PER_USER = 15.0, 10, 1
RATE = 120.0  # episodes/s published: the stream outlasts the kill and the restart


@dataclass
class Run:
    name: str
    settings: Settings
    users: list[str]
    snapshot: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    reflections: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    episodes_topic: list = field(default_factory=list)
    acked: int = 0
    info: dict = field(default_factory=dict)
    asked: list = field(default_factory=list)  # (tool, user) of every model request
    answered: list = field(default_factory=list)
    seconds: float = 0.0


@pytest.fixture(scope="module")
def crash_broker(request, tmp_path_factory):
    """This module's own broker: one case pauses it."""
    yield from own_broker_for(request, tmp_path_factory, "crash-broker")


def crash_settings(broker, tmp: Path) -> Settings:
    # The shortest session brokers accept: after a SIGKILL the group waits the
    # session out before the restarted worker gets the partitions. Kafka and
    # noida-db refuse less than 6 s (group.min.session.timeout.ms) with
    # InvalidSessionTimeoutError; Tansu would take 3 s. noida-db also holds a
    # rebalance for the whole rebalance timeout when a member died, hence the
    # short one.
    return make_settings(broker.url, tmp / "data", threshold=THRESHOLD, min_episodes=MIN_EPISODES,
                         reasoner="anthropic", reasoner_retries=0, **SHORT_GROUP_TIMEOUTS)


def run_scenario(name: str, broker, tmp: Path, crash=None) -> Run:
    """Publish the stream at RATE while one worker processes it; `crash(worker,
    model, broker, feed)` kills it at its point and returns what it saw, then a
    second worker with the same settings finishes. Then the view is read from
    the data dir and the topics from the broker."""
    started = time.monotonic()
    tmp.mkdir(parents=True, exist_ok=True)
    settings = crash_settings(broker, tmp)
    users = users_by_partition(2, settings.partitions)
    asyncio.run(ensure_topics(settings))
    model, workers = Model(), Workers(tmp)
    run = Run(name, settings, users)
    try:
        worker = workers.start(settings, worker_env(model))
        feed = Feed(settings, episode_stream(users, PER_USER), RATE).start()
        if crash is not None:
            run.info = crash(worker, model, broker, feed)
            worker = workers.start(settings, worker_env(model))
        feed.join(60)
        wait_settled(worker, users, PER_USER, CYCLES_PER_USER, 90,
                     f"{name}: every episode visible and every cycle in the view")
        run.stats = {u: {k: worker.stats(u)[k] for k in ("episodes", "reflections", "pending_importance",
                                                         "high_salience", "cycles")} for u in users}
        run.acked = len(feed.acked)
        run.info["model_requests"] = len(model.asked)
        run.asked, run.answered = list(model.asked), list(model.answered)
    finally:
        workers.stop_all()
        model.close()
    return read_topics(run, view_snapshot(settings, users), settings, started)


@pytest.fixture(scope="module")
def baseline(crash_broker, tmp_path_factory) -> Run:
    return run_scenario("no crash", crash_broker, tmp_path_factory.mktemp("baseline"))


def belief_differences(run: Run, baseline: Run) -> dict:
    """Per user: belief ids only in one run, and fields that differ on shared ids."""
    mine, theirs = comparable(beliefs_of(run.snapshot)), comparable(beliefs_of(baseline.snapshot))
    out = {}
    for u in theirs:
        a, b = mine.get(u, {}), theirs[u]
        fields_ = {rid: {k: (a[rid][k], b[rid][k]) for k in a[rid] if a[rid][k] != b[rid][k]}
                   for rid in a.keys() & b.keys() if a[rid] != b[rid]}
        if a.keys() ^ b.keys() or fields_:
            out[u] = {"only_here": sorted(a.keys() - b.keys()), "only_in_reference": sorted(b.keys() - a.keys()),
                      "fields": fields_}
    return out


def comparable(beliefs: dict) -> dict:
    return {u: {rid: {k: p.get(k) for k in ("text", "evidence_ids", "depth", "importance", "confidence",
                                            "question", "cycle_id", "status", "occurred_at", "reasoner")}
                for rid, p in found.items()} for u, found in beliefs.items()}


def assert_same_as_baseline(run: Run, baseline: Run) -> dict:
    """What every crash case must end with; returns the figures it printed."""
    n = len(run.users) * PER_USER
    assert run.acked == n
    episodes = episodes_of(run.snapshot)
    # Every episode in the view exactly once: its point id is derived from
    # (user, episode id), and the counts per user are of distinct episodes.
    for u in run.users:
        assert sorted(episodes[u]) == sorted(f"{u}-{i}" for i in range(PER_USER)), u
        assert run.stats[u]["episodes"] == PER_USER
        assert all(p["status"] == "recorded" and p["text"] for p in episodes[u].values())
    assert {u: {e: (p["text"], p["importance"], p["occurred_at"]) for e, p in found.items()}
            for u, found in episodes.items()} == \
           {u: {e: (p["text"], p["importance"], p["occurred_at"]) for e, p in found.items()}
            for u, found in episodes_of(baseline.snapshot).items()}
    # Accumulators: the same sums, salience counts and cycles as the run without a crash.
    assert run.stats == baseline.stats
    figures = assert_no_duplicate_beliefs(run.reflections, run.snapshot)
    # The beliefs: the same ids, texts, evidence, depth and confidence. This is
    # exact: with one cycle a user (see THRESHOLD) nothing here depends on timing.
    assert not belief_differences(run, baseline)
    assert all(len(b) > 0 for b in beliefs_of(run.snapshot).values())  # the cycles made beliefs
    cycles = collections.Counter(e["cycle_id"] for e in run.reflections if e["type"] == "ReflectionCycleCompleted")
    assert sorted(cycles) == sorted(f"{u}:1" for u in run.users)
    figures.update(
        events_in=n, episodes_in_view=sum(len(e) for e in episodes.values()),
        episode_topic_records=len(run.episodes_topic), episode_topic_duplicates=topic_duplicates(run.episodes_topic),
        lost=n - sum(len(e) for e in episodes.values()),
        beliefs_in_view=sum(len(b) for b in beliefs_of(run.snapshot).values()),
        view_duplicates=0,  # asserted above: one point per episode id and per (user, cycle, text)
        cycles_completed_records=sum(cycles.values()), cycles_rerun=sum(cycles.values()) - len(cycles),
        request_topic_duplicates=topic_duplicates(run.requests), model_requests=run.info.get("model_requests"),
        seconds=round(run.seconds, 1))
    print(f"\n[{run.name}] " + ", ".join(f"{k}={v}" for k, v in {**figures, **run.info}.items()))
    return figures


def test_no_crash_run_is_the_reference(baseline):
    """The reference run itself: everything once, each user one cycle with beliefs."""
    assert_same_as_baseline(baseline, baseline)
    assert topic_duplicates(baseline.reflections) == 0 and topic_duplicates(baseline.requests) == 0


@after_a_dead_member
def test_sigkill_during_projection(crash_broker, tmp_path, baseline):
    total = len(baseline.users) * PER_USER

    def crash(worker, model, broker, feed):
        seen = wait_for(lambda: (v := visible_episodes(worker, baseline.users)) >= total * 0.4 and v,
                        60, "40% of the episodes visible")
        cycles = (worker.get("/v1/reasoner") or {}).get("cycles", {})
        kill(worker)
        return {"visible_at_kill": seen, "published_at_kill": len(feed.acked), "cycles_at_kill": cycles}

    run = run_scenario("SIGKILL during projection", crash_broker, tmp_path, crash)
    assert run.info["visible_at_kill"] < total  # the kill landed mid-stream
    assert_same_as_baseline(run, baseline)


@after_a_dead_member
def test_sigkill_during_a_reflection_cycle(crash_broker, tmp_path, baseline):
    def crash(worker, model, broker, feed):
        model.hold = "record_insights"  # the first cycle's insights call never returns before the kill
        wait_for(model.held.is_set, 60, "a cycle's insights call in flight")
        held = [k for k in model.asked if k[0] == "record_insights"][0]
        kill(worker)
        model.release.set()  # the held call answers into a closed socket
        return {"held_cycle_of": held[1], "published_at_kill": len(feed.acked)}

    run = run_scenario("SIGKILL during a cycle", crash_broker, tmp_path, crash)
    # The restarted worker ran the cycle again: its insights were asked again, and answered.
    held = ("record_insights", run.info["held_cycle_of"])
    assert run.asked.count(held) == 2 and run.answered.count(held) == 2  # the first answer went nowhere
    assert_same_as_baseline(run, baseline)


@after_a_dead_member
def test_sigkill_between_the_model_answer_and_the_publish(crash_broker, tmp_path, baseline):
    def crash(worker, model, broker, feed):
        model.before_answer = ("record_insights", broker.pause)  # the answer goes out; no ack can come back
        wait_for(lambda: ("record_insights" in {t for t, _ in model.answered})
                 and open_client_sockets(model.port) == 0, 60,
                 "the worker has read the model's answer (its connection closed)")
        user = [u for t, u in model.answered if t == "record_insights"][0]
        killed_at = time.time()
        kill(worker)
        broker.resume()
        return {"answered_cycle_of": user, "published_at_kill": len(feed.acked), "killed_at": killed_at}

    run = run_scenario("SIGKILL between answer and publish", crash_broker, tmp_path, crash)
    # The first life stores the outcome before it publishes (table cycle-outcomes), and no write of it
    # can be acknowledged while the broker is paused. Whether the write left the worker before the
    # kill is a race: if it did, the paused broker takes it from its socket once resumed and the
    # restart reuses it (asked once); if not, the restart cannot know the answer and asks again.
    user = run.info["answered_cycle_of"]
    stored = asyncio.run(read_topic(run.settings, f"{run.settings.app_id}-cycle-outcomes-changelog",
                                    lambda r: (orjson.loads(r.key), r.timestamp / 1000)))
    first_life_stored = any(key == user and at < run.info["killed_at"] for key, at in stored)
    assert run.answered.count(("record_insights", user)) == (1 if first_life_stored else 2), \
        (first_life_stored, run.answered)
    assert_same_as_baseline(run, baseline)


# ---------------------------------------------------------------- two workers, one consumer group
#
# What the project supports: the view is per process. open_view() gives a
# Qdrant Edge shard in <data_dir>/view, which one process owns (its WAL is
# locked), or a Qdrant server with --qdrant-url. No Qdrant server can be had
# here (no binary on PyPI or Debian; qdrant-client's local mode is
# in-process). So two workers run with two data dirs: each projects, and
# serves, the partitions it consumes, and a user's reads go to the worker
# that owns the user's partition. The union of the two views is compared
# with the one-worker view.
#
# Limit of that set-up, left alone: a worker that takes over a partition
# starts projecting at the committed offset, so its own view lacks what the
# other worker had projected of it. A cycle of a moved user after the
# hand-over then sees part of its window (the reflector waits 10 s for it,
# then goes on with what it sees) and can decide otherwise. The hand-over
# test below therefore kills a worker once the cycles have run and their
# requests are committed; one shared view (a Qdrant server) is what makes a
# hand-over before or during a cycle exact.


def split(workers, topic: str, partitions: int) -> list[set[int]] | None:
    """Each worker's partitions of `topic` once they are disjoint, cover all
    and every worker has some (and every worker is ready), else None."""
    if not all((w.get("/healthz") or {}).get("status") == "ok" for w in workers):
        return None
    sets = [assigned_partitions(w, topic) for w in workers]
    if all(sets) and sum(map(len, sets)) == partitions and set().union(*sets) == set(range(partitions)):
        return sets
    return None


def union_snapshot(settings_list, users) -> dict:
    merged = {u: {} for u in users}
    for settings in settings_list:
        for u, points in view_snapshot(settings, users).items():
            for pid, payload in points.items():
                assert merged[u].get(pid, payload) == payload, f"two views disagree on {pid}"
                merged[u][pid] = payload
    return merged


def run_group(name: str, broker, tmp: Path, kill_one: bool, rate: float = RATE) -> tuple[Run, dict]:
    """Two workers of one app (one consumer group), each with its own data
    dir and port; with `kill_one`, the second is SIGKILLed once every cycle
    has run, while the stream still flows, and the first finishes alone."""
    started = time.monotonic()
    tmp.mkdir(parents=True, exist_ok=True)
    base = crash_settings(broker, tmp)
    group = [replace(base, data_dir=str(tmp / f"data-{i}"), web_port=free_port()) for i in range(2)]
    users = users_by_partition(2, base.partitions)
    asyncio.run(ensure_topics(base))
    model, workers = Model(), Workers(tmp)
    run, info = Run(name, base, users), {}
    try:
        for s in group:
            workers.start(s, worker_env(model))
        a, b = workers.started
        sets = wait_for(lambda: split([a, b], base.topic_episodes, base.partitions), 60,
                        "the two workers to split the partitions")
        info["partitions"] = [sorted(x) for x in sets]
        owner = {u: a if partition_of(u, base.partitions) in sets[0] else b for u in users}
        info["users"] = [sorted(u for u in users if owner[u] is w) for w in (a, b)]
        feed = Feed(base, episode_stream(users, PER_USER), rate).start()
        if kill_one:
            b_users = [u for u in users if owner[u] is b]
            # Every cycle done (each user's 22nd episode fired it), the stream not yet over.
            wait_for(lambda: all(owner[u].stats(u).get("cycles") == 1 and
                                 (owner[u].get(f"/v1/users/{u}/beliefs?limit=1") or {})
                                 .get("freshness", {}).get("fresh") for u in users), 60, "every cycle done")
            # ... and committed: a request B ran but had not committed yet would
            # run again in A, over A's view, which lacks B's projection of it
            # (seen: 3 of 4 moved users got a belief with other evidence and
            # another id). That is the limit described above, not tested here.
            wait_for(lambda: all(committed_to_end(base, t) for t in (base.topic_requests, base.topic_reflections)),
                     30, "the cycles' requests and events committed by the group")
            info["published_at_kill"] = len(feed.acked)
            kill(b)
            killed_at = time.monotonic()
            wait_for(lambda: assigned_partitions(a, base.topic_episodes) == set(range(base.partitions))
                     and (a.get("/healthz") or {}).get("status") == "ok", 60,
                     "the survivor to take over every partition")
            info["takeover_s"] = round(time.monotonic() - killed_at, 1)
            owner = {u: a for u in users}
            info["moved_users"] = b_users
        feed.join(60)
        assert len(feed.acked) == len(users) * PER_USER
        # Settled: the accumulators (tables, recovered from their changelogs
        # by whoever owns the partition) counted every episode, and every
        # cycle is done and in a view. The view count is per worker, so the
        # episodes are checked in the union below.
        wait_for(lambda: all((st := owner[u].stats(u)).get("high_salience") == PER_USER and st.get("cycles") == 1
                             and (owner[u].get(f"/v1/users/{u}/beliefs?limit=1") or {})
                             .get("freshness", {}).get("fresh") for u in users), 90, f"{name}: settled")
        if not kill_one:
            wait_for(lambda: all(owner[u].stats(u).get("episodes") == PER_USER for u in users), 60,
                     "every episode in its owner's view")
        run.stats = {u: {k: owner[u].stats(u)[k] for k in ("pending_importance", "high_salience", "cycles")}
                     for u in users}
        run.acked = len(feed.acked)
        run.asked, run.answered = list(model.asked), list(model.answered)
    finally:
        workers.stop_all()
        model.close()
    return read_topics(run, union_snapshot(group, users), base, started), info


def assert_group_same_as_baseline(run: Run, info: dict, baseline: Run) -> None:
    figures = assert_no_duplicate_beliefs(run.reflections, run.snapshot)
    episodes = episodes_of(run.snapshot)
    for u in run.users:  # every episode once in the union of the views, as one worker holds them
        assert sorted(episodes[u]) == sorted(f"{u}-{i}" for i in range(PER_USER)), u
    assert {u: {e: (p["text"], p["status"]) for e, p in found.items()} for u, found in episodes.items()} == \
           {u: {e: (p["text"], p["status"]) for e, p in found.items()}
            for u, found in episodes_of(baseline.snapshot).items()}
    assert run.stats == {u: {k: s[k] for k in ("pending_importance", "high_salience", "cycles")}
                         for u, s in baseline.stats.items()}
    assert not belief_differences(run, baseline)
    n = len(run.users) * PER_USER
    figures.update(events_in=n, episodes_in_view=sum(len(e) for e in episodes.values()),
                   lost=n - sum(len(e) for e in episodes.values()),
                   beliefs_in_view=sum(len(b) for b in beliefs_of(run.snapshot).values()),
                   episode_topic_duplicates=topic_duplicates(run.episodes_topic),
                   request_topic_duplicates=topic_duplicates(run.requests), seconds=round(run.seconds, 1))
    print(f"\n[{run.name}] " + ", ".join(f"{k}={v}" for k, v in {**figures, **info}.items()))


def test_two_workers_split_the_partitions_and_together_make_the_one_worker_view(crash_broker, tmp_path, baseline):
    run, info = run_group("two workers", crash_broker, tmp_path, kill_one=False)
    assert all(info["partitions"]) and all(info["users"])  # each worker was assigned some partitions
    assert_group_same_as_baseline(run, info, baseline)


@after_a_dead_member
def test_one_of_two_workers_sigkilled_the_other_takes_over_and_finishes(crash_broker, tmp_path, baseline):
    # A slower stream: the kill waits for the cycles (at 55% of the stream)
    # and for their commit (Faust commits every 2.8 s), and must come before its end.
    run, info = run_group("two workers, one SIGKILLed", crash_broker, tmp_path, kill_one=True, rate=30.0)
    assert info["moved_users"] and info["published_at_kill"] < len(run.users) * PER_USER  # killed mid-stream
    assert_group_same_as_baseline(run, info, baseline)


# ---------------------------------------------------------------- no broker: the re-run itself

TEMPLATES = ("revert of PR {n}: the auth middleware broke login", "revert of PR {n}: auth token refresh failed",
             "revert of PR {n}: auth session cookie expired early", "lunch today was pasta number {n}")


def test_a_request_redelivered_after_its_beliefs_were_projected_adds_nothing(tmp_path):
    """A worker killed after publishing a cycle's beliefs, before committing its
    request, runs the cycle again once the beliefs are in the view. It used to
    cite its own first run's beliefs (they occur at the cycle's time) and add
    depth-2 beliefs with new ids that a run without the crash never makes."""
    view, embedder = EdgeView(tmp_path, "reflect", 384), HashingEmbedder()
    try:
        episodes = [EpisodeRecorded(user_id="al", episode_id=f"al-{i}", text=TEMPLATES[i % 4].format(n=i),
                                    importance=0.6, occurred_at=f"2026-01-01T00:00:{i:02d}Z") for i in range(12)]
        EpisodeProjector(view, embedder).apply(episodes)
        request = ReflectionRequested(user_id="al", cycle_id="al:1", why="threshold",
                                      occurred_at=episodes[-1].occurred_at)
        window = window_records(view, "al", [("episode", e.episode_id) for e in episodes])
        first = run_cycle(request, window, view, embedder, OfflineReasoner(), CycleConfig())
        assert [e for e in first if isinstance(e, ReflectionCreated)]
        ReflectionProjector(view, embedder).apply(first)
        again = run_cycle(request, window, view, embedder, OfflineReasoner(), CycleConfig())
        assert [e.TYPE for e in again] == ["ReflectionCycleCompleted"], [(e.TYPE, getattr(e, "depth", None))
                                                                        for e in again]
        assert again[-1].event_id == first[-1].event_id  # the audit record is a redelivery of the same id
    finally:
        view.close()


def test_resuming_an_active_flow_keeps_what_the_agents_have_queued():
    """The second flow resume of Faust's recovery cleared the agents' queues
    after their records were fetched: a worker restarted with a backlog ran one
    cycle and then sat idle (the SIGKILL cases above stalled in 2 runs of 3
    before streams/worker/app.py's fix). A resume of a suspended flow still clears."""
    from mode.utils.queues import FlowControlEvent, FlowControlQueue

    from streams.worker.patches import patch_flow_control_resume

    async def scenario() -> tuple[int, int]:
        patch_flow_control_resume()
        flow = FlowControlEvent(initially_suspended=True)
        queue = FlowControlQueue(flow_control=flow, clear_on_resume=True)
        flow.resume()
        queue.put_nowait("fetched during recovery")
        flow.resume()  # recovery's second resume: the flow is active already
        kept = queue.qsize()
        flow.suspend()  # a rebalance
        flow.resume()
        return kept, queue.qsize()
    assert asyncio.run(scenario()) == (1, 0)


