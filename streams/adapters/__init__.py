"""Adapters: the engines, SDKs and model runtimes behind the pure cores in
processors/. `factory` makes them from settings. The embedders' and views'
adapters still live in processors/ and move here next (processors/README.md)."""
