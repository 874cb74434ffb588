"""The pure parts of routing a user's reads to its owner (streams/ownership.py):
the owner in the group's map, and the watermarks of
what an embedded view holds. The routing itself, on real workers:
tests/test_workers.py."""

from __future__ import annotations

from aiokafka import TopicPartition

from streams.ownership import Watermarks, owner_in


def test_the_owner_is_the_worker_assigned_the_partition_and_none_while_unassigned():
    distribution = {"http://a:1": {"episodes": [0, 2], "reflections": [0, 2]},
                    "http://b:1": {"episodes": [1], "reflections": [1, 3]}}
    assert owner_in(distribution, "episodes", 2) == "http://a:1"
    assert owner_in(distribution, "episodes", 1) == "http://b:1"
    assert owner_in(distribution, "episodes", 3) is None  # mid-rebalance: nobody, not a guess
    assert owner_in({}, "episodes", 0) is None


def test_watermarks_only_advance_survive_a_restart_and_are_per_view(tmp_path):
    path = tmp_path / "view" / "offsets.json"
    marks = Watermarks(path)
    e0, r0 = TopicPartition("episodes", 0), TopicPartition("reflections", 0)
    assert marks.get("reflect-0001", e0) == 0
    marks.advance("reflect-0001", {e0: 10, r0: 3})
    marks.advance("reflect-0001", {e0: 7})  # a replayed batch never moves it back
    again = Watermarks(path)
    assert (again.get("reflect-0001", e0), again.get("reflect-0001", r0)) == (10, 3)
    assert again.get("reflect-0002", e0) == 0  # a rebuilt view holds only what its rebuild recorded
    again.forget("reflect-0001")
    assert Watermarks(path).get("reflect-0001", e0) == 0
