"""Episodes: record one, read one back, retract one; forget a user.

A record names its episode: the body's `episode_id`, else the one its
`Idempotency-Key` header names (streams/producer.py, `episode_id_for_key`),
else a new random one. Sent again with the same id or key, it is the same
episode. A body id and a key that name two episodes are refused (409): either
would be a guess, and the wrong guess counts a retried write twice or loses
the id the caller keeps."""

from __future__ import annotations

import asyncio

from faust.web import Request, Response, View

from processors.projector import served
from streams.http.routes.common import (ApiError, answers_json, context, json_body, known_fields, owned, publish,
                                        users_point)
from streams.producer import episode_id_for_key, key_problem, make_episode, make_forget, make_retraction

EPISODE_FIELDS = {"text", "importance", "episode_id", "occurred_at", "source", "metadata"}
RETRACT_FIELDS = {"reason"}
IDEMPOTENCY_KEY = "Idempotency-Key"


def _keyed_id(request: Request, user_id: str) -> str | None:
    """The episode id the request's Idempotency-Key names, None without one; 422 naming the header if bad."""
    key = request.headers.get(IDEMPOTENCY_KEY)
    if key is None:
        return None
    problem = key_problem(key)
    if problem:
        raise ApiError(422, "invalid", problem, IDEMPOTENCY_KEY)
    return episode_id_for_key(user_id, key)


class Episodes(View):
    @answers_json
    async def post(self, request: Request, user_id: str) -> Response:
        body = known_fields(await json_body(request), EPISODE_FIELDS)
        for name in ("text", "importance"):
            if name not in body:
                raise ApiError(422, "invalid", "is required", name)
        keyed, given = _keyed_id(request, user_id), body.get("episode_id")
        event = make_episode(user_id, body["text"], body["importance"], episode_id=keyed if given is None else given,
                             occurred_at=body.get("occurred_at"), source=body.get("source"),
                             metadata=body.get("metadata"))
        if keyed is not None and event.episode_id != keyed:  # a valid body id, another episode than the key's
            raise ApiError(409, "conflict", f"episode_id names another episode than the {IDEMPOTENCY_KEY} "
                                            f"header ({keyed}): send one of them, or both naming the same one",
                           "episode_id")
        ctx = context(self)
        await publish(ctx.episodes_topic, event, ctx.sealing)
        return self.json({"episode_id": event.episode_id, "event_id": event.event_id}, status=202)


class Episode(View):
    @answers_json
    @owned(tables=False)
    async def get(self, request: Request, user_id: str, episode_id: str) -> Response:
        payload = await asyncio.to_thread(users_point, context(self).view, "episode", user_id, episode_id)
        if payload is None:
            raise ApiError(404, "not_found", "no such episode for this user")
        return self.json(served(payload))


class Retract(View):
    @answers_json
    async def post(self, request: Request, user_id: str, episode_id: str) -> Response:
        body = known_fields(await json_body(request, required=False), RETRACT_FIELDS)
        event = make_retraction(user_id, episode_id, body.get("reason", "incorrect"))
        await publish(context(self).episodes_topic, event)
        return self.json({"episode_id": episode_id, "event_id": event.event_id}, status=202)


class User(View):
    @answers_json
    async def delete(self, request: Request, user_id: str) -> Response:
        """Everything of the user forgotten (a UserForgotten on the log): 202
        once the log has it; its proof, ErasureCompleted, once carried out."""
        event = make_forget(user_id)
        await publish(context(self).episodes_topic, event)
        return self.json({"user_id": user_id, "event_id": event.event_id,
                          "proof": f"/v1/users/{user_id}/erasures/{event.event_id}"}, status=202)


PAGES = {
    "/v1/users/{user_id}": User,
    "/v1/users/{user_id}/episodes": Episodes,
    "/v1/users/{user_id}/episodes/{episode_id}": Episode,
    "/v1/users/{user_id}/episodes/{episode_id}/retract": Retract,
}
