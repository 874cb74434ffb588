"""The HTTP API of `reflect up` and `reflect worker` (deploy/README.md, "HTTP API"),
one module per resource; each names its routes in `PAGES`.

Writes go through Kafka: they answer 202 once the broker has acknowledged the
event, and become visible when the projector has applied it. Reads of the
view run off the event loop (`asyncio.to_thread`): a slow view must not stall
heartbeats and agents. Errors are `{"error": {"code", "message", "field"?}}`
with a 4xx status; an unexpected failure is logged and answered as a JSON
500, never with a trace.

With a credential configured (the shared `api_token`, an `auth_secret` or an
`auth_public_key_file`) every route but /healthz and /livez wants
`Authorization: Bearer <token>`: 401 without a valid one, 403 when it does not
grant the route's scope or user (streams/auth.py has the route → scope map).
The probes stay open because they carry no credentials and tell nothing but
readiness. /metrics needs `admin`: it names topics and partitions. A body over
`max_request_bytes` is refused with 413 before the handler reads it when
Content-Length says so, and while it is read otherwise (chunked).
"""

from __future__ import annotations

from streams.http.routes import admin, beliefs, episodes, ops, reasoner, recall, reflect, reflections, replays, stats
from streams.http.routes.common import Context

RESOURCES = (ops, episodes, reflect, beliefs, recall, reflections, stats, admin, replays, reasoner)


def install(runtime) -> None:
    """Register every route on the runtime's Faust app; handlers find the
    worker through `app.reflect`."""
    app = runtime.app
    app.reflect = Context(runtime)
    for resource in RESOURCES:
        for path, page in resource.PAGES.items():
            app.page(path)(page)
