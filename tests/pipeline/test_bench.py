"""`reflect bench` stays runnable: its figures' shape, its CLI, one small scenario for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

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
