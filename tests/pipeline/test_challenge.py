"""The contradiction gate and the challenge verdict: the offline heuristic on
its labeled set, the gate's pure folds, and the polars → pandas story
through the worker's own pipelines in-process (tests/support/memory_worker.py, the
real Qdrant Edge view, the hashing embedder, the offline reasoner). The same
story on the real broker is tests/integration/test_challenge_flow.py.

    python -m pytest tests/pipeline/test_challenge.py -q
    python -m processors.challenge          # the labeled set's accuracy
"""

from __future__ import annotations

import asyncio
import functools
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from processors.challenge import (LABELED, bearings, closed, gather, judge_one, labeled_accuracy, offline_verdict,
                                  quorum_of)
from processors.embedders import HashingEmbedder
from streams.adapters.factory import make_embedder
from processors.reasoners import OfflineReasoner
from streams.adapters.view.edge import EdgeView
from streams.adapters.view.shared import SharedView
from schemas import ChallengeRequested, ReflectionChallenged, ReflectionCreated, ReflectionReinforced, parse_time
from streams.settings import Settings
from streams.worker.pipeline.policy import Backoff
from support.challenge_story import AGAIN, MIN_EPISODES, OTHER, PANDAS, POLARS, THRESHOLD, USER, spaced, story
from support.memory_worker import MemoryWorker, memory_runtime


# ------------------------------------------------------------------ the verdict


def test_the_offline_verdict_on_the_labeled_set():
    measured = labeled_accuracy(LABELED)
    # The figure the docs quote (processors/README.md): a heuristic, not a reading.
    assert measured["n"] >= 50 and set(measured["per_label"]) >= {"holds", "refined", "contradicted"}
    assert measured["accuracy"] >= 0.8, measured
    assert all(acc >= 0.6 for acc in measured["per_label"].values()), measured


def test_the_verdict_reads_choices_cues_and_subjects():
    belief, evidence = "Dana prefers polars over pandas.", POLARS[:3]
    assert judge_one(belief, evidence, PANDAS[0])[0] == "contradicted"  # back to X, no longer wants Y
    assert judge_one(belief, evidence, AGAIN[0])[0] == "holds"  # polars over pandas, again
    assert judge_one(belief, evidence, "Dana uses polars, except for plotting where pandas stays.")[0] == "refined"
    assert judge_one(belief, evidence, OTHER[0])[0] == "unrelated"  # only her name in common
    answer = offline_verdict(belief, evidence, [PANDAS[0], PANDAS[1], AGAIN[0]])
    assert (answer.verdict, answer.cited, answer.heuristic) == ("contradicted", (1, 2), True)
    assert answer.statement == "Changed: now pandas rather than polars."
    tie = offline_verdict(belief, evidence, [PANDAS[0], AGAIN[0], OTHER[0]])
    assert (tie.verdict, tie.cited) == ("holds", (2,))  # an even split supersedes nothing; unrelated ones don't count
    assert offline_verdict(belief, evidence, [AGAIN[0], AGAIN[1]]).statement == ""


# ------------------------------------------------------------------ the gate


def test_many_episodes_bearing_on_a_belief_make_one_challenge_at_the_quorum():
    episodes = [{"id": f"e{i}", "occurred_at": f"2026-03-02T1{i}:00:00Z"} for i in range(5)]
    scores = [{"b1": 0.9, "b2": 0.1}, {"b1": 0.5}, {"b1": 0.8, "b2": 0.7}, {"b1": 0.95}, {"b2": 0.9}]
    pending, used = gather((), episodes, scores, threshold=0.6, quorums={"b1": 3, "b2": 2})
    assert used == 4  # e3 brings b1 to three challengers: the challenges are asked there
    assert [(c.reflection_id, c.challenger_ids, c.similarity) for c in closed(pending)] == [
        ("b1", ("e0", "e2", "e3"), 0.95)]  # b2 waits for a second challenger
    again, used = gather(pending, episodes[:1], scores[:1], 0.6, {"b1": 3, "b2": 2})  # a redelivery counts once
    assert used == 1 and [p["by"] for p in again if p["id"] == "b1"] == [["e0", "e2", "e3"]]
    pending, used = gather(again, episodes[4:], scores[4:], 0.6, {"b1": 3, "b2": 2})
    assert [c.challenger_ids for c in closed(pending) if c.reflection_id == "b2"] == [("e2", "e4")]
    assert quorum_of({"support": 30}, 3) == 15 and quorum_of({"support": 40}, 3) == 16
    assert quorum_of({"evidence_ids": ["a", "b"]}, 3) == 3


def test_an_episode_bears_only_on_beliefs_held_when_it_happened():
    embed = HashingEmbedder().embed
    held = {"reflection_id": "old", "occurred_at": "2026-03-01T00:00:00Z", "evidence_ids": ["p1", "p2"]}
    later = {"reflection_id": "new", "occurred_at": "2026-03-09T00:00:00Z", "evidence_ids": ["p1", "p2"]}
    vectors = dict(zip(["p1", "p2"], embed(POLARS[:2])))
    episodes = [{"id": "c1", "occurred_at": "2026-03-05T00:00:00Z"}]
    [scores] = bearings(episodes, embed([PANDAS[0]]), [held, later], {}, vectors)
    assert list(scores) == ["old"]
    assert scores["old"] == pytest.approx(float(np.max(embed([PANDAS[0]]) @ embed(POLARS[:2]).T)), abs=1e-5)


