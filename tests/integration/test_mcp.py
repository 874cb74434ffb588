"""`reflect mcp` driven by the mcp SDK's own client, over stdio and streamable
HTTP, against a real worker with the shared token and per-user JWTs; over HTTP
no caller borrows another's credential."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from schemas import ReflectionCreated
from streams.auth import AuthError, Keys, claims_for, keys_of, mint
from streams.broker import free_port
from streams.client.mcp_server import access_of, exposure_problem
from streams.producer import Publisher
from streams.settings import Settings
from streams.topics import ensure_topics
from support.harness import run, wait_for

TOKEN = "mcp-test-token-0123456789abcdef0123"
SECRET = "mcp-test-secret-0123456789abcdef0123456789"  # HS256: 32 bytes at least
ANOTHER_SECRET = "another-secret-0123456789abcdef0123"  # what a forger signs with
TOOLS = {"record_episode", "recall", "pinned_beliefs", "explain_belief", "retract_episode"}
BELIEF = "The user reads the deploy logs before any retry."


def mcp_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("REFLECT_")}, **extra}


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def _belief(settings, evidence: list[str]) -> None:
    async with Publisher(settings) as p:
        await p.publish(ReflectionCreated(user_id="ann", reflection_id="r1", cycle_id="ann:1", text=BELIEF,
                                          evidence_ids=tuple(evidence), depth=1, importance=0.7, confidence=0.7,
                                          reasoner="offline", prompt_version="offline-v1"),
                        topic=settings.topic_reflections)


def jwt(users: str, scope: str = "read write", secret: str = SECRET) -> str:
    """A per-user token, as `reflect token mint` makes one."""
    return mint(claims_for(users.split(","), scope, 600, time.time(), subject=f"{users}-agent"), secret)


@pytest.fixture
def api(settings, worker):
    s = replace(settings, threshold=1000.0)  # the belief is published below, as the reflector would
    run(ensure_topics(s))
    worker(s, env={"REFLECT_API_TOKEN": TOKEN, "REFLECT_AUTH_SECRET": SECRET})
    return s, f"http://127.0.0.1:{s.web_port}"


@pytest.mark.integration
def test_stdio_tools_scoped_to_one_user(api):
    settings, url = api
    server = StdioServerParameters(command=sys.executable, args=["-m", "streams.cli", "mcp", "--api", url,
                                                                 "--user", "ann"],
                                   env=mcp_env(REFLECT_API_TOKEN=TOKEN))

    async def session():
        async with Client(server, read_timeout_seconds=60) as mcp:
            listed = await mcp.list_tools()
            assert {t.name for t in listed.tools} == TOOLS
            assert all(t.description and t.input_schema for t in listed.tools)
            ids = []
            for text in ("deploy failed; read the logs, then retried", "logs first, then the retry worked"):
                done = await mcp.call_tool("record_episode", {"text": text, "importance": 0.8})
                assert not done.is_error, text_of(done)
                ids.append(done.structured_content["episode_id"])
            await _belief(settings, ids)

            async def recalled():
                found = await mcp.call_tool("recall", {"query": "what happened with the deploy retry?"})
                return {r["id"] for r in found.structured_content["results"]} >= set(ids)

            await wait_async(recalled, 30, "both episodes recallable through the tool")

            async def pinned():
                return BELIEF.rstrip(".") in text_of(await mcp.call_tool("pinned_beliefs", {"budget": 200}))

            await wait_async(pinned, 30, "the belief in the pinned block")
            why = await mcp.call_tool("explain_belief", {"reflection_id": "r1"})
            assert {e["id"] for e in why.structured_content["provenance"]["evidence"]} == set(ids)
            gone = await mcp.call_tool("retract_episode", {"episode_id": ids[1], "reason": "erasure"})
            assert gone.structured_content["episode_id"] == ids[1]

            other = await mcp.call_tool("recall", {"query": "x", "user_id": "bob"})
            assert other.is_error and "acts for user 'ann' only" in text_of(other)
            bad = await mcp.call_tool("recall", {"query": "x", "k": 0})
            assert bad.is_error and "invalid (field k)" in text_of(bad)
            missing = await mcp.call_tool("explain_belief", {"reflection_id": "nope"})
            assert missing.is_error and "not_found" in text_of(missing)

    run(session())


async def wait_async(condition, timeout: float, what: str, every: float = 0.2):
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _serving(process: subprocess.Popen, port: int, log: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"reflect mcp exited with {process.returncode}: {log.read_text()[-2000:]}")
    return _listening(port)


@contextmanager
def mcp_http(url: str, log: Path, env: dict[str, str]):
    """`reflect mcp --transport http` over the worker at `url`, in `env`: its endpoint."""
    port = free_port()
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "streams.cli", "mcp", "--api", url, "--transport", "http",
                                    "--port", str(port)], env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: _serving(process, port, log), 30, "reflect mcp --transport http listening")
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.terminate()
            process.wait(15)


def session(endpoint: str, **headers: str) -> Client:
    return Client(streamable_http_client(endpoint, http_client=httpx2.AsyncClient(headers=headers)))


def bearer(token: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **headers}


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "0"}}}


async def refused(endpoint: str, **headers: str) -> None:
    """The endpoint answers 401 before any MCP is spoken, and the SDK's client gets no session."""
    async with httpx2.AsyncClient(headers=headers) as http:
        answer = await http.post(endpoint, json=INITIALIZE,
                                 headers={"Accept": "application/json, text/event-stream"})
    assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer"), answer.text
    with pytest.raises((MCPError, BaseExceptionGroup)) as failed:  # the SDK's task groups wrap its error
        async with session(endpoint, **headers) as mcp:
            await mcp.call_tool("recall", {"query": "first", "user_id": "bob"})
    assert isinstance(failed.value, MCPError) or failed.group_contains(MCPError), failed.value


