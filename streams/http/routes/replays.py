"""The replay lab's routes (admin): start a replay of the log into a side
view, follow it, list and drop replays, and compare a replay's beliefs with
the live view's or another replay's (streams/worker/replay.py)."""

from __future__ import annotations

import asyncio

from faust.web import Request, Response, View

from processors.replay import ReplayError, ReplaySpec
from streams.http.routes.common import ApiError, answers_json, context, json_body


def refused(error: ReplayError, status: int = 422) -> ApiError:
    return ApiError(status, "invalid" if status == 422 else "not_found" if status == 404 else "conflict", str(error))


class Replays(View):
    @answers_json
    async def get(self, request: Request) -> Response:
        """Every replay of this worker's data directory, with its size and age."""
        return self.json({"replays": await asyncio.to_thread(context(self).replays.listed)})

    @answers_json
    async def post(self, request: Request) -> Response:
        """Start a replay (202); `"estimate_only": true` plans it and starts nothing (200)."""
        body = await json_body(request)
        only = body.pop("estimate_only", False)
        if not isinstance(only, bool):
            raise ApiError(422, "invalid", "true or false", "estimate_only")
        replays = context(self).replays
        try:
            spec = ReplaySpec.from_dict(body)
        except (ReplayError, TypeError) as exc:
            raise ApiError(422, "invalid", str(exc)) from None
        try:
            prompts = replays.prompts(spec)
        except ReplayError as exc:  # a prompt set this worker does not have
            raise refused(exc, 404) from None
        if only:
            ends, planned = await replays.plan(spec)
            return self.json({"spec": spec.to_dict(), "prompts": prompts, "estimate": planned.to_dict(),
                              "estimated_cost_usd": replays.cost(spec, planned.tokens),
                              "episodes_logged": sum(ends.values())})
        try:
            started = await replays.start(spec)
        except ReplayError as exc:
            raise refused(exc, 409) from None
        return self.json(started, status=202)


class Replay(View):
    @answers_json
    async def get(self, request: Request, name: str) -> Response:
        try:
            return self.json(await asyncio.to_thread(context(self).replays.summary, name))
        except ReplayError as exc:
            raise refused(exc, 404) from None

    @answers_json
    async def delete(self, request: Request, name: str) -> Response:
        """Drop a replay: its side worker, topics and view."""
        try:
            await context(self).replays.drop(name)
        except ReplayError as exc:
            raise refused(exc, 404) from None
        return self.json({"dropped": name})


class ReplayDiff(View):
    @answers_json
    async def get(self, request: Request, name: str) -> Response:
        """The replay's beliefs against `against` (live, or another replay's), for `user`s or all it replayed."""
        replays, query = context(self).replays, request.query
        users = query.getall("user", []) or None
        try:
            found = await asyncio.to_thread(replays.diff, name, query.get("against", "live"), users)
        except ReplayError as exc:
            raise refused(exc, 404 if "no replay" in str(exc) else 409) from None
        return self.json(found.to_dict())


class ReplayPromotion(View):
    @answers_json
    async def post(self, request: Request, name: str) -> Response:
        """Make a done replay's beliefs the live ones, through the live log."""
        try:
            return self.json(await context(self).replays.promote(name))
        except ReplayError as exc:
            raise refused(exc, 404 if "no replay" in str(exc) else 409) from None
        except TimeoutError as exc:  # the side's log not read to its end: the broker is away or slow
            raise ApiError(503, "unavailable", str(exc), retry_after=5) from None


PAGES = {"/v1/admin/replays": Replays, "/v1/admin/replays/{name}": Replay,
         "/v1/admin/replays/{name}/diff": ReplayDiff, "/v1/admin/replays/{name}/promote": ReplayPromotion}
