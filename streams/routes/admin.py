"""The rebuild of the view from the log: start one, follow it."""

from __future__ import annotations

from faust.web import Request, Response, View

from streams.rebuild import Progress, rebuild
from streams.routes.common import ApiError, answers_json, context


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


PAGES = {"/v1/admin/rebuild": Rebuild}
