"""Routing a user's reads to its owner (streams/worker/ownership.py): the owner in
the group's map, the watermarks of what an embedded view holds, and the
catch-up of a partition gained (over the test broker). The routing itself,
on real workers: tests/integration/test_workers.py."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import orjson
import pytest
from aiokafka import TopicPartition

from processors.embedders import HashingEmbedder
from processors.reasoners import OfflineReasoner
from streams.adapters.view.edge import EdgeView
from streams.broker import free_port
from streams.shredding import Sealing
from streams.topics import ensure_topics
from streams.worker.ownership import NO_USER, Watermarks, owner_in, partition_of
from support.harness import wait_for
from support.memory_worker import memory_runtime
from support.runs import (SHORT_GROUP_TIMEOUTS, Workers, episode_stream, kill, make_settings, publish,
                          users_by_partition)

PER_USER = 12
RELEASED, CAUGHT_UP = re.compile(r"partition (\d+) released"), re.compile(r"caught up partition (\d+)")


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
        runtime = memory_runtime(settings, view, embedder, OfflineReasoner(embedder))
        runtime.sealing, ownership = Sealing(settings), runtime.ownership  # the log's texts are sealed

        async def gained() -> None:
            p = partition_of(user, settings.partitions)
            ownership.assigned({p})
            try:
                await asyncio.wait_for(ownership.whole[p].wait(), 60)
            finally:
                await runtime.sealing.close()
        asyncio.run(gained())
        assert len(list(view.scroll(user, kind="episode"))) == 12
    finally:
        view.close()


@pytest.mark.integration
def test_a_partition_lost_leaves_the_view_once_its_new_owner_has_caught_up_and_comes_back_whole(broker, tmp_path):
    """Two workers with Edge views: the first held every user; once the second
    has taken some partitions and caught up, the first worker's view holds
    none of their users' points nor their watermarks. Gained back, they are
    replayed from the start: every episode is served again."""
    settings = make_settings(broker.url, tmp_path / "w0", threshold=1e9, qdrant_url=None, **SHORT_GROUP_TIMEOUTS)
    users = users_by_partition(2, settings.partitions)
    asyncio.run(ensure_topics(settings))
    asyncio.run(publish(settings, episode_stream(users, PER_USER)))
    workers = Workers(tmp_path)
    try:
        first = workers.start(settings)
        wait_for(lambda: all(first.stats(u).get("episodes") == PER_USER for u in users), 120, "every episode in")
        second = workers.start(dataclasses.replace(settings, web_port=free_port(), data_dir=str(tmp_path / "w1")))
        def found(worker, pattern) -> set[int]:
            return {int(n) for n in pattern.findall(worker.log_path.read_text(errors="replace"))}
        released = wait_for(lambda: (lambda r: r if r and r == found(second, CAUGHT_UP) else None)(
            found(first, RELEASED)), 120, "the first worker released every partition the second caught up")
        kill(first)  # no leave-group: nothing else moves before its view is read
        view = EdgeView(settings.view_dir, settings.view, HashingEmbedder().dim)
        try:
            held = {u: view.count(u) for u in users}
            marks = Watermarks(view).of(settings.view)
        finally:
            view.close()
        assert {u for u, n in held.items() if n} == {u for u in users
                                                     if partition_of(u, settings.partitions) not in released}
        assert not {tp.partition for tp in marks} & released
        # The first worker back on its data directory, the second stopped: it owns every partition again.
        first = workers.start(settings)
        second.stop()
        wait_for(lambda: all(first.get(f"/v1/users/{u}/episodes/{u}-{PER_USER - 1}") for u in users), 120,
                 "every user's last episode served by the first worker again")
        assert all(first.get(f"/v1/users/{u}/episodes/{u}-0") for u in users)
    finally:
        workers.stop_all()
