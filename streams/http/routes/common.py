"""What every route shares: JSON errors, the guard in front of the routes,
query and body parsing, the context handlers reach the worker through, and
the write path (publish and wait for the broker's acknowledgement)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import ssl
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka.errors import KafkaError
from aiohttp import ClientConnectorCertificateError, ClientError, ClientTimeout, web
from faust.web import Request, Response, View
from yarl import URL

from processors.accumulator import Accumulator
from processors.freshness import POLICIES, Freshness
from processors.projector import point_id
from schemas import ContractError, parse_time, schema_text
from streams import auth
from streams.http import forwarding
from streams.http.routes.limits import limit
from streams.settings import SettingsError

log = logging.getLogger("reflect.api")
SEND_TIMEOUT = 15.0  # seconds a write waits for the broker's acknowledgement
FORWARDED = "X-Reflect-Forwarded"  # on a read one worker forwards to the user's owner: never forwarded again
FORWARD_SLACK = 10.0  # seconds a forwarded read may take beyond a blocking refresh's own bound
FAUST_PAGES = {"/"}  # pages Faust registers on every worker that Reflect does not serve
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.retry_after = retry_after  # seconds, for a 503 the caller should retry

    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None

    def body(self) -> dict[str, Any]:
        error = {"code": self.code, "message": self.message}
        return {"error": {**error, "field": self.field} if self.field else error}


@dataclass
class Context:
    """All a handler reaches of the worker; `app.reflect` on its Faust app."""
    runtime: Any

    @property
    def rebuilding(self):
        """The one rebuild or compaction the worker may run (streams/worker/rebuild.py)."""
        return self.runtime.rebuilding

    @property
    def replays(self):
        """The replays of this worker's data directory (streams/worker/replay.py)."""
        if self.runtime.replays is None:
            from streams.worker.replay import Replays

            runtime = self.runtime
            runtime.replays = Replays(runtime.settings, runtime.view, runtime.embedder.dim, runtime.sealing)
        return self.runtime.replays

    @property
    def view(self):
        return self.runtime.view

    @property
    def tables(self):
        """The worker's tables (its own partitions' users)."""
        return self.runtime.tables

    @property
    def episodes_topic(self):
        return self.runtime.outlets.episodes

    @property
    def sealing(self):
        """What seals an episode before it goes on the log (streams/shredding.py)."""
        return self.runtime.sealing

    @property
    def settings(self):
        return self.runtime.settings


def users_point(view, kind: str, user_id: str, record_id: str) -> dict[str, Any] | None:
    """The user's point of this kind and id, or None: another user's is none of theirs."""
    pid = point_id(kind, user_id, record_id)
    found = view.get([pid]).get(pid)
    return found if found is not None and found.get("user_id") == user_id else None


def context(view: View) -> Context:
    return view.app.reflect


def answers_json(handler):
    """Turn every failure of a handler into a JSON error answer."""
    @functools.wraps(handler)
    async def wrapped(self: View, request: Request, **kwargs) -> Response:
        try:
            return await handler(self, request, **kwargs)
        except ContractError as exc:
            error = ApiError(422, "invalid", exc.reason, exc.field)
        except ApiError as exc:
            error = exc
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            error = ApiError(500, "internal", "internal error; see the worker's log")
        return self.json(error.body(), status=error.status, headers=error.headers())
    return wrapped


