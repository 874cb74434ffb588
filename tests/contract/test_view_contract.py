"""One contract, every adapter of the VectorStore port: Qdrant Edge and the
qdrant-client server adapter (in qdrant-client's local mode)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from processors.ports import NO_USER, EmbedderMismatch, Scoring, ViewError, ViewPoint
from streams.adapters.view.edge import EdgeView
from streams.adapters.view.qdrant import QdrantView

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


def test_users_lists_who_the_view_holds_and_forget_takes_every_point_of_some(make_view):
    view = make_view()
    view.upsert([point(i, ("alice", "bob", "carol")[i % 3]) for i in range(12)])
    view.upsert([ViewPoint(pid(99), None, {"user_id": NO_USER, "kind": "watermarks"})])  # the view's own record
    assert view.users() == ["alice", "bob", "carol"]
    view.forget(["alice", "carol", "nobody"])
    assert view.users() == ["bob"] and view.count("alice") == view.count("carol") == 0 and view.count("bob") == 4
    assert view.get([pid(0), pid(1), pid(99)]).keys() == {pid(1), pid(99)}


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


def test_vectors_of_points_that_have_one(make_view):
    view = make_view()
    view.upsert([point(1), point(2), ViewPoint(pid(3), None, {"user_id": "alice", "kind": "episode"})])
    view.strip([pid(2)], {"status": "retracted"}, drop=["text"])
    got = view.vectors([pid(1), pid(2), pid(3), pid(99)])
    assert list(got) == [pid(1)] and np.allclose(got[pid(1)], unit(1), atol=1e-6)  # stored as float32
    assert view.vectors([]) == {}


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


# ------------------------------------------------------------ hybrid retrieval

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()


def worded(n: int, user: str = "alice", text: str | None = None, **payload) -> ViewPoint:
    rng = np.random.default_rng(1000 + n)
    text = text or " ".join(rng.choice(WORDS, 6))
    return ViewPoint(pid(n), unit(n), {"user_id": user, "kind": "episode", "status": "recorded", "text": text,
                                       "occurred_at": "2026-06-01T00:00:00Z", **payload})


def test_hybrid_finds_the_point_a_rare_term_names_where_the_vector_alone_misses(make_view):
    view = make_view()
    view.upsert([worded(i) for i in range(30)] + [worded(30, text="zanzibar incident report alpha")])
    # A vector that is no point's: dense alone ranks point 30 low, BM25 on "zanzibar" lifts it to the top.
    dense = [h.id for h in view.search("alice", unit(999), k=31)]
    assert dense.index(pid(30)) > 10
    [hits] = view.search_hybrid("alice", [unit(999)], ["what about zanzibar?"], k=5, scoring=Scoring(lexical=2.0))
    assert hits[0].id == pid(30)
    assert hits[0].score > hits[1].score and all(h.payload["user_id"] == "alice" for h in hits)


def test_hybrid_without_a_term_in_common_ranks_by_cosine_alone(make_view):
    view = make_view()
    view.upsert([worded(i) for i in range(20)])
    [hits] = view.search_hybrid("alice", [unit(3)], ["nothing shared here"], k=6)
    plain = view.search("alice", unit(3), k=6)
    assert [h.id for h in hits] == [h.id for h in plain]
    assert [round(h.score, 4) for h in hits] == [round(h.score, 4) for h in plain]  # fused = cosine


def test_hybrid_is_scoped_filtered_and_batched(make_view):
    view = make_view()
    view.upsert([worded(i, "alice") for i in range(10)] + [worded(10, "bob", text="zanzibar zanzibar")]
                + [worded(11, "alice", text="zanzibar later", occurred_at="2026-07-01T00:00:00Z")]
                + [worded(12, "alice", text="zanzibar belief", kind="reflection", status="live")])
    a, b = view.search_hybrid("alice", [unit(1), unit(2)], ["zanzibar", "zanzibar"], k=20,
                              before="2026-06-15T00:00:00Z", kind="episode", status="recorded")
    assert {h.id for h in a} == {pid(i) for i in range(10)} == {h.id for h in b}  # not bob's, not later, not beliefs
    [beliefs] = view.search_hybrid("alice", [unit(1)], ["zanzibar"], k=5, kind="reflection")
    assert [h.id for h in beliefs] == [pid(12)]
    assert view.search_hybrid("alice", [], [], k=3) == []


def test_the_engine_applies_importance_and_recency_in_its_formula(make_view):
    view = make_view()
    same = unit(5)  # one vector for all: cosine 1, so the boosts alone separate them
    view.upsert([ViewPoint(pid(i), same, {"user_id": "alice", "text": "plain words", "importance": imp,
                                          "occurred_at": at})
                 for i, (imp, at) in enumerate([(0.0, "2026-06-10T00:00:00Z"), (0.8, "2026-06-10T00:00:00Z"),
                                                (0.0, "2026-05-11T00:00:00Z")])])
    scoring = Scoring(importance=0.5, recency=1.0, half_life_hours=24 * 30, now="2026-06-10T00:00:00Z")
    [hits] = view.search_hybrid("alice", [same], ["zzz"], k=3, scoring=scoring)
    got = {h.id: h.score for h in hits}
    # 1 · (1 + 0.5 · importance + 1.0 · decay), decay 1 now and 0.5 one half-life back.
    assert got[pid(0)] == pytest.approx(2.0, abs=1e-3)
    assert got[pid(1)] == pytest.approx(2.4, abs=1e-3)
    assert got[pid(2)] == pytest.approx(1.5, abs=1e-3)
    assert [h.id for h in hits] == [pid(1), pid(0), pid(2)]
    with pytest.raises(ValueError, match="needs `now`"):
        view.search_hybrid("alice", [same], ["x"], k=3, scoring=Scoring(recency=1.0))


def test_a_stripped_point_is_not_found_by_its_terms_either(make_view):
    view = make_view()
    view.upsert([worded(i) for i in range(5)] + [worded(5, text="zanzibar")])
    view.strip([pid(5)], {"status": "retracted"}, drop=["text"])
    [hits] = view.search_hybrid("alice", [unit(5)], ["zanzibar"], k=10)
    assert pid(5) not in {h.id for h in hits} and len(hits) == 5


def old_layout(kind: str, tmp_path):
    """A view as built before BM25 terms were stored: dense vectors only."""
    if kind == "edge":
        import qdrant_edge as q
        from streams.adapters.view.edge import _active_name

        root = tmp_path / "old-edge"
        shard = q.EdgeShard.create(str(root / _active_name(root, "reflect")), q.EdgeConfig(
            vectors={"text": q.EdgeVectorParams(size=DIM, distance=q.Distance.Cosine)}))
        shard.update(q.UpdateOperation.upsert_points([q.Point(p.id, {"text": p.vector}, p.payload)
                                                      for p in [worded(i) for i in range(8)]]))
        shard.flush()
        shard.close()
        return lambda: EdgeView(root, "reflect", DIM)
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=str(tmp_path / "old-qdrant"))
    client.create_collection("reflect-0001", vectors_config={
        "text": models.VectorParams(size=DIM, distance=models.Distance.COSINE)})
    client.upsert("reflect-0001", [models.PointStruct(id=p.id, vector={"text": p.vector}, payload=p.payload)
                                   for p in [worded(i) for i in range(8)]])
    return lambda: QdrantView(client, "reflect", DIM)


@pytest.mark.parametrize("kind", ["edge", "qdrant-local"])
def test_a_view_built_before_bm25_serves_dense_only_and_its_successor_is_hybrid(kind, tmp_path, caplog):
    view = old_layout(kind, tmp_path)()
    try:
        assert view.lexical is False and "reflect rebuild" in caplog.text
        [hits] = view.search_hybrid("alice", [unit(2)], ["anything"], k=3)
        assert [h.id for h in hits] == [h.id for h in view.search("alice", unit(2), k=3)]
        view.upsert([worded(20, text="zanzibar")])  # still writable
        view.strip([pid(20)], {"status": "retracted"}, drop=["text"])
        new = view.successor()
        new.upsert([worded(i) for i in range(8)] + [worded(9, text="zanzibar")])
        assert new.lexical is True
        lifted = new.search_hybrid("alice", [unit(997)], ["zanzibar"], k=1, scoring=Scoring(lexical=2.0))
        assert lifted[0][0].id == pid(9) != new.search("alice", unit(997), k=1)[0].id
    finally:
        view.close()


def test_search_up_to_a_position_leaves_out_what_was_logged_after_or_gone_by_then(make_view):
    """A cycle reads the log as of its request: points logged after it, and
    episodes retracted at or before it, are out; a point without a position
    (a belief) is in, and so is an episode retracted only later."""
    view = make_view()
    view.upsert([point(1, position=1), point(2, position=2), point(3, position=3),
                 point(4, position=1, status="retracted", retracted_position=2),
                 point(5, position=1, status="retracted", retracted_position=9),
                 ViewPoint(pid(6), unit(6), {"user_id": "alice", "kind": "reflection", "text": "belief"})])
    found = {h.id for h in view.search("alice", unit(0), k=10, upto=2)}
    assert found == {pid(1), pid(2), pid(5), pid(6)}
    hybrid = {h.id for h in view.search_hybrid("alice", [unit(0)], ["text"], k=10, upto=2)[0]}
    assert hybrid == found
    assert len(view.search("alice", unit(0), k=10)) == 6


def test_hybrid_scores_up_to_a_time_ignore_what_was_projected_after_it(make_view):
    """A cycle's evidence must not depend on how far the projector had read:
    BM25 statistics are taken over what the query may see, not the whole store."""
    view = make_view()
    view.upsert([worded(i, text=f"zanzibar {WORDS[i]}" if i < 3 else None) for i in range(10)])
    ask = lambda: [(h.id, round(h.score, 5)) for h in view.search_hybrid(  # noqa: E731
        "alice", [unit(99)], ["zanzibar"], k=10, before="2026-06-01T00:00:00Z")[0]]
    first = ask()
    view.upsert([worded(100 + i, text="zanzibar again", occurred_at="2026-07-01T00:00:00Z") for i in range(20)])
    assert ask() == first
    view.upsert([worded(200, text="zanzibar excluded", cycle_id="c1")])
    with_it = [(h.id, round(h.score, 5)) for h in view.search_hybrid(
        "alice", [unit(99)], ["zanzibar"], k=10, before="2026-06-01T00:00:00Z", exclude={"cycle_id": "c1"})[0]]
    assert with_it == first


def test_a_whole_prefetch_scores_every_point_exactly_whatever_the_layout(make_view):
    """The reflector's evidence step: with each half prefetched whole, a point
    found by its terms alone still gets its cosine, so the fused score is a
    function of the point, and the top k cut by (-score, id) is the same for
    any order of upserts (the same log must give the same beliefs)."""
    view = make_view()

    def history(user: str, offset: int) -> list[ViewPoint]:
        # Twenty points on one vector (a tie wider than any cut), ten carrying the query's terms.
        tied = [ViewPoint(pid(offset + i), unit(7), {**worded(i, user).payload, "n": i,
                                                     "text": "retry the deploy" if i % 3 else "lunch"})
                for i in range(20)]
        return tied + [ViewPoint(pid(offset + 20 + i), unit(20 + i), {**worded(20 + i, user).payload, "n": 20 + i,
                                                                      "text": f"retry deploy logs {i}"})
                       for i in range(10)]
    for p in history("alice", 0):
        view.upsert([p])
    for p in reversed(history("bob", 100)):  # the same points, stored in the other order
        view.upsert([p])
    question = ["retry the deploy after logs"]
    answers = [sorted((round(h.score, 5), h.payload["n"]) for h in hits) for user in ("alice", "bob")
               for [hits] in [view.search_hybrid(user, [unit(7)], question, k=30, prefetch=30)]]
    assert answers[0] == answers[1] and len(answers[0]) == 30
    [cut] = view.search_hybrid("alice", [unit(7)], question, k=30, prefetch=2)
    assert len(cut) < 30  # a narrow prefetch leaves points out: the whole one does not
    # Restricted to some ids, those points score as in the whole query (IDF stays the user's).
    some = [pid(i) for i in (0, 4, 21, 25)]
    [pool] = view.search_hybrid("alice", [unit(7)], question, k=30, ids=some, prefetch=len(some))
    whole = {h.id: round(h.score, 5) for h in view.search_hybrid("alice", [unit(7)], question, k=30,
                                                                 prefetch=30)[0]}
    assert {h.id: round(h.score, 5) for h in pool} == {i: whole[i] for i in some}
# --- the embedder a view was built with (issue 21.2) -------------------------

def open_as(kind: str, tmp_path, embedder: str | None, dim: int = DIM, view: str = "reflect"):
    if kind == "edge":
        return EdgeView(tmp_path / "edge", view, dim, embedder=embedder)
    return QdrantView.connect(None, view, dim, path=str(tmp_path / "qdrant"), embedder=embedder)


@pytest.mark.parametrize("kind", ["edge", "qdrant-local"])
def test_a_view_refuses_another_embedder_naming_both_and_the_rebuild(kind, tmp_path):
    view = open_as(kind, tmp_path, "minilm")
    view.upsert([point(1)])
    view.close()
    with pytest.raises(EmbedderMismatch) as refused:
        open_as(kind, tmp_path, "e5-small")
    message = str(refused.value)
    assert "minilm (8-d)" in message and "e5-small (8-d)" in message and "`reflect rebuild`" in message
    with pytest.raises(EmbedderMismatch, match=r"minilm \(8-d\).*minilm \(16-d\)"):
        open_as(kind, tmp_path, "minilm", dim=16)  # same name, other dim: another model too
    again = open_as(kind, tmp_path, "minilm")  # the embedder that built it: served as before
    assert again.count("alice") == 1
    new = again.successor()  # a rebuild's view records the same embedder
    new.upsert([point(2)])
    new.promote()
    again.drop()
    new.close()
    with pytest.raises(EmbedderMismatch, match="built with the minilm"):
        open_as(kind, tmp_path, "hashing")


@pytest.mark.parametrize("kind", ["edge", "qdrant-local"])
def test_a_view_without_a_record_adopts_the_embedder_that_opens_it(kind, tmp_path):
    view = open_as(kind, tmp_path, None)  # as built before views recorded their embedder
    view.upsert([point(1)])
    view.close()
    adopted = open_as(kind, tmp_path, "e5-small")
    assert adopted.count("alice") == 1
    adopted.close()
    with pytest.raises(EmbedderMismatch, match="built with the e5-small"):
        open_as(kind, tmp_path, "minilm")
    open_as(kind, tmp_path, None).close()  # no embedder named: nothing checked


def test_open_view_checks_the_settings_embedder(tmp_path):
    from streams.adapters.factory import open_view
    from streams.settings import Settings

    first = open_view(Settings.load(env={}, data_dir=str(tmp_path), embedder="hashing"), 384)
    first.close()
    with pytest.raises(EmbedderMismatch, match=r"hashing \(384-d\).*minilm \(384-d\)"):
        open_view(Settings.load(env={}, data_dir=str(tmp_path), embedder="minilm"), 384)


def test_a_worker_over_a_view_of_another_embedder_stops_with_one_line(tmp_path):
    from streams.adapters.factory import open_view
    from streams.settings import Settings, SettingsError
    from streams.worker.app import create_app

    open_view(Settings.load(env={}, data_dir=str(tmp_path), embedder="hashing"), 384).close()
    with pytest.raises(SettingsError, match=r"invalid setting embedder \(the view 'reflect' .* hashing .* minilm"):
        create_app(Settings.load(env={}, data_dir=str(tmp_path), embedder="minilm"))


def test_an_optimized_view_answers_as_before(make_view):
    """What a rebuild does to its successor: the same points, the same answers."""
    view = make_view()
    view.upsert([worded(i, "alice") for i in range(300)] + [worded(300 + i, "bob") for i in range(50)])
    asked = [(unit(7), "zanzibar incident"), (unit(40), "text 41"), (unit(999), "nothing shared here")]

    def answers():
        return [[(h.id, round(h.score, 5)) for h in hits]
                for hits in view.search_hybrid("alice", [v for v, _ in asked], [t for _, t in asked], k=10)]

    before, counted = answers(), (view.count("alice"), view.count("bob"))
    view.optimize()
    assert answers() == before and (view.count("alice"), view.count("bob")) == counted


def test_optimizing_an_edge_view_leaves_the_callers_threads_running(tmp_path):
    """Edge's own optimize holds the GIL for its whole run: for these 10,000
    points of 384 dimensions a thread of the caller waited 1.9 s in-process.
    EdgeView.optimize runs it in a child process; what is left is closing and
    opening the shard (a 0.3 s wait, measured)."""
    import threading
    import time

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(10_000, 384))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    view = EdgeView(tmp_path / "edge", "reflect", 384)
    try:
        view.upsert([ViewPoint(pid(i), list(v), {"user_id": f"u{i % 5}", "kind": "episode", "status": "recorded",
                                                  "text": f"episode {i} about deploys {i % 97} and logs"})
                     for i, v in enumerate(vectors)])
        ticks, done = [time.perf_counter()], threading.Event()

        def tick():  # a sample every 5 ms until optimize returns: the longest gap is how long this thread waited
            while not done.wait(0.005):
                ticks.append(time.perf_counter())

        ticker = threading.Thread(target=tick)
        ticker.start()
        try:
            view.optimize()
        finally:
            done.set()
            ticker.join()
        assert max(b - a for a, b in zip(ticks, ticks[1:])) < 1.0
        assert view.count("u0") == 2000
    finally:
        view.close()
