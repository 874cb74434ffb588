"""What stats says of a user's last cycle, and why it made nothing."""

from __future__ import annotations

from schemas import ReflectionCycleCompleted
from streams.worker.cycle_notes import summary


def completed(**fields) -> ReflectionCycleCompleted:
    base = dict(user_id="ann", cycle_id="ann:manual:1", why="manual", kept=0, dropped=0, duration_ms=1.0,
                questions=("what does the user do before a retry?",), outcome="empty", reasoner="offline",
                usage={"calls": 0, "input_tokens": 0, "output_tokens": 0})
    return ReflectionCycleCompleted(**{**base, **fields})


def test_a_cycle_that_made_nothing_says_why():
    assert "too few episodes" in summary(completed(questions=()))["why_nothing"]
    dropped = summary(completed(dropped=3, drops=({"reason": "fewer than 2 valid citations", "text": "a"},) * 2 +
                                ({"reason": "instruction-shaped", "text": "b"},)))
    assert dropped["why_nothing"] == ("every insight (3) was dropped: fewer than 2 valid citations (2); "
                                      "instruction-shaped (1)")
    assert "refused: user budget spent" in summary(completed(outcome="refused", error="user budget spent",
                                                             questions=()))["why_nothing"]
    assert "no insight" in summary(completed())["why_nothing"]
    made = summary(completed(kept=1, outcome="ok"))
    assert made["created"] == 1 and "why_nothing" not in made


def test_a_failed_cycle_names_its_error_without_what_the_model_said():
    said = summary(completed(outcome="failed", error="ReasonerOutputError: unreadable answer 'the heron code is 7741'",
                             questions=()))["why_nothing"]
    assert said == "the cycle was failed: ReasonerOutputError" and "7741" not in said
