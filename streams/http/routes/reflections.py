"""Explain a belief: it (any status) with its provenance tree down to the
episodes, and, where a challenge changed it, the chain: belief → challenger
episodes → successor (or the belief it superseded). And an erasure's proof."""

from __future__ import annotations

import asyncio
from typing import Any

from faust.web import Request, Response, View

from processors import provenance
from streams.http.routes.beliefs import belief
from streams.http.routes.common import ApiError, answers_json, context, owned, users_point


def explained(view, user_id: str, reflection_id: str, max_depth: int) -> dict[str, Any] | None:
    """The belief and its provenance tree, or None if the user has no such reflection."""
    def get(kind: str, rid: str):
        return users_point(view, kind, user_id, rid)

    found = get("reflection", reflection_id)
    if found is None:
        return None
    return {"belief": belief(found), "provenance": provenance.tree(get, "reflection", reflection_id, max_depth),
            **({"chain": chained} if (chained := provenance.chain(get, found)) else {})}


class Explain(View):
    @answers_json
    @owned(tables=False)
    async def get(self, request: Request, user_id: str, reflection_id: str) -> Response:
        ctx = context(self)
        found = await asyncio.to_thread(explained, ctx.view, user_id, reflection_id, ctx.settings.max_depth + 1)
        if found is None:
            raise ApiError(404, "not_found", f"user {user_id} has no reflection {reflection_id}", "reflection_id")
        return self.json({"user_id": user_id, **found})


class Erasure(View):
    @answers_json
    @owned(tables=False)
    async def get(self, request: Request, user_id: str, erasure_id: str) -> Response:
        """The proof of an erasure (ErasureCompleted): what it took the text of, ids only."""
        found = await asyncio.to_thread(users_point, context(self).view, "erasure", user_id, erasure_id)
        if found is None:
            raise ApiError(404, "not_found", f"user {user_id} has no completed erasure {erasure_id} (an erasure "
                                             "completes once its walk is done)", "erasure_id")
        return self.json({k: v for k, v in found.items() if k != "kind"})


PAGES = {"/v1/users/{user_id}/reflections/{reflection_id}": Explain,
         "/v1/users/{user_id}/erasures/{erasure_id}": Erasure}
