"""One contract, every adapter of the VectorStore port: Qdrant Edge and the
qdrant-client server adapter (in qdrant-client's local mode)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from processors.view import EdgeView, QdrantView, ViewError, ViewPoint

DIM = 8


@pytest.fixture(params=["edge", "qdrant-local"])
def make_view(request, tmp_path):
    opened = []

    def make(view: str = "reflect"):
        if request.param == "edge":
            v = EdgeView(tmp_path / "edge", view, DIM)
        else:
            v = QdrantView.connect(None, view, DIM, path=str(tmp_path / "qdrant"))
        opened.append(v)
        return v

    yield make
    for v in opened:
        v.close()


def unit(seed: int) -> list[float]:
    vec = np.random.default_rng(seed).normal(size=DIM)
    return list(vec / np.linalg.norm(vec))


def pid(n: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, str(n)))


def point(n: int, user: str = "alice", **payload) -> ViewPoint:
    return ViewPoint(pid(n), unit(n), {"user_id": user, "kind": "episode", "status": "recorded",
                                       "text": f"text {n}", **payload})


def test_upsert_get_count_scoped_to_user(make_view):
    view = make_view()
    view.upsert([point(i, "alice" if i % 2 else "bob") for i in range(10)])
    assert view.count("alice") == 5 and view.count("bob") == 5 and view.count("carol") == 0
    assert view.count("alice", kind="episode", status="recorded") == 5
    got = view.get([pid(1), pid(2), pid(99)])
    assert set(got) == {pid(1), pid(2)} and got[pid(1)]["text"] == "text 1"


def test_upsert_same_ids_twice_is_idempotent(make_view):
    view = make_view()
    view.upsert([point(i) for i in range(6)])
    view.upsert([point(i) for i in range(6)])
    assert view.count("alice") == 6


def test_search_is_exact_and_never_crosses_users(make_view):
    view = make_view()
    view.upsert([point(i, "alice" if i < 20 else "bob") for i in range(40)])
    hits = view.search("alice", unit(25), k=5)  # bob's point 25 is the true nearest overall
    assert len(hits) == 5 and all(h.payload["user_id"] == "alice" for h in hits)
    expected = sorted(range(20), key=lambda i: -float(np.dot(unit(i), unit(25))))[:5]
    assert [h.id for h in hits] == [pid(i) for i in expected]
    assert hits[0].score >= hits[-1].score
    assert view.search("bob", unit(25), k=1)[0].id == pid(25)


def test_search_many_answers_each_vector_as_search_would(make_view):
    view = make_view()
    view.upsert([point(i, "alice" if i < 20 else "bob") for i in range(40)])
    batched = view.search_many("alice", [unit(3), unit(25), unit(11)], k=4)
    assert [[h.id for h in hits] for hits in batched] == \
        [[h.id for h in view.search("alice", unit(i), k=4)] for i in (3, 25, 11)]
    assert all(h.payload["user_id"] == "alice" for hits in batched for h in hits)
    assert view.search_many("alice", [], k=4) == []


def test_search_before_a_time_leaves_out_what_occurred_later(make_view):
    view = make_view()
    times = ["2026-06-01T09:00:00Z", "2026-06-02T09:00:00+00:00", "2026-06-02T10:00:00.5Z", "2026-07-01T00:00:00Z"]
    view.upsert([ViewPoint(pid(i), unit(i), {"user_id": "alice", "occurred_at": t}) for i, t in enumerate(times)])
    found = {h.id for h in view.search("alice", unit(0), k=10, before="2026-06-02T10:00:00.5Z")}
    assert found == {pid(0), pid(1), pid(2)}  # inclusive, whatever the offset notation
    assert len(view.search("alice", unit(0), k=10)) == 4


def test_strip_removes_vector_and_keys_and_keeps_the_audit_payload(make_view):
    view = make_view()
    view.upsert([point(1), point(2)])
    view.strip([pid(1)], {"status": "retracted"}, drop=["text"])
    payload = view.get([pid(1)])[pid(1)]
    assert payload["status"] == "retracted" and "text" not in payload and payload["user_id"] == "alice"
    assert [h.id for h in view.search("alice", unit(1), k=5)] == [pid(2)]  # no vector: not searchable
    assert view.count("alice", status="retracted") == 1


def test_payload_only_point_is_stored_and_not_searchable(make_view):
    view = make_view()
    view.upsert([ViewPoint(pid(7), None, {"user_id": "alice", "kind": "episode", "status": "retracted"})])
    assert view.get([pid(7)])[pid(7)]["status"] == "retracted"
    assert view.search("alice", unit(7), k=3) == []


def test_scroll_pages_through_one_user(make_view):
    view = make_view()
    view.upsert([point(i, "alice" if i % 3 else "bob") for i in range(1200)])
    seen = dict(view.scroll("alice"))
    assert len(seen) == 800 and all(p["user_id"] == "alice" for p in seen.values())
    assert len(dict(view.scroll("alice", kind="reflection"))) == 0


def test_view_survives_reopen_under_its_stable_name(make_view):
    view = make_view("beliefs")
    view.upsert([point(i) for i in range(3)])
    name = view.name
    view.flush()
    view.close()
    again = make_view("beliefs")
    assert again.name == name and again.count("alice") == 3


def test_edge_shard_has_one_owner(tmp_path):
    first = EdgeView(tmp_path, "reflect", DIM)
    try:
        with pytest.raises(ViewError, match="one process owns a shard"):
            EdgeView(tmp_path, "reflect", DIM)
    finally:
        first.close()


def test_a_successor_fills_while_the_view_serves_then_takes_its_place(make_view):
    view = make_view("beliefs")
    view.upsert([point(i) for i in range(3)])
    new = view.successor()
    assert new.name != view.name and new.count("alice") == 0
    new.upsert([point(i) for i in range(5)])
    assert view.count("alice") == 3  # reads still answer from the old one
    new.promote()
    old_name = view.name
    view.drop()
    new.flush()
    new.close()
    again = make_view("beliefs")  # what a restart opens under the stable name
    assert again.name == new.name != old_name and again.count("alice") == 5
