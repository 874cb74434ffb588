"""What the settings name, made: here, so that no pure core imports an adapter."""

from __future__ import annotations

import os

from processors.embedders import HashingEmbedder
from processors.ports import Embedder, Reasoner, VectorStore
from processors.reasoners import OfflineReasoner
from streams.adapters.view.edge import EdgeView
from streams.adapters.view.qdrant import QdrantView
from streams.adapters.view.shared import SharedView


def make_reasoner(settings, embedder: Embedder | None = None) -> Reasoner:
    """The offline reasoner groups by meaning with the worker's own embedder."""
    if settings.reasoner == "offline":
        return OfflineReasoner(embedder)
    from streams.adapters.anthropic import AnthropicReasoner  # the SDK only when asked for

    return AnthropicReasoner.from_settings(settings)


def make_embedder(name: str) -> Embedder:
    """The embedder REFLECT_EMBEDDER names (minilm and e5-small need their extras)."""
    if name == "hashing":
        return HashingEmbedder()
    if name == "minilm":
        from streams.adapters.minilm import MiniLMEmbedder  # lazy: the optional `minilm` extra

        return MiniLMEmbedder()
    if name == "e5-small":
        from streams.adapters.e5 import E5SmallEmbedder  # lazy: the optional `e5` extra

        return E5SmallEmbedder()
    raise ValueError(f"unknown embedder {name!r}")


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
