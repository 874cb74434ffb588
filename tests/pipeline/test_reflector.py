"""One reflection cycle against a real Qdrant Edge view (no broker needed)."""

from __future__ import annotations

import pytest

from processors.embedders import HashingEmbedder
from processors.projector import EpisodeProjector, ReflectionProjector
from processors.ports import Usage
from processors.reasoners import OfflineReasoner
from processors.reflection import Insight
from processors.reflector import CycleConfig, cycle_window, run_cycle, window_records
from streams.adapters.view.edge import EdgeView
from schemas import (EpisodeRecorded, EpisodeRetracted, ReflectionCreated, ReflectionReinforced, ReflectionRequested,
                     decode)

TEXTS = ["revert of PR {n}: the auth middleware broke login",
         "revert of PR {n}: auth token refresh failed in staging",
         "revert of PR {n}: auth session cookie expired early",
         "lunch today was pasta number {n}"]


@pytest.fixture
def stack(tmp_path):
    view = EdgeView(tmp_path, "reflect", 384)
    embedder = HashingEmbedder()
    yield view, embedder, EpisodeProjector(view, embedder), ReflectionProjector(view, embedder)
    view.close()


def record(projector, user, n):
    episodes = [EpisodeRecorded(user_id=user, episode_id=f"{user}-{i}", text=TEXTS[i % 4].format(n=i),
                                importance=0.6) for i in range(n)]
    projector.apply(episodes)
    return [{"id": e.episode_id, "kind": "episode", "text": e.text} for e in episodes]


def request(user, cycle):
    return ReflectionRequested(user_id=user, cycle_id=f"{user}:{cycle}", why="threshold")


def test_redelivered_request_yields_the_same_events(stack):
    view, embedder, episodes, _ = stack
    window = record(episodes, "alice", 8)
    first = run_cycle(request("alice", 1), window, view, embedder, OfflineReasoner(), CycleConfig())
    again = run_cycle(request("alice", 1), window, view, embedder, OfflineReasoner(), CycleConfig())
    beliefs = [e for e in first if isinstance(e, ReflectionCreated)]
    assert beliefs and [e.reflection_id for e in beliefs] == [e.reflection_id for e in again
                                                              if isinstance(e, ReflectionCreated)]
    assert all(decode(e.encode()) == e for e in first)  # every event honours its contract
    assert first[-1].TYPE == "ReflectionCycleCompleted" and first[-1].outcome == "ok"
    assert first[-1].kept == len(beliefs) and first[-1].usage["input_tokens"] == 0


def test_a_near_duplicate_insight_reinforces_the_live_belief(stack):
    view, embedder, episodes, reflections = stack
    window = record(episodes, "alice", 8)
    first = run_cycle(request("alice", 1), window, view, embedder, OfflineReasoner(), CycleConfig())
    reflections.apply(first)
    live = view.count("alice", kind="reflection", status="live")
    window += record(episodes, "alice", 12)[8:]
    # The window as the reflector reads it: with the earlier beliefs, which the reasoner repeats.
    second = run_cycle(request("alice", 2), cycle_window(view, request("alice", 2), window), view, embedder,
                       OfflineReasoner(), CycleConfig())
    reinforced = [e for e in second if isinstance(e, ReflectionReinforced)]
    assert reinforced and second[-1].reinforced == len(reinforced)
    reflections.apply(second)
    new = sum(isinstance(e, ReflectionCreated) for e in second)
    assert view.count("alice", kind="reflection", status="live") == live + new
    point = next(p for _, p in view.scroll("alice", kind="reflection")
                 if p["reflection_id"] == reinforced[0].reflection_id)
    assert point["evidence_ids"] == list(reinforced[0].evidence_ids)


def test_beliefs_never_cite_another_users_identical_episodes(stack):
    view, embedder, episodes, _ = stack
    window = record(episodes, "alice", 8)
    record(episodes, "bob", 8)  # the very same texts
    events = run_cycle(request("alice", 1), window, view, embedder, OfflineReasoner(), CycleConfig())
    cited = {e for ev in events if isinstance(ev, ReflectionCreated) for e in ev.evidence_ids}
    assert cited and all(e.startswith("alice-") for e in cited)


class Broken:
    name, prompt_version = "broken", "v0"

    def questions(self, statements, n=3, importance=None):
        raise TimeoutError("reasoner did not answer")


class Hostile(OfflineReasoner):
    """Answers with out-of-range and single citations, as a model might."""

    def insights(self, question, statements, n=5, dates=None):
        good, usage = super().insights(question, statements, n, dates)
        return [Insight("cite everything", tuple(range(-3, 200))), Insight("single", (1,)),
                Insight("nothing valid", (0, 99)), *good[:1]], usage


def test_failed_cycle_is_reported_not_raised(stack):
    view, embedder, episodes, _ = stack
    window = record(episodes, "alice", 4)
    events = run_cycle(request("alice", 1), window, view, embedder, Broken(), CycleConfig())
    [audit] = events
    assert audit.outcome == "failed" and "TimeoutError" in audit.error and audit.kept == 0


