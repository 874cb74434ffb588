"""A manual reflection cycle, asked for by the user's agent."""

from __future__ import annotations

from faust.web import Request, Response, View

import re

from schemas import ReflectionRequested, new_id, now
from streams.http.routes.common import ApiError, answers_json, context, json_body, known_fields, publish

REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")


class Reflect(View):
    @answers_json
    async def post(self, request: Request, user_id: str) -> Response:
        # An optional `request_id` names the cycle: a client's retry of the
        # same request is the same cycle, which the accumulator forwards once.
        body = known_fields(await json_body(request, required=False), {"request_id"})
        named = body.get("request_id")
        if named is not None and not (isinstance(named, str) and REQUEST_ID.fullmatch(named)):
            raise ApiError(422, "invalid", "must be 1 to 40 of A-Z a-z 0-9 _ -", "request_id")
        # On the user's episodes partition, not the requests topic: the
        # accumulator forwards it in stream order with the window as of there,
        # so its window does not depend on how far the stream had been read.
        cycle_id = f"{user_id}:manual:{named or new_id()}"
        event = ReflectionRequested(event_id=f"request:{cycle_id}", user_id=user_id, cycle_id=cycle_id,
                                    why="manual", occurred_at=now())
        await publish(context(self).episodes_topic, event)
        return self.json({"cycle_id": cycle_id, "event_id": event.event_id}, status=202)


PAGES = {"/v1/users/{user_id}/reflect": Reflect}