def owned(handler=None, *, tables: bool = True):
    """A read of one user's state, answered by the worker that owns the user
    (streams/worker/ownership.py): here when this worker owns it and its answer is
    whole, forwarded to the owner otherwise (with this worker's assertion,
    never the caller's token: streams/http/forwarding.py), 503 with Retry-After while the
    group rebalances or the owner catches up — never an answer from a worker
    that does not hold the user. `tables=False`: the read needs only the view,
    which a Qdrant server shares, so any worker answers it then."""
    if handler is None:
        return functools.partial(owned, tables=tables)

    @functools.wraps(handler)
    async def wrapped(self: View, request: Request, user_id: str, **kwargs) -> Response:
        ownership = context(self).runtime.ownership
        if not (tables or ownership.local_view):
            return await handler(self, request, user_id=user_id, **kwargs)
        owner, here = ownership.owner(user_id), str(self.app.conf.canonical_url)
        if owner == here:
            if not ownership.ready(user_id):
                raise ApiError(503, "unavailable", "this worker is taking over the user's partition "
                                                   "(recovering its tables or catching its view up); retry",
                               retry_after=1)
            return await handler(self, request, user_id=user_id, **kwargs)
        if owner is None or FORWARDED in request.headers:  # the workers' maps disagree: mid-rebalance
            raise ApiError(503, "unavailable", "the workers are rebalancing partitions; retry", retry_after=1)
        return await forward(self.app, request, owner, user_id,
                             context(self).settings.refresh_timeout + FORWARD_SLACK)
    return wrapped


@dataclass(frozen=True)
class Forwarding:
    """How this worker forwards reads and admits forwarded ones
    (streams/http/forwarding.py); held by its aiohttp app under `FORWARDING`, where
    the guard finds it. Built once, at start: the TLS context reads files."""
    url: str  # this worker's canonical URL: the audience of assertions to it, the issuer of its own
    keys: forwarding.ClusterKeys
    client_ssl: ssl.SSLContext  # verifies the owner's certificate (an https owner)
    tls: bool  # forward over TLS only
    replays: forwarding.Replays


FORWARDING = web.AppKey("reflect.forwarding", Forwarding)


def install_forwarding(web_app: web.Application, settings, url: str) -> Forwarding:
    """Give the worker's web server what forwarding needs; warn once, at
    start, when forwarded reads cannot be signed (they answer 503 then)."""
    state = Forwarding(url, forwarding.cluster_keys_of(settings), forwarding.client_ssl(settings),
                       forwarding.tls_of(settings), forwarding.Replays())
    if state.keys.problem:
        log.warning("reads another worker must answer will fail (503): %s", state.keys.problem)
    web_app[FORWARDING] = state
    return state


def forward_headers(request: Request, state: Forwarding, owner: str, user_id: str, now: float) -> dict[str, str]:
    """What a forwarded read carries: never the caller's token (it stays on
    the worker it reached, which has authorized the caller), but this
    worker's assertion for the one user and scope, addressed to the owner;
    nothing with auth off. 503 when it cannot be signed or must not go in clear."""
    problem = forwarding.plain_problem(owner, state.tls) or (state.keys.problem if state.keys.auth_on else None)
    if problem:
        raise ApiError(503, "unavailable", f"cannot forward this read: {problem}")
    headers = {k: v for k, v in request.headers.items() if k.lower() == "accept"}
    headers[FORWARDED] = state.url
    if state.keys.auth_on:
        scope = auth.need_of(request.method, _route_of(request)).scope
        headers[forwarding.HEADER] = forwarding.mint(state.keys.signing, user=user_id, scope=scope,
                                                     audience=owner, issuer=state.url, now=now)
    return headers


async def forward(app, request: Request, owner: str, user_id: str, timeout: float) -> web.Response:
    """The owner's answer to the same read, as it gave it. Its certificate
    verified when it is https: one that does not verify is a 503, never a
    retry over plain HTTP."""
    state = request.app.get(FORWARDING)
    if state is None:  # a web server not built by streams/worker/app.py: refuse rather than forward unsigned
        raise ApiError(503, "unavailable", "this worker cannot forward reads (forwarding is not set up)")
    headers = forward_headers(request, state, owner, user_id, time.time())
    url = URL(owner).join(request.rel_url)
    try:
        async with app.http_client.get(url, headers=headers, ssl=state.client_ssl,
                                       timeout=ClientTimeout(total=timeout)) as answer:
            body = await answer.read()
            kept = {k: answer.headers[k] for k in ("Content-Type", "WWW-Authenticate", "Retry-After")
                    if k in answer.headers}
            return web.Response(body=body, status=answer.status, headers=kept)
    except ClientConnectorCertificateError as exc:
        log.warning("forwarding a read to %s: its certificate does not verify: %s", owner, exc.certificate_error)
        raise ApiError(503, "unavailable", f"the worker that owns this user ({owner}) presented a certificate "
                                           "that does not verify (REFLECT_CLUSTER_CA_FILE)") from None
    except (ClientError, TimeoutError) as exc:
        raise ApiError(503, "unavailable", f"the worker that owns this user ({owner}) did not answer: "
                                           f"{type(exc).__name__}; retry", retry_after=1) from None


