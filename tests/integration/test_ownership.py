"""Routing a user's reads to its owner (streams/ownership.py): the owner in
the group's map, the watermarks of what an embedded view holds, and the
catch-up of a partition gained (over the test broker). The routing itself,
on real workers: tests/integration/test_workers.py."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiokafka import TopicPartition

from processors.embedders import HashingEmbedder
from processors.reasoners import OfflineReasoner
from streams.adapters.view.edge import EdgeView
from streams.ownership import NO_USER, Watermarks, owner_in, partition_of
from streams.topics import ensure_topics
from support.memory_worker import memory_runtime
from support.runs import episode_stream, make_settings, publish, users_by_partition


def test_the_owner_is_the_worker_assigned_the_partition_and_none_while_unassigned():
    distribution = {"http://a:1": {"episodes": [0, 2], "reflections": [0, 2]},
                    "http://b:1": {"episodes": [1], "reflections": [1, 3]}}
    assert owner_in(distribution, "episodes", 2) == "http://a:1"
    assert owner_in(distribution, "episodes", 1) == "http://b:1"
    assert owner_in(distribution, "episodes", 3) is None  # mid-rebalance: nobody, not a guess
    assert owner_in({}, "episodes", 0) is None


def test_watermarks_live_in_the_view_only_advance_and_survive_a_restart(tmp_path):
    e0, r0 = TopicPartition("episodes", 0), TopicPartition("reflections", 0)
    view = EdgeView(tmp_path, "reflect", 8)
    try:
        marks = Watermarks(view, tmp_path / "offsets.json")
        assert marks.get(view.name, e0) == 0
        marks.advance(view.name, {e0: 10, r0: 3})
        marks.advance(view.name, {e0: 7})  # a replayed batch never moves it back
        assert view.count(NO_USER, kind="watermarks") == 1  # one point, in the view itself
        assert marks.get("reflect-0002", e0) == 0  # a rebuilt view holds only what its rebuild recorded
    finally:
        view.close()
    view = EdgeView(tmp_path, "reflect", 8)  # reopened: read back from the shard's own log
    try:
        again = Watermarks(view)
        assert (again.get(view.name, e0), again.get(view.name, r0)) == (10, 3)
        assert not (tmp_path / "offsets.json").exists()
        assert view.count("u") == 0  # no user's read meets the point
    finally:
        view.close()


def test_a_view_from_before_reads_its_watermarks_from_the_old_file(tmp_path):
    view = EdgeView(tmp_path, "reflect", 8)
    try:
        (tmp_path / "offsets.json").write_bytes(orjson.dumps({view.name: {"episodes:0": 42}}))
        assert Watermarks(view, tmp_path / "offsets.json").get(view.name, TopicPartition("episodes", 0)) == 42
    finally:
        view.close()


@pytest.mark.integration
@pytest.mark.broker
def test_a_partition_gained_is_caught_up_to_the_end_of_its_log_not_only_to_its_commit(broker, tmp_path):
    """Nothing committed (no worker read the episodes): the previous owner
    may have run cycles on events its other agents had not committed, so the
    new owner's view takes the whole log before the partition is whole."""
    settings = make_settings(broker.url, tmp_path)
    user = users_by_partition(1, settings.partitions)[0]
    asyncio.run(ensure_topics(settings))
    asyncio.run(publish(settings, episode_stream([user], 12)))
    embedder = HashingEmbedder()
    view = EdgeView(settings.view_dir, settings.view, embedder.dim)
    try:
        ownership = memory_runtime(settings, view, embedder, OfflineReasoner(embedder)).ownership

        async def gained() -> None:
            p = partition_of(user, settings.partitions)
            ownership.assigned({p})
            await asyncio.wait_for(ownership.whole[p].wait(), 60)
        asyncio.run(gained())
        assert len(list(view.scroll(user, kind="episode"))) == 12
    finally:
        view.close()
