"""`reflect up`: one process with its own broker, the worker and the HTTP API."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import orjson
import pytest

from streams.broker import free_port
from support.broker import OWN_BROKER
from support.harness import wait_for

pytestmark = [pytest.mark.integration, OWN_BROKER]


def call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def start_up(tmp_path, *flags: str, **env: str):
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REFLECT_")}, **env}
    out = open(tmp_path / "up.out", "w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "up", "--port", str(port), "--data-dir", str(tmp_path / "d"),
         "--embedder", "hashing", *flags], env=env, stdout=out, stderr=open(tmp_path / "up.err", "w"))
    wait_for(lambda: process.poll() is None and "Reflect is up." in open(tmp_path / "up.out").read(), 90,
             "the announcement of `reflect up`")
    return port, process


@pytest.fixture
def stack(tmp_path):
    port, process = start_up(tmp_path)
    yield port, process, tmp_path
    if process.poll() is None:
        process.kill()
        process.wait(10)


def test_up_serves_the_api_and_stops_cleanly(stack):
    port, process, tmp_path = stack
    announcement = (tmp_path / "up.out").read_text()
    assert f"http://127.0.0.1:{port}" in announcement and "embedded noida-db at 127.0.0.1:" in announcement
    assert f"export REFLECT_API=http://127.0.0.1:{port} " in announcement  # not 8080: where reads must look

    status, answer = call(port, "POST", "/v1/users/ann/episodes",
                          b'{"text": "deploys need a log check", "importance": 0.7, "episode_id": "e1"}')
    assert (status, answer["episode_id"]) == (202, "e1")
    for body, field in ((b'{"text": "x", "importance": 7}', "importance"), (b'{"importance": 0.5}', "text"),
                        (b'{"text": "x", "importance": 0.5, "colour": 1}', "colour"), (b"[1,", "(body)")):
        status, answer = call(port, "POST", "/v1/users/ann/episodes", body)
        assert status == 422 and answer["error"]["field"] == field, (body, answer)
    status, answer = call(port, "GET", "/v1/users/ann/beliefs?limit=0")
    assert status == 422 and answer["error"]["field"] == "limit"

    wait_for(lambda: call(port, "GET", "/v1/users/ann/stats")[1]["episodes"] == 1, 30, "episode e1 in the view")
    assert call(port, "GET", "/v1/users/ann/episodes/e1")[1]["text"] == "deploys need a log check"
    assert call(port, "GET", "/v1/users/bob/episodes/e1")[0] == 404  # scoped to the user

    status, answer = call(port, "POST", "/v1/users/ann/reflect")
    assert status == 202 and answer["cycle_id"].startswith("ann:manual:")
    assert call(port, "POST", "/v1/users/ann/episodes/e1/retract", b'{"reason": "incorrect"}')[0] == 202
    wait_for(lambda: call(port, "GET", "/v1/users/ann/stats")[1]["retracted"] == 1, 30, "e1 retracted")
    status, answer = call(port, "GET", "/v1/users/ann/beliefs")
    assert (status, answer["beliefs"], answer["freshness"]["policy"]) == (200, [], "concurrent")

    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    broker_port = int(re.search(r"embedded noida-db at 127.0.0.1:(\d+)", announcement).group(1))
    for gone in (port, broker_port):  # the API and the embedded broker stopped with it
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", gone), timeout=2).close()


def test_up_reflects_through_any_messages_api_server(tmp_path):
    from support.messages_api import MessagesServer, OfflineModel

    server = MessagesServer(OfflineModel())
    port, process = start_up(tmp_path, "--reasoner", "anthropic", "--reasoner-batch", "per-question",
                             ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=server.url)
    try:
        assert "reasoner anthropic" in (tmp_path / "up.out").read_text()
        for i, text in enumerate(["revert of PR 1 broke auth login", "revert of PR 2: auth token expired",
                                  "revert of PR 3: auth cookie lost"]):
            call(port, "POST", "/v1/users/ann/episodes", orjson.dumps({"text": text, "importance": 0.8}))
        wait_for(lambda: call(port, "GET", "/v1/users/ann/stats")[1]["episodes"] == 3, 30, "3 episodes in the view")
        call(port, "POST", "/v1/users/ann/reflect")
        wait_for(lambda: call(port, "GET", "/v1/reasoner")[1]["cycles"], 30, "the manual cycle")
        state = call(port, "GET", "/v1/reasoner")[1]
        assert (state["reasoner"], state["batched"], state["cycles"]) == ("anthropic", False, {"ok": 1})
        tools = [r["body"]["tool_choice"]["name"] for r in server.requests]
        assert state["calls"] == len(tools) >= 2
        assert tools == ["record_questions"] + ["record_insights"] * (len(tools) - 1)
        wait_for(lambda: call(port, "GET", "/v1/users/ann/beliefs")[1]["beliefs"], 30, "beliefs projected")
        beliefs = call(port, "GET", "/v1/users/ann/beliefs")[1]["beliefs"]
        assert all(len(b["evidence_ids"]) >= 2 for b in beliefs)
    finally:
        process.kill()
        process.wait(10)
        server.close()
