"""Bounded beliefs: evidence, confidence and history stay bounded however often
a belief is reinforced, and projecting an event again changes nothing. The
real Qdrant Edge view, no broker."""

from __future__ import annotations

import pytest

from processors.embedders import HashingEmbedder
from processors.invalidator import Invalidator, bounded, empty_state, lost_ids
from processors.projector import (LIVE_HISTORY, EpisodeProjector, ReflectionProjector, bounded_history, change,
                                  point_id, reflection_payload)
from processors.provenance import as_of
from processors.reasoners import OfflineReasoner
from processors.reflection import Belief, Candidate
from processors.reflector import CycleConfig, _belief_event, confidence, kept_evidence
from streams.adapters.view.edge import EdgeView
from schemas import (EpisodeRecorded, EpisodeRetracted, ReflectionCreated, ReflectionInvalidated, ReflectionReinforced,
                     ReflectionRequested, decode)

T0 = "2026-12-01T09:00:00Z"


# ------------------------------------------------------------------ pure parts

def test_confidence_rises_with_support_by_less_each_time_and_never_reaches_one():
    values = [confidence(s) for s in range(2, 1000)]
    assert values[0] == 0.5  # a belief at the citation floor
    assert all(a < b for a, b in zip(values, values[1:]))
    far = [confidence(s) for s in range(1000, 10**6, 997)]  # steps below the 6 decimals kept: flat, never down
    assert far == sorted(far)
    steps = [b - a for a, b in zip(values, values[1:20])]
    assert all(a > b for a, b in zip(steps, steps[1:]))
    assert confidence(10**12) < 1.0


def test_kept_evidence_is_the_most_recently_cited_in_citation_order():
    cited = [f"e{i}" for i in range(40)]
    assert kept_evidence(cited, 32) == tuple(cited[8:])
    assert kept_evidence(cited[:3], 32) == tuple(cited[:3])


def entry(n: int, status: str = "live") -> dict:
    return {"at": f"2026-12-01T09:{n // 60:02d}:{n % 60:02d}Z", "status": status, "confidence": n / 1000,
            "event_id": f"ev-{n}"}


def test_history_keeps_the_creation_every_change_of_status_and_the_newest_reinforcements():
    history = [entry(n, "weakened" if n in (5, 50) else "live") for n in range(100)]
    kept = bounded_history(history)
    live = [h for h in kept if h["status"] == "live"]
    assert len(live) == LIVE_HISTORY + 1 and live[0] == history[0] and live[1:] == [
        h for h in history if h["status"] == "live"][-LIVE_HISTORY:]
    assert [h for h in kept if h["status"] != "live"] == [history[5], history[50]]
    assert kept == sorted(kept, key=lambda h: h["at"])  # still in order
    assert bounded_history(history[:LIVE_HISTORY + 1]) == history[:LIVE_HISTORY + 1]


def test_as_of_a_time_whose_reinforcements_were_dropped_shows_the_last_confidence_kept_before_it():
    history = [entry(n, "weakened" if n == 5 else "live") for n in range(100)]
    payload = {"created_at": history[0]["at"], "confidence": 0.099, "status": "live",
               "history": bounded_history(history)}
    assert as_of(payload, history[3]["at"])["confidence"] == 0.0  # the creation's
    assert as_of(payload, history[20]["at"])["confidence"] == 0.005  # the weakening's
    assert as_of(payload, history[90]["at"])["confidence"] == 0.09  # kept: exact


def reinforced(support: int | None, evidence, confidence: float = 0.7):
    return ReflectionReinforced(event_id=f"reinforced:{len(evidence)}", user_id="ann", reflection_id="r",
                                cycle_id=f"ann:{len(evidence)}", evidence_ids=tuple(evidence),
                                added_evidence_ids=tuple(evidence[-1:]), confidence=confidence, support=support)


def test_a_reinforcement_from_before_support_was_counted_still_applies_by_its_evidence():
    payload = {"evidence_ids": ["a", "b"], "status": "live", "history": []}  # no support either
    keys, _ = change(payload, reinforced(None, ["a", "b", "c"]))
    assert keys["support"] == 3 and keys["evidence_ids"] == ["a", "b", "c"]
    assert change({**payload, **keys}, reinforced(None, ["a", "b", "c"])) == ({}, False)


# ------------------------------------------------------------------ on a real view

@pytest.fixture
def view(tmp_path):
    store = EdgeView(tmp_path, "reflect", 384)
    yield store
    store.close()


def candidate(eid: str) -> Candidate:
    return Candidate(eid, "episode", f"episode {eid}", 0.6, T0, 0, 0.9)