# ------------------------------------------------------------------ the story, in-process


@functools.cache
def meaning():
    """The story is told in other words each time: grouping it takes an
    embedder that reads meaning (the hashing one only sees shared words)."""
    return make_embedder("minilm")


def run_story(tmp: Path, events, batch: int = 256, **overrides):
    async def go():
        settings = Settings.load(env={}, data_dir=str(tmp), threshold=THRESHOLD, min_episodes=MIN_EPISODES,
                                 projector_batch=batch, embedder="minilm", **{"challenge": "on", **overrides})
        view = SharedView(EdgeView(settings.view_dir, settings.view, meaning().dim))
        runtime = memory_runtime(settings, view, meaning(), OfflineReasoner(meaning()), Backoff(0.001, 0.01))
        await MemoryWorker(runtime).run(events)
        return runtime, view
    return asyncio.run(go())


def beliefs(view) -> dict[str, dict]:
    return {p["reflection_id"]: p for _, p in view.scroll(USER, kind="reflection")}


def logged(runtime, kind) -> list:
    return [e for e in runtime.outlets.reflections.events() if isinstance(e, kind)]


def challenges(runtime) -> list[ReflectionChallenged]:
    """The challenge cycles run, in log order: each one's audit record (the
    gates run them where they judge, in the requests pipeline, so no
    ChallengeRequested reaches the log)."""
    assert not [e for e in runtime.outlets.requests.events() if isinstance(e, ChallengeRequested)]
    return logged(runtime, ReflectionChallenged)


def test_contradicting_episodes_supersede_the_old_beliefs_with_a_successor_citing_them(tmp_path):
    runtime, view = run_story(tmp_path, story(PANDAS, "pandas"))
    held = beliefs(view)
    first = [p for p in held.values() if p["cycle_id"] == f"{USER}:1"]
    assert first and all("polars" in p["text"] for p in first)
    assert all(p["status"] == "superseded" for p in first), [(p["text"], p["status"]) for p in first]
    verdicts = {e.reflection_id: e for e in logged(runtime, ReflectionChallenged) if e.verdict == "contradicted"}
    for old in first:
        verdict = verdicts[old["reflection_id"]]
        assert verdict.heuristic and set(verdict.cited_ids) <= {f"pandas-{i}" for i in range(1, 11)}
        assert old.get("superseded_by") == verdict.successor_id and old["superseded_cause"] == list(verdict.cited_ids)
        successor = held[verdict.successor_id]
        assert successor["status"] == "live" and successor["text"] == "Changed: now pandas rather than polars."
        assert set(verdict.cited_ids) <= set(successor["evidence_ids"])  # and later challenges that held add more
    # One change, one successor: the other challenges of the same change name the one the first formed.
    [successor] = {verdicts[o["reflection_id"]].successor_id for o in first}
    assert held[successor]["supersedes"] in {o["reflection_id"] for o in first}
    # Within one batch of the contradicting episodes: the first of them, as many as the quorum, make the challenge.
    first_challenge = challenges(runtime)[0]
    quorum = quorum_of(held[first_challenge.reflection_id], 3)
    assert first_challenge.challenger_ids == tuple(f"pandas-{i}" for i in range(1, quorum + 1))
    live = [p for p in held.values() if p["status"] == "live"]
    assert live and not any(p["reflection_id"] in {o["reflection_id"] for o in first} for p in live)


def test_supporting_episodes_reinforce_and_supersede_nothing(tmp_path):
    runtime, view = run_story(tmp_path, story(AGAIN, "again"))
    verdicts = [e for e in logged(runtime, ReflectionChallenged)]
    assert verdicts and {e.verdict for e in verdicts} == {"holds"}, [(e.verdict, e.reason) for e in verdicts]
    assert all(p["status"] == "live" for p in beliefs(view).values())
    reinforced = [e for e in logged(runtime, ReflectionReinforced) if e.cycle_id.startswith(f"{USER}:challenge:")]
    assert reinforced and all(set(e.added_evidence_ids) <= {f"again-{i}" for i in range(1, 11)} for e in reinforced)
    assert not [e for e in logged(runtime, ReflectionCreated) if e.supersedes]


def test_unrelated_episodes_ask_no_challenge(tmp_path):
    runtime, view = run_story(tmp_path, story(OTHER, "other"))
    assert beliefs(view) and not challenges(runtime)


def test_the_story_in_batches_of_256_and_of_3_gives_the_same_beliefs(tmp_path):
    _, whole = run_story(tmp_path / "whole", story(PANDAS, "pandas"))
    _, small = run_story(tmp_path / "small", story(PANDAS, "pandas"), batch=3)
    keys = ("text", "status", "evidence_ids", "cycle_id", "superseded_by", "supersedes", "confidence", "support")
    assert {r: {k: p.get(k) for k in keys} for r, p in beliefs(whole).items()} == \
           {r: {k: p.get(k) for k in keys} for r, p in beliefs(small).items()}


