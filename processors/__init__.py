"""Reflect's pure cores: the roles' decisions, and the ports they work through (processors/ports.py).

No module here touches an engine, a model, the broker, a child process or the
environment (tests/contract/test_import_graph.py); the adapters behind the ports are in
streams/adapters/, and the agents that run the cores in streams/worker/pipeline/."""
