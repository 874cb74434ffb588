"""The view's adapters, behind the `VectorStore` port (processors/ports.py).

Two adapters, one contract (tests/contract/test_view_contract.py runs against both):

* `edge.EdgeView` — Qdrant Edge, Qdrant's in-process engine, on a directory.
  The embedded default: user-filtered top-10 in milliseconds where
  qdrant-client's local mode takes seconds. One process owns a shard (its WAL
  is locked), so the worker that writes the view also serves its reads.
* `qdrant.QdrantView` — a Qdrant server through qdrant-client
  (`--qdrant-url`); its tests run qdrant-client's local mode, which speaks the
  same client API.

`shared.SharedView` lets the worker's threads call either at once;
`streams.adapters.factory.open_view` opens the one the settings name.

Per-user searches are exact, since filtered HNSW lost recall on this data
(0.68 vs 1.0); `search_hybrid` is a score formula over two prefetches.
A view has a stable name; the physical shard/collection behind it is versioned
so a rebuild can fill a new one and swap it in. Each physical view records the
embedder that built it (name and dim: `reflect-embedder.json` in the Edge shard
directory, the collection's metadata on a server); opened for another embedder
it refuses (`EmbedderMismatch`), since vectors of two models do not compare.
"""

from __future__ import annotations

from typing import Sequence

from processors.ports import EmbedderMismatch

REBUILD = "run `reflect rebuild` to add them"


def check_embedder(recorded: dict | None, embedder: str, dim: int, view: str, where: str) -> None:
    """Refuse a view another embedder built; one with no record (built before records were kept) passes."""
    if not recorded or (recorded.get("name"), recorded.get("dim")) == (embedder, dim):
        return
    built = f"{recorded.get('name')} ({recorded.get('dim')}-d)"
    raise EmbedderMismatch(
        f"the view {view!r} ({where}) was built with the {built} embedder and cannot be read with "
        f"{embedder} ({dim}-d): vectors of two embedders do not compare. Run with --embedder "
        f"{recorded.get('name')} (REFLECT_EMBEDDER) to use it; to switch to {embedder}, start a worker with "
        f"--embedder {embedder} on a new --view name and run `reflect rebuild` (it replays the log into that "
        f"view with {embedder}).")


def floats(vector: Sequence[float]) -> list[float]:
    return vector.tolist() if hasattr(vector, "tolist") else [float(x) for x in vector]


def next_name(view: str, name: str) -> str:
    """The physical name after `name`: `<view>-0002` after `<view>-0001`."""
    number = name.rsplit("-", 1)[-1]
    return f"{view}-{int(number) + 1 if number.isdigit() else 1:04d}"
