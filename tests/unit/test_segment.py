"""What a segment of the episodes log decides (processors/segment.py): pure."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, strategies as st

from processors.accumulator import Accumulator, Trigger, admit
from processors.segment import fold, segments
from schemas import (EpisodeRecorded, EpisodeRetracted, GateRequested, InvalidationRequested, ReflectionRequested,
                     UserForgotten)

TRIGGER = Trigger(threshold=3.0, min_episodes=2, salience_cut=0.5)


def ep(i: int, importance: float = 0.5, user: str = "u") -> EpisodeRecorded:
    return EpisodeRecorded(user_id=user, episode_id=f"{user}{i}", text=f"episode {i}", importance=importance,
                           occurred_at=f"2026-06-01T09:{i % 60:02d}:00Z")


def at(records, start: int = 0):
    return [(r, start + n) for n, r in enumerate(records)]


def fresh(segment):
    return {r.user_id: Accumulator() for r, _ in segment}


def requests(folded, user="u"):
    return [e for e in folded.asks.get(user, []) if isinstance(e, ReflectionRequested)]


def decided(events):
    """What a request decides: all but when the fold ran."""
    return [{k: v for k, v in e.to_dict().items() if k != "recorded_at"} for e in events]


def test_a_segment_folds_as_its_records_one_by_one_and_asks_at_the_firing_record():
    records = [ep(i) for i in range(13)] + [ep(i, 0.9, user="v") for i in range(5)]
    segment = at(records)
    folded = fold(fresh(segment), segment, {}, TRIGGER, gated=False)
    one_by_one, asked = Accumulator(), []
    for record in records[:13]:
        one_by_one, request = admit(one_by_one, record, TRIGGER)
        asked += [request] if request else []
    assert folded.states["u"] == replace(one_by_one, applied=12)
    assert [r.cycle_id for r in requests(folded)] == [r.cycle_id for r in asked] == ["u:1", "u:2"]
    assert [r.window_episode_ids for r in requests(folded)] == [r.window_episode_ids for r in asked]
    # Each at the offset of the episode that fired it: 6 episodes of 0.5 reach 3.0.
    assert [r.position for r in requests(folded)] == [5, 11]
    assert [r.cycle_id for r in requests(folded, "v")] == ["v:1"] and folded.states["v"].applied == 17


def test_a_redelivered_segment_decides_nothing_again():
    segment = at([ep(i) for i in range(8)])
    once = fold(fresh(segment), segment, {}, TRIGGER, gated=True)
    again = fold(once.states, segment, {}, TRIGGER, gated=True)
    assert once.asks and not again.asks and again.states == once.states
    assert again.redelivered == {"u": (7, list(range(8)))}
    # Only what comes after the state's offset counts.
    more = fold(once.states, segment + at([ep(8), ep(9)], 8), {}, TRIGGER, gated=False)
    assert more.redelivered["u"][1] == list(range(8)) and more.states["u"].episodes == 10


def test_an_episode_logged_before_is_counted_once_however_far_back():
    segment = at([ep(0), ep(1)], 40)
    folded = fold(fresh(segment), segment, {("u", "u0"): 3, ("u", "u1"): 41}, TRIGGER, gated=False)
    assert folded.again == [("u", "u0", 40, 3)]
    assert folded.states["u"].episodes == 1 and folded.states["u"].applied == 41



def test_a_retraction_is_forwarded_at_its_position_with_the_next_sequence():
    state = fold({"u": Accumulator()}, at([ep(0), ep(1)]), {}, TRIGGER, gated=False).states
    retraction = EpisodeRetracted(user_id="u", episode_id="u0", reason="wrong")
    folded = fold(state, [(retraction, 7)], {}, TRIGGER, gated=False)
    (invalidation,) = folded.asks["u"]
    assert isinstance(invalidation, InvalidationRequested) and invalidation.position == 7
    assert invalidation.sequence == state["u"].asked + 1 and folded.states["u"].asked == invalidation.sequence
    assert [r["id"] for r in folded.states["u"].recent] == ["u1"]


def test_a_forget_is_asked_at_its_position_and_resets_what_the_user_said():
    state = fold({"u": Accumulator()}, at([ep(i) for i in range(4)]), {}, TRIGGER, gated=False).states
    folded = fold(state, [(UserForgotten(user_id="u"), 9)], {}, TRIGGER, gated=False)
    (forget,) = folded.asks["u"]
    assert isinstance(forget, UserForgotten) and forget.position == 9 and forget.sequence == state["u"].asked + 1
    assert folded.states["u"].episodes == 0 and folded.states["u"].cycles == state["u"].cycles


def test_with_a_gate_on_each_run_goes_to_it_before_the_request_it_fired_and_at_the_segment_end():
    segment = at([ep(i) for i in range(8)])
    gated = fold(fresh(segment), segment, {}, TRIGGER, gated=True)
    kinds = [type(e).__name__ for e in gated.asks["u"]]
    assert kinds == ["GateRequested", "ReflectionRequested", "GateRequested"]
    runs = [e for e in gated.asks["u"] if isinstance(e, GateRequested)]
    assert [[x["id"] for x in r.episodes] for r in runs] == [[f"u{i}" for i in range(6)], ["u6", "u7"]]
    assert [r.sequence for r in runs] == [1, 2] and gated.states["u"].gate_runs == 2
    # The gates' runs are numbered apart: the requests are the same with the gates off.
    plain = fold(fresh(segment), segment, {}, TRIGGER, gated=False)
    assert decided(requests(plain)) == decided(requests(gated))
    assert all(isinstance(e, ReflectionRequested) for e in plain.asks["u"])


@given(st.lists(st.tuples(st.sampled_from("uv"), st.floats(0.1, 1.0)), min_size=1, max_size=40),
       st.integers(0, 40))
def test_a_segment_cut_in_two_asks_for_the_same_cycles(episodes, cut):
    """Where a batch ends depends on the broker; what the log asks for never does."""
    records = [ep(i, importance, user) for i, (user, importance) in enumerate(episodes)]
    segment = at(records)
    states = fresh(segment)
    whole = fold(states, segment, {}, TRIGGER, gated=False)
    first = fold(states, segment[:cut], {}, TRIGGER, gated=False)
    second = fold({**states, **first.states}, segment[cut:], {}, TRIGGER, gated=False)
    for user in states:
        assert decided(requests(whole, user)) == decided(requests(first, user) + requests(second, user))
        assert whole.states[user] == second.states.get(user, first.states.get(user))


def test_segments_cut_every_retraction_and_forget_apart():
    r, f = EpisodeRetracted(user_id="u", episode_id="u0", reason="x"), UserForgotten(user_id="u")
    batch = [(ep(0), 0), (ep(1), 1), (r, 2), (ep(2), 3), (f, 4), (r, 5), (ep(3), 6)]
    assert [[m for _, m in s] for s in segments(batch)] == [[0, 1], [2], [3], [4], [5], [6]]
