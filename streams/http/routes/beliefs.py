"""A user's live beliefs, as JSON or as a system-prompt block; or those held
at a past time (`as_of`). The block presents them as observations about the
user, never as instructions (processors/retrieval.prompt_block): a belief's
text is data written by a model from episode text."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

from faust.web import Request, Response, View

from processors import provenance
from processors.freshness import POLICIES
from processors.retrieval import pinned_score, prompt_block
from schemas import parse_time
from streams.http.routes.common import (answers_json, choice_query, context, int_query, list_query, owned, refreshed,
                                        time_query)

BELIEF_KEYS = ("reflection_id", "text", "evidence_ids", "depth", "confidence", "importance", "status",
               "valid_from", "invalid_at", "created_at", "expired_at", "reinforced_at", "weakened_at",
               "lost_evidence_ids", "question", "cycle_id", "reasoner", "prompt_version", "supersedes",
               *provenance.CHANGE_KEYS)
INCLUDABLE = ("stale", "superseded")  # statuses served only when asked for (?include=stale,superseded)


def belief(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: payload[k] for k in BELIEF_KEYS if k in payload}


def live_beliefs(view, user_id: str, limit: int, as_of: str | None = None,
                 include: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The user's live beliefs, best for a system prompt first (`pinned_score`);
    with `as_of` (transaction time), those the system held then, as it held them;
    with `include`, stale or superseded ones too (each with its status)."""
    statuses = ("live", *include)
    if as_of is None:
        found = [belief(p) for status in statuses for _, p in view.scroll(user_id, kind="reflection", status=status)
                 if p.get("user_id") == user_id]
    else:
        found = [belief(held) for _, p in view.scroll(user_id, kind="reflection")
                 if p.get("user_id") == user_id for held in [provenance.as_of(p, as_of)]
                 if held and held["status"] in statuses]
    now = parse_time(as_of) if as_of else datetime.now(timezone.utc)
    # Sorted by the unrounded score: rounded, two close scores would tie at one
    # moment and not the next, and the order of a page would flicker.
    scored = sorted(((pinned_score(b, now), b.get("created_at", ""), b) for b in found),
                    key=lambda t: t[:2], reverse=True)
    return [{**b, "pinned_score": round(score, 6)} for score, _, b in scored[:limit]]


class Beliefs(View):
    @answers_json
    @owned
    async def get(self, request: Request, user_id: str) -> Response:
        ctx = context(self)
        limit, at = int_query(request, "limit", 50, 1, 1000), time_query(request, "as_of")
        form = choice_query(request, "format", ("json", "prompt"), "json")
        budget = int_query(request, "budget", 500, 16, 100_000)
        include = list_query(request, "include", INCLUDABLE)
        if at is None:
            fresh = await refreshed(ctx, request, user_id)
        else:  # the past does not wait for cycles, but a bad policy is still refused
            fresh = None
            choice_query(request, "refresh", POLICIES, ctx.settings.refresh)
        answer = {"user_id": user_id,
                  "beliefs": await asyncio.to_thread(live_beliefs, ctx.view, user_id, limit, at, include)}
        if form == "prompt":  # only live beliefs are ever pinned into a prompt, whatever was included
            text, shown, withheld = prompt_block([b for b in answer["beliefs"] if b["status"] == "live"], budget)
            answer = {"user_id": user_id, "prompt": text, "beliefs": shown, "budget_tokens": budget,
                      "withheld": withheld}
        return self.json({**answer, **({"as_of": at} if at else {"freshness": fresh})})


PAGES = {"/v1/users/{user_id}/beliefs": Beliefs}
