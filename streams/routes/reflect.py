"""A manual reflection cycle, asked for by the user's agent."""

from __future__ import annotations

from faust.web import Request, Response, View

from schemas import ReflectionRequested, new_id, now
from streams.routes.common import answers_json, context, publish


class Reflect(View):
    @answers_json
    async def post(self, request: Request, user_id: str) -> Response:
        # On the user's episodes partition, not the requests topic: the
        # accumulator forwards it in stream order with the window as of there,
        # so its window does not depend on how far the stream had been read.
        cycle_id = f"{user_id}:manual:{new_id()}"
        event = ReflectionRequested(event_id=f"request:{cycle_id}", user_id=user_id, cycle_id=cycle_id,
                                    why="manual", occurred_at=now())
        await publish(context(self).episodes_topic, event)
        return self.json({"cycle_id": cycle_id, "event_id": event.event_id}, status=202)


PAGES = {"/v1/users/{user_id}/reflect": Reflect}
