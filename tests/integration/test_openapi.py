"""schemas/openapi.json is the HTTP API: every route it names is registered and
every registered route is in it, its user-id rule is the server's, and a
Schemathesis run against a live `reflect up` finds no server error, no answer
outside the document and no 4xx outside the error shape."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from streams.broker import free_port
from streams.http.routes import RESOURCES
from streams.http.routes.common import FAUST_PAGES, USER_ID_MAX, user_id_problem
from support.broker import OWN_BROKER
from support.harness import wait_for

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / "schemas" / "openapi.json"
METHODS = ("get", "post", "put", "patch", "delete")
# Bounds of the CI run: examples per operation (about 700 cases, 15-30 s here), and
# a hard stop. Not --max-time: Schemathesis spends all of that budget, repeating.
FUZZ_EXAMPLES = int(os.environ.get("REFLECT_FUZZ_EXAMPLES", "20"))
FUZZ_SECONDS = 240


def openapi() -> dict:
    return json.loads(DOCUMENT.read_text("utf-8"))


def registered() -> set[tuple[str, str]]:
    """(path, method) of every handler Reflect's resources define."""
    return {(path, method) for resource in RESOURCES for path, page in resource.PAGES.items()
            for method in METHODS if method in vars(page)}


def documented() -> set[tuple[str, str]]:
    return {(path, method) for path, item in openapi()["paths"].items() for method in METHODS if method in item}


def test_the_document_names_exactly_the_registered_routes():
    doc = openapi()
    assert doc["openapi"].startswith("3.1")
    assert documented() == registered()
    assert not set(doc["paths"]) & FAUST_PAGES  # `/` is no route: 404


def test_every_operation_documents_its_errors_in_the_error_shape():
    doc = openapi()
    error = doc["components"]["schemas"]["Error"]
    assert error["required"] == ["error"] and error["properties"]["error"]["required"] == ["code", "message"]
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item and path not in ("/healthz", "/livez"):
                answers = item[method]["responses"]
                assert answers["4XX"] == {"$ref": "#/components/responses/Error"}, (path, method)
                assert answers["503"] == {"$ref": "#/components/responses/Unavailable"}, (path, method)


def _user_id_schema() -> dict:
    return openapi()["paths"]["/v1/users/{user_id}/stats"]["parameters"][0]["schema"]


def _documented_ok(user_id: str) -> bool:
    schema = _user_id_schema()
    return len(user_id) <= schema["maxLength"] and re.fullmatch(schema["pattern"][1:-1], user_id) is not None


@pytest.mark.parametrize("user_id", ["ann", "ann\n", "a/b", "team:7@x", "a//b", "a/.../b", "a/.b", "x" * 64,
                                     "../x", "a/../b", "a/./b", "a/..", ".hidden", "", "x" * 65, "a b", "é"])
def test_the_documented_user_id_rule_is_the_servers(user_id):
    assert _user_id_schema()["maxLength"] == USER_ID_MAX
    assert _documented_ok(user_id) == (user_id_problem(user_id) is None)


@hsettings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab0./:-_", max_size=12))
def test_the_documented_user_id_rule_is_the_servers_for_any_id(user_id):
    assert _documented_ok(user_id) == (user_id_problem(user_id) is None)


@pytest.fixture
def reflect_up(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REFLECT_")}
    out = tmp_path / "up.out"
    process = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "up", "--port", str(port), "--data-dir", str(tmp_path / "d"),
         "--embedder", "hashing"], env=env, stdout=open(out, "w"), stderr=open(tmp_path / "up.err", "w"),
        stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: process.poll() is None and "Reflect is up." in out.read_text(), 90,
                 "the announcement of `reflect up`")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.mark.integration
@OWN_BROKER
def test_schemathesis_finds_no_server_error_against_reflect_up(reflect_up, tmp_path):
    reports = tmp_path / "schemathesis"
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", str(DOCUMENT), "--url", reflect_up,
         "--max-examples", str(FUZZ_EXAMPLES), "--workers", "1",
         "--seed", "20261205", "--request-timeout", "30",
         # Writes are asynchronous by design (202, then visible once projected): an
         # episode read back at once may be 404 yet, which this check counts as a failure.
         "--exclude-checks", "ensure_resource_availability",
         "--report", "json,ndjson", "--report-dir", str(reports)],
        capture_output=True, text=True, timeout=FUZZ_SECONDS, cwd=tmp_path)  # its cache stays out of the repository
    seconds = time.monotonic() - started
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    summary = json.loads(next(reports.glob("json-*.json")).read_text())
    statuses = [int(s) for line in next(reports.glob("ndjson-*.ndjson")).read_text().splitlines()
                for s in re.findall(r'"status_code":\s*(\d{3})', line)]
    server_errors = sum(s >= 500 for s in statuses)
    generated = summary["test_cases"]["generated"]
    print(f"\nschemathesis: {generated} cases generated over {summary['operations']['tested']} operations, "
          f"{len(statuses)} responses, {server_errors} server errors, {seconds:.0f} s")
    assert summary["operations"]["tested"] == len(registered()) and generated >= 10 * len(registered())
    assert summary["test_cases"]["with_failures"] == 0 and server_errors == 0 and statuses