def test_only_valid_citations_are_persisted(stack):
    view, embedder, episodes, _ = stack
    window = record(episodes, "alice", 8)
    events = run_cycle(request("alice", 1), window, view, embedder, Hostile(), CycleConfig())
    created = [e for e in events if isinstance(e, ReflectionCreated)]
    assert created and "single" not in {e.text for e in created} and "nothing valid" not in {e.text for e in created}
    ids = {f"alice-{i}" for i in range(8)}
    assert all(set(e.evidence_ids) <= ids and len(e.evidence_ids) >= 2 for e in created)
    assert events[-1].dropped >= 2 * len([q for q in events[-1].questions])


def test_a_repeat_on_the_same_evidence_neither_reinforces_nor_duplicates(stack):
    view, embedder, episodes, reflections = stack
    window = record(episodes, "alice", 8)
    config = CycleConfig(max_depth=1)  # no beliefs over beliefs: the second cycle sees what the first saw
    reflections.apply(run_cycle(request("alice", 1), window, view, embedder, OfflineReasoner(), config))
    live = list(view.scroll("alice", kind="reflection"))
    again = run_cycle(request("alice", 2), window, view, embedder, OfflineReasoner(), config)
    assert not [e for e in again if isinstance(e, (ReflectionCreated, ReflectionReinforced))]
    assert again[-1].dropped > 0 and list(view.scroll("alice", kind="reflection")) == live


def test_window_records_are_read_by_id_and_skip_what_was_retracted(stack):
    view, embedder, episodes, _ = stack
    record(episodes, "alice", 4)
    record(episodes, "bob", 4)
    episodes.apply([EpisodeRetracted(user_id="alice", episode_id="alice-1")])
    refs = [("episode", f"alice-{i}") for i in range(4)] + [("episode", "bob-0"), ("reflection", "nope")]
    assert [r["id"] for r in window_records(view, "alice", refs)] == ["alice-0", "alice-2", "alice-3"]


def test_beliefs_at_max_depth_are_not_offered_as_evidence(stack):
    view, embedder, episodes, reflections = stack
    window = record(episodes, "alice", 8)
    for depth in (1, 2):  # a cycle over a view that already holds beliefs reaches depth 2 …
        made = run_cycle(request("alice", depth), window, view, embedder, OfflineReasoner(),
                         CycleConfig(duplicate_cosine=1.01))
        reflections.apply(made)
        window = window + [{"id": e.reflection_id, "kind": "reflection", "text": e.text}
                           for e in made if isinstance(e, ReflectionCreated)]
    depths = {p["depth"] for _, p in view.scroll("alice", kind="reflection")}
    assert depths == {1, 2}
    # … and never beyond the cap: nothing deeper is created, however often it runs.
    made = run_cycle(request("alice", 3), window, view, embedder, OfflineReasoner(), CycleConfig(duplicate_cosine=1.01))
    assert all(e.depth <= 2 for e in made if isinstance(e, ReflectionCreated))


def test_a_cycle_sees_only_what_occurred_by_its_time_so_a_stream_ahead_changes_nothing(stack):
    view, embedder, episodes, _ = stack
    window = record(episodes, "alice", 8)
    asked = request("alice", 1)
    first = run_cycle(asked, window, view, embedder, OfflineReasoner(), CycleConfig())
    # The stream runs on: more of the same kind of episode, occurring after the request.
    episodes.apply([EpisodeRecorded(user_id="alice", episode_id=f"later-{i}", text=TEXTS[i % 3].format(n=100 + i),
                                    importance=0.9, occurred_at="2100-01-01T00:00:00Z") for i in range(12)])
    again = run_cycle(asked, window, view, embedder, OfflineReasoner(), CycleConfig())
    beliefs = [e for e in again if isinstance(e, ReflectionCreated)]

    def decided(events):  # all but recorded_at, the transaction time
        return [{k: v for k, v in e.to_dict().items() if k != "recorded_at"} for e in events
                if isinstance(e, ReflectionCreated)]
    assert beliefs and decided(beliefs) == decided(first)
    assert all(not i.startswith("later-") for b in beliefs for i in b.evidence_ids)
    assert {b.occurred_at for b in beliefs} == {asked.occurred_at}  # a belief is valid from its cycle's time


class FailsOnSecondQuestion(OfflineReasoner):
    """Bills every call; the insights of the second question never come."""

    calls = 0

    def questions(self, statements, n=3, importance=None):
        return super().questions(statements, n, importance)[0], Usage(calls=1, input_tokens=100)

    def insights(self, question, statements, n=5, dates=None):
        self.calls += 1
        if self.calls == 2:
            raise TimeoutError("no answer")
        return super().insights(question, statements, n, dates)[0], Usage(calls=1, input_tokens=50)


def test_a_cycle_that_fails_midway_still_reports_the_calls_it_was_billed_for(stack):
    view, embedder, episodes, _ = stack
    window = record(episodes, "alice", 8)
    audit = run_cycle(request("alice", 1), window, view, embedder, FailsOnSecondQuestion(), CycleConfig())[-1]
    assert audit.outcome == "failed" and (audit.usage["calls"], audit.usage["input_tokens"]) == (2, 150)
