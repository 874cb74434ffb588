"""Issue 34: the offline sentence says what a group shares, groups are held
by meaning rather than a shared name (measured on hand-labeled pairs), and
a *holds* verdict cites only challengers that say what the belief says.
The score over many seeds is a benchmark (tests/benchmarks/beliefs.py)."""

from __future__ import annotations

import pytest

from processors.challenge import offline_verdict
from processors.embedders import HashingEmbedder
from processors.extractive import GAP, stated, varying, words
from processors.reasoners import OfflineReasoner
from processors.extractive import question_about

PAIRS = "processors/data/group_pairs.tsv"


@pytest.fixture(scope="module")
def minilm():
    return OfflineReasoner(pytest.importorskip("processors.minilm").MiniLMEmbedder())


def test_values_and_what_says_which_instance_go_nothing_is_added():
    cases = [  # (statement, another member, place words, what the belief says)
        ("Another rollback, #512: a tweak to the auth layer in session.py left password reset links broken.",
         "Another rollback, #519: a tweak to the auth layer in tokens.py left SSO callbacks broken.", set(),
         "Another rollback: a tweak to the auth layer left password reset links broken."),  # a verb's object stays
        ("When the build in onboarding crashed, the user insisted on reading the build logs before trying again.",
         "When the deploy in search crashed, the user insisted on reading the worker logs before trying again.",
         set(), "When the build crashed, the user insisted on reading the logs before trying again."),
        ("The user postponed the uploads deploy: no deploys on a Friday.",
         "The user postponed the billing deploy: no deploys on a Friday.", set(),
         "The user postponed the deploy: no deploys on a Friday."),  # a modifier goes
        ("We reverted the change to auth/session.py from PR #12; token refresh was failing in production.", "",
         set(), "We reverted the change to auth from PR; token refresh was failing in production."),  # a path's words
        ("Asked to retry the dashboard migration, the user first wanted the failure's build log output.", "",
         {"retry", "dashboard"}, "Asked to retry the dashboard migration, the user first wanted the failure's build "
                                 "log output."),  # a place word goes only where it says where
        ("The user held back the payments rollout until after the weekend.", "", {"payments"},
         "The user held back the payments rollout until after the weekend."),
        ("Fixed a small bug in payments (stale cache key).", "", {"payments"}, "Fixed a small bug (stale cache key)."),
    ]
    for statement, other, places, expected in cases:
        said = stated(statement, varying(statement, [other] if other else []), places)
        assert said == expected
        assert GAP not in said and words(said) <= words(statement) | {"auth"}  # every word the statement's own


def test_slots_are_the_words_in_which_a_template_copy_differs():
    one = "Before fixing the wrong total in profile, the user wrote a failing test that reproduces it."
    assert varying(one, ["Before fixing the missing row in billing, the user wrote a failing test that "
                         "reproduces it."]) == {"wrong", "total", "profile"}
    assert varying(one, ["The user reproduced the race condition in export with a red test first."]) == set()


def test_the_labeled_pairs_group_by_what_happened_not_by_a_name(minilm):
    rows = [line.rstrip("\n").split("\t") for line in open(PAIRS, encoding="utf-8")
            if line.strip() and not line.startswith("#")]
    grouped = {label: sum(minilm.together([a, b]) for lab, a, b in rows if lab == label) for label in ("same", "name")}
    print(f"\nlabeled pairs grouped: same {grouped['same']}/12, name only {grouped['name']}/12")
    assert len(rows) == 24
    assert grouped["same"] >= 11 and grouped["name"] == 0  # without the name test: 12 and 6


def test_a_habit_in_other_words_is_stated_without_a_gap(minilm):
    habit = ["Before retrying the failed build of admin, the user asked to see the scheduler logs first.",
             "The checkout nightly job failed; the user wanted the worker logs before any retry."]
    [said], _ = minilm.insights(question_about(habit[0]), habit)
    assert said.citations == (1, 2) and GAP not in said.text


def test_the_hashing_embedder_tests_no_names():
    hashing = OfflineReasoner(HashingEmbedder())
    assert not hashing._named(["Reverted PR 1: auth broke login", "Reverted PR 2: auth broke tokens"], frozenset())


BELIEF = "Reverted pull request: the change to auth broke login redirects (4 times, Jul)."
EVIDENCE = ["Reverted pull request #412: the change to auth/session.py broke login redirects.",
            "The user rolled back PR #431; its edit to the authentication code (tokens.py) broke SSO callbacks.",
            "Another rollback, #440: a tweak to the auth layer in oauth.py left token refresh broken.",
            "We reverted the change to auth/middleware.py from PR #452; session expiry was failing in production."]


def test_holds_cites_only_challengers_that_say_what_the_belief_says(minilm):
    tests = "Wrote 12 new unit tests for the auth session handler; all of them pass."
    logo = "The auth login page got a new logo; the change was merged."
    again = "Reverted pull request #470: the change to auth/oauth.py broke password reset links."
    words_only = offline_verdict(BELIEF, EVIDENCE, [tests, logo, again])
    assert words_only.verdict == "holds" and words_only.cited == (1, 2, 3)  # the rules see auth, login, change
    answer, _ = minilm.verdict(BELIEF, EVIDENCE, [tests, logo, again])
    assert answer.verdict == "holds" and answer.cited == (3,)
    alone, _ = minilm.verdict(BELIEF, EVIDENCE, [tests, logo])
    assert alone.verdict == "unrelated" and alone.cited == ()  # the gate's false alarm: nothing changes
    # Not all of it: a review of an auth pull request is as close to the reverts by meaning (MiniLM 0.6 to
    # their evidence) as a revert said in other words, and still reinforces the belief.
    review, _ = minilm.verdict(BELIEF, EVIDENCE, ["Reviewed the auth/session.py pull request with the user; "
                                                  "it was approved."])
    assert review.verdict == "holds"


def test_the_many_seeds_figures_are_a_distribution_and_its_targets():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))
    import beliefs

    row = lambda found, n, noise, dup, logs: {"found": found, "beliefs": n, "noise": noise,  # noqa: E731
                                             "noise_share": round(noise / n, 3), "duplicates": dup,
                                             "patterns": {"logs": {"found": logs}}}
    spread = beliefs.distribution([row(1, 18, 6, 1, True), row(4, 10, 1, 0, True), row(3, 12, 2, 0, False)])
    assert (spread["found_mean"], spread["found_min"], spread["found_histogram"]) == (2.67, 1, {1: 1, 3: 1, 4: 1})
    assert (spread["noise_share_max"], spread["duplicates"], spread["per_pattern"]) == (0.333, 1, {"logs": 2})
    assert 101 not in beliefs.DEVELOPED and beliefs.FIRST == 101  # reported seeds are never the developed ones
