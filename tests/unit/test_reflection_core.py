"""The reflection loop's pure core: trigger, rerank, citation remapping, offline reasoner."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from hypothesis import given, strategies as st

from processors.accumulator import WINDOW, Accumulator, Trigger, admit
from processors.reflection import Candidate, Insight, judge, reflection_id, rerank
from schemas import EpisodeRecorded, EpisodeRetracted, ReflectionRequested, UserForgotten, decode

NOW = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)


def ep(i: int, importance: float = 0.6, user: str = "u") -> EpisodeRecorded:
    return EpisodeRecorded(user_id=user, episode_id=f"e{i}", text=f"episode {i}", importance=importance)


def feed(acc, events, trigger):
    requests = []
    for e in events:
        acc, request = admit(acc, e, trigger)
        if request:
            requests.append(request)
    return acc, requests


def test_no_cycle_below_the_high_salience_floor_however_much_importance():
    trigger = Trigger(threshold=15.0, min_episodes=50, salience_cut=0.5)
    acc, requests = feed(Accumulator(), [ep(i, 0.9) for i in range(49)], trigger)
    assert requests == [] and acc.pending > 15 and acc.high_salience == 49
    acc, requests = feed(acc, [ep(49, 0.9)], trigger)
    assert len(requests) == 1 and acc.pending == 0.0 and acc.cycles == 1


def test_exactly_one_cycle_when_the_sum_crosses_and_then_a_fresh_sum():
    trigger = Trigger(threshold=3.0, min_episodes=2, salience_cut=0.5)
    acc, requests = feed(Accumulator(), [ep(i, 0.5) for i in range(6)], trigger)
    assert [r.cycle_id for r in requests] == ["u:1"] and acc.pending == 0.0
    acc, requests = feed(acc, [ep(i, 0.5) for i in range(6, 11)], trigger)
    assert requests == [] and acc.pending == 2.5
    acc, requests = feed(acc, [ep(11, 0.5)], trigger)
    assert [r.cycle_id for r in requests] == ["u:2"] and requests[0].why == "threshold"


def test_redelivered_episodes_are_not_counted_twice():
    trigger = Trigger(threshold=100, min_episodes=1)
    once, _ = feed(Accumulator(), [ep(i) for i in range(10)], trigger)
    twice, _ = feed(once, [ep(i) for i in range(10)], trigger)
    assert twice == once and twice.episodes == 10


def test_recent_window_is_bounded_and_forgets_retractions():
    trigger = Trigger(threshold=1e9, min_episodes=1)
    acc, _ = feed(Accumulator(), [ep(i) for i in range(WINDOW + 20)], trigger)
    assert len(acc.recent) == WINDOW and acc.recent[0]["id"] == "e20"
    acc, _ = feed(acc, [EpisodeRetracted(user_id="u", episode_id="e50")], trigger)
    ids = [r["id"] for r in acc.recent]
    assert ids[-1] == f"e{WINDOW + 19}" and "e50" not in ids and len(ids) == WINDOW - 1
    assert Accumulator.from_dict(acc.to_dict()) == acc


def cand(i: int, sim: float, imp: float = 0.5, hours: float = 0, depth: int = 0) -> Candidate:
    at = (NOW - timedelta(hours=hours)).isoformat().replace("+00:00", "Z")
    return Candidate(f"c{i}", "episode", f"text {i}", imp, at, depth, sim)


def test_rerank_weighs_recency_importance_and_similarity():
    pool = [cand(1, 0.9, 0.1, 500), cand(2, 0.5, 0.9, 1), cand(3, 0.1, 0.1, 900), cand(4, 0.8, 0.8, 2)]
    assert [c.id for c in rerank(pool, NOW, k=2)] == ["c4", "c2"]
    from processors.reflection import Weights
    only_sim = Weights(recency=0, importance=0, similarity=1)
    assert [c.id for c in rerank(pool, NOW, k=4, weights=only_sim)] == ["c1", "c4", "c2", "c3"]
    assert rerank([], NOW, 3) == []


def test_judge_remaps_ignores_out_of_range_and_enforces_floor_and_depth():
    evidence = [cand(1, 0.9), cand(2, 0.8), cand(3, 0.7, depth=1), cand(4, 0.6, depth=2)]
    insights = [
        Insight("valid", (1, 2)),
        Insight("single citation", (1,)),
        Insight("out of range only", (0, 5, 99)),
        Insight("one valid plus junk", (2, 42, -1)),
        Insight("depth two", (1, 3)),
        Insight("too deep", (3, 4)),
        Insight("duplicate numbers", (2, 2)),
    ]
    verdict = judge("u", "u:1", insights, evidence, citation_floor=2, max_depth=2)
    assert [(b.text, [c.id for c in b.evidence], b.depth) for b in verdict.kept] == [
        ("valid", ["c1", "c2"], 1), ("depth two", ["c1", "c3"], 2)]
    assert len(verdict.dropped) == 5
    assert verdict.kept[0].reflection_id == reflection_id("u", "u:1", ["c2", "c1"])


@given(st.lists(st.lists(st.integers(min_value=-5, max_value=20), max_size=6), max_size=6))
def test_judge_never_cites_outside_the_evidence_shown(citation_lists):
    evidence = [cand(i, 0.5) for i in range(1, 9)]
    verdict = judge("u", "u:1", [Insight(f"i{n}", tuple(c)) for n, c in enumerate(citation_lists)], evidence)
    shown = {c.id for c in evidence}
    for belief in verdict.kept:
        assert len(belief.evidence) >= 2 and {c.id for c in belief.evidence} <= shown


def test_a_request_carries_the_window_that_fired_it():
    trigger = Trigger(threshold=3.0, min_episodes=2, salience_cut=0.5)
    acc, _ = feed(Accumulator(), [ep(i, 0.1) for i in range(4)], trigger)
    acc, [request] = feed(acc, [ep(i, 0.9) for i in range(4, 7)], trigger)
    assert request.window_episode_ids == tuple(f"e{i}" for i in range(7))
    assert request.window_reflection_ids == ()
    assert decode(request.encode()) == request  # within its contract


def manual(cycle: str) -> ReflectionRequested:
    return ReflectionRequested(user_id="u", cycle_id=f"u:manual:{cycle}", why="manual",
                               occurred_at="2026-12-01T12:00:00Z")


def test_every_request_gets_the_user_s_next_sequence_in_stream_order():
    trigger = Trigger(threshold=3.0, min_episodes=2, salience_cut=0.5)
    acc, requests = feed(Accumulator(), [ep(0, 0.9), ep(1, 0.9), manual("a"), ep(2, 0.9), ep(3, 0.9)], trigger)
    assert [(r.why, r.sequence) for r in requests] == [("manual", 1), ("threshold", 2)]
    assert requests[0].window_episode_ids == ("e0", "e1")  # the window as of its place in the stream
    assert acc.asked == 2 and acc.cycles == 1 and acc.pending == 0.0
    assert decode(requests[0].encode()) == requests[0]


def test_a_manual_request_leaves_the_pending_sum_and_is_forwarded_once():
    trigger = Trigger(threshold=100, min_episodes=1)
    acc, _ = feed(Accumulator(), [ep(0, 0.9)], trigger)
    again, requests = feed(acc, [manual("a"), manual("a")], trigger)
    assert len(requests) == 1 and again.pending == acc.pending and again.asked == 1
    assert Accumulator.from_dict(again.to_dict()) == again


def test_a_forget_resets_what_the_user_said_but_not_the_numbering():
    trigger = Trigger(threshold=3.0, min_episodes=2, salience_cut=0.5)
    acc, requests = feed(Accumulator(), [ep(i, 0.5) for i in range(8)], trigger)
    acc, forwarded = admit(replace(acc, applied=41), UserForgotten(user_id="u"), trigger)
    assert isinstance(forwarded, UserForgotten) and forwarded.sequence == len(requests) + 1
    assert (acc.recent, acc.pending, acc.episodes, acc.high_salience) == ((), 0.0, 0, 0)
    assert (acc.asked, acc.cycles, acc.applied) == (len(requests) + 1, len(requests), 41)
    acc, again = feed(acc, [ep(i, 0.5) for i in range(100, 106)], trigger)
    # A new life: counted from nothing, with cycle ids and sequences no earlier request had.
    assert [r.cycle_id for r in again] == [f"u:{len(requests) + 1}"] and again[0].sequence == acc.asked
    assert again[0].window_episode_ids == tuple(f"e{i}" for i in range(100, 106))
