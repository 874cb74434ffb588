"""This worker's reasoner: its settings, breaker and figures since start."""

from __future__ import annotations

from faust.web import Request, Response, View

from streams.http.routes.common import answers_json, context


class ReasonerState(View):
    @answers_json
    async def get(self, request: Request) -> Response:
        runtime = context(self).runtime
        tally, breaker, budget, reasoner = runtime.tally, runtime.breaker, runtime.budget, runtime.reasoner
        return self.json({
            "reasoner": reasoner.name, "prompt_version": reasoner.prompt_version,
            "model": getattr(reasoner, "model", None),
            "batched": reasoner.batched,
            "breaker": {"state": breaker.state, "consecutive_failures": breaker.consecutive},
            "budget": {"user_daily_tokens": budget.user_tokens, "partition_daily_tokens": budget.partition_tokens,
                       # a tenant's share in each partition, as the partition's is the deployment's
                       "tenant_partition_daily_tokens": budget.tenant_tokens},
            "cycles": tally.cycles, "calls": tally.calls, "tokens": tally.tokens,
            "cost_usd": round(tally.cost_usd, 6), "last_error": tally.last_error,
        })


PAGES = {"/v1/reasoner": ReasonerState}
