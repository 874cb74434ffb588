"""What the settings name, made: here, so that no pure core imports an adapter."""

from __future__ import annotations

from processors.embedders import Embedder
from processors.reasoners import OfflineReasoner, Reasoner


def make_reasoner(settings, embedder: Embedder | None = None) -> Reasoner:
    """The offline reasoner groups by meaning with the worker's own embedder."""
    if settings.reasoner == "offline":
        return OfflineReasoner(embedder)
    from processors.anthropic_reasoner import AnthropicReasoner  # the SDK only when asked for

    return AnthropicReasoner.from_settings(settings)
