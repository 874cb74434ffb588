"""BM25 terms of a text: the lexical half of hybrid retrieval.

Dense vectors miss what a question names exactly (a name, a number, a rare
word); BM25 finds it. Both view adapters store these sparse vectors beside the
dense ones and let the engine apply IDF (per user, at query time), so this
module only tokenizes and weighs term frequency. It uses Qdrant Edge's own
BM25 model, so the Edge shard and a Qdrant server hold the same terms.
"""

from __future__ import annotations

import functools

# Episodes and beliefs are a sentence or two: ~20 tokens after stopwords
# (BM25's default 256 would treat every one of them as very short).
AVG_LEN = 20.0


@functools.lru_cache(maxsize=1)
def _model():
    import qdrant_edge as q

    return q.Bm25(q.Bm25Config(language="english", avg_len=AVG_LEN))


def document_terms(text: str) -> tuple[list[int], list[float]]:
    """(indices, weights) of a stored text: term frequency saturated by length."""
    v = _model().embed_document(text)
    return list(v.indices), list(v.values)


def query_terms(text: str) -> tuple[list[int], list[float]]:
    """(indices, weights) of a question: each distinct term once (weight 1)."""
    v = _model().embed_query(text)
    return list(v.indices), list(v.values)
