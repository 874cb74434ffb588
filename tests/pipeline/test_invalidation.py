"""Retraction-safe beliefs, without a broker: the invalidator and the
projectors over a real Qdrant Edge view, events handed from one to the next."""

from __future__ import annotations

import pytest

from processors.embedders import HashingEmbedder
from processors.invalidator import Invalidator, empty_state
from processors.projector import EpisodeProjector, ReflectionProjector, point_id
from processors.provenance import as_of, tree
from streams.adapters.view.edge import EdgeView
from schemas import (EpisodeRecorded, EpisodeRetracted, ErasureCompleted, ReflectionCreated,
                     ReflectionCycleCompleted, ReflectionInvalidated, ReflectionRequested, now)
from streams.http.routes.beliefs import live_beliefs


@pytest.fixture
def world(tmp_path):
    view, embedder = EdgeView(tmp_path, "reflect", 384), HashingEmbedder()
    episodes, beliefs = EpisodeProjector(view, embedder), ReflectionProjector(view, embedder)
    invalidator, state = Invalidator(view, citation_floor=2, max_depth=2), empty_state()

    class World:
        def episode(self, eid, text=None):
            episodes.apply([EpisodeRecorded(user_id="ann", episode_id=eid, text=text or f"episode {eid}",
                                            importance=0.5)])

        def belief(self, rid, evidence, depth=1, confidence=0.6, project=True, text_of=None):
            event = ReflectionCreated(user_id="ann", reflection_id=rid, cycle_id="ann:1",
                                      text=text_of or f"belief {rid}",
                                      evidence_ids=tuple(evidence), depth=depth, importance=0.5,
                                      confidence=confidence, reasoner="offline", prompt_version="v1",
                                      question="q?")
            if project:
                beliefs.apply([event])
            return self.flow(invalidator.on_belief(event, state)), event

        def retract(self, eid, reason="incorrect"):
            event = EpisodeRetracted(user_id="ann", episode_id=eid, reason=reason)
            episodes.apply([event])
            out, known = invalidator.on_retracted(event, state)
            return self.flow(out), known

        def flow(self, out):
            beliefs.apply([e for e in out if isinstance(e, ReflectionInvalidated)])
            return out

        def payload(self, rid):
            return view.get([point_id("reflection", "ann", rid)])[point_id("reflection", "ann", rid)]

        view_ = view
        projector = beliefs

    yield World()
    view.close()


def invalidated(out):
    return {e.reflection_id: e.status for e in out if isinstance(e, ReflectionInvalidated)}


def test_a_depth_two_belief_goes_invalid_when_the_beliefs_it_rests_on_do(world):
    for e in "abcd":
        world.episode(e)
    world.belief("b1", ["a", "b"])
    world.belief("b2", ["a", "c"])
    world.belief("top", ["b1", "b2"], depth=2)
    out, _ = world.retract("a")
    assert invalidated(out) == {"b1": "invalid", "b2": "invalid", "top": "invalid"}
    top = next(e for e in out if isinstance(e, ReflectionInvalidated) and e.reflection_id == "top")
    assert top.path[0] == "a" and top.path[-1] == "top" and len(top.path) == 3 and top.cause == "a"
    assert world.payload("top")["status"] == "invalid" and live_beliefs(world.view_, "ann", 10) == []


def test_three_pieces_of_evidence_survive_one_retraction_weakened_and_are_revalidated(world):
    for e in "abc":
        world.episode(e)
    world.belief("w", ["a", "b", "c"], confidence=0.6)
    out, _ = world.retract("a")
    assert invalidated(out) == {"w": "weakened"}
    [request] = [e for e in out if isinstance(e, ReflectionRequested)]
    assert (request.why, request.reflection_id, request.window_episode_ids) == ("revalidation", "w", ("b", "c"))
    payload = world.payload("w")
    assert payload["status"] == "live" and payload["confidence"] == pytest.approx(0.4)
    assert payload["lost_evidence_ids"] == ["a"]
    assert [b["reflection_id"] for b in live_beliefs(world.view_, "ann", 10)] == ["w"]  # still served
    out, _ = world.retract("b")  # a second loss leaves one: below the floor
    assert invalidated(out) == {"w": "invalid"} and not [e for e in out if isinstance(e, ReflectionRequested)]


def test_a_diamond_yields_one_invalidation_and_a_redelivery_none(world):
    for e in "ab":
        world.episode(e)
    world.belief("left", ["a", "b"])
    world.belief("right", ["a", "b"])
    world.belief("top", ["left", "right", "a"], depth=2)  # three paths from a to top
    out, _ = world.retract("a")
    assert sorted(e.reflection_id for e in out if isinstance(e, ReflectionInvalidated)) == ["left", "right", "top"]
    assert world.retract("a")[0] == []


