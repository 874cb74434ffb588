"""For operators and their probes: readiness and Prometheus metrics."""

from __future__ import annotations

from faust.web import Request, Response, View

from streams import auth
from streams.http.routes.common import answers_json, context
from streams.worker import metrics


class Health(View):
    """Readiness: 503 while partitions are assigned and tables recover from
    their changelogs (reads would answer from empty state), while a
    partition just gained is caught up into the embedded view, while
    recall's router is trained (streams/worker/app.py), and while a
    pipeline stage waits on a dependency (degraded: its partitions do not
    advance). With auth configured, only an admin credential learns which
    partitions or stages, since when and why (a stage's error can name hosts
    and topics); anyone else, the status alone."""

    @answers_json
    async def get(self, request: Request) -> Response:
        status, details = self.readiness()
        if details and auth.sees_details(request.headers.get("Authorization"), self.app.keys):
            return self.json({"status": status, **details}, status=503)
        return self.json({"status": status}, status=200 if status == "ok" else 503)

    def readiness(self) -> tuple[str, dict]:
        runtime = context(self).runtime
        recovering = self.app.rebalancing or not self.app.tables.recovery.completed.is_set()
        if recovering:  # the ownership and health state are not the partitions' yet
            return readiness(True, [], runtime.router_ready, {})
        return readiness(False, runtime.ownership.catching_up(), runtime.router_ready, runtime.health.degraded())


def readiness(recovering: bool, catching_up: list[int], router_ready: bool, stalled: dict) -> tuple[str, dict]:
    """(status, details) of a worker in this state, first cause first."""
    if recovering:
        return "starting", {}
    if catching_up:
        return "starting", {"catching_up": catching_up}
    if not router_ready:
        return "starting", {"router": "training"}
    if stalled:
        return "degraded", {"stalled": stalled}
    return "ok", {}


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
