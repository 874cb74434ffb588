"""Adapters: the engines, SDKs and model runtimes behind the pure cores' ports
(processors/ports.py): the view on Qdrant Edge or a Qdrant server (`view/`,
with BM25 terms from `lexical` and the shard optimizer `optimize`, run as a
child), the Anthropic reasoner, the MiniLM and e5 embedders, which failures
are a dependency's (`failures`); `factory` makes them from settings."""
