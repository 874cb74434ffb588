"""`reflect bench` stays runnable: its figures' shape, its CLI, one small scenario for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import cycle_overhead  # noqa: E402
from suite_figures import figure, target  # noqa: E402


def test_a_figure_carries_its_baseline_and_ratio():
    assert figure("worker", 500, "episodes/s", "bare agent", 2000) == {
        "name": "worker", "value": 500, "unit": "episodes/s", "baseline": "bare agent", "baseline_value": 2000,
        "ratio": 0.25}
    assert "ratio" not in figure("p95", 3.2, "ms")
    assert figure("x", 1, "ms", "zero", 0)["ratio"] is None  # never a division error in a report


def test_a_target_says_whether_it_is_met():
    assert target("ratio", 0.9, ">=", 1.0)["met"] is False
    assert target("p95", 4.0, "<=", 5.0)["met"] is True


def test_cycle_scenario_measures_for_real_and_serializes():
    result = cycle_overhead.measure([200, 400], reps=1)
    assert [r["episodes"] for r in result["rows"]] == [200, 400]
    assert all(r["offline_ms"] > 0 and r["naive_whole_store_ms"] > 0 for r in result["rows"])
    assert result["targets"][0]["what"].startswith("cycle growth")
    assert orjson.loads(orjson.dumps(result)) == result


def test_cli_rejects_an_unknown_scenario():
    done = subprocess.run([sys.executable, "-m", "streams.cli", "bench", "--only", "nosuch"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no scenario 'nosuch'" in done.stderr


def test_beliefs_scenario_keeps_its_report_seeds_apart_from_the_development_seeds():
    import beliefs

    assert beliefs.seeds_of(20) == list(range(100, 120)) == beliefs.seeds_of("20") == beliefs.seeds_of(None)
    assert beliefs.seeds_of("dev") == [7, 8, 11, 12] and beliefs.seeds_of("7,8") == [7, 8]
    assert beliefs.seeds_of("7,") == [7] and beliefs.seeds_of(7) == list(range(100, 107))  # a lone number counts
    assert not set(beliefs.DEVELOPMENT) & set(beliefs.REPORT)
    for wrong in (0, 21):
        with pytest.raises(ValueError):
            beliefs.seeds_of(wrong)


def demo_result(found: list[tuple[bool, int, float]], beliefs: int, noise: int, duplicates: int) -> dict:
    patterns = [{"pattern": f"p{k}", "found": f, "cited": c, "precision": p, "about": 0.5}
                for k, (f, c, p) in enumerate(found)]
    return {"score": {"found": sum(f for f, _, _ in found), "of": len(found), "beliefs": beliefs, "noise": noise,
                      "duplicates": duplicates}, "patterns": patterns, "seconds": 50.0,
            "challenges": {"cycles": 3, "verdicts": {}}}


def test_beliefs_rows_and_distribution_say_found_precision_noise_and_duplicates_per_seed():
    import beliefs

    a = beliefs.row(100, demo_result([(True, 4, 1.0), (True, 2, 0.8), (False, 1, 1.0), (False, 0, 0.0)], 20, 5, 1))
    b = beliefs.row(101, demo_result([(True, 4, 1.0)] * 4, 10, 1, 0))
    assert (a["found"], a["precision"], a["noise_share"], a["duplicates"], a["challenges"]) == (2, 0.45, 0.25, 1, 3)
    assert b["precision"] == 1.0 and b["noise_share"] == 0.1  # a pattern cited once counts 0 precision
    dist = beliefs.summary([a, b])
    assert dist["found"] == {"mean": 3.0, "min": 2, "median": 3.0, "max": 4}
    assert dist["pooled_noise_share"] == 0.2 and dist["duplicates"]["max"] == 1
    assert "| 100 | 2/4 | 0.45 | 20 | 5 (25%) | 1 | 3 | 50.0 |" in beliefs.table([a, b])


def test_the_stub_stand_in_says_one_sentence_citing_what_each_question_found():
    """The baseline the beliefs scenario runs the demo against, through the real SDK."""
    import anthropic

    from streams.adapters.anthropic import AnthropicReasoner
    from support.messages_api import MessagesServer, StubModel

    server = MessagesServer(StubModel(["Q1?", "Q2?", "Q3?", "Q4?"]))
    try:
        client = anthropic.Anthropic(api_key="k", base_url=server.url, max_retries=0, timeout=5)
        reasoner = AnthropicReasoner(client, "claude-haiku-4-5")
        assert reasoner.questions(["a", "b"], n=3)[0] == ["Q1?", "Q2?", "Q3?"]
        said, _ = reasoner.insights_for(["Q1?", "Q2?"], [f"s{i}" for i in range(12)], 5,
                                        found=[list(range(1, 11)), [12, 3]])
        assert [(q, i.text, i.citations) for q, i in said] == [
            (0, StubModel.SENTENCE, tuple(range(1, 9))), (1, StubModel.SENTENCE, (12, 3))]
        assert reasoner.verdict("b", ["e"], ["c"])[0].verdict == "unrelated"
    finally:
        server.close()