def _error_response(error: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(error.body()), status=error.status, content_type="application/json",
                        headers=headers)


def too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"the request body is over the limit of {limit} bytes "
                                      "(REFLECT_MAX_REQUEST_BYTES)", "(body)")


def _refused(error: auth.AuthError) -> web.Response:
    """401 with a Bearer challenge (RFC 6750), or 403 naming the scope asked for."""
    if error.status == 401:
        challenge, code = 'Bearer realm="reflect", error="invalid_token"', "unauthorized"
    else:
        challenge, code = f'Bearer realm="reflect", error="insufficient_scope", scope="{error.scope}"', "forbidden"
    return _error_response(ApiError(error.status, code, error.message, error.field), {"WWW-Authenticate": challenge})


def _route_of(request: web.Request) -> str | None:
    """The template of the route the router matched (/v1/users/{user_id}/…), None if none did."""
    resource = getattr(request.match_info.route, "resource", None)
    return resource.canonical if resource is not None else None


def admitted(request: web.Request, keys: auth.Keys) -> web.Response | None:
    """The refusal of a request its credential does not cover, else None. The
    user checked is the router's own `user_id`: the one the handler will read."""
    need = auth.need_of(request.method, _route_of(request))
    if need is None or not keys.configured:
        return None
    if forwarding.HEADER in request.headers:  # a read another worker forwards: its assertion, not a token
        return assertion_refusal(request, need)
    header = request.headers.get("Authorization")
    try:
        grant = auth.credential_of(header, keys)
    except auth.AuthError as error:
        response = _refused(error)
        if header is None:  # no credential at all: the plain challenge (RFC 6750 §3)
            response.headers["WWW-Authenticate"] = 'Bearer realm="reflect"'
        return response
    error = auth.refusal(grant, need, request.match_info.get("user_id"))
    return _refused(error) if error else None


FORWARDABLE = auth.Need("read", per_user=True)  # what `owned` forwards: a read of one user's state


def assertion_refusal(request: web.Request, need: auth.Need) -> web.Response | None:
    """The refusal of a forwarded read whose assertion does not admit it, else
    None: admitted only on a per-user read, beside X-Reflect-Forwarded, signed
    with the cluster key, addressed to this worker, for the route's user and
    scope, unexpired and not seen before."""
    state = request.app.get(FORWARDING)
    if need != FORWARDABLE:
        return _refused(auth.AuthError(401, "an assertion admits only a forwarded read of one user"))
    if state is None or state.keys.problem:
        problem = state.keys.problem if state is not None else "forwarding is not set up"
        return _error_response(ApiError(503, "unavailable", f"this worker cannot admit forwarded reads: {problem}"))
    issuer = request.headers.get(FORWARDED)
    if not issuer:
        return _refused(auth.AuthError(401, f"an assertion comes with {FORWARDED}"))
    now = time.time()
    try:
        claims = forwarding.verify(request.headers[forwarding.HEADER], state.keys.verifying, audience=state.url,
                                   issuer=issuer, user=request.match_info.get("user_id"), scope=need.scope, now=now)
    except forwarding.Refused as refused:
        return _refused(auth.AuthError(401, refused.message))
    if not state.replays.first_use(str(claims["jti"]), claims["exp"], now):
        return _refused(auth.AuthError(401, "the assertion has been used already"))
    return None


