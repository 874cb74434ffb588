"""The error policy's verdict on a failure it does not know (streams/worker/pipeline/policy.py),
over a real Qdrant Edge view for its probe."""

from __future__ import annotations

import asyncio

import pytest

from streams.adapters.view.edge import EdgeView
from streams.worker.pipeline.policy import Backoff, Health, Policy


class Steps:
    """A step that fails its first `failing` calls with an error the policy does not know, then answers."""

    def __init__(self, failing: int) -> None:
        self.failing, self.calls = failing, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failing:
            raise RuntimeError("the engine's own error")
        return "done"


@pytest.fixture
def policy(tmp_path):
    view = EdgeView(tmp_path, "reflect", 8)

    async def dead_letter(message, error, stage) -> None:
        raise AssertionError("nothing here is dead-lettered")
    yield Policy(view, dead_letter, Health(), Backoff(first=0.001, cap=0.01))
    view.close()


def test_a_failure_once_while_the_view_answers_is_tried_again(policy):
    """An outage that ends between the failure and the probe is an outage, not a bad record."""
    step = Steps(failing=1)
    assert asyncio.run(policy.until_done("project", step)) == "done" and step.calls == 2


def test_a_failure_again_while_the_view_answers_is_deterministic(policy):
    step = Steps(failing=10)
    with pytest.raises(RuntimeError, match="engine's own"):
        asyncio.run(policy.until_done("project", step))
    assert step.calls == 2 and not policy.health.stalled
