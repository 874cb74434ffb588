"""The public client (streams/client/) against a real worker, and its retry
rules against servers that refuse in the ways a real deployment does."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import replace

import pytest
from aiohttp import web

from schemas import ReflectionCreated
from streams.broker import free_port
import streams.cli.main as cli
from streams.client import (AsyncReflectClient, Invalid, NotFound, ReflectClient, ReflectUnreachable, Retry,
                            Unauthorized, Unavailable, api_url)
from streams.producer import Publisher
from streams.topics import ensure_topics
from support.harness import run, wait_for

TOKEN = "client-test-token-0123456789abcdef"
QUICK = Retry(attempts=3, backoff=0.01, max_wait=0.05)


async def _belief(settings, user: str, rid: str, evidence: list[str]) -> None:
    event = ReflectionCreated(user_id=user, reflection_id=rid, cycle_id=f"{user}:1", evidence_ids=tuple(evidence),
                              text="The user checks the logs before retrying a failed deploy.", depth=1,
                              importance=0.7, confidence=0.7, reasoner="offline", prompt_version="offline-v1")
    async with Publisher(settings) as p:
        await p.publish(event, topic=settings.topic_reflections)


@pytest.mark.integration
def test_client_sync_and_async_against_a_worker(settings, worker, monkeypatch, capsys):
    s = replace(settings, threshold=1000.0)  # no cycle of its own: the belief is published below
    run(ensure_topics(s))
    worker(s, env={"REFLECT_API_TOKEN": TOKEN})
    api = f"http://127.0.0.1:{s.web_port}"
    with ReflectClient(api, TOKEN) as reflect:
        assert reflect.health().ok
        first = reflect.record("ann", "deploy failed: read the logs, then retried", 0.8, metadata={"pr": 7}, wait=30)
        assert first.episode_id and first.event_id  # the client names the episode before sending
        assert reflect.episode("ann", first.episode_id)["metadata"] == {"pr": 7}  # wait=: readable on return
        second = reflect.record("ann", "logs first again before the retry", 0.7, episode_id="e2", source="chat")
        assert second.episode_id == "e2"
        run(_belief(s, "ann", "r1", [first.episode_id, "e2"]))
        wait_for(lambda: reflect.stats("ann").reflections == 1, 30, "the belief in the view")

        held = reflect.beliefs("ann")
        assert [b.reflection_id for b in held.beliefs] == ["r1"] and held.freshness["policy"] == "concurrent"
        block = reflect.beliefs_prompt("ann", budget=200)
        assert block.shown == 1 and "logs before retrying" in block.prompt
        found = reflect.recall("ann", "what happened with the deploy retry?", k=5)
        assert found.route in ("instance", "pattern") and found.results and found.results[0].text
        why = reflect.explain("ann", "r1")
        assert why.belief.evidence_ids == [first.episode_id, "e2"]
        assert {c["id"] for c in why.provenance["evidence"]} == {first.episode_id, "e2"}

        with pytest.raises(Invalid) as bad:
            reflect.record("ann", "x", importance=7)
        assert (bad.value.status, bad.value.code, bad.value.field) == (422, "invalid", "importance")
        with pytest.raises(Invalid) as bad:
            reflect.recall("ann", "x", k=0)
        assert bad.value.field == "k"
        with pytest.raises(NotFound) as missing:
            reflect.explain("ann", "no-such-belief")
        assert missing.value.field == "reflection_id"
    with ReflectClient(api, token=None, retry=QUICK) as anonymous, pytest.raises(Unauthorized) as refused:
        anonymous.stats("ann")
    assert refused.value.code == "unauthorized"

    async def async_reads():
        async with AsyncReflectClient(api, TOKEN) as reflect:
            stats, held = await asyncio.gather(reflect.stats("ann"), reflect.beliefs("ann"))
            third = await reflect.record("ann", "a third, from the async client", 0.2, wait=30)
            return stats, held, await reflect.episode("ann", third.episode_id)

    stats, held, third = run(async_reads())
    assert stats.user_id == "ann" and [b.reflection_id for b in held.beliefs] == ["r1"]
    assert third["text"] == "a third, from the async client"

    # The CLI's reads go through the same client and find the API in REFLECT_API.
    monkeypatch.setenv("REFLECT_API", api)
    monkeypatch.setenv("REFLECT_API_TOKEN", TOKEN)
    capsys.readouterr()
    assert cli.main(["beliefs", "--user", "ann", "--format", "prompt"]) == 0
    assert "logs before retrying" in capsys.readouterr().out
    assert cli.main(["explain", "--user", "ann", "--reflection-id", "r1"]) == 0
    assert "[live] reflection r1" in capsys.readouterr().out
    monkeypatch.delenv("REFLECT_API_TOKEN")
    assert cli.main(["stats", "--user", "ann"]) == 1
    assert capsys.readouterr().err.startswith("reflect: error: 401 unauthorized")

    with ReflectClient(api, TOKEN) as reflect:
        assert reflect.retract("ann", "e2", "erasure").episode_id == "e2"
        wait_for(lambda: reflect.explain("ann", "r1").belief.status == "invalid", 30, "r1 invalid without e2")
        manual = reflect.reflect("ann").cycle_id
        assert manual.startswith("ann:manual:")
        kinds = wait_for(lambda: reflect.stats("ann").cycles_by_kind if reflect.stats("ann").cycles_by_kind.get(
            "manual") else None, 30, "the manual cycle counted")
        assert kinds == {"threshold": 0, "manual": 1, "revalidation": 0}
        last = wait_for(lambda: reflect.stats("ann").raw["last_cycle"], 30, "the manual cycle's outcome in stats")
        assert (last["cycle_id"], last["why"], last["created"] + last["reinforced"]) == (manual, "manual", 0)
        assert last["why_nothing"]  # two unrelated live episodes: nothing a belief could rest on, and it says so

        # A retried request (same request_id) is the same cycle, forwarded once; a later one shows it was not counted.
        same = [reflect.request("POST", "/v1/users/ann/reflect", body={"request_id": "again-1"}) for _ in range(2)]
        assert [a.status for a in same] == [202, 202]
        assert same[0].body["cycle_id"] == same[1].body["cycle_id"] == "ann:manual:again-1"
        reflect.request("POST", "/v1/users/ann/reflect", body={"request_id": "again-2"})
        counted = wait_for(lambda: (lambda n: n if n >= 3 else None)(reflect.stats("ann").cycles_by_kind["manual"]),
                           30, "the later manual cycle counted")
        assert counted == 3
        # request(): any route, its answer as the API shaped it, an error included (nothing raised).
        bad = reflect.request("POST", "/v1/users/ann/reflect", body={"request_id": "no spaces"})
        assert (bad.status, bad.ok, bad.body["error"]["field"]) == (422, False, "request_id")
        held = reflect.request("GET", "/v1/users/ann/beliefs", params={"limit": 5})
        assert held.ok and held.headers["content-type"].startswith("application/json") and held.body["user_id"] == "ann"
    with ReflectClient(api, token=None, env={}) as anonymous:
        refused = anonymous.request("GET", "/v1/users/ann/stats")
        assert refused.status == 401 and refused.body["error"]["code"] == "unauthorized"


class Refusing:
    """A real HTTP server that answers 503 (with Retry-After) `times` times, then 200."""

    def __init__(self, times: int, retry_after: str | None = "1") -> None:
        self.times, self.retry_after, self.calls, self.port = times, retry_after, 0, free_port()
        self.ready = threading.Event()

    async def _answer(self, request: web.Request) -> web.Response:
        self.calls += 1
        if self.calls <= self.times:
            headers = {"Retry-After": self.retry_after} if self.retry_after else None
            return web.json_response({"error": {"code": "unavailable", "message": "rebalancing; retry"}},
                                     status=503, headers=headers)
        return web.json_response({"user_id": "ann", "beliefs": [], "freshness": {"policy": "concurrent"}})

    def __enter__(self) -> "Refusing":
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self._serve, daemon=True).start()
        assert self.ready.wait(10)
        return self

    def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.ready.set()
        self.loop.run_forever()

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_a_503_is_retried_after_its_retry_after():
    with Refusing(times=2) as server, ReflectClient(f"http://127.0.0.1:{server.port}", retry=QUICK) as reflect:
        started = time.monotonic()
        assert reflect.beliefs("ann").beliefs == []
        assert server.calls == 3 and time.monotonic() - started >= 2.0  # two Retry-After: 1 honoured


def test_a_503_that_lasts_raises_unavailable_after_the_bounded_attempts():
    with Refusing(times=99, retry_after=None) as server, \
            ReflectClient(f"http://127.0.0.1:{server.port}", retry=QUICK) as reflect:
        with pytest.raises(Unavailable) as gave_up:
            reflect.record("ann", "x", 0.5)  # a write too: the broker did not take it, so it may be sent again
        assert server.calls == 3 and gave_up.value.code == "unavailable"

    async def async_call():
        async with AsyncReflectClient(f"http://127.0.0.1:{server.port}", retry=QUICK) as reflect:
            return await reflect.beliefs("ann")

    with Refusing(times=1, retry_after=None) as server:
        assert run(async_call()).beliefs == [] and server.calls == 2


class Dropping:
    """Accepts each connection and closes it without an answer; counts them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.accepted = self.sock.getsockname()[1], 0
        threading.Thread(target=self._drop, daemon=True).start()

    def _drop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.recv(65536)
            conn.close()


