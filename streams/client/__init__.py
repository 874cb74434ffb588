"""The Python client of Reflect's HTTP API, sync and async.

    from streams.client import ReflectClient
    with ReflectClient() as reflect:                    # REFLECT_API, else reflect up's http://127.0.0.1:8080
        reflect.record("alice", "the deploy failed: auth token expired", importance=0.8)
        print(reflect.beliefs_prompt("alice").prompt)   # pinned beliefs for a system prompt

`AsyncReflectClient` has the same methods, awaited. Both send the bearer token
(`token=`, else REFLECT_API_TOKEN: the shared token or a per-user JWT), retry
a 503 or a 429 (honouring its Retry-After) and a connection failure with capped
backoff a bounded number of times, and raise `ReflectApiError` subclasses
carrying the API's error `code` and `field`, or `ReflectUnreachable`.

A write is retried too: `record` names its episode id (a uuid4, unless given)
before the first try and sends it on every try of that call, so a retry is
the same episode again, even after a connection that dropped before the
answer came (the write may have arrived: the view upserts it by id, and the
accumulator counts an id once). Without this client, send the
`Idempotency-Key` header instead (streams/http/routes/episodes.py).

`request(method, path)` reaches any route, the API's answer as it is: an
`Answer` (status, JSON body, headers) whatever the status, sent once.

The package holds the client's typed results too (`results`), and `reflect mcp`
(`mcp_server`): the client's operations as MCP tools.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import quote

import httpx

from streams.client.results import (Accepted, Answer, Belief, Beliefs, Explanation, Forbidden, Health, Invalid,
                                    Memory, NotFound, PromptBlock, RateLimited, Recall, ReflectApiError,
                                    ReflectError, ReflectUnreachable, Stats, Unauthorized, Unavailable)
from streams.settings import UP_API

DEFAULT_API = UP_API  # where `reflect up` serves by default
RETRIED_STATUS = 503
PACED_STATUS = 429  # over the rate limit: retried after its Retry-After, like a 503
VISIBLE_POLL = 0.05  # seconds between reads while waiting for a write to be applied (no server push to wait on)
# Only failures where the request may be sent again safely: it never left
# (connect), or the answer never came for a read or a write that names what it
# makes (`_Call.repeatable`).
CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
READ_ERRORS = (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError)

__all__ = ["ReflectClient", "AsyncReflectClient", "Retry", "api_url", "DEFAULT_API",
           "Accepted", "Answer", "Belief", "Beliefs", "PromptBlock", "Memory", "Recall", "Explanation", "Stats",
           "Health",
           "ReflectError", "ReflectUnreachable", "ReflectApiError", "Invalid", "NotFound", "Unauthorized",
           "Forbidden", "RateLimited", "Unavailable"]


def api_url(explicit: str | None = None, env=os.environ) -> str:
    """The API to talk to: the argument, else REFLECT_API, else `reflect up`'s default."""
    return (explicit or env.get("REFLECT_API", "").strip() or DEFAULT_API).rstrip("/")


def api_token(explicit: str | None = None, env=os.environ) -> str | None:
    return explicit or env.get("REFLECT_API_TOKEN", "").strip() or None


@dataclass(frozen=True)
class Retry:
    """How often and how long to retry: `attempts` tries in all, waits doubling
    from `backoff` to `max_wait` seconds (with jitter), a 503's or 429's Retry-After
    honoured up to `max_retry_after`."""
    attempts: int = 5
    backoff: float = 0.25
    max_wait: float = 4.0
    max_retry_after: float = 30.0

    def wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        ceiling = min(self.backoff * 2 ** attempt, self.max_wait)
        return ceiling / 2 + random.uniform(0, ceiling / 2)  # jitter: workers of one rebalance spread out


