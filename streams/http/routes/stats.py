"""A user's figures: what the view holds and where the accumulator stands."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from faust.web import Request, Response, View

from processors.accumulator import Accumulator
from processors.gate import Gates
from processors.guard import Spend, day_of
from streams.http.routes.common import answers_json, context, owned

CYCLE_KINDS = ("threshold", "manual", "revalidation")  # always shown, 0 until asked


def counts(view, user_id: str) -> dict[str, int]:
    return {"episodes": view.count(user_id, kind="episode", status="recorded"),
            "retracted": view.count(user_id, kind="episode", status="retracted"),
            "reflections": view.count(user_id, kind="reflection")}


def cycle_kinds(asked_by: dict[str, int], revalidations: int, challenges: int) -> dict[str, int]:
    """Cycles asked by kind; a forwarded retraction is a request but no cycle."""
    asked = {why: n for why, n in asked_by.items() if why != "invalidation"}
    # Revalidations and challenges were numbered here before they ran within a walk or a gate's judgement.
    counted = {why: asked.get(why, 0) for why in CYCLE_KINDS} | asked | \
        {"revalidation": asked.get("revalidation", 0) + revalidations}
    return counted | ({"challenge": asked.get("challenge", 0) + challenges} if challenges else {})


class Stats(View):
    @answers_json
    @owned
    async def get(self, request: Request, user_id: str) -> Response:
        ctx = context(self)
        held = await asyncio.to_thread(counts, ctx.view, user_id)
        acc = Accumulator.from_dict(ctx.tables.accumulators.get(user_id))
        walked = ctx.tables.provenance.get(user_id) or {}
        spent = Spend.from_dict(ctx.tables.spend.get(f"user:{user_id}"))
        return self.json({
            "user_id": user_id, **held,
            # Recorded episodes the accumulator has folded in, in log order (retracted or not): the view's
            # counts above may lead it, as the episodes pipeline projects a batch before it folds it.
            "folded": acc.episodes,
            "pending_importance": round(acc.pending, 6),
            "high_salience": acc.high_salience,
            "cycles": acc.cycles,  # threshold cycles, as v1 readers know it; every kind below
            # Revalidation cycles run within their retraction's walk (streams/worker/pipeline/requests.py).
            "cycles_by_kind": cycle_kinds(acc.asked_by, walked.get("revalidations", 0),
                                          Gates.from_dict(ctx.tables.gates.get(user_id)).challenges),
            # Every request asked (threshold, manual, a retraction's walk) and those done.
            "requests": acc.asked, "requests_done": ctx.tables.requests_done.get(user_id) or 0,
            "tokens_today": spent.today(day_of(datetime.now(timezone.utc))),
            "last_cycle": ctx.tables.last_cycle.get(user_id) or None,  # what it made, or why nothing
        })


PAGES = {"/v1/users/{user_id}/stats": Stats}
