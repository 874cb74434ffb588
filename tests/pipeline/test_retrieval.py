"""Recall over a real Qdrant Edge view: the router, both routes, the fallback,
and tenant isolation (results and the evidence attached to them)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from processors.embedders import HashingEmbedder
from processors.projector import EpisodeProjector, ReflectionProjector
from processors.cues import classify
from processors.retrieval import recall
from streams.adapters.view.edge import EdgeView
from schemas import EpisodeRecorded, EpisodeRetracted, ReflectionCreated, ReflectionInvalidated
from support.labeled import QUERIES


NOW = datetime(2026, 6, 10, tzinfo=timezone.utc)


def test_routing_accuracy_on_the_labeled_queries():
    misses = [(q, want, classify(q)) for q, want in QUERIES if classify(q)[0] != want]
    n = len(QUERIES)
    acc = 1 - len(misses) / n
    print(f"\nrouting accuracy {acc:.2f} on {n} queries "
          f"({sum(w == 'instance' for _, w in QUERIES)} instance, {sum(w == 'pattern' for _, w in QUERIES)} pattern)")
    for q, want, (got, why) in misses:
        print(f"  miss: {q!r} wanted {want}, got {got} ({why})")
    assert n >= 40 and acc >= 0.9


def test_the_reason_names_the_deciding_cue():
    assert classify("How does the user usually handle retries?") == (
        "pattern", "pattern cues 'usually', 'how does …'")
    route, why = classify("When did the deploy fail yesterday?")
    assert route == "instance" and "'when did'" in why and "'relative day'" in why
    assert classify("what does the user do about retries")[1].startswith("no cue; default pattern")
    assert classify("the deploy that broke auth")[1].startswith("no cue; default instance")


@pytest.fixture
def world(tmp_path):
    view, embedder = EdgeView(tmp_path, "reflect", 384), HashingEmbedder()
    episodes, beliefs = EpisodeProjector(view, embedder), ReflectionProjector(view, embedder)

    class World:
        def episode(self, user, eid, text, at="2026-06-01T09:00:00Z", importance=0.5):
            episodes.apply([EpisodeRecorded(user_id=user, episode_id=eid, text=text, importance=importance,
                                            occurred_at=at)])

        def belief(self, user, rid, text, evidence, at="2026-06-05T09:00:00Z"):
            beliefs.apply([ReflectionCreated(user_id=user, reflection_id=rid, cycle_id=f"{user}:1", text=text,
                                             evidence_ids=tuple(evidence), depth=1, importance=0.7,
                                             confidence=0.8, reasoner="offline", prompt_version="v1",
                                             occurred_at=at)])

        def invalidate(self, user, rid, cause):
            beliefs.apply([ReflectionInvalidated(user_id=user, reflection_id=rid, cause=cause, path=(cause, rid),
                                                 status="invalid", invalid_at=NOW.isoformat(),
                                                 expired_at=NOW.isoformat())])

        def retract(self, user, eid):
            episodes.apply([EpisodeRetracted(user_id=user, episode_id=eid)])

        def recall(self, user, query, **kw):
            return recall(view, embedder, user, query, now=NOW, **kw)

        view_ = view

    yield World()
    view.close()


def retries(w, user="ann", prefix="a"):
    w.episode(user, f"{prefix}1", "the user retried the flaky payment test three times before debugging",
              at="2026-06-01T10:00:00Z")
    w.episode(user, f"{prefix}2", "the user retried the flaky auth test twice, then fixed the race",
              at="2026-06-02T11:30:00Z")
    w.episode(user, f"{prefix}3", "deploy of the billing service to staging failed with a timeout",
              at="2026-06-03T08:15:00Z")


def test_instance_route_returns_raw_episodes_with_their_timestamps(world):
    retries(world)
    world.belief("ann", "r1", "the user retries flaky tests before debugging them", ["a1", "a2"])
    out = world.recall("ann", "When did the billing service deploy to staging fail?")
    assert out["route"] == "instance" and out["reason"].startswith("router: instance")
    assert {r["kind"] for r in out["results"]} == {"episode"}
    top = out["results"][0]
    assert (top["id"], top["occurred_at"]) == ("a3", "2026-06-03T08:15:00Z")
    assert "billing" in top["text"] and 0 < top["score"] <= (1 + 1.0) * (1 + 0.1 + 0.1)  # RECALL_SCORING's bound


def test_pattern_route_returns_live_beliefs_with_their_evidence(world):
    retries(world)
    world.belief("ann", "r1", "the user retries flaky tests before debugging them", ["a1", "a2"])
    out = world.recall("ann", "Does the user usually retry flaky tests before debugging them?")
    assert out["route"] == "pattern" and "episodes only" not in out["reason"]
    belief, *episodes = out["results"]  # the belief, then the episodes ranked with it
    assert belief["kind"] == "reflection" and belief["id"] == "r1" and belief["score"] >= 0.35
    assert {r["kind"] for r in episodes} == {"episode"} and all(r["score"] < belief["score"] for r in episodes)
    assert belief["evidence_ids"] == ["a1", "a2"]
    assert [(e["id"], e["kind"], e["occurred_at"]) for e in belief["evidence"]] == [
        ("a1", "episode", "2026-06-01T10:00:00Z"), ("a2", "episode", "2026-06-02T11:30:00Z")]
    assert "payment" in belief["evidence"][0]["text"]


def test_an_unrelated_belief_ranks_below_the_episode_the_question_names(world):
    retries(world)
    world.belief("ann", "r1", "the user retries flaky tests before debugging them", ["a1", "a2"])
    out = world.recall("ann", "What does the user prefer for the billing service staging deploy?")
    assert out["route"] == "pattern" and out["results"][0]["id"] == "a3"
    assert [r["kind"] for r in out["results"]].index("reflection") > 0


def test_pattern_serves_episodes_only_when_no_belief_reaches_the_floor(world):
    retries(world)
    world.belief("ann", "r1", "the user retries flaky tests before debugging them", ["a1", "a2"])
    out = world.recall("ann", "What does the user prefer for the billing service staging deploy?",
                       min_belief_score=0.5)
    assert out["route"] == "pattern"
    assert "no belief matched well (best 0." in out["reason"] and "< 0.50); episodes only" in out["reason"]
    assert out["results"] and {r["kind"] for r in out["results"]} == {"episode"}
    assert out["results"][0]["id"] == "a3"
    empty = world.recall("bob", "What does the user usually prefer?")  # nothing at all for bob
    assert empty["results"] == [] and "no live belief" in empty["reason"]


def test_invalid_beliefs_and_retracted_episodes_are_never_returned(world):
    retries(world)
    world.belief("ann", "r1", "the user retries flaky tests before debugging them", ["a1", "a2"])
    world.belief("ann", "r2", "the user retries flaky tests before debugging", ["a2", "a3", "r1"])
    world.invalidate("ann", "r1", cause="a1")
    world.retract("ann", "a1")
    out = world.recall("ann", "Does the user usually retry flaky tests before debugging them?")
    assert [r["id"] for r in out["results"] if r["kind"] == "reflection"] == ["r2"] == [out["results"][0]["id"]]
    assert [e["id"] for e in out["results"][0]["evidence"]] == ["a2", "a3"]  # not r1 (invalid)
    assert not {"r1", "a1"} & {r["id"] for r in out["results"]}
    for mode in ("instance", "pattern", "auto"):
        got = world.recall("ann", "the user retried the flaky payment test three times", mode=mode)
        assert not {"r1", "a1"} & {r["id"] for r in got["results"]}


def test_recall_never_crosses_users_in_results_or_evidence(world):
    retries(world, "ann", "a")
    retries(world, "bob", "b")  # the very same texts
    world.episode("ann", "only-ann", "the user retried the flaky login test in CI")
    world.belief("ann", "ra", "the user retries flaky tests before debugging them", ["a1", "a2"])
    # Bob's belief: same text, citing ids that exist only as Ann's episodes.
    world.belief("bob", "rb", "the user retries flaky tests before debugging them", ["a1", "only-ann", "b2"])
    for mode in ("instance", "pattern"):
        out = world.recall("bob", "Does the user usually retry flaky tests before debugging them?", mode=mode)
        ids = {r["id"] for r in out["results"]} | {e["id"] for r in out["results"] for e in r.get("evidence", ())}
        assert ids and ids <= {"b1", "b2", "b3", "rb"}
    rb = world.recall("bob", "Does the user usually retry flaky tests before debugging them?")["results"][0]
    assert rb["evidence_ids"] == ["a1", "only-ann", "b2"] and [e["id"] for e in rb["evidence"]] == ["b2"]
    ann = world.recall("ann", "Does the user usually retry flaky tests before debugging them?")
    assert [r["id"] for r in ann["results"] if r["kind"] == "reflection"] == ["ra"] == [ann["results"][0]["id"]]
    assert [e["id"] for e in ann["results"][0]["evidence"]] == ["a1", "a2"]


def test_payloads_are_checked_again_even_if_the_view_leaks(world):
    """A view whose user filter fails (searches everyone): recall still drops what is not the user's."""
    retries(world, "ann", "a")
    retries(world, "bob", "b")
    world.belief("bob", "rb", "the user retries flaky tests before debugging them", ["b1", "b2"])
    view = world.view_

    class Leaky:
        def search_hybrid(self, user_id, vectors, texts, k, before=None, scoring=None, **match):
            return [a + b for a, b in zip(view.search_hybrid("ann", vectors, texts, k, scoring=scoring, **match),
                                          view.search_hybrid("bob", vectors, texts, k, scoring=scoring, **match))]

        def get(self, ids):
            return view.get(ids)

    for mode in ("instance", "pattern"):
        out = recall(Leaky(), HashingEmbedder(), "ann", "the user retried the flaky auth test", mode=mode, now=NOW)
        assert out["results"] and {r["id"] for r in out["results"]} <= {"a1", "a2", "a3"}


def test_mode_is_validated_and_an_explicit_mode_says_so(world):
    with pytest.raises(ValueError, match="'beliefs'"):
        world.recall("ann", "anything", mode="beliefs")
    retries(world)
    out = world.recall("ann", "How does the user usually handle flaky tests?", mode="instance")
    assert out["route"] == "instance" and out["reason"] == "mode 'instance' requested"
    assert {r["kind"] for r in out["results"]} == {"episode"}


def test_now_defaults_to_the_current_time(world):
    retries(world)
    out = recall(world.view_, HashingEmbedder(), "ann", "flaky test", mode="instance", k=2)
    assert len(out["results"]) == 2


def test_the_episode_a_question_names_outranks_a_newer_unrelated_one(world):
    world.episode("ann", "old", "deploy of the billing service to staging failed with a timeout",
                  at="2026-05-01T08:00:00Z")
    for i in range(5):
        world.episode("ann", f"new{i}", f"the user retried the flaky job {i} after reading logs",
                      at=f"2026-06-1{i}T08:00:00Z", importance=0.9)
    out = world.recall("ann", "When did the billing service deploy to staging fail?")
    assert out["results"][0]["id"] == "old"