NO_RETRY = Retry(attempts=1)


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    parse: Callable[[dict[str, Any]], Any]
    params: dict[str, Any] | None = None
    body: Any = None
    visible: "_Call | None" = None  # a read that answers once the write is applied
    wait: float = 0.0  # seconds to wait for it
    raw: bool = False  # request(): the Answer whatever its status, sent once
    names_it: bool = False  # a write that names what it makes (record's episode id): the same again when repeated

    def gave_up(self) -> ReflectError:
        return ReflectError(f"{self.path} was accepted, but {self.visible.path} did not answer within {self.wait} s; "
                            "the worker may be behind (GET /healthz, stats)")

    @property
    def repeatable(self) -> bool:
        """Safe to send again when the answer was lost: a read, or a write that names what it makes."""
        return self.method == "GET" or self.names_it


def _user(user: str, *tail: str) -> str:
    """/v1/users/{user}/…, each part escaped whole: a `/` in an id stays in the id."""
    return "/".join(["/v1/users", *(quote(p, safe="") for p in (user, *tail))])


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _retry_after(answer: httpx.Response) -> float | None:
    try:
        return float(answer.headers["Retry-After"])
    except (KeyError, ValueError):
        return None


def _json_of(answer: httpx.Response) -> Any:
    try:
        return answer.json()
    except ValueError:  # a proxy's HTML page, an empty body
        return None


def _outcome(call: _Call, answer: httpx.Response) -> Any:
    """The parsed result of a 2xx, else the error the API named."""
    body = _json_of(answer)
    if answer.is_success and isinstance(body, dict):
        return call.parse(body)
    raise ReflectApiError.from_answer(answer.status_code, body, _retry_after(answer))