def test_a_belief_published_after_the_retraction_is_decided_when_it_arrives(world):
    for e in "abc":
        world.episode(e)
    world.retract("a")
    out, _ = world.belief("late", ["a", "b"])  # its cycle ran while "a" was walked
    assert invalidated(out) == {"late": "invalid"}
    assert world.payload("late")["status"] == "invalid"
    world.belief("late2", ["b", "c"])
    out, _ = world.retract("b")
    assert invalidated(out) == {"late2": "invalid"}  # found in the view, where its writer put it first


def test_an_unknown_episode_is_a_no_op(world):
    assert world.retract("never-seen") == ([], False)


def test_as_of_before_the_retraction_still_shows_the_belief(world):
    for e in "ab":
        world.episode(e)
    world.belief("b", ["a", "b"])
    before = now()
    world.retract("a")
    payload = world.payload("b")
    assert payload["status"] == "invalid" and as_of(payload, now()) is None
    held = as_of(payload, before)
    assert held["status"] == "live" and held["confidence"] == 0.6 and held["text"] == "belief b"
    assert as_of(payload, "2000-01-01T00:00:00Z") is None  # not created yet


def test_erasure_takes_the_text_of_the_episode_and_of_every_belief_derived_from_it(world):
    for e, text in (("a", "SECRET-42 in the payroll export"), ("b", "b"), ("c", "c")):
        world.episode(e, text)
    world.belief("b1", ["a", "b", "c"])  # would only be weakened by an ordinary retraction
    world.belief("top", ["b1", "b"], depth=2)
    out, _ = world.retract("a", reason="erasure")
    assert invalidated(out) == {"b1": "invalid", "top": "invalid"}
    assert {e.reflection_id for e in out if isinstance(e, ReflectionRequested)} == {"b1"}  # re-derived from b, c
    for _, payload in world.view_.scroll("ann"):
        assert "SECRET" not in repr(payload)
        assert payload.get("kind") == "episode" or payload["status"] == "invalid" and "text" not in payload


def test_an_erasure_names_the_cycles_that_read_the_episode_or_a_belief_it_took(world):
    for e in "abc":
        world.episode(e)
    world.belief("b1", ["a", "b", "c"])
    world.belief("other", ["b", "c"])

    def cycle(cid, read):
        return ReflectionCycleCompleted(user_id="ann", cycle_id=cid, why="threshold", questions=("q?",), kept=0,
                                        dropped=0, duration_ms=1.0, outcome="empty", reasoner="offline",
                                        usage={"calls": 0, "input_tokens": 0, "output_tokens": 0}, read_ids=read)
    world.projector.apply([cycle("read-a", ("a", "b")), cycle("read-b1", ("b1", "c")),
                           cycle("read-neither", ("b", "c", "other"))])
    out, _ = world.retract("a", reason="erasure")
    [proof] = [e for e in out if isinstance(e, ErasureCompleted)]
    assert proof.cycles == ("read-a", "read-b1")


def test_erasing_an_episode_retracted_before_takes_the_text_the_first_retraction_left(world):
    for e in "abc":
        world.episode(e, f"SECRET-{e}")
    world.belief("w", ["a", "b", "c"], text_of="derived from SECRET-a")
    world.belief("x", ["a", "b"], text_of="derived from SECRET-a too")
    out, _ = world.retract("a")
    assert invalidated(out) == {"w": "weakened", "x": "invalid"} and "SECRET-a" in repr(world.payload("x"))
    out, _ = world.retract("a", reason="erasure")
    assert invalidated(out) == {"w": "invalid", "x": "invalid"}
    assert len({e.event_id for e in out}) == len(out)  # new ids: a subscriber that dedupes still sees them
    assert "SECRET-a" not in repr([p for _, p in world.view_.scroll("ann")])
    assert world.retract("a", reason="erasure")[0] == []  # and once is enough


def test_explain_shows_the_provenance_tree_with_each_status(world):
    for e in "abc":
        world.episode(e)
    world.belief("b1", ["a", "b"])
    world.belief("b2", ["b", "c", "a"])
    world.belief("top", ["b1", "b2"], depth=2)
    world.retract("a")

    def get(kind, rid):
        pid = point_id(kind, "ann", rid)
        return world.view_.get([pid]).get(pid)

    node = tree(get, "reflection", "top", 3)
    assert node["status"] == "invalid"  # b1 went invalid, b2 only weakened: one valid piece left
    b1, b2 = node["evidence"]
    assert (b1["status"], b2["status"]) == ("invalid", "live")
    assert [(c["id"], c["status"], c.get("lost", False)) for c in b1["evidence"]] == [
        ("a", "retracted", True), ("b", "recorded", False)]
