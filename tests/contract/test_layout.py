"""The tests' own layout (tests/README.md): each test module in its tier's
folder, one marked `integration` only where a broker or a worker is expected,
and no module under tests/ (the benchmarks included) importing a test module
or tests/conftest.py: what tests share is in tests/support/."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "pipeline", "contract", "integration", "faults")


def imports_of_tests(source: str) -> set[str]:
    """The test modules and conftest `source` imports, anywhere in it (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module] if node.module else [alias.name for alias in node.names]
        else:
            continue
        found.update(m for m in modules if m.rsplit(".", 1)[-1].startswith("test_") or
                     m.rsplit(".", 1)[-1] == "conftest")
    return found


def marked_integration(source: str) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "integration" and
               isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
               for node in ast.walk(ast.parse(source)))


def test_the_checks_see_what_they_look_for():
    assert imports_of_tests("from test_faults_crash import Workers\nimport tests.unit.test_router") == \
        {"test_faults_crash", "tests.unit.test_router"}
    assert imports_of_tests("def f():\n    from conftest import wait_for") == {"conftest"}
    assert imports_of_tests("from support.runs import Workers\nimport pytest\nfrom . import helpers") == set()
    assert marked_integration("import pytest\npytestmark = [pytest.mark.faults, pytest.mark.integration]")
    assert marked_integration("@pytest.mark.integration\ndef test_x(): pass")
    assert not marked_integration("@pytest.mark.parametrize('x', [1])\ndef test_x(x): pass")


def test_no_module_under_tests_imports_a_test_module_or_conftest():
    found = {str(path.relative_to(TESTS)): imports_of_tests(path.read_text("utf-8"))
             for path in sorted(TESTS.rglob("*.py")) if path.name != "conftest.py"}
    assert {name: sorted(imports) for name, imports in found.items() if imports} == {}


def test_every_test_module_is_in_a_tier_and_integration_ones_where_a_broker_is():
    modules = [path for path in TESTS.rglob("test_*.py") if "benchmarks" not in path.relative_to(TESTS).parts]
    assert len(modules) > 60  # the scan sees them
    assert [str(p.relative_to(TESTS)) for p in modules if p.parent.parent != TESTS or p.parent.name not in TIERS] == []
    assert sorted(p.name for p in modules if marked_integration(p.read_text("utf-8"))
                  and p.parent.name not in ("integration", "faults")) == []