class _Api:
    """The API's operations, each described once as a `_Call`; the sync and
    async clients differ only in how `_send` carries it out."""

    def __init__(self, api: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 retry: Retry = Retry(), env: Mapping[str, str] = os.environ) -> None:
        # env: where REFLECT_API and REFLECT_API_TOKEN are looked up; {} uses the arguments only.
        self.api, self.retry, self.timeout = api_url(api, env), retry, timeout
        token = api_token(token, env)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _send(self, call: _Call) -> Any:
        raise NotImplementedError

    def _should_retry(self, call: _Call, attempt: int, failure: BaseException) -> bool:
        if call.raw or attempt + 1 >= self.retry.attempts:
            return False
        if isinstance(failure, ReflectApiError):
            return failure.status in (RETRIED_STATUS, PACED_STATUS)
        return isinstance(failure, CONNECT_ERRORS) or (call.repeatable and isinstance(failure, READ_ERRORS))

    def _final(self, failure: BaseException) -> BaseException:
        return failure if isinstance(failure, ReflectApiError) else ReflectUnreachable(self.api, failure)

    # -- writes --------------------------------------------------------------------------------------------

    def record(self, user: str, text: str, importance: float, *, episode_id: str | None = None,
               occurred_at: str | None = None, source: str | None = None,
               metadata: dict[str, Any] | None = None, wait: float | None = None) -> Accepted:
        """Record an episode (importance 0..1); `.episode_id` names it. Reads see
        it once the worker has applied it; `wait=` seconds: return only then.
        Without `episode_id`, one is made here, once: every retry of this call
        sends it, so the episode is recorded once however often it is sent."""
        episode_id = episode_id or uuid.uuid4().hex
        body = _given(text=text, importance=importance, episode_id=episode_id, occurred_at=occurred_at,
                      source=source, metadata=metadata)
        visible = _Call("GET", _user(user, "episodes", episode_id), dict) if wait else None
        return self._send(_Call("POST", _user(user, "episodes"), Accepted.from_json, body=body, visible=visible,
                                wait=wait or 0.0, names_it=True))

    def retract(self, user: str, episode_id: str, reason: str = "incorrect") -> Accepted:
        """Retract an episode (incorrect, erasure, duplicate, superseded, other):
        beliefs resting on it are revisited."""
        return self._send(_Call("POST", _user(user, "episodes", episode_id, "retract"), Accepted.from_json,
                                body={"reason": reason}))

    def forget(self, user: str) -> Accepted:
        """Forget everything of the user: every key destroyed, every point
        dropped, in the user's request order. `.event_id` names the forget;
        `erasure(user, event_id)` serves its proof once it is carried out."""
        return self._send(_Call("DELETE", _user(user), Accepted.from_json))

    def reflect(self, user: str) -> Accepted:
        """Ask for a manual reflection cycle now; `.cycle_id` names it. The
        request is named before the first try, so a retry asks for the same
        cycle (the worker forwards a manual cycle id once)."""
        return self._send(_Call("POST", _user(user, "reflect"), Accepted.from_json,
                                body={"request_id": uuid.uuid4().hex}))

    # -- reads ---------------------------------------------------------------------------------------------

    def beliefs(self, user: str, *, limit: int | None = None, as_of: str | None = None,
                refresh: str | None = None) -> Beliefs:
        """Live beliefs, most pinned first; `as_of` (RFC 3339): those held then."""
        return self._send(_Call("GET", _user(user, "beliefs"), Beliefs.from_json,
                                params=_given(limit=limit, as_of=as_of, refresh=refresh)))

    def beliefs_prompt(self, user: str, *, budget: int | None = None, limit: int | None = None,
                       as_of: str | None = None, refresh: str | None = None) -> PromptBlock:
        """Pinned beliefs as a system-prompt block of at most `budget` tokens."""
        return self._send(_Call("GET", _user(user, "beliefs"), PromptBlock.from_json, params=_given(
            format="prompt", budget=budget, limit=limit, as_of=as_of, refresh=refresh)))

    def recall(self, user: str, query: str, *, mode: str | None = None, k: int | None = None,
               refresh: str | None = None) -> Recall:
        """Answer a question from episodes (what happened) or beliefs (patterns), as its type asks."""
        return self._send(_Call("GET", _user(user, "recall"), Recall.from_json,
                                params=_given(q=query, mode=mode, k=k, refresh=refresh)))

    def explain(self, user: str, reflection_id: str) -> Explanation:
        """A belief in any status and its provenance down to the episodes."""
        return self._send(_Call("GET", _user(user, "reflections", reflection_id), Explanation.from_json))

    def erasure(self, user: str, erasure_id: str) -> dict[str, Any]:
        """The proof of a completed erasure: the episodes and beliefs it took the text of, the keys destroyed."""
        return self._send(_Call("GET", _user(user, "erasures", erasure_id), dict))

    def episode(self, user: str, episode_id: str) -> dict[str, Any]:
        """An episode as projected into the view."""
        return self._send(_Call("GET", _user(user, "episodes", episode_id), dict))

    def stats(self, user: str) -> Stats:
        return self._send(_Call("GET", _user(user, "stats"), Stats.from_json))

    def health(self) -> "Health":
        """/healthz, whatever its status: `Health.ok` once the worker serves."""
        return self._send(_Call("GET", "/healthz", Health.from_json))

    # -- operators -----------------------------------------------------------------------------------------

    def start_rebuild(self) -> dict[str, Any]:
        return self._send(_Call("POST", "/v1/admin/rebuild", dict))

    def rebuild_progress(self) -> dict[str, Any]:
        return self._send(_Call("GET", "/v1/admin/rebuild", dict))

    def start_replay(self, name: str, *, estimate_only: bool = False, **spec: Any) -> dict[str, Any]:
        """Replay the log into side view `name` (spec: reasoner, prompt_version,
        users, without, until, budget_tokens); `estimate_only`: what it would take, nothing started."""
        body = {"name": name, **{k: v for k, v in spec.items() if v not in (None, (), [])}}
        return self._send(_Call("POST", "/v1/admin/replays", dict, body=body | ({"estimate_only": True}
                                                                                if estimate_only else {})))

    def replay(self, name: str) -> dict[str, Any]:
        """A replay's spec, state, progress, size and age."""
        return self._send(_Call("GET", f"/v1/admin/replays/{quote(name, safe='')}", dict))

    def replays(self) -> list[dict[str, Any]]:
        return self._send(_Call("GET", "/v1/admin/replays", lambda body: body["replays"]))

    def drop_replay(self, name: str) -> dict[str, Any]:
        return self._send(_Call("DELETE", f"/v1/admin/replays/{quote(name, safe='')}", dict))

    def promote_replay(self, name: str) -> dict[str, Any]:
        """Make a done replay's beliefs the live ones: {"published", "invalidated", "promoted_at"}."""
        return self._send(_Call("POST", f"/v1/admin/replays/{quote(name, safe='')}/promote", dict))

    def replay_diff(self, name: str, *, against: str = "live", users: Sequence[str] = ()) -> dict[str, Any]:
        """{"added", "dropped", "changed", "same"}: the replay's beliefs against `against`'s."""
        return self._send(_Call("GET", f"/v1/admin/replays/{quote(name, safe='')}/diff", dict,
                                params={"against": against, **({"user": list(users)} if users else {})}))

    # -- any route -----------------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                body: Any = None) -> Answer:
        """One request to any route, e.g. `request("GET", "/v1/reasoner")`: the
        `Answer` (status, JSON body, headers) whatever its status, so a 4xx or
        5xx raises nothing and an error body can be read as the API shaped it.
        Sent once: what a 503 means is the caller's to decide. Raises only
        `ReflectUnreachable`, when no answer came. `path` goes as written, query
        included: escape a user id in it yourself (quote(user, safe=""))."""
        return self._send(_Call(method.upper(), path, dict, params=params, body=body, raw=True))


