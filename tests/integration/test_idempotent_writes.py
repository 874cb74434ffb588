"""A write retried is one episode (issue 30, item 7): the client names the
episode once per call and sends that id on every retry, and the API derives
the id from an `Idempotency-Key` header when the body has none. Fast: the
derivation, the key rule against the OpenAPI document, and the client against
servers that drop or refuse; integration: the same against a real worker."""

from __future__ import annotations

import json
import re
import socket
import threading
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import orjson
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from schemas import ContractError
from streams.client import AsyncReflectClient, ReflectClient, ReflectUnreachable, Retry
from streams.http.routes.common import USER_ID
from streams.producer import IDEMPOTENCY_KEYS, KEY_MAX, episode_id_for_key, key_problem, make_episode
from streams.topics import ensure_topics
from support.broker import read_opened
from support.harness import run, wait_for

QUICK = Retry(attempts=3, backoff=0.01, max_wait=0.05)
DOCUMENT = Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"


# -- the derivation ---------------------------------------------------------------------------------------------

def test_a_key_names_one_episode_per_user_for_good():
    derived = episode_id_for_key("alice", "order-7/try")
    assert derived == episode_id_for_key("alice", "order-7/try")  # a retry: the same episode
    assert derived == uuid.uuid5(IDEMPOTENCY_KEYS, "alice\norder-7/try").hex
    assert episode_id_for_key("bob", "order-7/try") != derived  # two users' keys never meet
    assert episode_id_for_key("alice", "order-8/try") != derived
    assert USER_ID.fullmatch(derived)  # a valid id by the contract's rule


def test_the_namespace_is_pinned():
    # Changing it would make every write retried across the change a second episode.
    assert str(IDEMPOTENCY_KEYS) == "d61187e2-b215-440d-9da4-14f359ef0199"
    assert episode_id_for_key("alice", "k") == "51e09144bbd35acca89a729ed8817815"


@pytest.mark.parametrize("key", ["", " ", "a b", " lead", "trail ", "tab\there", "new\nline", "é", "\x7f",
                                 "x" * (KEY_MAX + 1), None, 7])
def test_a_bad_key_is_named(key):
    assert key_problem(key) is not None
    with pytest.raises(ContractError) as refused:
        episode_id_for_key("alice", key)
    assert refused.value.field == "idempotency_key" and "visible ASCII" in refused.value.reason


@pytest.mark.parametrize("key", ["k", "~" * KEY_MAX, "3f2b8c1e-5d4a-4b6f-9e7d-2a1c0b9f8e7d",
                                 "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"])
def test_a_good_key_passes(key):
    assert key_problem(key) is None


def _documented_key() -> dict:
    post = json.loads(DOCUMENT.read_text("utf-8"))["paths"]["/v1/users/{user_id}/episodes"]["post"]
    (header,) = [p for p in post["parameters"] if p["in"] == "header"]
    assert header["name"] == "Idempotency-Key" and header["required"] is False
    return header["schema"]


@hsettings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x2FF), max_size=8) | st.text(min_size=250, max_size=260))
def test_the_documented_key_rule_is_the_servers(key):
    schema = _documented_key()
    # A JSON Schema pattern is ECMA-262, whose `$` is the end of the text; Python's also matches before a
    # final newline (hypothesis found "0\n"), so it is read here as `\Z`.
    pattern = schema["pattern"].replace("$", r"\Z")
    documented = schema["minLength"] <= len(key) <= schema["maxLength"] and re.search(pattern, key)
    assert bool(documented) == (key_problem(key) is None)


def test_make_episode_takes_a_key_and_refuses_a_body_id_naming_another_episode():
    keyed = make_episode("alice", "deploy failed", 0.5, idempotency_key="k-1")
    assert keyed.episode_id == episode_id_for_key("alice", "k-1")
    again = make_episode("alice", "deploy failed", 0.5, idempotency_key="k-1", episode_id=keyed.episode_id)
    assert again.episode_id == keyed.episode_id and again.event_id != keyed.event_id
    with pytest.raises(ContractError) as refused:
        make_episode("alice", "deploy failed", 0.5, idempotency_key="k-1", episode_id="e-1")
    assert refused.value.field == "episode_id" and keyed.episode_id in refused.value.reason
    plain = make_episode("alice", "deploy failed", 0.5)
    assert plain.episode_id and plain.episode_id != make_episode("alice", "deploy failed", 0.5).episode_id


