"""Episodes: record one, read one back, retract one."""

from __future__ import annotations

import asyncio

from faust.web import Request, Response, View

from processors.projector import point_id
from streams.producer import make_episode, make_retraction
from streams.routes.common import ApiError, answers_json, context, json_body, known_fields, owned, publish

EPISODE_FIELDS = {"text", "importance", "episode_id", "occurred_at", "source", "metadata"}
RETRACT_FIELDS = {"reason"}


class Episodes(View):
    @answers_json
    async def post(self, request: Request, user_id: str) -> Response:
        body = known_fields(await json_body(request), EPISODE_FIELDS)
        for name in ("text", "importance"):
            if name not in body:
                raise ApiError(422, "invalid", "is required", name)
        event = make_episode(user_id, body["text"], body["importance"], episode_id=body.get("episode_id"),
                             occurred_at=body.get("occurred_at"), source=body.get("source"),
                             metadata=body.get("metadata"))
        await publish(context(self).episodes_topic, event)
        return self.json({"episode_id": event.episode_id, "event_id": event.event_id}, status=202)


class Episode(View):
    @answers_json
    @owned(tables=False)
    async def get(self, request: Request, user_id: str, episode_id: str) -> Response:
        pid = point_id("episode", user_id, episode_id)
        payload = (await asyncio.to_thread(context(self).view.get, [pid])).get(pid)
        if payload is None or payload.get("user_id") != user_id:
            raise ApiError(404, "not_found", "no such episode for this user")
        return self.json(payload)


class Retract(View):
    @answers_json
    async def post(self, request: Request, user_id: str, episode_id: str) -> Response:
        body = known_fields(await json_body(request, required=False), RETRACT_FIELDS)
        event = make_retraction(user_id, episode_id, body.get("reason", "incorrect"))
        await publish(context(self).episodes_topic, event)
        return self.json({"episode_id": episode_id, "event_id": event.event_id}, status=202)


PAGES = {
    "/v1/users/{user_id}/episodes": Episodes,
    "/v1/users/{user_id}/episodes/{episode_id}": Episode,
    "/v1/users/{user_id}/episodes/{episode_id}/retract": Retract,
}