@pytest.mark.integration
def test_streamable_http_refuses_a_call_that_brings_no_bearer_of_its_own(api, tmp_path):
    _, url = api
    # The process holds the shared admin token: a verification key here, never a credential to lend.
    with mcp_http(url, tmp_path / "mcp.log", mcp_env(REFLECT_API_TOKEN=TOKEN)) as endpoint:

        async def sessions():
            await refused(endpoint)
            await refused(endpoint, **bearer("not-the-token-0123456789"))  # verified here: refused here
            async with session(endpoint, **bearer(TOKEN)) as mcp:  # the shared token, brought by its holder
                assert {t.name for t in (await mcp.list_tools()).tools} == TOOLS
                done = await mcp.call_tool("record_episode", {"text": "bob's first", "importance": 0.4,
                                                              "user_id": "bob"})
                assert not done.is_error, text_of(done)
                unscoped = await mcp.call_tool("recall", {"query": "first"})
                assert unscoped.is_error and "user_id is required" in text_of(unscoped)
            async with session(endpoint, **bearer(TOKEN, **{"X-Reflect-User": "bob"})) as mcp:  # one user
                found = await mcp.call_tool("recall", {"query": "first"})
                assert [r["text"] for r in found.structured_content["results"]] == ["bob's first"]
                other = await mcp.call_tool("recall", {"query": "first", "user_id": "ann"})
                assert other.is_error and "acts for user 'bob' only" in text_of(other)

        run(sessions())


@pytest.mark.integration
def test_streamable_http_passes_each_callers_own_token_to_the_api_unchanged(api, tmp_path):
    _, url = api
    ann = jwt("ann")
    here = mcp_env(REFLECT_API_TOKEN=TOKEN, REFLECT_AUTH_SECRET=SECRET)  # verifies bearers here, holds the admin token
    with mcp_http(url, tmp_path / "verifying.log", here) as verifying, \
            mcp_http(url, tmp_path / "relaying.log", mcp_env()) as relaying:  # no keys: the API verifies

        async def sessions(endpoint: str):
            await refused(endpoint)
            async with session(endpoint, **bearer(ann)) as mcp:
                done = await mcp.call_tool("record_episode", {"text": "ann's deploy", "importance": 0.5,
                                                              "user_id": "ann"})
                assert not done.is_error, text_of(done)
                found = await mcp.call_tool("recall", {"query": "deploy", "user_id": "ann"})
                assert done.structured_content["episode_id"] in {r["id"] for r in found.structured_content["results"]}
                # Forbidden, not unauthorized: a valid credential that does not grant bob reached the API,
                # ann's token and not the process's admin token.
                other = await mcp.call_tool("recall", {"query": "deploy", "user_id": "bob"})
                assert other.is_error and "Reflect refused: forbidden" in text_of(other), text_of(other)
            async with session(endpoint, **bearer(ann, **{"X-Reflect-User": "bob"})) as mcp:  # a scope grants nothing
                scoped = await mcp.call_tool("recall", {"query": "deploy"})
                assert scoped.is_error and "Reflect refused: forbidden" in text_of(scoped), text_of(scoped)

        run(sessions(verifying))
        run(sessions(relaying))

        forged = bearer(jwt("ann", secret=ANOTHER_SECRET))

        async def relayed() -> str:
            async with session(relaying, **forged) as mcp:
                return text_of(await mcp.call_tool("recall", {"query": "deploy", "user_id": "ann"}))

        run(refused(verifying, **forged))  # refused here, before the API
        assert "Reflect refused: unauthorized" in run(relayed())  # refused by the API


def test_a_bearer_is_verified_with_the_apis_keys_when_held_else_left_to_the_api():
    keys = keys_of(Settings.load(env={"REFLECT_API_TOKEN": TOKEN, "REFLECT_AUTH_SECRET": SECRET}))
    admin, ann = access_of(TOKEN, keys), access_of(jwt("ann", "read"), keys)
    assert (admin.token, admin.scopes) == (TOKEN, ["admin", "read", "write"])
    assert (ann.scopes, ann.subject, ann.claims) == (["read"], "ann-agent", {"users": ["ann"]})
    assert admin.client_id != ann.client_id and TOKEN not in admin.client_id  # a session is bound to its token
    for bad in (jwt("ann", secret=ANOTHER_SECRET), "not-the-token-0123456789"):
        with pytest.raises(AuthError):
            access_of(bad, keys)
    unverified = access_of("anything-well-formed", Keys())  # no keys here: the API decides
    assert (unverified.token, unverified.scopes) == ("anything-well-formed", [])
    for malformed in ("two words", "", "tab\there"):
        with pytest.raises(AuthError):
            access_of(malformed, Keys())


def test_a_host_beyond_loopback_needs_keys_or_a_knowing_override():
    for host in ("127.0.0.1", "localhost", "::1"):
        assert exposure_problem(host, verifying=False, insecure=False) is None
    problem = exposure_problem("0.0.0.0", verifying=False, insecure=False)
    assert problem.startswith("refusing to start") and "REFLECT_AUTH_SECRET" in problem
    assert "--insecure-no-auth" in problem and "REFLECT_API_TOKEN" in problem
    assert exposure_problem("0.0.0.0", verifying=True, insecure=False) is None
    assert exposure_problem("mcp.example.com", verifying=False, insecure=True) is None


def test_reflect_mcp_refuses_to_serve_a_host_beyond_loopback_without_keys():
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "streams.cli", "mcp", "--transport", "http", "--host", "0.0.0.0",
                          "--port", str(port)], env=mcp_env(), capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "refusing to start" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not _listening(port)
