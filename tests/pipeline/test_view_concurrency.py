"""The view shared by threads (`SharedView`) over a real Qdrant Edge shard:
concurrent reads and writes answer as serial ones, and a swap waits for the
calls in flight and sends the calls made meanwhile to the new view."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from processors.ports import ViewPoint
from streams.adapters.view.edge import EdgeView
from streams.adapters.view.shared import SharedView
from support.harness import wait_for

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from view_threads import DIM, trial  # noqa: E402


def test_threads_reading_and_writing_get_the_serial_answers(tmp_path):
    t = trial(lambda name: SharedView(EdgeView(tmp_path / name, "reflect", DIM)), threads=4, rounds=160,
              users=3, per_user=600)
    assert set(t.calls) == {"upsert", "get", "count", "search", "scroll"}
    assert sum(t.calls.values()) == 4 * 160
    assert t.clean, (dict(t.mismatches), t.errors[:3], t.differs)


class Held:
    """A view whose `get` waits for `release` once it has begun: a call in flight."""

    def __init__(self, view: EdgeView) -> None:
        self.view, self.begun, self.release = view, threading.Event(), threading.Event()

    def get(self, ids):
        self.begun.set()
        assert self.release.wait(30), "never released"
        return self.view.get(ids)

    def __getattr__(self, name: str):
        return getattr(self.view, name)


def edge(tmp_path: Path, name: str, users: list[str]) -> EdgeView:
    view = EdgeView(tmp_path / name, "reflect", DIM)
    view.upsert([ViewPoint(f"00000000-0000-0000-0000-{i:012d}", [1.0] * DIM, {"user_id": u, "text": name})
                 for i, u in enumerate(users)])
    return view


def test_swap_waits_for_the_calls_in_flight_and_later_calls_see_the_new_view(tmp_path):
    old = Held(edge(tmp_path, "old", ["alice"]))
    new = edge(tmp_path, "new", ["alice", "alice"])
    shared, answers = SharedView(old), {}

    def run(name: str, call) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.__setitem__(name, call()))
        thread.start()
        return thread

    in_flight = run("in flight", lambda: shared.get(["00000000-0000-0000-0000-000000000000"]))
    assert old.begun.wait(30)
    swapping = run("swap", lambda: shared.swap(new))
    swapping.join(0.3)
    assert swapping.is_alive(), "the swap returned while a call was in flight on the old view"
    later = run("later", lambda: shared.count("alice"))
    old.release.set()
    for thread in (in_flight, swapping, later):
        thread.join(30)
    assert answers["in flight"]["00000000-0000-0000-0000-000000000000"]["text"] == "old"
    assert answers["swap"] is old and answers["later"] == 2  # the new view's count
    old.drop()  # idle: nothing reads it any more
    assert shared.get(["00000000-0000-0000-0000-000000000001"]) != {}
    new.close()


def test_a_write_made_while_writes_pause_waits_and_goes_to_the_view_swapped_in(tmp_path):
    """A rebuild's last catch-up reads the log with writes paused: a write
    the log has but the catch-up missed is not left in the old view."""
    old, new = edge(tmp_path, "old", ["alice"]), edge(tmp_path, "new", ["alice"])
    shared, late = SharedView(old), ViewPoint("00000000-0000-0000-0000-00000000000a", [1.0] * DIM,
                                              {"user_id": "alice", "text": "late"})
    shared.pause_writes()
    writing = threading.Thread(target=lambda: shared.upsert([late]))
    writing.start()
    writing.join(0.3)
    assert writing.is_alive(), "a write ran while writes were paused"
    assert shared.count("alice") == 1  # reads go on
    assert shared.swap(new) is old  # a write waiting is none in flight
    shared.resume_writes()
    writing.join(30)
    assert not writing.is_alive()
    assert (old.count("alice"), new.count("alice")) == (1, 2)
    old.drop()
    new.close()


class Halfway:
    """An Edge shard that calls `meanwhile()` once `after` engine updates are
    done: a write caught halfway (a strip is three updates)."""

    def __init__(self, shard, after: int, meanwhile) -> None:
        self.shard, self.left, self.meanwhile = shard, after, meanwhile

    def update(self, operation) -> None:
        self.shard.update(operation)
        self.left -= 1
        if self.left == 0:
            self.meanwhile()

    def __getattr__(self, name: str):
        return getattr(self.shard, name)


def test_a_copy_written_point_by_point_never_holds_half_a_write(tmp_path):
    """A scrub copies the view point by point while writes go on. A belief
    caught between a strip's updates (status and history set, the text not
    yet dropped) would be copied marked erased with its text, and the
    scrub's replay of the erasure would skip it as applied."""
    view = EdgeView(tmp_path / "view", "reflect", DIM)
    pid = "00000000-0000-0000-0000-000000000001"
    view.upsert([ViewPoint(pid, [1.0] * DIM, {"user_id": "alice", "status": "live", "text": "heron-lantern"})])
    shared, copies, copier = SharedView(view), [], []

    def copy_meanwhile():
        copier.append(threading.Thread(target=lambda: copies.append(shared.rewritten(shared.writes_paused))))
        copier[0].start()
        # On once the copy is done, or waits for this write to end.
        wait_for(lambda: not copier[0].is_alive() or shared._writes_held, 30, "the copy to end or wait")

    view._shard = Halfway(view._shard, 2, copy_meanwhile)
    shared.strip([pid], {"status": "invalid"}, drop=["text"])
    copier[0].join(30)
    assert copies[0].get([pid])[pid] == {"user_id": "alice", "status": "invalid"}
    copies[0].close()
    view.close()
