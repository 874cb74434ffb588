"""schemas/README.md's confluent-kafka example, run as written (addresses
aside) against a real broker, and its session-timeout note measured."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from schemas import ReflectionCreated
from streams.producer import Publisher
from streams.topics import ensure_topics
from support.harness import run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def examples() -> list[str]:
    """The python blocks of schemas/README.md: the aiokafka example, then the confluent-kafka one."""
    return re.findall(r"```python\n(.*?)```", (ROOT / "schemas" / "README.md").read_text("utf-8"), re.S)


class Handled(Exception):
    """Raised by the test's `handle` to leave the example's endless loop."""


def test_the_confluent_kafka_example_runs_as_written(settings):
    pytest.importorskip("confluent_kafka", reason="the example's client (the test extra installs it)")
    run(ensure_topics(settings))
    belief = ReflectionCreated(user_id="ann", reflection_id="r1", cycle_id="ann:1", text="logs before a retry",
                               evidence_ids=("e1", "e2"), depth=1, importance=0.7, confidence=0.7,
                               reasoner="offline", prompt_version="offline-v1")

    async def publish():
        async with Publisher(settings) as p:
            await p.publish(belief, topic=settings.topic_reflections)

    run(publish())
    validators, example = examples()[0], examples()[1]
    example = (example.replace("127.0.0.1:9092", settings.bootstrap)
               .replace('["reflections"]', f'["{settings.topic_reflections}"]')
               .replace('"schemas/v1"', repr(str(ROOT / "schemas" / "v1"))))
    handled = []

    def handle(event):
        handled.append(event)
        raise Handled

    scope = {"handle": handle}
    exec(validators, scope)  # load_validator (and the aiokafka subscribe, unused here)
    started = time.monotonic()
    with pytest.raises(Handled):
        exec(example, scope)
    seconds = time.monotonic() - started
    print(f"\nconfluent-kafka: the first event after {seconds:.1f} s (session.timeout.ms 6000)")
    assert [e["event_id"] for e in handled] == [belief.event_id]
    assert seconds < 20  # librdkafka's default 45 s session timeout took ~23 s on Tansu
