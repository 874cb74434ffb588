"""What every route shares: JSON errors, the guard in front of the routes,
query and body parsing, the context handlers reach the worker through, and
the write path (publish and wait for the broker's acknowledgement)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from faust.web import Request, Response, View

from processors.accumulator import Accumulator
from processors.freshness import POLICIES, Freshness
from schemas import ContractError, parse_time
from streams import auth
from streams.rebuild import Progress
from streams.settings import SettingsError

log = logging.getLogger("reflect.api")
SEND_TIMEOUT = 15.0  # seconds a write waits for the broker's acknowledgement
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def body(self) -> dict[str, Any]:
        error = {"code": self.code, "message": self.message}
        return {"error": {**error, "field": self.field} if self.field else error}


@dataclass
class Rebuilding:
    """The one rebuild this worker may run: its progress and its task."""
    progress: Progress | None = None
    task: asyncio.Future | None = None


@dataclass
class Context:
    """All a handler reaches of the worker; `app.reflect` on its Faust app."""
    runtime: Any
    rebuilding: Rebuilding = field(default_factory=Rebuilding)

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
    def settings(self):
        return self.runtime.settings


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
        return self.json(error.body(), status=error.status)
    return wrapped


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


def guard(keys: auth.Keys, limit: int):
    """aiohttp middleware in front of every route, Faust's own included: the
    credential and what it grants, the declared body size, and JSON for the
    router's errors."""
    @web.middleware
    async def middleware(request: web.Request, handler):
        refused = admitted(request, keys)
        if refused is not None:
            return refused
        if request.content_length is not None and request.content_length > limit:
            return _error_response(too_large(limit))
        try:
            return await handler(request)
        except web.HTTPException as exc:  # no route, wrong method: JSON like every other error
            if exc.status < 400:
                raise
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return _error_response(ApiError(exc.status, _HTTP_CODES.get(exc.status, "invalid"), exc.reason), allow)
    return middleware


def web_options(settings) -> dict[str, Any]:
    """faust.App(web_application_options=…): aiohttp's own body limit (what a
    read of a chunked body stops at) and the guard. Every worker's web server
    is built here, so this is where one exposed without credentials is refused."""
    problem = auth.exposure_problem(settings)
    if problem:
        raise SettingsError(problem)
    try:
        keys = auth.keys_of(settings)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"invalid setting auth_public_key_file: {exc}") from None
    return {"client_max_size": settings.max_request_bytes,
            "middlewares": [guard(keys, settings.max_request_bytes)]}


async def json_body(request: Request, required: bool = True) -> dict[str, Any]:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:  # a chunked body ran over client_max_size while read
        raise too_large(request.client_max_size) from None
    if not raw.strip():
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


async def publish(topic, event) -> None:
    try:
        sent = await asyncio.wait_for(topic.send(key=event.user_id.encode(), value=event.encode()), SEND_TIMEOUT)
        # Shielded: the 503 gives up waiting, not the send. Cancelling Faust's
        # future made its publish callback raise when the broker answered late.
        await asyncio.wait_for(asyncio.shield(sent), SEND_TIMEOUT)
    except (asyncio.TimeoutError, OSError) as exc:
        raise ApiError(503, "unavailable", f"the broker did not acknowledge the event: {exc!r}") from None