def _id_pattern() -> re.Pattern:
    """The contract's id rule (schemas/v1/envelope.json, `$defs.id`): the one a write's events must meet."""
    return re.compile(orjson.loads(schema_text("envelope"))["$defs"]["id"]["pattern"])


USER_ID = _id_pattern()
# Below the contract's 128: ids derived from a user's (`request:<user>:manual:<32 hex>`,
# `cycle:<user>:<n>`) must fit in 128 too, or a valid user could not reflect.
USER_ID_MAX = 64


def user_id_problem(user_id: str | None) -> ApiError | None:
    """One user-id rule for every route, reads as well as writes: the
    contract's, and no `.` or `..` segment (`a/../b` would name another path
    wherever an id becomes one)."""
    if user_id is None:
        return None
    if len(user_id) > USER_ID_MAX or not USER_ID.fullmatch(user_id):
        return ApiError(422, "invalid", f"a user id is 1 to {USER_ID_MAX} of A-Z a-z 0-9 . _ : @ / + = -, "
                                        "starting with a letter or digit", "user_id")
    if any(part in (".", "..") for part in user_id.split("/")):
        return ApiError(422, "invalid", "a user id has no . or .. segment", "user_id")
    return None


READS = frozenset({"GET", "HEAD", "OPTIONS"})


def guard(keys: auth.Keys, limit: int, replay: str | None = None):
    """aiohttp middleware in front of every route, Faust's own included: the
    credential and what it grants, the declared body size, and JSON for the
    router's errors. A replay's side worker (`replay`) answers reads only."""
    @web.middleware
    async def middleware(request: web.Request, handler):
        refused = admitted(request, keys)
        if refused is not None:
            return refused
        if replay and request.method not in READS:
            return _error_response(ApiError(409, "conflict", f"this worker replays the log into side view "
                                                             f"{replay}: it takes no writes"))
        if request.content_length is not None and request.content_length > limit:
            return _error_response(too_large(limit))
        if _route_of(request) in FAUST_PAGES:  # Faust's own index is no route of Reflect's
            return _error_response(ApiError(404, "not_found", "no such route"))
        bad_user = user_id_problem(request.match_info.get("user_id"))
        if bad_user is not None:
            return _error_response(bad_user)
        try:
            return await handler(request)
        except web.HTTPException as exc:  # no route, wrong method: JSON like every other error
            if exc.status < 400:
                raise
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return _error_response(ApiError(exc.status, _HTTP_CODES.get(exc.status, "invalid"), exc.reason), allow)
    return middleware


def keys_for(settings) -> auth.Keys:
    """The credentials every worker's web server checks. Built here, once, so
    this is where a server exposed without credentials is refused."""
    problem = auth.exposure_problem(settings)
    if problem:
        raise SettingsError(problem)
    try:
        return auth.keys_of(settings)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"invalid setting auth_public_key_file: {exc}") from None


def web_options(settings, keys: auth.Keys) -> dict[str, Any]:
    """faust.App(web_application_options=…): aiohttp's own body limit (what a
    read of a chunked body stops at), the guard, and the rate limit."""
    limited = limit(settings)  # after the guard: only admitted requests are counted
    return {"client_max_size": settings.max_request_bytes,
            "middlewares": [guard(keys, settings.max_request_bytes, settings.replay), *([limited] if limited else [])]}


async def json_body(request: Request, required: bool = True) -> dict[str, Any]:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:  # a chunked body ran over client_max_size while read
        raise too_large(request.client_max_size) from None
    if not raw:  # whitespace is no JSON: refused below, never taken for no body
        if required:
            raise ApiError(422, "invalid", "a JSON object body is required", "(body)")
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(422, "invalid", f"body is not JSON: {exc}", "(body)") from None
    if not isinstance(body, dict):
        raise ApiError(422, "invalid", "body must be a JSON object", "(body)")
    return body


