"""What the test tiers share (tests/README.md): imported as `support`, with
tests/ on the path (pyproject.toml's pytest `pythonpath`; the benchmarks put
it there themselves). A test module imports helpers from here or takes
tests/conftest.py's fixtures, never from another test module
(tests/contract/test_layout.py)."""
