"""The ports the pure cores work through: the view, the embedder, the reasoner.

Each is a Protocol with the data types it speaks; the adapters behind them
(Qdrant Edge and a Qdrant server, MiniLM and e5, the Anthropic API) are in
streams/adapters/, and the pure hashing embedder and offline reasoner beside
the cores (processors/embedders.py, processors/reasoners.py).

The view holds episodes and reflections materialized for reads. Vectors are
*named* ("text") so a retracted point can keep its audit payload with no
vector at all. Beside the dense vector each point with a text holds its BM25
terms (sparse "bm25", IDF applied by the engine per user): `search_hybrid`
fuses both and applies recency × importance in one engine query, so the view
returns the final top k. Every query is filtered to one user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

if TYPE_CHECKING:  # annotations only: the optimize child imports the view's port, and nothing heavier
    import numpy as np

    from processors.challenge import Answer
    from processors.reflection import Insight


# The view

VECTOR = "text"
LEXICAL = "bm25"  # sparse BM25 terms of the point's text
# Keyword indexes, created with the shard; lineage_ids is the reverse
# provenance index (a belief matches each id it has ever cited), and
# evidence_ids that of views projected before lineage was kept; read_ids
# that of cycles (a cycle matches each record it read).
INDEXED = ("user_id", "kind", "status", "evidence_ids", "lineage_ids", "read_ids")
NO_USER = "\x00watermarks"  # the user id of the view's own records: no event can carry it, no read meets it
MAX_USERS = 1_000_000  # users one view lists at most (a worker's share of them)
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

    def users(self) -> list[str]:
        """Every user the view holds a point of (the engine's facet on user_id)."""
        ...

    def forget(self, user_ids: Sequence[str], kinds: Sequence[str] | None = None, before: int | None = None) -> None:
        """Every point of these users gone, vectors, payloads and all; with
        `kinds`, of those kinds; with `before`, but those logged at or after
        it (POSITION: a forget keeps what the user said after it)."""
        ...

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


# The embedder
class Embedder(Protocol):
    """Texts → unit vectors."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dim), rows L2-normalized."""


# The reasoner
@dataclass(frozen=True)
class Usage:
    """What a cycle spent: calls and tokens as the API bills them (input_tokens
    excludes the cached prefix, read or written), and their estimated cost."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # cache reads
    cache_write_tokens: int = 0
    cost_usd: float | None = 0.0  # None: no price known for the model

    def __add__(self, other: "Usage") -> "Usage":
        cost = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        return Usage(self.calls + other.calls, self.input_tokens + other.input_tokens,
                     self.output_tokens + other.output_tokens, self.cached_tokens + other.cached_tokens,
                     self.cache_write_tokens + other.cache_write_tokens, cost)

    def to_dict(self) -> dict:
        return {"calls": self.calls, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_tokens": self.cached_tokens, "cache_write_tokens": self.cache_write_tokens,
                "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6)}


class Reasoner(Protocol):
    """`batched` reasoners also answer `insights_for`: all questions of a cycle in
    one call, over the union of their evidence, each insight tagged with the
    0-based index of its question. `dated` ones are also given, as `dates`,
    when each statement occurred (ISO times)."""

    name: str
    prompt_version: str
    batched: bool

    def questions(self, statements: Sequence[str], n: int = 3,
                  importance: Sequence[float] | None = None) -> tuple[list[str], Usage]: ...

    def insights(self, question: str, statements: Sequence[str], n: int = 5) -> tuple[list[Insight], Usage]: ...

    def verdict(self, belief: str, evidence: Sequence[str],
                challengers: Sequence[str]) -> tuple["Answer", Usage]:
        """Does `belief` (resting on `evidence`) still hold given the new
        `challengers`? Citations number the challengers (processors/challenge.py)."""
        ...
