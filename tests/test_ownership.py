"""The pure parts of routing a user's reads to its owner (streams/ownership.py):
the owner in the group's map, and the watermarks of
what an embedded view holds. The routing itself, on real workers:
tests/test_workers.py."""

from __future__ import annotations

import orjson
from aiokafka import TopicPartition

from processors.view import EdgeView
from streams.ownership import NO_USER, Watermarks, owner_in


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
