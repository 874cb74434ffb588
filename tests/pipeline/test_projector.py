"""The projector's pure core and its effect on a real view."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from processors.accumulator import Accumulator, Trigger
from processors.embedders import HashingEmbedder
from processors.projector import (EpisodeProjector, ReflectionProjector, episode_point, first_logged, forgotten_payload,
                                  forgotten_point, plan_episodes, point_id)
from processors.ports import GONE, POSITION, ViewPoint
from streams.adapters.view.edge import EdgeView
from processors.segment import fold
from schemas import (EpisodeRecorded, EpisodeRetracted, ErasureCompleted, ReflectionChallenged,
                     ReflectionCreated, UserForgotten)


def rec(eid: str, text: str = "t", user: str = "u") -> EpisodeRecorded:
    return EpisodeRecorded(user_id=user, episode_id=eid, text=text, importance=0.5)


def ret(eid: str, user: str = "u", reason: str = "incorrect") -> EpisodeRetracted:
    return EpisodeRetracted(user_id=user, episode_id=eid, reason=reason)


def test_point_ids_are_deterministic_and_scoped_by_user_and_kind():
    assert point_id("episode", "u", "e1") == point_id("episode", "u", "e1")
    assert len({point_id("episode", "u", "e1"), point_id("episode", "v", "e1"),
                point_id("reflection", "u", "e1")}) == 3


def test_last_record_wins_and_retraction_is_terminal_in_any_order():
    plan = plan_episodes([rec("a", "old"), rec("a", "new"), rec("b"), ret("b")], retracted=set())
    assert [(e.episode_id, e.text) for e in plan.upserts] == [("a", "new")]
    assert [e.episode_id for e in plan.retractions] == ["b"]
    plan = plan_episodes([ret("b"), rec("b")], retracted=set())
    assert plan.upserts == [] and [e.episode_id for e in plan.retractions] == ["b"]


def test_already_retracted_points_are_left_alone():
    gone = {episode_point(ret("a"))}
    plan = plan_episodes([rec("a"), ret("a"), rec("c")], retracted=gone)
    assert [e.episode_id for e in plan.upserts] == ["c"] and plan.retractions == []


events = st.lists(st.tuples(st.sampled_from(["rec", "ret"]), st.sampled_from("abcd"), st.sampled_from("uv")),
                  max_size=30)


def build(spec):
    return [rec(e, f"{e}-{i}", u) if kind == "rec" else ret(e, u) for i, (kind, e, u) in enumerate(spec)]


@given(events)
def test_batching_does_not_change_the_final_view(spec):
    """Applying a stream in one batch or one event at a time gives the same view."""
    stream = build(spec)

    def fold(batches):
        view: dict[str, tuple[str, str | None]] = {}
        for batch in batches:
            retracted = {p for p, (status, _) in view.items() if status == "retracted"}
            plan = plan_episodes(batch, retracted)
            for e in plan.upserts:
                view[episode_point(e)] = ("recorded", e.text)
            for e in plan.retractions:
                view[episode_point(e)] = ("retracted", None)
        return view

    assert fold([stream]) == fold([[e] for e in stream])
    assert fold([stream]) == fold([stream, stream])  # redelivery of everything changes nothing


@pytest.fixture
def projector(tmp_path):
    view = EdgeView(tmp_path, "reflect", 384)
    yield EpisodeProjector(view, HashingEmbedder())
    view.close()


def test_apply_projects_payload_and_retraction_leaves_a_tombstone(projector):
    projector.apply([rec("a", "alpha"), rec("b", "beta"), ret("z"), rec("c", "gamma")], [0, 1, 2, 3])
    projector.apply([ret("a"), rec("z", "must not appear"), ret("c", reason="erasure")], [4, 5, 6])
    view = projector.view
    a, b, c, z = (view.get([episode_point(ret(e))])[episode_point(ret(e))] for e in "abcz")
    assert b == {"user_id": "u", "kind": "episode", "episode_id": "b", "text": "beta", "importance": 0.5,
                 "occurred_at": b["occurred_at"], "recorded_at": b["recorded_at"], "status": "recorded",
                 "depth": 0, POSITION: 1}
    assert a["status"] == c["status"] == z["status"] == "retracted" and "text" not in z
    # Retracted as incorrect, it keeps its text for the cycles asked before the retraction (GONE);
    # erased, until its walk (which runs after them) proves it took it.
    assert a["text"] == "alpha" and (a[POSITION], a[GONE]) == (0, 4) and c[GONE] == 6 and c["text"] == "gamma"
    assert view.count("u", status="recorded") == 1


def test_two_users_episodes_of_one_id_are_each_counted_as_first_logged(projector):
    """An episode id is its user's: another user's episode of that id,
    logged earlier, is not this one logged again (an agent numbering each
    user's episodes)."""
    theirs, mine = rec("e1", "theirs", user="v"), rec("e1", "mine", user="u")
    segment = [(theirs, 10), (mine, 11)]
    projector.apply([r for r, _ in segment], [at for _, at in segment])
    first = first_logged(projector.view, [r for r, _ in segment])
    folded = fold({"u": Accumulator(), "v": Accumulator()}, segment, first, Trigger(), gated=True)
    assert folded.again == [] and folded.states["u"].episodes == folded.states["v"].episodes == 1
    gates = {user: [e["position"] for e in asks[0].episodes] for user, asks in folded.asks.items()}
    assert gates == {"v": [10], "u": [11]}  # each its own episode's position


def proof_of(erasure: EpisodeRetracted) -> ErasureCompleted:
    return ErasureCompleted(user_id=erasure.user_id, erasure_id=erasure.event_id, episode_id=erasure.episode_id,
                            episodes=(erasure.episode_id,), beliefs=())


def text_of(view, episode: str):
    return view.get([episode_point(ret(episode))])[episode_point(ret(episode))].get("text")


def test_an_erasure_takes_the_text_an_earlier_retraction_left_once_its_walk_is_done(projector):
    erasure = ret("a", reason="erasure")
    projector.apply([rec("a", "alpha")], [0])
    projector.apply([ret("a")], [1])
    projector.apply([erasure], [2])
    assert text_of(projector.view, "a") == "alpha"  # for the cycles asked before the erasure
    ReflectionProjector(projector.view, HashingEmbedder()).apply([proof_of(erasure)])
    assert text_of(projector.view, "a") is None


@pytest.mark.parametrize("together", [False, True], ids=["apart", "together"])
def test_a_replay_that_reads_the_proof_first_never_holds_the_erased_text(projector, together):
    """A rebuild reads `reflections` and `episodes` side by side: an erasure's
    proof may come before the episode it took. Nothing brings the text back."""
    erasure = ret("a", reason="erasure")
    ReflectionProjector(projector.view, HashingEmbedder()).apply([proof_of(erasure)])
    if together:
        projector.apply([rec("a", "alpha"), erasure], [0, 1])
    else:
        projector.apply([rec("a", "alpha")], [0])
        assert text_of(projector.view, "a") == "alpha"  # the erasure is not read yet: nor is it served
        projector.apply([erasure], [1])
    payload = projector.view.get([episode_point(erasure)])[episode_point(erasure)]
    assert "text" not in payload and payload["status"] == "retracted"


def test_the_view_does_not_depend_on_where_batches_end(tmp_path):
    """A rebuild replays in other batches than the live run: same view."""
    events = [EpisodeRecorded(user_id="ann", episode_id="e1", text="first", importance=0.5, source="chat"),
              EpisodeRecorded(user_id="ann", episode_id="e2", text="second", importance=0.5),
              EpisodeRetracted(user_id="ann", episode_id="e1"),
              EpisodeRetracted(user_id="ann", episode_id="e3"),
              EpisodeRecorded(user_id="ann", episode_id="e3", text="late", importance=0.5)]
    views = []
    for name, batches in (("one", [events]), ("each", [[e] for e in events])):
        view = EdgeView(tmp_path / name, "reflect", 384)
        projector = EpisodeProjector(view, HashingEmbedder())
        for batch in batches:
            projector.apply(batch)
        views.append(dict(view.scroll("ann")))
        view.close()
    one, each = views
    assert one == each
    assert {p["episode_id"] for p in one.values() if p["status"] == "retracted"} == {"e1", "e3"}


def test_a_forget_replayed_drops_the_users_episodes_where_it_was_logged(projector):
    view = projector.view
    belief = point_id("reflection", "u", "r1")  # a new life's belief, which a replay may project first
    view.upsert([ViewPoint(belief, None, {"user_id": "u", "kind": "reflection", "reflection_id": "r1"})])
    projector.apply([rec("a", "old life"), rec("b", "theirs", user="v"), rec("c", "old too"),
                     UserForgotten(user_id="u"), rec("d", "new life")], [0, 1, 2, 3, 4])
    assert {p["episode_id"] for _, p in view.scroll("u", kind="episode")} == {"d"}
    assert view.get([belief]) and [p["text"] for _, p in view.scroll("v", kind="episode")] == ["theirs"]
    # A batch read before the forget and projected after it brings nothing back.
    projector.apply([rec("e", "opened before the forget"), rec("f", "after")], [2, 5])
    assert {p["episode_id"] for _, p in view.scroll("u", kind="episode")} == {"d", "f"}


def test_the_live_projector_leaves_a_forget_to_the_users_request_order(tmp_path):
    view = EdgeView(tmp_path, "reflect", 384)
    try:
        live = EpisodeProjector(view, HashingEmbedder(), forget_now=False)
        live.apply([rec("a", "said before"), UserForgotten(user_id="u"), rec("b", "said after")], [0, 1, 2])
        assert {p["episode_id"] for _, p in view.scroll("u", kind="episode")} == {"a", "b"}
    finally:
        view.close()


def test_beliefs_read_before_a_forget_and_projected_after_are_not_kept(tmp_path):
    view = EdgeView(tmp_path, "reflect", 384)
    try:
        view.upsert([ViewPoint(forgotten_point("u"), None,
                               forgotten_payload(UserForgotten(user_id="u"), before=9, reflections_before=5))])

        def belief(rid: str, user: str = "u") -> ReflectionCreated:
            return ReflectionCreated(user_id=user, reflection_id=rid, cycle_id="c", text=f"belief {rid}",
                                     evidence_ids=("e1",), depth=1, importance=0.5, confidence=0.6,
                                     reasoner="offline", prompt_version="v")
        proof = ErasureCompleted(user_id="u", erasure_id="forget:1", scope="user", episodes=(), beliefs=(), points=3)
        ReflectionProjector(view, HashingEmbedder()).apply(
            [belief("old"), belief("theirs", user="v"), proof, belief("new")], [3, 4, 4, 6])
        assert {p["reflection_id"] for _, p in view.scroll("u", kind="reflection")} == {"new"}
        assert view.count("v", kind="reflection") == 1 and view.count("u", kind="erasure") == 1
    finally:
        view.close()


def test_a_forgets_proof_replayed_drops_the_beliefs_before_it_not_after(tmp_path):
    view = EdgeView(tmp_path, "reflect", 384)
    try:
        def belief(rid: str, user: str = "u") -> ReflectionCreated:
            return ReflectionCreated(user_id=user, reflection_id=rid, cycle_id="c", text=f"belief {rid}",
                                     evidence_ids=("e1",), depth=1, importance=0.5, confidence=0.6,
                                     reasoner="offline", prompt_version="v")
        proof = ErasureCompleted(user_id="u", erasure_id="forget:1", scope="user", episodes=(), beliefs=(), points=1)
        events = [belief("old"), belief("theirs", user="v"), proof, belief("new")]
        ReflectionProjector(view, HashingEmbedder(), erase_now=False).apply(events)
        assert view.count("u", kind="reflection") == 2  # the live pipeline's forget dropped them already
        ReflectionProjector(view, HashingEmbedder()).apply(events)
        assert {p["reflection_id"] for _, p in view.scroll("u", kind="reflection")} == {"new"}
        assert view.count("v", kind="reflection") == 1 and view.count("u", kind="erasure") == 1
    finally:
        view.close()


def test_an_erasures_proof_replayed_onto_an_older_copy_takes_the_episodes_text(projector):
    projector.apply([rec("a", "alpha"), rec("b", "beta")], [0, 1])  # a copy taken before the walk stripped a
    proof = ErasureCompleted(user_id="u", erasure_id="x", episode_id="a", episodes=("a",), beliefs=())
    view, pid = projector.view, episode_point(rec("a"))
    ReflectionProjector(view, HashingEmbedder(), erase_now=False).apply([proof])
    assert view.get([pid])[pid]["text"] == "alpha"  # live: the walk strips it, before the proof
    ReflectionProjector(view, HashingEmbedder()).apply([proof])
    assert "text" not in view.get([pid])[pid] and view.vectors([pid]) == {}
    assert view.get([episode_point(rec("b"))])[episode_point(rec("b"))]["text"] == "beta"


def test_a_challenge_cycle_is_found_by_the_belief_and_the_challengers_it_read(tmp_path):
    view = EdgeView(tmp_path, "reflect", 384)
    try:
        def challenge(cycle: str, reason: str | None) -> ReflectionChallenged:
            return ReflectionChallenged(user_id="u", cycle_id=cycle, reflection_id="r1", challenger_ids=("e7", "e8"),
                                        outcome="ok", reasoner="anthropic", usage={}, duration_ms=1.0,
                                        verdict="holds", reason=reason)
        # The second one's key is gone (what a replay reads after an erasure): nothing left to find it by.
        ReflectionProjector(view, HashingEmbedder()).apply([challenge("c1", "why it holds"), challenge("c2", None)])
        for read in ("r1", "e8"):
            assert [p["cycle_id"] for _, p in view.scroll("u", kind="cycle", read_ids=read)] == ["c1"]
    finally:
        view.close()
