"""The demo's bundled sample history: deterministic, well-formed, with discoverable planted patterns."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta

import pytest

from streams.cli.sample import history

H = history()
START = datetime(2026, 6, 1)
PATTERN_WORDS = ("revert", "auth", "logs", "retry", "test", "fail", "friday", "deploy")


def when(occurred_at: str) -> datetime:
    assert occurred_at.endswith("Z")
    return datetime.fromisoformat(occurred_at[:-1])


def test_deterministic_for_a_seed():
    assert history() == H
    assert [e.text for e in history(seed=8).episodes] != [e.text for e in H.episodes]


def test_count_ids_and_user():
    assert len(H.episodes) == 2100 and H.user_id == "maya"
    assert len({e.episode_id for e in H.episodes}) == 2100
    assert H.episodes[0].episode_id == "demo-0001"


def test_times_non_decreasing_within_three_months():
    times = [when(e.occurred_at) for e in H.episodes]
    assert times == sorted(times)
    assert START <= times[0] and times[-1] < START + timedelta(days=92)
    assert all(9 <= t.hour < 18 for t in times)


def test_fields_well_formed():
    for e in H.episodes:
        assert 0 < len(e.text) < 300 and e.source
        assert 0.0 <= e.importance <= 1.0 and e.importance == round(e.importance, 2)


def test_patterns_are_planted_and_spread_one_thinly():
    by_id = {e.episode_id: e for e in H.episodes}
    assert {p.name for p in H.patterns} == {"reverts-touch-auth", "logs-before-retry",
                                           "failing-test-first", "no-friday-deploys"}
    for p in H.patterns:
        assert p.description and 15 <= len(p.episode_ids) <= 45
        assert all(by_id[i].pattern == p.name for i in p.episode_ids)
        days = [when(by_id[i].occurred_at) for i in p.episode_ids]
        assert max(days) - min(days) >= timedelta(days=60)
    assert min(len(p.episode_ids) for p in H.patterns) <= 18  # thin: one every five or six days
    tagged = sum(e.pattern is not None for e in H.episodes)
    assert tagged == sum(len(p.episode_ids) for p in H.patterns)


def test_friday_pattern_only_on_fridays():
    fridays = [e for e in H.episodes if e.pattern == "no-friday-deploys"]
    assert fridays and all(when(e.occurred_at).weekday() == 4 for e in fridays)


@pytest.mark.parametrize("seed", [7, 8])
def test_patterns_are_paraphrased_at_most_one_content_word_is_in_all_of_a_pattern(seed):
    for p in history(seed=seed).patterns:
        texts = [e.text.lower() for e in history(seed=seed).episodes if e.pattern == p.name]
        words = [set(re.findall(r"[a-z]+", t)) for t in texts]
        shared = {w for w in set.intersection(*words) if len(w) > 3} - {"user"}  # the subject of all
        assert len(shared) <= 1, (p.name, shared)  # at most the topic's own word ("test")
        assert len({t.split()[0] for t in texts}) >= 4  # several openings, not one template


@pytest.mark.parametrize("seed", [7, 1, 42])
def test_background_uses_the_patterns_words_too(seed):
    background = " ".join(e.text.lower() for e in history(seed=seed).episodes if e.pattern is None)
    assert all(w in background for w in PATTERN_WORDS)


def test_importance_says_nothing_of_being_a_pattern():
    planted = [e.importance for e in H.episodes if e.pattern]
    background = [e.importance for e in H.episodes if e.pattern is None]
    assert abs(sum(planted) / len(planted) - sum(background) / len(background)) < 0.05
    assert 0.3 <= sum(i >= 0.5 for i in background) / len(background) <= 0.6


def test_first_week_has_enough_important_episodes():
    week = [e for e in H.episodes if when(e.occurred_at) < START + timedelta(days=7)]
    assert sum(e.importance >= 0.5 for e in week) >= 50


def test_start_parameter():
    h = history(start="2026-01-05", episodes=500)
    assert h.episodes[0].occurred_at.startswith("2026-01-05")
    assert when(h.episodes[-1].occurred_at).date() < date(2026, 1, 5) + timedelta(days=92)