def test_a_belief_reinforced_a_thousand_times_keeps_its_contract_and_its_bounds(view):
    embedder = HashingEmbedder()
    episodes, reflections = EpisodeProjector(view, embedder), ReflectionProjector(view, embedder)
    config, reasoner, text = CycleConfig(), OfflineReasoner(), "ann reverts what touches auth"
    vector = embedder.embed([text])[0]
    episodes.apply([EpisodeRecorded(user_id="ann", episode_id="ep-0", text="auth broke", importance=0.6)])
    confidences, rid = [], None
    for i in range(1001):
        episodes.apply([EpisodeRecorded(user_id="ann", episode_id=f"ep-{i + 1}", text=f"auth broke {i}",
                                        importance=0.6)])
        # Each cycle re-cites the newest evidence the belief keeps and cites one new piece.
        belief = Belief(f"belief-{i}", text, (candidate(f"ep-{i}"), candidate(f"ep-{i + 1}")), 1, 0.6)
        request = ReflectionRequested(user_id="ann", cycle_id=f"ann:{i}", why="threshold")
        event = _belief_event(request, belief, vector, "what breaks?", view, reasoner, config)
        assert isinstance(event, ReflectionCreated if i == 0 else ReflectionReinforced)
        assert decode(event.encode()) == event  # its contract, every time
        reflections.apply([event])
        rid = rid or event.reflection_id
        payload = view.get([point_id("reflection", "ann", rid)])[point_id("reflection", "ann", rid)]
        assert len(payload["evidence_ids"]) <= config.max_evidence
        assert payload["support"] == i + 2  # every distinct episode cited, once
        assert payload["confidence"] < 1.0
        assert len(payload["history"]) <= LIVE_HISTORY + 1
        confidences.append(payload["confidence"])
    assert confidences == sorted(confidences) and confidences[-1] > confidences[0]
    assert payload["evidence_ids"] == [f"ep-{n}" for n in range(1002 - config.max_evidence, 1002)]
    assert view.count("ann", kind="reflection") == 1


def created(evidence=("a", "b", "c")) -> ReflectionCreated:
    return ReflectionCreated(event_id="created:r", user_id="ann", reflection_id="r", cycle_id="ann:1",
                             text="ann likes tea", evidence_ids=evidence, depth=1, importance=0.5, confidence=0.6,
                             reasoner="offline", prompt_version="v1", support=len(evidence))


def weakened() -> ReflectionInvalidated:
    return ReflectionInvalidated(event_id="invalidated:r:a", user_id="ann", reflection_id="r", cause="a",
                                 path=("a", "r"), status="weakened", invalid_at=T0, expired_at="2026-12-01T10:00:00Z",
                                 confidence=0.3, surviving_evidence_ids=("b", "c", "d"))


def payload_of(view) -> dict:
    pid = point_id("reflection", "ann", "r")
    return view.get([pid])[pid]


def test_applying_the_same_reinforcement_or_invalidation_again_changes_nothing(view):
    reflections = ReflectionProjector(view, HashingEmbedder())
    reflections.apply([created()])
    for event in (reinforced(4, ["a", "b", "c", "d"]), weakened()):
        reflections.apply([event])
        once = payload_of(view)
        assert change(once, event) == ({}, False)
        reflections.apply([event])
        assert payload_of(view) == once
    assert [h["event_id"] for h in once["history"]] == [
        created().event_id, reinforced(4, ["a", "b", "c", "d"]).event_id, weakened().event_id]


def test_an_older_reinforcement_applied_after_a_newer_one_or_a_weakening_changes_nothing(view):
    reflections = ReflectionProjector(view, HashingEmbedder())
    older, newer = reinforced(4, ["a", "b", "c", "d"], 0.66), reinforced(5, ["a", "b", "c", "d", "e"], 0.71)
    reflections.apply([created(), newer, older])
    assert (payload_of(view)["support"], payload_of(view)["confidence"]) == (5, 0.71)
    reflections.apply([weakened()])
    late = payload_of(view)
    reflections.apply([older, newer])  # a replay of both, after the weakening
    assert payload_of(view) == late and late["confidence"] == 0.3


def test_a_belief_projected_from_its_created_event_counts_its_support():
    assert reflection_payload(created(("a", "b")))["support"] == 2
    legacy = ReflectionCreated(**{**created().__dict__, "support": None})
    assert reflection_payload(legacy)["support"] == 3


# ------------------------------------------------------------------ the invalidator's state

def test_bounded_state_keeps_the_newest_gone_and_the_weakened_decisions():
    state = {"gone": {f"e{i}": {"at": f"2026-12-01T09:00:{59 - i:02d}Z", "erasure": False} for i in range(6)},
             "decided": {"e1": {"lost": ["e0"], "status": "invalid", "confidence": 0.0},
                         "w": {"lost": ["e5"], "status": "live", "confidence": 0.4}}}
    kept = bounded(state, max_gone=3)
    assert list(kept["gone"]) == ["e2", "e1", "e0"]  # the newest by valid time, oldest first
    assert kept["decided"] == {"w": state["decided"]["w"]}  # e1 is invalid: gone says so
    assert lost_ids(kept) == {"e0", "e1", "e2", "e5"}  # what w lost stays lost


