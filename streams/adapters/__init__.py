"""Adapters: the SDKs and model runtimes behind the pure cores' ports in
processors/ (the Anthropic reasoner, the MiniLM and e5 embedders); `factory`
makes them from settings. The view's adapters (Qdrant Edge and server, BM25
terms, the shard optimizer) still live in processors/ and move here next."""
