"""The view on a Qdrant server, through qdrant-client, behind an alias.

Its tests run qdrant-client's local mode, which speaks the same client API
(but is not thread-safe: `open_view` never opens it).
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Sequence

from processors.ports import (GONE, INDEXED, LEXICAL, MAX_USERS, NO_USER, POSITION, PREFETCH, TIMED, VECTOR, Hit,
                              Scoring, ViewPoint)
from streams.adapters.lexical import document_terms, query_terms
from streams.adapters.view import REBUILD, check_embedder, floats, next_name

log = logging.getLogger("reflect")

EMBEDDER_KEY = "reflect_embedder"  # in a collection's metadata: {"name", "dim"}


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
                check_embedder(held, embedder, dim, view, f"collection {self.name}")
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
        out = {VECTOR: floats(p.vector)}
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

    def users(self) -> list[str]:
        found = self.client.facet(self.target, key="user_id", limit=MAX_USERS, exact=True)
        return sorted(str(h.value) for h in found.hits if h.count and h.value != NO_USER)

    def forget(self, user_ids: Sequence[str], kinds: Sequence[str] | None = None, before: int | None = None) -> None:
        if user_ids:
            m = self._m
            must = [m.FieldCondition(key="user_id", match=m.MatchAny(any=list(user_ids)))]
            if kinds is not None:
                must.append(m.FieldCondition(key="kind", match=m.MatchAny(any=list(kinds))))
            keep = None if before is None else [m.FieldCondition(key=POSITION, range=m.Range(gte=before))]
            chosen = m.Filter(must=must, must_not=keep)
            self.client.delete(self.target, points_selector=m.FilterSelector(filter=chosen))

    def count(self, user_id: str, **match: str) -> int:
        return self.client.count(self.target, count_filter=self._filter(user_id, match), exact=True).count

    def search(self, user_id: str, vector: Sequence[float], k: int, before: str | None = None,
               upto: int | None = None, **match: str) -> list[Hit]:
        return self.search_many(user_id, [vector], k, before, upto, **match)[0]

    def search_many(self, user_id: str, vectors: Sequence[Sequence[float]], k: int, before: str | None = None,
                    upto: int | None = None, **match: str) -> list[list[Hit]]:
        m, where = self._m, self._filter(user_id, match, before, upto=upto)
        found = self.client.query_batch_points(self.target, requests=[m.QueryRequest(
            query=floats(v), using=VECTOR, limit=k, filter=where, with_payload=True,
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
            halves = [m.Prefetch(query=floats(vector), using=VECTOR, limit=limit, filter=where,
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
        name = next_name(self.view, self.name)
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
