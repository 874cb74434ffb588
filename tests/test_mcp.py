"""`reflect mcp` driven by the mcp SDK's own client, over stdio and streamable
HTTP, against a real worker with a token."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import replace

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from conftest import run, wait_for
from schemas import ReflectionCreated
from streams.broker import free_port
from streams.producer import Publisher
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration
TOKEN = "mcp-test-token-0123456789abcdef0123"
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


@pytest.fixture
def api(settings, worker):
    s = replace(settings, threshold=1000.0)  # the belief is published below, as the reflector would
    run(ensure_topics(s))
    worker(s, env={"REFLECT_API_TOKEN": TOKEN})
    return s, f"http://127.0.0.1:{s.web_port}"


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
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_streamable_http_sessions_bring_their_own_user_and_token(api, tmp_path):
    _, url = api
    port = free_port()
    log = open(tmp_path / "mcp.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "streams.cli", "mcp", "--api", url, "--transport", "http",
                                "--port", str(port)], env=mcp_env(REFLECT_API_TOKEN=TOKEN), stdout=log, stderr=log,
                               stdin=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}/mcp"

    def session(**headers: str) -> Client:
        return Client(streamable_http_client(endpoint, http_client=httpx2.AsyncClient(headers=headers)))

    try:
        wait_for(lambda: process.poll() is None and _listening(port), 30, "reflect mcp --transport http listening")

        async def sessions():
            async with Client(endpoint) as mcp:  # no scope: each call names its user; the server's token
                assert {t.name for t in (await mcp.list_tools()).tools} == TOOLS
                done = await mcp.call_tool("record_episode", {"text": "bob's first", "importance": 0.4,
                                                              "user_id": "bob"})
                assert not done.is_error, text_of(done)
                unscoped = await mcp.call_tool("recall", {"query": "first"})
                assert unscoped.is_error and "user_id is required" in text_of(unscoped)
            async with session(**{"X-Reflect-User": "bob"}) as mcp:  # one user for the session
                found = await mcp.call_tool("recall", {"query": "first"})
                assert [r["text"] for r in found.structured_content["results"]] == ["bob's first"]
                other = await mcp.call_tool("recall", {"query": "first", "user_id": "ann"})
                assert other.is_error and "acts for user 'bob' only" in text_of(other)
            async with session(Authorization="Bearer not-the-token") as mcp:  # its own credential, refused
                refused = await mcp.call_tool("recall", {"query": "first", "user_id": "bob"})
                assert refused.is_error and "unauthorized" in text_of(refused)

        run(sessions())
    finally:
        process.terminate()
        process.wait(15)
        log.close()