def _result(call: _Call, answer: httpx.Response) -> Any:
    """What one answer makes of a call: the Answer itself for request(), else
    the parsed 2xx or the API's error; /healthz answers 503 with a status body
    while starting: a result, not an error."""
    if call.raw:
        return Answer(answer.status_code, _json_of(answer), dict(answer.headers))
    if call.path == "/healthz" and answer.status_code == RETRIED_STATUS:
        return call.parse(answer.json())
    return _outcome(call, answer)


class ReflectClient(_Api):
    """Blocking client; use as a context manager, or `close()` it."""

    def __init__(self, api: str | None = None, token: str | None = None, **options: Any) -> None:
        super().__init__(api, token, **options)
        self._http = httpx.Client(base_url=self.api, headers=self.headers, timeout=self.timeout)

    def _send(self, call: _Call) -> Any:
        result = self._once(call)
        deadline = time.monotonic() + call.wait
        while call.visible is not None and not self._found(call.visible):
            if time.monotonic() > deadline:
                raise call.gave_up()
            time.sleep(VISIBLE_POLL)
        return result

    def _found(self, probe: _Call) -> bool:
        try:
            return self._once(probe) is not None
        except NotFound:
            return False

    def _once(self, call: _Call) -> Any:
        for attempt in range(self.retry.attempts):
            try:
                answer = self._http.request(call.method, call.path, params=call.params, json=call.body)
                return _result(call, answer)
            except (ReflectApiError, httpx.TransportError) as failure:
                if not self._should_retry(call, attempt, failure):
                    raise self._final(failure) from None
                time.sleep(self.retry.wait(attempt, getattr(failure, "retry_after", None)))
        raise AssertionError("unreachable: the last attempt raises")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ReflectClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncReflectClient(_Api):
    """The same methods as `ReflectClient`, each a coroutine; `async with` it, or `await aclose()`."""

    def __init__(self, api: str | None = None, token: str | None = None, **options: Any) -> None:
        super().__init__(api, token, **options)
        self._http = httpx.AsyncClient(base_url=self.api, headers=self.headers, timeout=self.timeout)

    async def _send(self, call: _Call) -> Any:
        result = await self._once(call)
        deadline = time.monotonic() + call.wait
        while call.visible is not None and not await self._found(call.visible):
            if time.monotonic() > deadline:
                raise call.gave_up()
            await asyncio.sleep(VISIBLE_POLL)
        return result

    async def _found(self, probe: _Call) -> bool:
        try:
            return await self._once(probe) is not None
        except NotFound:
            return False

    async def _once(self, call: _Call) -> Any:
        for attempt in range(self.retry.attempts):
            try:
                answer = await self._http.request(call.method, call.path, params=call.params, json=call.body)
                return _result(call, answer)
            except (ReflectApiError, httpx.TransportError) as failure:
                if not self._should_retry(call, attempt, failure):
                    raise self._final(failure) from None
                await asyncio.sleep(self.retry.wait(attempt, getattr(failure, "retry_after", None)))
        raise AssertionError("unreachable: the last attempt raises")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncReflectClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
