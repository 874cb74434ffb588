"""Operators' routes: the rebuild of the view from the log (start one, follow
it), and the revocation of a token before it expires."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime, timezone

from faust.web import Request, Response, View

from schemas import parse_time
from streams.http.routes.common import ApiError, answers_json, context, json_body, known_fields, send
from streams.worker import revocations
from streams.worker.rebuild import Progress, rebuild


class Rebuild(View):
    @answers_json
    async def post(self, request: Request) -> Response:
        """Start a rebuild of the view from the log (one at a time)."""
        ctx = context(self)
        running = ctx.rebuilding
        if running.busy():
            raise ApiError(409, "conflict", f"a {running.progress.kind} is already running")
        running.start(Progress(), lambda progress: rebuild(ctx.runtime, ctx.runtime.projection_lock, progress))
        return self.json({"state": "running", "old_view": ctx.view.name}, status=202)

    @answers_json
    async def get(self, request: Request) -> Response:
        ctx = context(self)
        progress = ctx.rebuilding.progress
        return self.json(progress.to_dict() if progress else {"state": "idle", "view": ctx.view.name})


REVOKE_FIELDS = {"jti", "expires_at"}
REVOKE_WAIT = 10.0  # seconds the route waits to read its own revocation back
FOREVER = 10 * 365 * 86400  # without REFLECT_AUTH_MAX_TTL a token may live any time: keep its revocation long


def expiry_of(body: dict, max_ttl: int, now: float) -> float:
    """When the revoked token expires: as given, else the longest any token accepted now lives."""
    if "expires_at" not in body:
        return now + (max_ttl or FOREVER)
    raw = body["expires_at"]
    try:
        at = parse_time(raw) if isinstance(raw, str) else None
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise ApiError(422, "invalid", "must be an RFC 3339 time with a zone, e.g. 2026-06-01T09:00:00Z",
                       "expires_at")
    return at.timestamp()


class Revocation(View):
    @answers_json
    async def post(self, request: Request) -> Response:
        """Revoke a token by its `jti`: refused by every worker once each has read it."""
        ctx = context(self)
        body = known_fields(await json_body(request), REVOKE_FIELDS)
        jti = body.get("jti")
        if not isinstance(jti, str) or not 0 < len(jti) <= 128:
            raise ApiError(422, "invalid", "the token id to revoke: a string of 1 to 128 characters", "jti")
        expires = expiry_of(body, ctx.settings.auth_max_ttl, time.time())
        topic = self.app.topic(ctx.settings.topic_revocations, key_serializer="raw", value_serializer="raw")
        await send(topic, jti.encode(), revocations.record(jti, expires))  # 503 unacknowledged: revoke again
        watch = self.app.revocation_watch
        if expires > time.time():  # an expired token's revocation is ignored: nothing to wait for
            with contextlib.suppress(asyncio.TimeoutError):
                await watch.read_back(jti, REVOKE_WAIT)
        shown = datetime.fromtimestamp(expires, timezone.utc).isoformat().replace("+00:00", "Z")
        return self.json({"jti": jti, "expires_at": shown, "in_force_here": jti in watch.revoked}, status=202)


PAGES = {"/v1/admin/rebuild": Rebuild, "/v1/admin/revocations": Revocation}
