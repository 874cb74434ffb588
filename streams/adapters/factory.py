"""What the settings name, made: here, so that no pure core imports an adapter."""

from __future__ import annotations

from processors.embedders import Embedder, HashingEmbedder
from processors.reasoners import OfflineReasoner, Reasoner


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