def known_fields(body: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """The body, if it names no field but `fields`."""
    unknown = sorted(set(body) - fields)
    if unknown:
        raise ApiError(422, "invalid", f"unknown field (expected {sorted(fields)})", unknown[0])
    return body


def _parsed_query(request: Request, name: str, parse, expected: str) -> tuple[str | None, Any]:
    """(raw, parsed) of a query parameter, (None, None) if absent; 422 naming it if unparsable."""
    raw = request.query.get(name)
    if raw is None:
        return None, None
    try:
        return raw, parse(raw)
    except ValueError:
        raise ApiError(422, "invalid", f"must be {expected}, got {raw!r}", name) from None


def int_query(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw, value = _parsed_query(request, name, int, "an integer")
    if raw is None:
        return default
    if not low <= value <= high:
        raise ApiError(422, "invalid", f"must be within {low}..{high}", name)
    return value


def choice_query(request: Request, name: str, options: tuple[str, ...], default: str) -> str:
    value = request.query.get(name, default)
    if value not in options:
        raise ApiError(422, "invalid", f"must be one of {', '.join(options)}, got {value!r}", name)
    return value


def list_query(request: Request, name: str, options: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated choice of `options` (`?include=stale,superseded`), in the order of `options`."""
    given = [v for v in request.query.get(name, "").split(",") if v]
    wrong = [v for v in given if v not in options]
    if wrong:
        raise ApiError(422, "invalid", f"each must be one of {', '.join(options)}, got {wrong[0]!r}", name)
    return tuple(o for o in options if o in given)


def time_query(request: Request, name: str) -> str | None:
    raw, parsed = _parsed_query(request, name, parse_time, "an RFC 3339 time")
    if raw is not None and parsed.tzinfo is None:
        raise ApiError(422, "invalid", "must carry a zone, e.g. 2026-06-01T09:00:00Z", name)
    return raw


def freshness(ctx: Context, user_id: str) -> Freshness:
    asked = Accumulator.from_dict(ctx.tables.accumulators.get(user_id)).asked
    return Freshness(asked, ctx.tables.requests_done.get(user_id) or 0, user_id in ctx.runtime.running)


async def refreshed(ctx: Context, request: Request, user_id: str) -> dict[str, Any]:
    """Apply the read's refresh policy; what the answer says of its freshness."""
    policy = choice_query(request, "refresh", POLICIES, ctx.settings.refresh)
    loop = asyncio.get_running_loop()
    started = loop.time()
    state = freshness(ctx, user_id)
    if policy == "blocking" and state.due:
        # The reflector notifies this condition when it marks a cycle done, its events in the view.
        done = ctx.runtime.cycle_done
        with contextlib.suppress(asyncio.TimeoutError):
            async with done:
                await asyncio.wait_for(done.wait_for(lambda: not freshness(ctx, user_id).due),
                                       ctx.settings.refresh_timeout)
        state = freshness(ctx, user_id)
    waited = (loop.time() - started) * 1000
    return state.to_dict(policy, waited, timed_out=policy == "blocking" and bool(state.due))


async def publish(topic, event, sealing=None) -> None:
    """`event` on `topic`, sealed first when `sealing` seals (streams/shredding.py)."""
    if sealing is not None:
        try:
            event = await asyncio.wait_for(sealing.sealed(event), SEND_TIMEOUT)
        except (asyncio.TimeoutError, OSError, KafkaError) as exc:
            raise ApiError(503, "unavailable", f"the key topic did not take the episode's key: {exc!r}") from None
    await send(topic, event.user_id.encode(), event.encode())


async def send(topic, key: bytes, value: bytes) -> None:
    """Publish and wait for the broker's acknowledgement; 503 when it does not come."""
    try:
        sent = await asyncio.wait_for(topic.send(key=key, value=value), SEND_TIMEOUT)
        # Shielded: the 503 gives up waiting, not the send. Cancelling Faust's
        # future made its publish callback raise when the broker answered late.
        await asyncio.wait_for(asyncio.shield(sent), SEND_TIMEOUT)
    except (asyncio.TimeoutError, OSError) as exc:
        raise ApiError(503, "unavailable", f"the broker did not acknowledge the event: {exc!r}") from None
