"""Two workers of one consumer group split the partitions and together hold
the view one worker holds alone (issue 9): the scaling path of DESIGN.md.

Each worker owns an embedded view of the users of its partitions, so "the
same view" is: every user's episodes and accumulator on exactly one of the
two, equal to what a single worker over the same log holds.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.request
import uuid

import pytest

from conftest import run, wait_for
from streams.broker import free_port
from streams.producer import Publisher
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration
USERS, PER_USER = 16, 12
LAG = re.compile(r'^reflect_consumer_lag\{([^}]*)\} ', re.M)


def episodes_topic_partitions(w) -> set[int]:
    """The partitions of the episodes topic this worker consumes (its lag series)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{w.settings.web_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    out = set()
    for labels in LAG.findall(text):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if fields.get("topic") == w.settings.topic_episodes:
            out.add(int(fields["partition"]))
    return out


async def publish(settings) -> None:
    async with Publisher(settings) as p:
        for i in range(USERS * PER_USER):
            await p.publish_episode(f"user-{i % USERS}", f"episode {i}: retried the flaky test", 0.3 + (i % 5) / 10,
                                    episode_id=f"e{i}", occurred_at=f"2026-06-01T10:{i // 60:02d}:{i % 60:02d}Z",
                                    wait=False)
        await p.flush()


def held(workers, user: str) -> list[tuple[int, float]]:
    """(episodes, pending importance) of `user` on each worker that holds any of it."""
    return [(s["episodes"], s["pending_importance"]) for w in workers for s in [w.stats(user)] if s["episodes"]]


def test_two_workers_split_the_partitions_and_hold_one_workers_view(settings, worker, tmp_path):
    assert settings.partitions >= 2
    run(ensure_topics(settings))
    second = dataclasses.replace(settings, web_port=free_port(), data_dir=str(tmp_path / "second"))
    pair = [worker(settings), worker(second)]
    run(publish(settings))
    users = [f"user-{u}" for u in range(USERS)]
    wait_for(lambda: all(sum(n for n, _ in held(pair, u)) == PER_USER for u in users), 120,
             "every episode visible on one of the two workers")
    split = wait_for(lambda: (lambda a, b: (a, b) if a and b and not a & b and
                              a | b == set(range(settings.partitions)) else None)(
        *map(episodes_topic_partitions, pair)), 30, "both workers consuming, partitions disjoint")
    print(f"partitions of the episodes topic: worker 1 {sorted(split[0])}, worker 2 {sorted(split[1])}")

    tag = uuid.uuid4().hex[:8]  # the same log read by a single worker of another group
    alone = worker(dataclasses.replace(settings, app_id=f"alone-{tag}", web_port=free_port(),
                                       data_dir=str(tmp_path / "alone")))
    wait_for(lambda: all(alone.stats(u)["episodes"] == PER_USER for u in users), 120, "the single worker's view")
    for u in users:
        on_pair = held(pair, u)
        assert len(on_pair) == 1, f"{u} is held by {len(on_pair)} workers: {on_pair}"
        single = alone.stats(u)
        assert on_pair[0] == (single["episodes"], single["pending_importance"]), u
