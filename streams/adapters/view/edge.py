"""The view on Qdrant Edge, Qdrant's in-process engine, on a directory.

Each physical shard is a directory under the view root; `<root>/<view>.json`
names the active one, so a rebuild or a compaction fills a successor and
swaps it in by rewriting that pointer.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from processors.ports import (GONE, INDEXED, LEXICAL, MAX_USERS, NO_USER, POSITION, PREFETCH, TIMED, VECTOR, Hit,
                              Scoring, ViewError, ViewPoint)
from streams.adapters.lexical import document_terms, query_terms
from streams.adapters.view import REBUILD, check_embedder, floats, next_name

log = logging.getLogger("reflect")

EMBEDDER_FILE = "reflect-embedder.json"  # in a shard directory: {"name", "dim"}
REWRITE_CHUNK = 512  # points a rewrite reads and writes at a time


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
            check_embedder(json.loads(record.read_text()), embedder, dim, view, str(path))
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
        out = {VECTOR: floats(p.vector)}
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
            limit=k, query=q.Query.Nearest(floats(v), using=VECTOR), filter=where, with_payload=True,
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
            halves = [q.Prefetch(limit=limit, query=q.Query.Nearest(floats(vector), using=VECTOR), filter=where,
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

    def users(self) -> list[str]:
        found = self._shard.facet(self._q.FacetRequest(key="user_id", limit=MAX_USERS, exact=True))
        # Edge's exact facet still lists a deleted value, with a count of 0.
        return sorted(str(h.value) for h in found.hits if h.count and h.value != NO_USER)

    def forget(self, user_ids: Sequence[str], kinds: Sequence[str] | None = None, before: int | None = None) -> None:
        if user_ids:
            q = self._q
            must = [q.FieldCondition(key="user_id", match=q.MatchAny(any=list(user_ids)))]
            if kinds is not None:
                must.append(q.FieldCondition(key="kind", match=q.MatchAny(any=list(kinds))))
            chosen = q.Filter(must=must) if before is None else \
                q.Filter(must=must, must_not=[q.FieldCondition(key=POSITION, range=q.RangeFloat(gte=before))])
            self._shard.update(q.UpdateOperation.delete_points_by_filter(chosen))

    def flush(self) -> None:
        self._shard.flush()

    def close(self) -> None:
        shard, self._shard = self._shard, None
        if shard is not None:
            shard.flush()
            shard.close()

    def successor(self) -> "EdgeView":
        name = next_name(self.view, self.name)
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
        child = subprocess.Popen([sys.executable, "-m", "streams.adapters.optimize", str(self.path), str(self.dim),
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
        the shard a live-grown view holds unoptimized (streams/worker/compaction.py)."""
        return self.points(), self._optimized

    def rewritten(self, between_writes=contextlib.nullcontext) -> "EdgeView":
        """A successor holding what this shard holds, written point by point:
        none of its files ever held what was stripped or deleted here (a
        shard keeps an erased text in its WAL and payload pages until it is
        dropped). Writes may go on meanwhile: a scrub replays what they
        change onto it (streams/worker/compaction.py). Each chunk is read
        inside `between_writes()` (SharedView.writes_paused), so that no point
        is copied halfway through a write (a strip is three engine updates):
        a belief copied with its erasure in its history but its text not yet
        dropped would keep the text, as the replay skips what history holds."""
        fresh = self.successor()
        for user in [*self.users(), NO_USER]:
            points = self.scroll(user)
            while True:
                with between_writes():
                    chunk = list(itertools.islice(points, REWRITE_CHUNK))
                    vectors = self.vectors([pid for pid, _ in chunk])
                if not chunk:
                    break
                fresh.upsert([ViewPoint(pid, vectors.get(pid), payload) for pid, payload in chunk])
        return fresh

    def copy(self) -> "EdgeView":
        """A successor holding what this shard holds: its files, flushed, copied
        (2.6 s for 500k points here). Only while no write runs (SharedView.writes_held)."""
        name = next_name(self.view, self.name)
        shutil.rmtree(self.root / name, ignore_errors=True)  # what a failed compaction left
        self._shard.flush()
        shutil.copytree(self.path, self.root / name)
        return EdgeView(self.root, self.view, self.dim, name=name, embedder=self.embedder)
