"""The view: episodes and reflections materialized for reads, behind one port.

Two adapters, one contract (tests/test_view_contract.py runs against both):

* `EdgeView` — Qdrant Edge, Qdrant's in-process engine, on a directory. The
  embedded default: user-filtered top-10 in milliseconds where qdrant-client's
  local mode takes seconds. One process owns a shard (its WAL is locked), so
  the worker that writes the view also serves its reads.
* `QdrantView` — a Qdrant server through qdrant-client (`--qdrant-url`); its
  tests run qdrant-client's local mode, which speaks the same client API.

Vectors are *named* ("text") so a retracted point can keep its audit payload
with no vector at all. Beside the dense vector each point with a text holds its
BM25 terms (sparse "bm25", IDF applied by the engine per user): `search_hybrid`
fuses both and applies recency × importance in one engine query (a score
formula over two prefetches), so the view returns the final top k. Every query is filtered to one user; per-user searches
are exact, since filtered HNSW lost recall on this data (0.68 vs 1.0).
A view has a stable name; the physical shard/collection behind it is versioned
so a rebuild can fill a new one and swap it in. Each physical view records the
embedder that built it (name and dim: `reflect-embedder.json` in the Edge shard
directory, the collection's metadata on a server); opened for another embedder
it refuses (`EmbedderMismatch`), since vectors of two models do not compare.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

from processors.lexical import document_terms, query_terms

log = logging.getLogger("reflect")

VECTOR = "text"
LEXICAL = "bm25"  # sparse BM25 terms of the point's text
REBUILD = "run `reflect rebuild` to add them"
# Keyword indexes, created with the shard; evidence_ids is the reverse
# provenance index (a belief matches each id it cites).
INDEXED = ("user_id", "kind", "status", "evidence_ids")
TIMED = "occurred_at"  # datetime index: a cycle searches what was true by its time
# An episode's place in its user's stream (its offset in the episodes topic,
# where all of a user's events are on one partition, in order): a cycle reads
# only what precedes its request in the log, so an episode projected at once,
# however late it comes, is seen by exactly the cycles after it.
POSITION = "position"
# A retracted episode's retraction position: a cycle asked at or after it no
# longer reads the episode; one asked before it still does.
GONE = "retracted_position"


@dataclass(frozen=True)
class ViewPoint:
    id: str
    vector: Sequence[float] | None  # None: payload only (a tombstone)
    payload: dict[str, Any]


@dataclass(frozen=True)
class Hit:
    id: str
    score: float
    payload: dict[str, Any]


@dataclass(frozen=True)
class Scoring:
    """How `search_hybrid` scores a point, inside the engine:

        fused = cosine + lexical · s / (s + saturation)     s: the point's BM25 score
        score = fused                                        with no boost
        score = max(fused, 0) · (1 + recency · decay + importance · importance)

    decay is 1 at `now` and halves every `half_life_hours` (on occurred_at).
    BM25 scores are unbounded, so they are saturated into 0..1 before being
    added to the cosine: a point found by terms alone still ranks below one
    that both vectors agree on. Every term is a function of the point alone
    (no rank fusion), so equal scores mean equal points, and a cut by
    (-score, id) is the same whatever the storage layout (the reflector's
    determinism rests on that)."""
    # The reflector's evidence step scores its dense pool with these defaults
    # (every point of the pool prefetched: a cut inside a tie at a half's
    # boundary is what made its evidence depend on storage order); recall
    # uses RECALL_SCORING (processors/retrieval.py).
    lexical: float = 0.5
    saturation: float = 4.0
    recency: float = 0.0
    importance: float = 0.0
    half_life_hours: float = 24.0 * 30
    now: str | None = None  # RFC 3339; required when recency > 0

    @property
    def boosted(self) -> bool:
        return bool(self.recency or self.importance)


# Candidates per half (dense, BM25) before the formula: at least this, or 2 × k.
# A point outside a half scores 0 there, so a turn BM25 finds but the dense
# top-N left out loses its whole cosine (0.3–0.6 with MiniLM): the cut, not
# the formula, decided the rank. At 100, users of 1,500 episodes lost
# recall to it; 400 scores nearly every point that matters as the formula
# would over all of them (MiniLM, recall@10: REALTALK 52.2 → 55.3 %, every
# point scored 55.4; the demo history's pattern questions 55 → 60 %), for
# ~0.8 ms more a query at 1,500 points, ~2 ms at 5,000 (tests/benchmarks/README.md,
# "Recall on public data").
PREFETCH = 400


class ViewError(RuntimeError):
    pass


class EmbedderMismatch(ViewError):
    """The view was built with another embedder than the one it is opened for."""


EMBEDDER_FILE = "reflect-embedder.json"  # in an Edge shard directory
EMBEDDER_KEY = "reflect_embedder"  # in a server collection's metadata: {"name", "dim"}


def _check_embedder(recorded: dict | None, embedder: str, dim: int, view: str, where: str) -> None:
    if not recorded or (recorded.get("name"), recorded.get("dim")) == (embedder, dim):
        return
    built = f"{recorded.get('name')} ({recorded.get('dim')}-d)"
    raise EmbedderMismatch(
        f"the view {view!r} ({where}) was built with the {built} embedder and cannot be read with "
        f"{embedder} ({dim}-d): vectors of two embedders do not compare. Run with --embedder "
        f"{recorded.get('name')} (REFLECT_EMBEDDER) to use it; to switch to {embedder}, start a worker with "
        f"--embedder {embedder} on a new --view name and run `reflect rebuild` (it replays the log into that "
        f"view with {embedder}).")


class ViewUnavailable(ViewError):
    """The view did not answer (a server down or restarting): transient, retried, never dead-lettered."""


class VectorStore(Protocol):
    def upsert(self, points: Sequence[ViewPoint]) -> None: ...

    def strip(self, ids: Sequence[str], payload: dict[str, Any], drop: Sequence[str]) -> None:
        """Remove the vectors of `ids`, set `payload` keys, delete `drop` keys."""

    def patch(self, ids: Sequence[str], payload: dict[str, Any]) -> None:
        """Set `payload` keys on `ids`, leaving vectors and other keys as they are."""

    def get(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]: ...

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        """The dense vectors of `ids` that have one (a tombstone has none)."""

    def count(self, user_id: str, **match: str) -> int: ...

    def search(self, user_id: str, vector: Sequence[float], k: int, before: str | None = None,
               upto: int | None = None, **match: str) -> list[Hit]:
        """The user's k nearest points, only those with occurred_at ≤ `before`
        and logged at or before position `upto` if given (see POSITION)."""

    def search_many(self, user_id: str, vectors: Sequence[Sequence[float]], k: int, before: str | None = None,
                    upto: int | None = None, **match: str) -> list[list[Hit]]:
        """`search` for several vectors under one filter, in one planned batch."""

    def search_hybrid(self, user_id: str, vectors: Sequence[Sequence[float]], texts: Sequence[str], k: int,
                      before: str | None = None, scoring: Scoring = Scoring(), exclude: dict[str, str] | None = None,
                      prefetch: int | None = None, ids: Sequence[str] | None = None, upto: int | None = None,
                      **match: str) -> list[list[Hit]]:
        """Per (vector, text) query: the user's k best points by `scoring`
        (dense cosine fused with BM25 on the text, boosted by recency and
        importance), in one batch; points matching `exclude` are left out of
        the answer and of the BM25 statistics. A view built before BM25 terms were stored
        answers by the dense half alone (see `lexical`).

        Each half is cut at `prefetch` candidates (default max(PREFETCH, 2k))
        before the formula; a point outside a half scores 0 there. `ids`
        restricts the answer (not the BM25 statistics) to those points: with a
        prefetch of at least their number, every one of them scores exactly,
        whatever the storage layout (the reflector's evidence step)."""

    def scroll(self, user_id: str, **match: str) -> Iterator[tuple[str, dict[str, Any]]]: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    # The rebuild: a fresh physical view behind the same stable name, filled
    # while this one serves, then made the one reads use (atomically).
    def successor(self) -> "VectorStore": ...

    def promote(self) -> None: ...

    def drop(self) -> None: ...

    def optimize(self) -> None:
        """Reorganize the stored points for reads. Only for a view no one
        reads or writes meanwhile: a rebuild's successor before it serves."""
        ...


def _floats(vector: Sequence[float]) -> list[float]:
    return vector.tolist() if hasattr(vector, "tolist") else [float(x) for x in vector]


def _active_name(root: Path, view: str) -> str:
    """The physical name behind `view`, recorded in `<root>/<view>.json`."""
    pointer = root / f"{view}.json"
    if pointer.exists():
        return json.loads(pointer.read_text())["active"]
    _point(root, view, f"{view}-0001")
    return f"{view}-0001"


def _point(root: Path, view: str, name: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    pointer = root / f"{view}.json"
    tmp = pointer.with_suffix(".tmp")
    tmp.write_text(json.dumps({"active": name}))
    os.replace(tmp, pointer)  # atomic: a reader sees the old pointer or the new one


def _next_name(view: str, name: str) -> str:
    number = name.rsplit("-", 1)[-1]
    return f"{view}-{int(number) + 1 if number.isdigit() else 1:04d}"


OPTIMIZE_TIMEOUT = 3600  # seconds; 209 s at 500k points here: a child past this is taken as hung
OPTIMIZED_FILE = "reflect-optimized.json"  # in an Edge shard directory: {"points"} when last optimized
_OPTIMIZING: set[subprocess.Popen] = set()  # the children optimizing a shard now


def stop_optimizing() -> None:
    """Kill the children optimizing a shard: a worker that stops does not wait
    minutes for one (the rebuild or compaction fails, and its successor is
    dropped; the next start compacts again)."""
    for child in list(_OPTIMIZING):
        child.kill()


def edge_config(dim: int, lexical: bool = True):
    """A shard's config: the dense vector, and the BM25 terms unless it predates them."""
    import qdrant_edge as q

    dense = {VECTOR: q.EdgeVectorParams(size=dim, distance=q.Distance.Cosine)}
    if not lexical:
        return q.EdgeConfig(vectors=dense)
    return q.EdgeConfig(vectors=dense, sparse_vectors={LEXICAL: q.EdgeSparseVectorParams(modifier=q.Modifier.Idf)})


class EdgeView:
    def __init__(self, root: str | Path, view: str, dim: int, name: str | None = None,
                 embedder: str | None = None) -> None:
        """The active shard of `view`, or (`name`) a named one, e.g. a successor.
        With `embedder`, the shard must have been built with it (a shard with no
        record, from before records were kept, adopts it); without, nothing is checked."""
        import qdrant_edge as q

        self._q = q
        self.dim, self.root, self.view, self.embedder = dim, Path(root), view, embedder
        self.name = name or _active_name(self.root, view)
        path = self.path = self.root / self.name
        record = path / EMBEDDER_FILE
        if embedder is not None and record.exists() and (path / "wal").exists():
            _check_embedder(json.loads(record.read_text()), embedder, dim, view, str(path))
        config = edge_config(dim)
        self.lexical = True
        optimized = path / OPTIMIZED_FILE  # read once: growth() is asked after every projected batch
        self._optimized = json.loads(optimized.read_text())["points"] if optimized.exists() else 0
        try:
            if (path / "wal").exists():
                try:
                    self._shard = q.EdgeShard.load(str(path), config)
                except Exception as exc:
                    if "incompatible" not in str(exc):
                        raise
                    # Built before BM25 terms were stored: serve it dense-only until rebuilt.
                    config = edge_config(dim, lexical=False)
                    self._shard = q.EdgeShard.load(str(path), config)
                    self.lexical = False
                    log.warning("view %s has no BM25 terms: recall is dense-only; %s", path, REBUILD)
            else:
                self._shard = q.EdgeShard.create(str(path), config)
                # Without these, recall after optimize() fell to 0.06: create them up front.
                self._shard.update(q.UpdateOperation.create_field_index(
                    "user_id", q.KeywordIndexParams(is_tenant=True)))
                for key in INDEXED[1:]:
                    self._shard.update(q.UpdateOperation.create_field_index(key, q.PayloadSchemaType.Keyword))
                self._shard.update(q.UpdateOperation.create_field_index(TIMED, q.PayloadSchemaType.Datetime))
                self._shard.update(q.UpdateOperation.create_field_index(POSITION, q.PayloadSchemaType.Integer))
        except Exception as exc:
            raise ViewError(f"cannot open the Qdrant Edge view at {path}: {exc} "
                            "(one process owns a shard: is another worker running on this data dir?)") from exc
        self._config = config
        if embedder is not None and not record.exists():
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps({"name": embedder, "dim": dim}))
            os.replace(tmp, record)

    def _filter(self, user_id: str, match: dict[str, str], before: str | None = None,
                exclude: dict[str, str] | None = None, ids: Sequence[str] | None = None, upto: int | None = None):
        q = self._q
        conditions = [q.FieldCondition(key=k, match=q.MatchValue(value=v))
                      for k, v in {"user_id": user_id, **match}.items()]
        if before is not None:
            conditions.append(q.FieldCondition(key=TIMED, range=q.RangeDateTime(lte=before)))
        if ids is not None:
            conditions.append(q.HasIdCondition(set(ids)))
        not_ = [q.FieldCondition(key=k, match=q.MatchValue(value=v)) for k, v in (exclude or {}).items()]
        if upto is not None:  # a missing POSITION or GONE (a belief, a live episode) never matches: kept
            not_ += [q.FieldCondition(key=POSITION, range=q.RangeFloat(gt=upto)),
                     q.FieldCondition(key=GONE, range=q.RangeFloat(lte=upto))]
        return q.Filter(must=conditions, must_not=not_) if not_ else q.Filter(must=conditions)

    def _vectors(self, p: ViewPoint) -> dict[str, Any]:
        if p.vector is None:
            return {}
        out = {VECTOR: _floats(p.vector)}
        if self.lexical and p.payload.get("text"):
            out[LEXICAL] = self._q.SparseVector(*document_terms(p.payload["text"]))
        return out

    def upsert(self, points: Sequence[ViewPoint]) -> None:
        if points:
            q = self._q
            self._shard.update(q.UpdateOperation.upsert_points([
                q.Point(p.id, self._vectors(p), p.payload) for p in points]))

    def strip(self, ids: Sequence[str], payload: dict[str, Any], drop: Sequence[str]) -> None:
        if ids:
            ids, op = list(ids), self._q.UpdateOperation
            self._shard.update(op.delete_vectors(ids, [VECTOR, LEXICAL] if self.lexical else [VECTOR]))
            self._shard.update(op.set_payload(ids, payload))
            if drop:
                self._shard.update(op.delete_payload(ids, list(drop)))

    def patch(self, ids: Sequence[str], payload: dict[str, Any]) -> None:
        if ids:
            self._shard.update(self._q.UpdateOperation.set_payload(list(ids), payload))

    def get(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        return {str(r.id): dict(r.payload) for r in self._shard.retrieve(list(ids), True, False)}

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        if not ids:
            return {}
        found = self._shard.retrieve(list(ids), False, True)
        return {str(r.id): list(r.vector[VECTOR]) for r in found if r.vector and r.vector.get(VECTOR)}

    def count(self, user_id: str, **match: str) -> int:
        return self._shard.count(self._q.CountRequest(filter=self._filter(user_id, match), exact=True))

    def search(self, user_id: str, vector: Sequence[float], k: int, before: str | None = None,
               upto: int | None = None, **match: str) -> list[Hit]:
        return self.search_many(user_id, [vector], k, before, upto, **match)[0]

    def search_many(self, user_id: str, vectors: Sequence[Sequence[float]], k: int, before: str | None = None,
                    upto: int | None = None, **match: str) -> list[list[Hit]]:
        # Exact per user (filtered HNSW lost recall here, 0.68 vs 1.0): the cost is a scan of the
        # user's points, and a batch evaluates the filter once for all vectors
        # (measured: 3 vectors over 50k points 20 ms batched vs 41 ms one by one).
        q, where = self._q, self._filter(user_id, match, before, upto=upto)
        found = self._shard.query_batch(q.QueryBatchRequest([q.QueryRequest(
            limit=k, query=q.Query.Nearest(_floats(v), using=VECTOR), filter=where, with_payload=True,
            params=q.SearchParams(exact=True)) for v in vectors]))
        return [[Hit(str(p.id), float(p.score), dict(p.payload)) for p in points] for points in found]

    def search_hybrid(self, user_id: str, vectors: Sequence[Sequence[float]], texts: Sequence[str], k: int,
                      before: str | None = None, scoring: Scoring = Scoring(), exclude: dict[str, str] | None = None,
                      prefetch: int | None = None, ids: Sequence[str] | None = None, upto: int | None = None,
                      **match: str) -> list[list[Hit]]:
        q, where = self._q, self._filter(user_id, match, before, exclude, ids, upto)
        # IDF over the user's points of every kind (scores of an episode query
        # and a belief query compare, so the two can be ranked together), and
        # only those the query may see by time: IDF over points projected
        # after `before` would make a cycle's evidence depend on how far the
        # projector had read (the same log must give the same beliefs).
        idf = q.SearchParams(idf=q.IdfParams(corpus=self._filter(user_id, {}, before, exclude, upto=upto)))
        limit = prefetch or max(PREFETCH, 2 * k)
        requests = []
        for vector, text in zip(vectors, texts):
            halves = [q.Prefetch(limit=limit, query=q.Query.Nearest(_floats(vector), using=VECTOR), filter=where,
                                 params=q.SearchParams(exact=True))]
            terms = query_terms(text) if self.lexical else ([], [])
            if terms[0]:  # a question of stopwords only has no BM25 half
                halves.append(q.Prefetch(limit=limit, query=q.Query.Nearest(q.SparseVector(*terms), using=LEXICAL),
                                         filter=where, params=idf))
            requests.append(q.QueryRequest(limit=k, prefetches=halves, query=self._formula(scoring, len(halves)),
                                           filter=where, with_payload=True))
        found = self._shard.query_batch(q.QueryBatchRequest(requests))
        return [[Hit(str(p.id), float(p.score), dict(p.payload)) for p in points] for points in found]

    def _formula(self, s: Scoring, halves: int):
        E, q = self._q.Expression, self._q
        fused = E.Variable("$score[0]")
        if halves > 1:
            bm25 = E.Variable("$score[1]")
            fused = E.Sum([fused, E.Mult([E.Constant(s.lexical), E.Div(
                bm25, E.Sum([bm25, E.Constant(s.saturation)]), by_zero_default=0.0)])])
        if s.recency and not s.now:
            raise ValueError("a recency boost needs `now`")
        if s.boosted:
            boost = [E.Constant(1.0), E.Mult([E.Constant(s.importance), E.Variable("importance")])]
            if s.recency:
                boost.append(E.Mult([E.Constant(s.recency), E.Decay(
                    q.DecayKind.Exp, E.DatetimeKey(TIMED), target=E.Datetime(s.now),
                    scale=s.half_life_hours * 3600, midpoint=0.5)]))
            fused = E.Mult([E.Max([fused, E.Constant(0.0)]), E.Sum(boost)])
        return q.Formula(fused, defaults={"$score[0]": 0.0, "$score[1]": 0.0, "importance": 0.0})

    def scroll(self, user_id: str, **match: str) -> Iterator[tuple[str, dict[str, Any]]]:
        offset = None
        while True:
            records, offset = self._shard.scroll(self._q.ScrollRequest(
                offset=offset, limit=512, filter=self._filter(user_id, match), with_payload=True))
            for r in records:
                yield str(r.id), dict(r.payload)
            if offset is None:
                return

    def flush(self) -> None:
        self._shard.flush()

    def close(self) -> None:
        shard, self._shard = self._shard, None
        if shard is not None:
            shard.flush()
            shard.close()

    def successor(self) -> "EdgeView":
        name = _next_name(self.view, self.name)
        shutil.rmtree(self.root / name, ignore_errors=True)  # what a failed rebuild left
        return EdgeView(self.root, self.view, self.dim, name=name, embedder=self.embedder)

    def promote(self) -> None:
        self.flush()
        _point(self.root, self.view, self.name)

    def drop(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def optimize(self) -> None:
        """Merge and index the shard's segments, in a child process: Edge's
        `optimize` holds the GIL for its whole run (4.4 s at 50k points, 48 s
        at 300k, measured), which would stall every thread of the worker. A
        grown, unoptimized shard pays for it in reads: the BM25 half of a
        filtered query walks every tenant's postings (at 300k points a
        hybrid query p50/p95 5.2/8.8 ms, optimized 3.6/5.2). The shard is
        closed meanwhile (one process owns it), then opened again."""
        self.close()
        child = subprocess.Popen([sys.executable, "-m", "processors.optimize_shard", str(self.path), str(self.dim),
                                  "lexical" if self.lexical else "dense"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        _OPTIMIZING.add(child)
        try:
            _, errors = child.communicate(timeout=OPTIMIZE_TIMEOUT)
            failed = (errors[-2000:] or f"exit status {child.returncode}") if child.returncode else ""
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            failed = f"not done in {OPTIMIZE_TIMEOUT} s"
        finally:
            _OPTIMIZING.discard(child)
        self._shard = self._q.EdgeShard.load(str(self.path), self._config)
        if failed:
            raise ViewError(f"optimizing the Qdrant Edge view at {self.path} failed: {failed}")
        self._optimized = self.points()
        (self.path / OPTIMIZED_FILE).write_text(json.dumps({"points": self._optimized}))

    def points(self) -> int:
        return self._shard.info().points_count

    def growth(self) -> tuple[int, int]:
        """(points now, points when last optimized; 0 if never): how much of
        the shard a live-grown view holds unoptimized (streams/compaction.py)."""
        return self.points(), self._optimized

    def copy(self) -> "EdgeView":
        """A successor holding what this shard holds: its files, flushed, copied
        (2.6 s for 500k points here). Only while no write runs (SharedView.writes_held)."""
        name = _next_name(self.view, self.name)
        shutil.rmtree(self.root / name, ignore_errors=True)  # what a failed compaction left
        self._shard.flush()
        shutil.copytree(self.path, self.root / name)
        return EdgeView(self.root, self.view, self.dim, name=name, embedder=self.embedder)


class QdrantView:
    """Qdrant server (or qdrant-client's local mode, for tests) behind an alias."""

    def __init__(self, client, view: str, dim: int, name: str | None = None, embedder: str | None = None) -> None:
        """The collection behind the alias `view`, or (`name`) a named one, e.g. a
        successor, addressed by its own name until promoted. `embedder` as in EdgeView."""
        from qdrant_client import models

        self._m = models
        self.client = client
        self.dim = dim
        self.view = view
        self.embedder = embedder
        aliases = {a.alias_name: a.collection_name for a in client.get_aliases().aliases}
        self.name = name or aliases.get(view, f"{view}-0001")
        self.target = self.name if name else view
        self.lexical = True
        record = {EMBEDDER_KEY: {"name": embedder, "dim": dim}} if embedder is not None else None
        if client.collection_exists(self.name):
            if embedder is not None:
                held = (client.get_collection(self.name).config.metadata or {}).get(EMBEDDER_KEY)
                _check_embedder(held, embedder, dim, view, f"collection {self.name}")
                if not held:  # built before records were kept: it adopts this embedder
                    client.update_collection(self.name, metadata=record)
        if not client.collection_exists(self.name):
            client.create_collection(self.name, vectors_config={
                VECTOR: models.VectorParams(size=dim, distance=models.Distance.COSINE)},
                sparse_vectors_config={LEXICAL: models.SparseVectorParams(modifier=models.Modifier.IDF)},
                metadata=record)
            client.create_payload_index(self.name, "user_id",
                                        models.KeywordIndexParams(type="keyword", is_tenant=True))
            for key in INDEXED[1:]:
                client.create_payload_index(self.name, key, models.PayloadSchemaType.KEYWORD)
            client.create_payload_index(self.name, TIMED, models.PayloadSchemaType.DATETIME)
            client.create_payload_index(self.name, POSITION, models.PayloadSchemaType.INTEGER)
        elif LEXICAL not in (client.get_collection(self.name).config.params.sparse_vectors or {}):
            # Built before BM25 terms were stored: serve it dense-only until rebuilt.
            self.lexical = False
            log.warning("collection %s has no BM25 terms: recall is dense-only; %s", self.name, REBUILD)
        if view not in aliases and not name:
            client.update_collection_aliases([models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=self.name, alias_name=view))])

    @classmethod
    def connect(cls, url: str | None, view: str, dim: int, path: str | None = None,
                api_key: str | None = None, embedder: str | None = None) -> "QdrantView":
        from qdrant_client import QdrantClient

        client = QdrantClient(url=url, api_key=api_key) if url else QdrantClient(path=path)
        try:
            return cls(client, view, dim, embedder=embedder)
        except Exception:
            client.close()  # refused (another embedder): let go of the connection or the local folder
            raise

    def _filter(self, user_id: str, match: dict[str, str], before: str | None = None,
                exclude: dict[str, str] | None = None, ids: Sequence[str] | None = None, upto: int | None = None):
        m = self._m
        conditions = [m.FieldCondition(key=k, match=m.MatchValue(value=v))
                      for k, v in {"user_id": user_id, **match}.items()]
        if before is not None:
            conditions.append(m.FieldCondition(key=TIMED, range=m.DatetimeRange(lte=before)))
        if ids is not None:
            conditions.append(m.HasIdCondition(has_id=list(ids)))
        not_ = [m.FieldCondition(key=k, match=m.MatchValue(value=v)) for k, v in (exclude or {}).items()]
        if upto is not None:  # a missing POSITION or GONE (a belief, a live episode) never matches: kept
            not_ += [m.FieldCondition(key=POSITION, range=m.Range(gt=upto)),
                     m.FieldCondition(key=GONE, range=m.Range(lte=upto))]
        return m.Filter(must=conditions, must_not=not_ or None)

    def _vectors(self, p: ViewPoint) -> dict[str, Any]:
        if p.vector is None:
            return {}
        out = {VECTOR: _floats(p.vector)}
        if self.lexical and p.payload.get("text"):
            indices, values = document_terms(p.payload["text"])
            out[LEXICAL] = self._m.SparseVector(indices=indices, values=values)
        return out

    def upsert(self, points: Sequence[ViewPoint]) -> None:
        if points:
            self.client.upsert(self.target, [
                self._m.PointStruct(id=p.id, payload=p.payload, vector=self._vectors(p)) for p in points])

    def strip(self, ids: Sequence[str], payload: dict[str, Any], drop: Sequence[str]) -> None:
        if ids:
            ids = list(ids)
            self.client.delete_vectors(self.target, vectors=[VECTOR, LEXICAL] if self.lexical else [VECTOR],
                                       points=ids)
            self.client.set_payload(self.target, payload=payload, points=ids)
            if drop:
                self.client.delete_payload(self.target, keys=list(drop), points=ids)

    def patch(self, ids: Sequence[str], payload: dict[str, Any]) -> None:
        if ids:
            self.client.set_payload(self.target, payload=payload, points=list(ids))

    def get(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        return {str(r.id): dict(r.payload or {}) for r in self.client.retrieve(self.target, list(ids))}

    def vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        if not ids:
            return {}
        found = self.client.retrieve(self.target, list(ids), with_payload=False, with_vectors=[VECTOR])
        return {str(r.id): list(r.vector[VECTOR]) for r in found if isinstance(r.vector, dict) and r.vector.get(VECTOR)}

    def count(self, user_id: str, **match: str) -> int:
        return self.client.count(self.target, count_filter=self._filter(user_id, match), exact=True).count

    def search(self, user_id: str, vector: Sequence[float], k: int, before: str | None = None,
               upto: int | None = None, **match: str) -> list[Hit]:
        return self.search_many(user_id, [vector], k, before, upto, **match)[0]

    def search_many(self, user_id: str, vectors: Sequence[Sequence[float]], k: int, before: str | None = None,
                    upto: int | None = None, **match: str) -> list[list[Hit]]:
        m, where = self._m, self._filter(user_id, match, before, upto=upto)
        found = self.client.query_batch_points(self.target, requests=[m.QueryRequest(
            query=_floats(v), using=VECTOR, limit=k, filter=where, with_payload=True,
            params=m.SearchParams(exact=True)) for v in vectors])
        return [[Hit(str(p.id), float(p.score), dict(p.payload or {})) for p in answer.points] for answer in found]

    def search_hybrid(self, user_id: str, vectors: Sequence[Sequence[float]], texts: Sequence[str], k: int,
                      before: str | None = None, scoring: Scoring = Scoring(), exclude: dict[str, str] | None = None,
                      prefetch: int | None = None, ids: Sequence[str] | None = None, upto: int | None = None,
                      **match: str) -> list[list[Hit]]:
        m, where = self._m, self._filter(user_id, match, before, exclude, ids, upto)
        # IDF over the user's points of every kind it may see by time, as in EdgeView.
        idf = m.SearchParams(idf=m.IdfCorpusParams(corpus=self._filter(user_id, {}, before, exclude, upto=upto)))
        limit = prefetch or max(PREFETCH, 2 * k)
        requests = []
        for vector, text in zip(vectors, texts):
            halves = [m.Prefetch(query=_floats(vector), using=VECTOR, limit=limit, filter=where,
                                 params=m.SearchParams(exact=True))]
            indices, values = query_terms(text) if self.lexical else ([], [])
            if indices:  # a question of stopwords only has no BM25 half
                halves.append(m.Prefetch(query=m.SparseVector(indices=indices, values=values), using=LEXICAL,
                                         limit=limit, filter=where, params=idf))
            requests.append(m.QueryRequest(prefetch=halves, query=self._formula(scoring, len(halves)), limit=k,
                                           filter=where, with_payload=True))
        found = self.client.query_batch_points(self.target, requests=requests)
        return [[Hit(str(p.id), float(p.score), dict(p.payload or {})) for p in answer.points] for answer in found]

    def _formula(self, s: Scoring, halves: int):
        m = self._m
        fused: Any = "$score[0]"
        if halves > 1:
            fused = m.SumExpression(sum=[fused, m.MultExpression(mult=[s.lexical, m.DivExpression(div=m.DivParams(
                left="$score[1]", right=m.SumExpression(sum=["$score[1]", s.saturation]), by_zero_default=0.0))])])
        if s.recency and not s.now:
            raise ValueError("a recency boost needs `now`")
        if s.boosted:
            boost: list[Any] = [1.0, m.MultExpression(mult=[s.importance, "importance"])]
            if s.recency:
                boost.append(m.MultExpression(mult=[s.recency, m.ExpDecayExpression(exp_decay=m.DecayParamsExpression(
                    x=m.DatetimeKeyExpression(datetime_key=TIMED), target=m.DatetimeExpression(datetime=s.now),
                    scale=s.half_life_hours * 3600, midpoint=0.5))]))
            fused = m.MultExpression(mult=[m.MaxExpression(max=[fused, 0.0]), m.SumExpression(sum=boost)])
        return m.FormulaQuery(formula=fused, defaults={"$score[0]": 0.0, "$score[1]": 0.0, "importance": 0.0})

    def scroll(self, user_id: str, **match: str) -> Iterator[tuple[str, dict[str, Any]]]:
        offset = None
        while True:
            records, offset = self.client.scroll(self.target, scroll_filter=self._filter(user_id, match),
                                                 limit=512, offset=offset, with_payload=True)
            for r in records:
                yield str(r.id), dict(r.payload or {})
            if offset is None:
                return

    def flush(self) -> None:
        pass  # the server persists each acknowledged write

    def close(self) -> None:
        self.client.close()

    def successor(self) -> "QdrantView":
        name = _next_name(self.view, self.name)
        if self.client.collection_exists(name):  # what a failed rebuild left
            self.client.delete_collection(name)
        return QdrantView(self.client, self.view, self.dim, name=name, embedder=self.embedder)

    def promote(self) -> None:
        m = self._m
        # One call, so a reader resolves the alias to the old collection or the new one.
        self.client.update_collection_aliases([
            m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=self.view)),
            m.CreateAliasOperation(create_alias=m.CreateAlias(collection_name=self.name, alias_name=self.view))])
        self.target = self.view

    def drop(self) -> None:
        self.client.delete_collection(self.name)

    def optimize(self) -> None:
        pass  # the server's own optimizer runs in the background


class SharedView:
    """One view called at once from the event loop's helper threads (API reads,
    projectors) and the reflector's thread, with no lock between the calls:
    both engines the worker opens allow it.

    * Qdrant Edge (qdrant-edge-py 0.9): an `EdgeShard` call holds the GIL for
      its whole run (while another thread ran 29 ms batched searches, the main
      thread went 26 ms without running), so native calls never overlap and
      each is atomic to other threads; the Rust shard is itself synchronized
      (in Qdrant's source: WAL under a mutex, segments under a read-write lock). Hammered from 4
      threads mixing retrieve, count, exact query and scroll with upserts on
      the very segments read (`python tests/benchmarks/view_threads.py
      --rounds 1000 --points 5000`, 3 runs): 1000 upserts and 3000 reads
      each, 0 answers differing from the serial ones, 0 errors, the written
      users as a serial run leaves them; tests/test_view_concurrency.py.
      What threads buy is not parallel engine work but turns: the loop and
      the other threads run between calls (scroll pages, payload conversion,
      embedding), where one lock held them all off for a whole scroll.
    * A Qdrant server (`QdrantView`): HTTP requests, concurrent by design.
    * Not qdrant-client's local mode, which is not thread-safe (the same hammer,
      `--engine local --rounds 100`: ~300 errors in 400 calls, from sqlite "cannot commit" to numpy
      IndexError, and a collection left unreadable). `open_view` never opens
      it; tests use it from one thread.

    A multi-call write (`strip`) may be seen half done, as on a server. What
    stays exclusive is `swap`: it waits for the calls in flight, so the view it
    returns is no longer in use and may be dropped, and calls made meanwhile
    wait for it and go to the new view.
    """

    WRITES = frozenset({"upsert", "strip", "patch"})

    def __init__(self, view: VectorStore) -> None:
        self._view = view
        self._turns = threading.Condition()
        self._in_flight, self._swapping = 0, False
        self._writing, self._writes_held = 0, False

    @contextmanager
    def writes_held(self) -> Iterator[VectorStore]:
        """The view with no write running until the block ends (writes called
        meanwhile wait; reads go on): a compaction copies its files here."""
        with self._turns:
            self._turns.wait_for(lambda: not self._writes_held)
            self._writes_held = True
            self._turns.wait_for(lambda: self._writing == 0)
        try:
            with self._current() as view:
                yield view
        finally:
            with self._turns:
                self._writes_held = False
                self._turns.notify_all()

    def swap(self, view: VectorStore) -> VectorStore:
        """Serve `view` from the next call on; returns the one it replaces, idle."""
        with self._turns:
            self._turns.wait_for(lambda: not self._swapping)
            self._swapping = True  # new calls wait: a busy view would never go idle
            self._turns.wait_for(lambda: self._in_flight == 0)
            old, self._view, self._swapping = self._view, view, False
            self._turns.notify_all()
            return old

    @contextmanager
    def _current(self, write: bool = False) -> Iterator[VectorStore]:
        """The view to call, held in use until the call returns."""
        with self._turns:
            self._turns.wait_for(lambda: not self._swapping and not (write and self._writes_held))
            self._in_flight += 1
            self._writing += write
            view = self._view
        try:
            yield view
        finally:
            with self._turns:
                self._in_flight -= 1
                self._writing -= write
                self._turns.notify_all()

    def __getattr__(self, name: str):
        if not callable(getattr(self._view, name)):
            return getattr(self._view, name)

        def call(*args, **kwargs):
            with self._current(write=name in self.WRITES) as view:
                result = getattr(view, name)(*args, **kwargs)
                # A lazy scroll would read the view after the call has returned.
                return iter(list(result)) if isinstance(result, Iterator) else result

        return call


def open_view(settings, dim: int) -> VectorStore:
    """The view the settings name: a Qdrant server if qdrant_url is set, else Edge.
    It must have been built with the settings' embedder (`EmbedderMismatch` else)."""
    embedder = getattr(settings, "embedder", None)
    if settings.qdrant_url:
        # REFLECT_QDRANT_API_KEY, else QDRANT_API_KEY (read before the setting existed).
        key = settings.qdrant_api_key or os.environ.get("QDRANT_API_KEY")
        view = QdrantView.connect(settings.qdrant_url, settings.view, dim, api_key=str(key) if key else None,
                                  embedder=embedder)
    else:
        view = EdgeView(settings.view_dir, settings.view, dim, embedder=embedder)
    return SharedView(view)
