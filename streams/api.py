"""The HTTP API of `reflect up` and `reflect worker` (DESIGN.md, "HTTP API").

Writes go through Kafka: they answer 202 once the broker has acknowledged the
event, and become visible when the projector has applied it. Errors are
`{"error": {"code", "message", "field"?}}` with a 4xx status; an unexpected
failure is logged and answered as a JSON 500, never with a trace.

With `api_token` set every route but /healthz wants `Authorization: Bearer
<token>` (401 otherwise); /healthz stays open because probes carry no
credentials and it tells nothing but readiness. /metrics is guarded too: it
names topics and partitions, and Prometheus sends a bearer token
(`authorization: {credentials_file: …}` in its scrape config). A body over
`max_request_bytes` is refused with 413 before the handler reads it when
Content-Length says so, and while it is read otherwise (chunked).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import orjson
from aiohttp import web
from faust.web import Request, Response, View

from processors import provenance
from processors.accumulator import Accumulator
from processors.freshness import POLICIES, Freshness
from processors.guard import Spend, day_of
from processors.projector import point_id
from processors.retrieval import pinned_score, prompt_block, recall
from schemas import ContractError, ReflectionRequested, new_id, now, parse_time
from streams import metrics
from streams.producer import make_episode, make_retraction

log = logging.getLogger("reflect.api")
EPISODE_FIELDS = {"text", "importance", "episode_id", "occurred_at", "source", "metadata"}
RETRACT_FIELDS = {"reason"}
OPEN_PATHS = frozenset({"/healthz"})  # probes carry no token
SEND_TIMEOUT = 15.0  # seconds a write waits for the broker's acknowledgement


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def body(self) -> dict[str, Any]:
        error = {"code": self.code, "message": self.message}
        return {"error": {**error, "field": self.field} if self.field else error}


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


def bearer_ok(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries the token; constant-time, so the
    answer's timing tells nothing about how much of a guess was right."""
    scheme, _, given = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