def test_connection_failures_retry_reads_but_not_a_write_that_may_have_arrived():
    dropping = Dropping()
    with ReflectClient(f"http://127.0.0.1:{dropping.port}", retry=QUICK) as reflect:
        with pytest.raises(ReflectUnreachable):
            reflect.stats("ann")
        assert dropping.accepted == 3  # a read is safe to ask again
        with pytest.raises(ReflectUnreachable):
            reflect.reflect("ann")
        assert dropping.accepted == 4  # a manual cycle asked twice would be two cycles
    dropping.sock.close()
    with ReflectClient(f"http://127.0.0.1:{dropping.port}", retry=QUICK) as reflect, \
            pytest.raises(ReflectUnreachable, match="no Reflect API at"):
        reflect.record("ann", "x", 0.5)  # refused connections: nothing was sent, so retried, then named


def test_request_answers_whatever_the_status_and_is_sent_once():
    with Refusing(times=1) as server, ReflectClient(f"http://127.0.0.1:{server.port}", retry=QUICK) as reflect:
        refused = reflect.request("get", "/v1/users/ann/beliefs")
        assert (refused.status, refused.ok, refused.body["error"]["code"]) == (503, False, "unavailable")
        assert refused.headers["retry-after"] == "1" and server.calls == 1  # not retried: the caller decides
        assert reflect.request("GET", "/v1/users/ann/beliefs").body["beliefs"] == [] and server.calls == 2

    async def async_call():
        async with AsyncReflectClient(f"http://127.0.0.1:{server.port}", retry=QUICK) as reflect:
            return await reflect.request("POST", "/v1/users/ann/reflect", body={"request_id": "r-1"})

    with Refusing(times=1) as server:
        assert run(async_call()).status == 503 and server.calls == 1
    dropping = Dropping()
    with ReflectClient(f"http://127.0.0.1:{dropping.port}", retry=QUICK) as reflect, \
            pytest.raises(ReflectUnreachable):
        reflect.request("GET", "/v1/users/ann/stats")  # a read, yet asked once
    assert dropping.accepted == 1
    dropping.sock.close()


def test_env_says_where_the_api_and_token_are_looked_up(monkeypatch):
    monkeypatch.setenv("REFLECT_API", "http://from-env:1")
    monkeypatch.setenv("REFLECT_API_TOKEN", TOKEN)
    with ReflectClient() as ambient, ReflectClient(env={}) as isolated, \
            ReflectClient(env={"REFLECT_API": "http://given:2", "REFLECT_API_TOKEN": "t" * 32}) as given:
        assert (ambient.api, ambient.headers) == ("http://from-env:1", {"Authorization": f"Bearer {TOKEN}"})
        assert (isolated.api, isolated.headers) == ("http://127.0.0.1:8080", {})
        assert (given.api, given.headers) == ("http://given:2", {"Authorization": f"Bearer {'t' * 32}"})


def test_the_api_is_found_by_argument_then_environment_then_up_default():
    assert api_url("http://h:1/", env={"REFLECT_API": "http://e:2"}) == "http://h:1"
    assert api_url(None, env={"REFLECT_API": "http://e:2"}) == "http://e:2"
    assert api_url(None, env={}) == "http://127.0.0.1:8080"
