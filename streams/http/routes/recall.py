"""Recall: a question answered from the user's episodes or beliefs, whichever
its type asks for."""

from __future__ import annotations

import asyncio

from faust.web import Request, Response, View

from processors.retrieval import recall
from streams.http.routes.common import ApiError, answers_json, choice_query, context, int_query, owned, refreshed


class Recall(View):
    @answers_json
    @owned
    async def get(self, request: Request, user_id: str) -> Response:
        ctx = context(self)
        query = (request.query.get("q") or "").strip()
        if not query:
            raise ApiError(422, "invalid", "a question is required", "q")
        mode = choice_query(request, "mode", ("auto", "instance", "pattern"), "auto")
        k = int_query(request, "k", 10, 1, 100)
        fresh = await refreshed(ctx, request, user_id)
        found = await asyncio.to_thread(recall, ctx.view, ctx.runtime.embedder, user_id, query[:2000], mode, k,
                                        min_belief_score=ctx.settings.recall_min_score)
        return self.json({"user_id": user_id, **found, "freshness": fresh})


PAGES = {"/v1/users/{user_id}/recall": Recall}
