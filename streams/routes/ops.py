"""For operators and their probes: readiness and Prometheus metrics."""

from __future__ import annotations

from faust.web import Request, Response, View

from streams import metrics
from streams.routes.common import answers_json, context


class Health(View):
    @answers_json
    async def get(self, request: Request) -> Response:
        # Ready once partitions are assigned and tables recovered from their
        # changelogs: before that, reads would answer from empty state.
        if self.app.rebalancing or not self.app.tables.recovery.completed.is_set():
            return self.json({"status": "starting"}, status=503)
        return self.json({"status": "ok"})


class Metrics(View):
    @answers_json
    async def get(self, request: Request) -> Response:
        settings = context(self).settings
        text = metrics.scrape(self.app, (settings.topic_episodes, settings.topic_requests, settings.topic_reflections))
        return self.bytes(text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})


PAGES = {"/healthz": Health, "/metrics": Metrics}
