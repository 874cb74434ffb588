"""Offsets Reflect owns (streams/commits.py): the group resumes each of the
pipeline's topics where the worker's effects are durable, committed through
Faust's `Consumer._commit` (pinned in pyproject.toml: this fails first when
it moves), and never where Faust's acknowledgements would put it (see also
tests/test_handover.py: a stop with a batch given up commits nothing past it).

    python -m pytest tests/test_commits.py -s
"""

from __future__ import annotations

import asyncio

import pytest

from conftest import wait_for
from streams.topics import ensure_topics
from test_determinism import publish
from test_faults_crash import Workers, committed_to_end, episode_stream, make_settings, read_events, \
    users_by_partition

pytestmark = [pytest.mark.integration, pytest.mark.broker]

PER_USER = 30


def test_every_pipeline_topic_is_committed_to_its_end_once_its_effects_are_durable(broker, tmp_path):
    settings = make_settings(broker.url, tmp_path / "data", threshold=5.0, min_episodes=5, projector_batch=16)
    users = users_by_partition(1, settings.partitions)
    asyncio.run(ensure_topics(settings))
    workers = Workers(tmp_path)
    try:
        worker = workers.start(settings)
        asyncio.run(publish(settings, episode_stream(users, PER_USER)))
        wait_for(lambda: all(worker.stats(u).get("episodes") == PER_USER and worker.stats(u).get("cycles", 0) > 0
                             for u in users), 90, "every episode in the view and cycles done")
        assert read_events(settings, settings.topic_reflections), "no belief event: the reflections topic is empty"
        for topic in (settings.topic_episodes, settings.topic_requests, settings.topic_reflections):
            wait_for(lambda: committed_to_end(settings, topic), 30, f"{topic} committed to its end")
    finally:
        workers.stop_all()
