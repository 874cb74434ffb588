"""For operators and their probes: readiness and Prometheus metrics."""

from __future__ import annotations

from faust.web import Request, Response, View

from streams import metrics
from streams.routes.common import answers_json, context


class Health(View):
    """Readiness: 503 while partitions are assigned and tables recover from
    their changelogs (reads would answer from empty state), while a
    partition just gained is caught up into the embedded view, and while a
    pipeline stage waits on a dependency (degraded: its partitions do not
    advance, and it says which stage, since when and why)."""

    @answers_json
    async def get(self, request: Request) -> Response:
        if self.app.rebalancing or not self.app.tables.recovery.completed.is_set():
            return self.json({"status": "starting"}, status=503)
        catching_up = context(self).runtime.ownership.catching_up()
        if catching_up:
            return self.json({"status": "starting", "catching_up": catching_up}, status=503)
        stalled = context(self).runtime.health.degraded()
        if stalled:
            return self.json({"status": "degraded", "stalled": stalled}, status=503)
        return self.json({"status": "ok"})


class Live(View):
    """Liveness: the worker's loop answers. A degraded worker is alive: a
    restart would not bring its view back, only cost a rebalance."""

    @answers_json
    async def get(self, request: Request) -> Response:
        return self.json({"status": "alive"})


class Metrics(View):
    @answers_json
    async def get(self, request: Request) -> Response:
        runtime = context(self).runtime
        settings = runtime.settings
        text = metrics.scrape(self.app, runtime.commits.committed if runtime.commits else {},
                              (settings.topic_episodes, settings.topic_requests, settings.topic_reflections))
        return self.bytes(text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})


PAGES = {"/healthz": Health, "/livez": Live, "/metrics": Metrics}