def guard(token: str | None, limit: int):
    """aiohttp middleware in front of every route, Faust's own included: the
    bearer token, the declared body size, and JSON for the router's errors."""
    @web.middleware
    async def middleware(request: web.Request, handler):
        if token and request.path not in OPEN_PATHS:
            header = request.headers.get("Authorization")
            if not bearer_ok(header, str(token)):
                challenge = 'Bearer realm="reflect"' + (', error="invalid_token"' if header else "")
                return _error_response(ApiError(401, "unauthorized", "a valid bearer token is required "
                                                "(Authorization: Bearer <REFLECT_API_TOKEN>)"),
                                       {"WWW-Authenticate": challenge})
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
    read of a chunked body stops at) and the guard."""
    return {"client_max_size": settings.max_request_bytes,
            "middlewares": [guard(settings.api_token, settings.max_request_bytes)]}


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


def _int_query(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(422, "invalid", f"must be an integer, got {raw!r}", name) from None
    if not low <= value <= high:
        raise ApiError(422, "invalid", f"must be within {low}..{high}", name)
    return value


BELIEF_KEYS = ("reflection_id", "text", "evidence_ids", "depth", "confidence", "importance", "status",
               "valid_from", "invalid_at", "created_at", "expired_at", "reinforced_at", "weakened_at",
               "lost_evidence_ids", "question", "cycle_id", "reasoner", "prompt_version")


def belief(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: payload[k] for k in BELIEF_KEYS if k in payload}


def live_beliefs(view, user_id: str, limit: int, as_of: str | None = None) -> list[dict[str, Any]]:
    """The user's live beliefs, best for a system prompt first (`pinned_score`);
    with `as_of` (transaction time), those the system held then, as it held them."""
    if as_of is None:
        found = [belief(p) for _, p in view.scroll(user_id, kind="reflection", status="live")
                 if p.get("user_id") == user_id]
    else:
        found = [belief(held) for _, p in view.scroll(user_id, kind="reflection")
                 if p.get("user_id") == user_id for held in [provenance.as_of(p, as_of)] if held]
    now = parse_time(as_of) if as_of else datetime.now(timezone.utc)
    # Sorted by the unrounded score: rounded, two close scores would tie at one
    # moment and not the next, and the order of a page would flicker.
    scored = sorted(((pinned_score(b, now), b.get("created_at", ""), b) for b in found),
                    key=lambda t: t[:2], reverse=True)
    return [{**b, "pinned_score": round(score, 6)} for score, _, b in scored[:limit]]


@dataclass(frozen=True)
class Tables:
    """The worker's tables the API reads (this worker's partitions)."""
    accumulators: Any
    spend: Any
    cycles_done: Any


def _choice_query(request: Request, name: str, options: tuple[str, ...], default: str) -> str:
    value = request.query.get(name, default)
    if value not in options:
        raise ApiError(422, "invalid", f"must be one of {', '.join(options)}, got {value!r}", name)
    return value


def _time_query(request: Request, name: str) -> str | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        parsed = parse_time(raw)
    except ValueError:
        raise ApiError(422, "invalid", f"must be an RFC 3339 time, got {raw!r}", name) from None
    if parsed.tzinfo is None:
        raise ApiError(422, "invalid", "must carry a zone, e.g. 2026-06-01T09:00:00Z", name)
    return raw


def install(runtime, tables: Tables, episodes_topic, requests_topic) -> None:
    app, view, settings = runtime.app, runtime.view, runtime.settings
    accumulators, spend = tables.accumulators, tables.spend

    def freshness(user_id: str) -> Freshness:
        asked = Accumulator.from_dict(accumulators.get(user_id)).cycles
        return Freshness(asked, tables.cycles_done.get(user_id) or 0, user_id in runtime.running)

    async def refreshed(request: Request, user_id: str) -> dict[str, Any]:
        """Apply the read's refresh policy; what the answer says of its freshness."""
        policy = _choice_query(request, "refresh", POLICIES, settings.refresh)
        loop = asyncio.get_running_loop()
        started = loop.time()
        state = freshness(user_id)
        while policy == "blocking" and state.due and loop.time() - started < settings.refresh_timeout:
            await asyncio.sleep(0.05)  # the reflector marks a cycle done once its events are in the view
            state = freshness(user_id)
        waited = (loop.time() - started) * 1000
        return state.to_dict(policy, waited, timed_out=policy == "blocking" and bool(state.due))

    async def publish(topic, event) -> None:
        try:
            sent = await asyncio.wait_for(topic.send(key=event.user_id.encode(), value=event.encode()),
                                          SEND_TIMEOUT)
            # Shielded: the 503 gives up waiting, not the send. Cancelling Faust's
            # future made its publish callback raise when the broker answered late.
            await asyncio.wait_for(asyncio.shield(sent), SEND_TIMEOUT)
        except (asyncio.TimeoutError, OSError) as exc:
            raise ApiError(503, "unavailable", f"the broker did not acknowledge the event: {exc!r}") from None

    @app.page("/metrics")
    class Metrics(View):
        @answers_json
        async def get(self, request: Request) -> Response:
            text = metrics.scrape(app, (settings.topic_episodes, settings.topic_requests, settings.topic_reflections))
            return self.bytes(text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})

    @app.page("/healthz")
    class Health(View):
        @answers_json
        async def get(self, request: Request) -> Response:
            # Ready once partitions are assigned and tables recovered from their
            # changelogs: before that, reads would answer from empty state.
            if app.rebalancing or not app.tables.recovery.completed.is_set():
                return self.json({"status": "starting"}, status=503)
            return self.json({"status": "ok"})

    @app.page("/v1/users/{user_id}/episodes")
    class Episodes(View):
        @answers_json
        async def post(self, request: Request, user_id: str) -> Response:
            body = await json_body(request)
            unknown = sorted(set(body) - EPISODE_FIELDS)
            if unknown:
                raise ApiError(422, "invalid", f"unknown field (expected {sorted(EPISODE_FIELDS)})", unknown[0])
            for name in ("text", "importance"):
                if name not in body:
                    raise ApiError(422, "invalid", "is required", name)
            event = make_episode(user_id, body["text"], body["importance"], episode_id=body.get("episode_id"),
                                 occurred_at=body.get("occurred_at"), source=body.get("source"),
                                 metadata=body.get("metadata"))
            await publish(episodes_topic, event)
            return self.json({"episode_id": event.episode_id, "event_id": event.event_id}, status=202)

    @app.page("/v1/users/{user_id}/episodes/{episode_id}")
    class Episode(View):
        @answers_json
        async def get(self, request: Request, user_id: str, episode_id: str) -> Response:
            pid = point_id("episode", user_id, episode_id)
            payload = view.get([pid]).get(pid)
            if payload is None or payload.get("user_id") != user_id:
                raise ApiError(404, "not_found", "no such episode for this user")
            return self.json(payload)

    @app.page("/v1/users/{user_id}/episodes/{episode_id}/retract")
    class Retract(View):
        @answers_json
        async def post(self, request: Request, user_id: str, episode_id: str) -> Response:
            body = await json_body(request, required=False)
            unknown = sorted(set(body) - RETRACT_FIELDS)
            if unknown:
                raise ApiError(422, "invalid", f"unknown field (expected {sorted(RETRACT_FIELDS)})", unknown[0])
            event = make_retraction(user_id, episode_id, body.get("reason", "incorrect"))
            await publish(episodes_topic, event)
            return self.json({"episode_id": episode_id, "event_id": event.event_id}, status=202)

    @app.page("/v1/users/{user_id}/reflect")
    class Reflect(View):
        @answers_json
        async def post(self, request: Request, user_id: str) -> Response:
            # A manual cycle leaves the threshold accumulator alone: its cycle
            # numbering must stay a function of the episode stream for replays.
            cycle_id = f"{user_id}:manual:{new_id()}"
            event = ReflectionRequested(event_id=f"request:{cycle_id}", user_id=user_id, cycle_id=cycle_id,
                                        why="manual", occurred_at=now())
            await publish(requests_topic, event)
            return self.json({"cycle_id": cycle_id, "event_id": event.event_id}, status=202)

    @app.page("/v1/users/{user_id}/beliefs")
    class Beliefs(View):
        @answers_json
        async def get(self, request: Request, user_id: str) -> Response:
            limit, at = _int_query(request, "limit", 50, 1, 1000), _time_query(request, "as_of")
            form = _choice_query(request, "format", ("json", "prompt"), "json")
            budget = _int_query(request, "budget", 500, 16, 100_000)
            fresh = await refreshed(request, user_id) if at is None else None
            answer = {"user_id": user_id, "beliefs": live_beliefs(view, user_id, limit, as_of=at)}
            if form == "prompt":
                text, shown = prompt_block(answer["beliefs"], budget)
                answer = {"user_id": user_id, "prompt": text, "beliefs": shown, "budget_tokens": budget}
            return self.json({**answer, **({"as_of": at} if at else {"freshness": fresh})})

    @app.page("/v1/users/{user_id}/recall")
    class Recall(View):
        @answers_json
        async def get(self, request: Request, user_id: str) -> Response:
            query = (request.query.get("q") or "").strip()
            if not query:
                raise ApiError(422, "invalid", "a question is required", "q")
            mode = _choice_query(request, "mode", ("auto", "instance", "pattern"), "auto")
            k = _int_query(request, "k", 10, 1, 100)
            fresh = await refreshed(request, user_id)
            found = await asyncio.to_thread(recall, view, runtime.embedder, user_id, query[:2000], mode, k,
                                            min_belief_score=settings.recall_min_score)
            return self.json({"user_id": user_id, **found, "freshness": fresh})

    @app.page("/v1/users/{user_id}/reflections/{reflection_id}")
    class Explain(View):
        @answers_json
        async def get(self, request: Request, user_id: str, reflection_id: str) -> Response:
            """A belief (any status) with its provenance tree down to the episodes."""
            def get(kind: str, rid: str):
                pid = point_id(kind, user_id, rid)
                found = view.get([pid]).get(pid)
                return found if found and found.get("user_id") == user_id else None

            found = get("reflection", reflection_id)
            if found is None:
                raise ApiError(404, "not_found", f"user {user_id} has no reflection {reflection_id}", "reflection_id")
            return self.json({"user_id": user_id, "belief": belief(found),
                              "provenance": provenance.tree(get, "reflection", reflection_id,
                                                            runtime.settings.max_depth + 1)})

    @app.page("/v1/users/{user_id}/stats")
    class Stats(View):
        @answers_json
        async def get(self, request: Request, user_id: str) -> Response:
            acc = Accumulator.from_dict(accumulators.get(user_id))
            return self.json({
                "user_id": user_id,
                "episodes": view.count(user_id, kind="episode", status="recorded"),
                "retracted": view.count(user_id, kind="episode", status="retracted"),
                "reflections": view.count(user_id, kind="reflection"),
                "pending_importance": round(acc.pending, 6),
                "high_salience": acc.high_salience,
                "cycles": acc.cycles,
                "tokens_today": Spend.from_dict(spend.get(f"user:{user_id}")).today(day_of(datetime.now(timezone.utc))),
            })

    rebuilding: dict[str, Any] = {"progress": None, "task": None}

    @app.page("/v1/admin/rebuild")
    class Rebuild(View):
        @answers_json
        async def post(self, request: Request) -> Response:
            """Start a rebuild of the view from the log (one at a time)."""
            from streams.rebuild import Progress, rebuild

            task = rebuilding["task"]
            if task is not None and not task.done():
                raise ApiError(409, "conflict", "a rebuild is already running")
            progress = rebuilding["progress"] = Progress()
            rebuilding["task"] = asyncio.ensure_future(rebuild(runtime, runtime.projection_lock, progress))
            return self.json({"state": "running", "old_view": runtime.view.name}, status=202)

        @answers_json
        async def get(self, request: Request) -> Response:
            progress = rebuilding["progress"]
            return self.json(progress.to_dict() if progress else {"state": "idle", "view": runtime.view.name})

    @app.page("/v1/reasoner")
    class ReasonerState(View):
        @answers_json
        async def get(self, request: Request) -> Response:
            """This worker's reasoner: its settings, breaker and figures since start."""
            tally, breaker, budget = runtime.tally, runtime.breaker, runtime.budget
            return self.json({
                "reasoner": runtime.reasoner.name, "prompt_version": runtime.reasoner.prompt_version,
                "model": getattr(runtime.reasoner, "model", None),
                "batched": runtime.reasoner.batched,
                "breaker": {"state": breaker.state, "consecutive_failures": breaker.consecutive},
                "budget": {"user_daily_tokens": budget.user_tokens,
                           "partition_daily_tokens": budget.partition_tokens},
                "cycles": tally.cycles, "calls": tally.calls, "tokens": tally.tokens,
                "cost_usd": round(tally.cost_usd, 6), "last_error": tally.last_error,
            })