def test_the_invalidator_state_stays_bounded_over_many_retractions_and_decides_as_before(view):
    embedder = HashingEmbedder()
    episodes, beliefs = EpisodeProjector(view, embedder), ReflectionProjector(view, embedder)
    invalidator, state = Invalidator(view, citation_floor=2, max_depth=2, max_gone=20), empty_state()

    def flow(out):
        beliefs.apply([e for e in out if isinstance(e, ReflectionInvalidated)])
        return {e.reflection_id: e.status for e in out if isinstance(e, ReflectionInvalidated)}

    def retract(eid):
        event = EpisodeRetracted(user_id="ann", episode_id=eid)
        episodes.apply([event])
        return flow(invalidator.on_retracted(event, state)[0])

    def belief(rid, evidence):
        event = ReflectionCreated(user_id="ann", reflection_id=rid, cycle_id="ann:1", text=f"belief {rid}",
                                  evidence_ids=tuple(evidence), depth=1, importance=0.5, confidence=0.6,
                                  reasoner="offline", prompt_version="v1")
        beliefs.apply([event])  # its writer puts it in the view before the log
        return flow(invalidator.on_belief(event, state))

    episodes.apply([EpisodeRecorded(user_id="ann", episode_id=e, text=f"episode {e}", importance=0.5)
                    for e in ("a", "b", "c", *(f"x{i}" for i in range(200)), *(f"y{i}" for i in range(200)))])
    belief("w", ["a", "b", "c"])
    assert retract("a") == {"w": "weakened"}
    for i in range(200):
        belief(f"v{i}", [f"x{i}", f"y{i}"])
        assert retract(f"x{i}") == {f"v{i}": "invalid"}
        assert len(state["gone"]) <= 20 and list(state["decided"]) == ["w"]
    assert "a" not in state["gone"]
    assert retract("b") == {"w": "invalid"}  # a still counts as lost: only c survives
    assert retract("a") == {} and retract("x0") == {}  # redelivered long after: decided already


def test_a_retraction_of_evidence_a_full_list_no_longer_shows_still_reaches_the_belief(view):
    """A belief shows its 32 newest pieces of evidence; its lineage keeps
    every one, created with more than 32 or reinforced past 32, and the walk
    follows it: an erasure of the oldest invalidates the belief, a plain
    retraction weakens it by its share of the lineage."""
    embedder = HashingEmbedder()
    episodes, beliefs = EpisodeProjector(view, embedder), ReflectionProjector(view, embedder)
    config, reasoner, text = CycleConfig(), OfflineReasoner(), "ann reverts what touches auth"
    vector = embedder.embed([text])[0]
    episodes.apply([EpisodeRecorded(user_id="ann", episode_id=f"ep-{i}", text=f"auth broke {i}", importance=0.6)
                    for i in range(80)])
    request = ReflectionRequested(user_id="ann", cycle_id="ann:1", why="threshold")
    wide = _belief_event(request, Belief("wide", text, tuple(candidate(f"ep-{i}") for i in range(40)), 1, 0.6),
                         vector, "q", view, reasoner, config)
    assert len(wide.evidence_ids) == config.max_evidence and len(wide.lineage_ids) == 40
    assert decode(wide.encode()) == wide
    beliefs.apply([wide])
    for i in range(40, 48):  # reinforced past what it shows: ep-0 … ep-15 are no longer shown
        again = Belief(f"again-{i}", text, (candidate(f"ep-{i - 1}"), candidate(f"ep-{i}")), 1, 0.6)
        beliefs.apply([_belief_event(ReflectionRequested(user_id="ann", cycle_id=f"ann:{i}", why="threshold"),
                                     again, vector, "q", view, reasoner, config)])
    shown = payload_of_belief(view, wide.reflection_id)
    assert "ep-0" not in shown["evidence_ids"] and "ep-14" not in shown["evidence_ids"]
    assert len(shown["lineage_ids"]) == 48

    invalidator, state = Invalidator(view, citation_floor=2, max_depth=2), empty_state()
    [weakened] = [e for e in invalidator.on_retracted(EpisodeRetracted(user_id="ann", episode_id="ep-14"), state)[0]
                  if isinstance(e, ReflectionInvalidated)]
    assert weakened.status == "weakened" and weakened.confidence == round(shown["confidence"] * 47 / 48, 6)
    beliefs.apply([weakened])
    erased = [e for e in invalidator.on_retracted(EpisodeRetracted(user_id="ann", episode_id="ep-0",
                                                                  reason="erasure"), state)[0]
              if isinstance(e, ReflectionInvalidated)]
    assert [(e.reflection_id, e.status, e.erased) for e in erased] == [(wide.reflection_id, "invalid", True)]


def payload_of_belief(view, rid: str) -> dict:
    pid = point_id("reflection", "ann", rid)
    return view.get([pid])[pid]