# -- the client against servers that drop or refuse -------------------------------------------------------------

class Listening:
    """A socket on a free local port; `take(conn)` for each connection, in a thread, until `close()`."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.connections = self.sock.getsockname()[1], 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.take(conn)

    def take(self, conn: socket.socket) -> None:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.sock.close()


class Scripted(Listening):
    """A raw HTTP server answering each request as its script says: `drop`
    (read it whole, close without an answer), `503`, else 202 echoing the
    episode id. Keeps every request body it read."""

    def __init__(self, *script: str) -> None:
        self.script, self.bodies = list(script), []
        super().__init__()

    def take(self, conn: socket.socket) -> None:
        with conn:
            self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        while len(body) < length:
            body += conn.recv(65536)
        self.bodies.append(orjson.loads(body))
        action = self.script.pop(0) if self.script else "202"
        if action == "drop":
            return
        status, answer = ((503, {"error": {"code": "unavailable", "message": "retry"}}) if action == "503" else
                          (202, {"episode_id": self.bodies[-1]["episode_id"], "event_id": "ev"}))
        payload = orjson.dumps(answer)
        conn.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (status, len(payload), payload))


def test_the_client_retrying_after_a_dropped_connection_sends_the_same_id():
    server = Scripted("drop", "503", "202", "202")
    with ReflectClient(server.url, env={}, retry=QUICK) as reflect:
        done = reflect.record("ann", "deploy failed", 0.8)
        other = reflect.record("ann", "deploy failed", 0.8)  # another call: another episode
    server.close()
    ids = [b["episode_id"] for b in server.bodies]
    assert len(ids) == 4 and ids[0] == ids[1] == ids[2] == done.episode_id  # the write arrived thrice, one id
    assert ids[3] == other.episode_id != done.episode_id


def test_the_async_client_retrying_after_a_dropped_connection_sends_the_same_id():
    server = Scripted("drop", "drop")

    async def record():
        async with AsyncReflectClient(server.url, env={}, retry=QUICK) as reflect:
            return await reflect.record("ann", "deploy failed", 0.8, episode_id="mine")

    done = run(record())
    server.close()
    assert done.episode_id == "mine" and [b["episode_id"] for b in server.bodies] == ["mine"] * 3


def test_a_write_dropped_every_time_gives_up_after_the_bounded_attempts():
    server = Scripted("drop", "drop", "drop", "drop")
    with ReflectClient(server.url, env={}, retry=QUICK) as reflect, pytest.raises(ReflectUnreachable):
        reflect.record("ann", "deploy failed", 0.8)
    server.close()
    assert len(server.bodies) == QUICK.attempts and len({b["episode_id"] for b in server.bodies}) == 1


# -- against a worker -------------------------------------------------------------------------------------------

class LosesFirstAnswer(Listening):
    """A TCP proxy in front of the API: the first connection's request reaches
    the worker, and its answer is dropped with the connection; later
    connections pass whole. A write lost this way did arrive."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        super().__init__()

    def take(self, conn: socket.socket) -> None:
        up = socket.create_connection(("127.0.0.1", self.upstream))
        threading.Thread(target=self._pump, args=(conn, up, False), daemon=True).start()
        threading.Thread(target=self._pump, args=(up, conn, self.connections == 1), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, lose: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if lose:  # the answer came: drop it and the connection
                    break
                sink.sendall(chunk)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def _episodes_with(w, user: str, text: str) -> list[dict]:
    found = w.client.recall(user, text, mode="instance", k=20).results
    return [m.raw for m in found if m.kind == "episode" and m.text == text]


def _episode_records(settings, user: str) -> list[dict]:
    values = run(read_opened(settings, settings.topic_episodes))
    return [v for v in values if v.get("user_id") == user and v.get("type") == "EpisodeRecorded"]


@pytest.mark.integration
@pytest.mark.broker
def test_a_write_retried_with_the_same_key_is_one_episode(settings, worker):
    s = replace(settings, threshold=1000.0)
    run(ensure_topics(s))
    w = worker(s)
    api, key = f"http://127.0.0.1:{s.web_port}", str(uuid.uuid4())
    body = {"text": "the deploy failed: auth token expired", "importance": 0.8}
    with httpx.Client(base_url=api, timeout=10) as http:
        answers = [http.post("/v1/users/ann/episodes", json=body, headers={"Idempotency-Key": key})
                   for _ in range(3)]
        assert [a.status_code for a in answers] == [202] * 3
        ids = {a.json()["episode_id"] for a in answers}
        assert ids == {episode_id_for_key("ann", key)}
        assert len({a.json()["event_id"] for a in answers}) == 3  # three events, one episode

        same = http.post("/v1/users/ann/episodes", json={**body, "episode_id": episode_id_for_key("ann", key)},
                         headers={"Idempotency-Key": key})
        assert same.status_code == 202 and same.json()["episode_id"] in ids
        clash = http.post("/v1/users/ann/episodes", json={**body, "episode_id": "e-other"},
                          headers={"Idempotency-Key": key})
        assert clash.status_code == 409 and clash.json()["error"]["code"] == "conflict"
        assert clash.json()["error"]["field"] == "episode_id" and episode_id_for_key("ann", key) in \
            clash.json()["error"]["message"]
        for bad in ("", "a b", "x" * (KEY_MAX + 1)):
            refused = http.post("/v1/users/ann/episodes", json=body, headers={"Idempotency-Key": bad})
            assert refused.status_code == 422, bad
            assert refused.json()["error"]["field"] == "Idempotency-Key", refused.json()
        blank = http.post("/v1/users/ann/episodes/marker/retract", content=b"\r",
                          headers={"Content-Type": "application/json"})  # found by the fuzz: whitespace is no body
        assert blank.status_code == 422 and blank.json()["error"]["field"] == "(body)"
        marker = http.post("/v1/users/ann/episodes", json={"text": "marker", "importance": 0.1,
                                                            "episode_id": "marker"})
        assert marker.status_code == 202

    # One user's events are applied in log order: once the marker is in, so are the four keyed writes.
    wait_for(lambda: (w.get("/v1/users/ann/episodes/marker") or {}).get("text") == "marker", 30, "the marker")
    stats = w.stats("ann")
    assert stats["episodes"] == 2  # the keyed episode once, and the marker
    assert stats["pending_importance"] == pytest.approx(0.8 + 0.1)  # the accumulator counted it once
    assert [e["id"] for e in _episodes_with(w, "ann", body["text"])] == [episode_id_for_key("ann", key)]
    assert len(_episode_records(s, "ann")) == 5  # four keyed events and the marker reached the log


@pytest.mark.integration
@pytest.mark.broker
def test_the_client_retrying_after_a_lost_answer_records_one_episode(settings, worker):
    s = replace(settings, threshold=1000.0)
    run(ensure_topics(s))
    w = worker(s)
    proxy = LosesFirstAnswer(s.web_port)
    try:
        with ReflectClient(f"http://127.0.0.1:{proxy.port}", env={}, retry=QUICK, timeout=10) as reflect:
            done = reflect.record("bea", "rolled back the release after the canary failed", 0.7)
            reflect.record("bea", "marker", 0.1, episode_id="marker", wait=30)
    finally:
        proxy.close()
    assert proxy.connections >= 2  # the answer of the first was lost, and the client tried again
    sent = [r["episode_id"] for r in _episode_records(s, "bea") if r["episode_id"] != "marker"]
    assert sent == [done.episode_id] * 2  # the write arrived twice, with the one id the client named
    stats = w.stats("bea")
    assert stats["episodes"] == 2 and stats["pending_importance"] == pytest.approx(0.7 + 0.1)
    assert [e["id"] for e in _episodes_with(w, "bea", "rolled back the release after the canary failed")] == \
        [done.episode_id]