def test_the_daily_budget_and_the_switch_bound_the_challenges(tmp_path):
    runtime, _ = run_story(tmp_path / "budget", story(PANDAS, "pandas"), challenge_daily=1)
    asked = challenges(runtime)
    assert len(asked) == 1  # the ten episodes fall on one day of valid time
    runtime, view = run_story(tmp_path / "off", story(PANDAS, "pandas"), challenge="off")
    assert not challenges(runtime) and all(p["status"] == "live" for p in beliefs(view).values())


# ------------------------------------------------------------------ staleness


def test_a_belief_goes_stale_at_the_horizon_in_valid_time_and_comes_back_on_fresh_support(tmp_path):
    from schemas import ReflectionStaled
    events = story([], "none") + spaced(OTHER, "other", 22) + spaced(AGAIN[:8], "again", 40)
    runtime, view = run_story(tmp_path / "whole", events, stale_after_days=30)
    staled = [e for e in logged(runtime, ReflectionStaled)]
    gone = [e for e in staled if e.stale]
    # What must go stale, by the definition applied to the state just before other-9: every live belief
    # whose newest support is over 30 days older than other-9 (day 31), the first cycle's among them (their
    # newest support: polars-8, 03-02 17:00; + 30 days is 04-01 17:00, after other-8 at 04-01 09:00).
    cut = next(i for i, e in enumerate(events) if getattr(e, "episode_id", None) == "other-9")
    _, before = run_story(tmp_path / "before", events[:cut], stale_after_days=30)
    horizon = parse_time("2026-04-02T09:00:00Z") - timedelta(days=30)
    due = {r for r, p in beliefs(before).items() if p["status"] == "live" and parse_time(p["supported_at"]) < horizon}
    first = {r for r, p in beliefs(view).items() if p["cycle_id"] == f"{USER}:1"}
    went = {e.reflection_id for e in gone}
    assert first <= due and went == due
    assert {e.cause for e in gone} == {"other-9"} and {e.occurred_at for e in gone} == {"2026-04-02T09:00:00Z"}
    # Revalidated: a challenge by the user's recent episodes newer than its support, up to the cause.
    revalidations = [r for r in challenges(runtime) if r.cycle_id.startswith(f"{USER}:refresh:")]
    assert {r.reflection_id for r in revalidations} == went
    assert all(r.challenger_ids[-1] == "other-9" for r in revalidations)
    back = [e for e in staled if not e.stale]
    assert back and {e.reflection_id for e in back} <= went  # fresh support (day 40 on) brought them back
    held = beliefs(view)
    assert all(held[e.reflection_id]["status"] == "live" for e in back)
    assert all(held[r]["status"] == "stale" for r in went - {e.reflection_id for e in back})
    _, small = run_story(tmp_path / "small", events, batch=3, stale_after_days=30)  # a replay in other batches
    keys = ("status", "supported_at", "stale_at", "refreshed_at", "evidence_ids", "support")
    assert {r: {k: p.get(k) for k in keys} for r, p in held.items()} == \
           {r: {k: p.get(k) for k in keys} for r, p in beliefs(small).items()}


def test_challenges_get_half_of_a_token_budget_and_never_starve_reflection_cycles(tmp_path):
    from datetime import datetime, timezone

    import anthropic

    from support.messages_api import MessagesServer, OfflineModel
    from streams.adapters.anthropic import AnthropicReasoner
    from processors.guard import Spend, day_of
    from schemas import ReflectionCycleCompleted

    server = MessagesServer(OfflineModel(meaning()))
    try:
        async def go():
            settings = Settings.load(env={}, data_dir=str(tmp_path), threshold=THRESHOLD, min_episodes=MIN_EPISODES,
                                     user_daily_tokens=100_000, challenge="on", embedder="minilm")
            view = SharedView(EdgeView(settings.view_dir, settings.view, meaning().dim))
            client = anthropic.Anthropic(api_key="k", base_url=server.url, max_retries=0, timeout=5)
            runtime = memory_runtime(settings, view, meaning(), AnthropicReasoner(client, "claude-haiku-4-5"),
                                     Backoff(0.001, 0.01))
            today = day_of(datetime.now(timezone.utc))  # budgets are per UTC day of the wall clock
            # Past half the day's tokens.
            runtime.tables.spend.data[f"user:{USER}"] = Spend().charged(today, 60_000, "earlier-cycle").to_dict()
            await MemoryWorker(runtime).run(story(PANDAS, "pandas"))
            return runtime
        runtime = asyncio.run(go())
    finally:
        server.close()
    challenged = logged(runtime, ReflectionChallenged)
    assert challenged and {(e.outcome, e.usage["calls"]) for e in challenged} == {("refused", 0)}
    assert "daily tokens" in challenged[0].error
    cycles = logged(runtime, ReflectionCycleCompleted)
    assert cycles and {c.outcome for c in cycles} == {"ok"}  # the reflection cycles still ran
