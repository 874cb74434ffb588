"""Daily token budgets per user, per tenant (in each partition) and per
partition: the pure decision, then a real worker where two tenants share one
partition and one spends its share."""

from __future__ import annotations

import urllib.request
from dataclasses import replace

import pytest

from processors.guard import Budget, Spend
from schemas import ReflectionRequested
from streams.producer import Publisher
from streams.settings import Settings
from streams.topics import ensure_topics
from streams.worker.pipeline.requests import spend_keys
from support.broker import read_opened
from support.harness import run, wait_for

DAY = "2026-12-03"


def request(user: str, cycle: str) -> ReflectionRequested:
    return ReflectionRequested(user_id=user, cycle_id=cycle, why="manual", occurred_at=f"{DAY}T09:00:00Z")


class Ledger:
    """The `reasoner-spend` table as the requests pipeline reads and charges it."""

    def __init__(self, delimiter: str = ":") -> None:
        self.table: dict[str, dict] = {}
        self.delimiter = delimiter

    def spent(self, user: str, partition: int) -> list[int]:
        keys = spend_keys(request(user, "-"), partition, self.delimiter)
        return [Spend.from_dict(self.table.get(key)).today(DAY) for key in keys]

    def charge(self, user: str, partition: int, tokens: int, cycle: str) -> None:
        for key in spend_keys(request(user, cycle), partition, self.delimiter):
            self.table[key] = Spend.from_dict(self.table.get(key)).charged(DAY, tokens, cycle).to_dict()


def test_a_tenants_budget_is_split_over_partitions_like_the_deployments():
    budget = Budget.from_settings(Settings.load(env={}, user_daily_tokens=1000, daily_tokens=8000,
                                                tenant_daily_tokens=2000, partitions=4))
    assert (budget.user_tokens, budget.partition_tokens, budget.tenant_tokens) == (1000, 2000, 500)
    tiny = Budget.from_settings(Settings.load(env={}, tenant_daily_tokens=3, partitions=4))
    assert tiny.tenant_tokens == 1  # a limit never rounds down to none


def test_each_partition_counts_a_tenant_under_a_key_of_its_own():
    # One writer per key: a key's changelog partition is the one it is written from.
    assert spend_keys(request("acme:1", "c"), 2, ":") == ("user:acme:1", "partition:2", "tenant:2:acme")
    assert spend_keys(request("acme:1", "c"), 3, ":")[2] == "tenant:3:acme"
    assert spend_keys(request("solo", "c"), 2, ":")[2] == "tenant:2:solo"  # no delimiter: a tenant of its own
    assert spend_keys(request("acme-1", "c"), 2, "-")[2] == "tenant:2:acme"


def test_a_tenant_that_spent_its_share_in_a_partition_is_refused_there_and_no_one_else_is():
    budget, ledger = Budget(user_tokens=1000, partition_tokens=5000, tenant_tokens=500), Ledger()
    ledger.charge("acme:1", 0, 600, "acme:1:c1")
    assert "tenant's share" in budget.refusal(*ledger.spent("acme:2", 0))  # another user, the same tenant
    assert "tenant's share" in budget.refusal(*ledger.spent("acme:1", 0))
    assert budget.refusal(*ledger.spent("globex:1", 0)) is None  # another tenant beside it
    assert budget.refusal(*ledger.spent("acme:3", 1)) is None  # the tenant's share of another partition
    ledger.charge("acme:1", 0, 600, "acme:1:c1")  # a rerun of the cycle (after a crash): charged once
    assert ledger.spent("acme:2", 0) == [0, 600, 600]


def test_the_user_and_partition_budgets_still_apply():
    budget, ledger = Budget(user_tokens=1000, partition_tokens=1500, tenant_tokens=1200), Ledger()
    ledger.charge("acme:1", 0, 1100, "acme:1:c1")
    assert "user's daily tokens" in budget.refusal(*ledger.spent("acme:1", 0))  # its tenant's share is not spent
    assert budget.refusal(*ledger.spent("acme:2", 0)) is None
    ledger.charge("globex:1", 0, 400, "globex:1:c1")  # 1500 in the partition, neither tenant at its share
    assert "partition's share" in budget.refusal(*ledger.spent("acme:2", 0))
    assert "partition's share" in budget.refusal(*ledger.spent("initech:1", 0))
    assert budget.refusal(*ledger.spent("acme:2", 1)) is None  # another partition's share


def test_the_narrowest_spent_budget_is_the_reason():
    every = Budget(user_tokens=1, partition_tokens=1, tenant_tokens=1)
    assert "user's" in every.refusal(1, 1, 1)
    assert "tenant's" in every.refusal(0, 1, 1)
    assert "partition's" in every.refusal(0, 1, 0)


def test_zero_lifts_each_limit():
    assert Budget().refusal(10**9, 10**9, 10**9) is None
    unlimited = Budget.from_settings(Settings.load(env={}, tenant_daily_tokens=0, partitions=4))
    assert unlimited.tenant_tokens == 0 and unlimited.refusal(0, 0, 10**9) is None


# ------------------------------------------------------------------ through a worker


async def publish_rounds(settings, episodes):
    async with Publisher(settings) as p:
        for user, episode_id, text in episodes:
            await p.publish_episode(user, text, 0.8, episode_id=episode_id, wait=False)


def _reflect(settings, user: str) -> None:
    ask = urllib.request.Request(f"http://127.0.0.1:{settings.web_port}/v1/users/{user}/reflect", data=b"",
                                 method="POST")
    with urllib.request.urlopen(ask, timeout=10) as answer:
        assert answer.status == 202


def _cycle_of(w, user: str) -> dict:
    """Ask for the user's cycle and wait for it to be done."""
    before = w.stats(user).get("requests_done", 0)
    _reflect(w.settings, user)
    return wait_for(lambda: w.stats(user).get("requests_done", 0) > before and w.stats(user)["last_cycle"],
                    60, f"{user}'s cycle done")


@pytest.mark.integration
def test_a_tenant_that_spent_its_share_is_refused_while_another_tenant_in_its_partition_reflects(settings, worker):
    from support.messages_api import MessagesServer, OfflineModel

    api = MessagesServer(OfflineModel())
    users = ("acme:1", "acme:2", "globex:1")
    try:
        # One partition: every user hashes to it, and the deployment's budget does not bind.
        s = replace(settings, partitions=1, threshold=100.0, reasoner="anthropic", reasoner_retries=0,
                    tenant_daily_tokens=1, user_daily_tokens=0, daily_tokens=0)
        run(ensure_topics(s))
        w = worker(s, env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})
        run(publish_rounds(s, [(u, f"{u.replace(':', '-')}-{i}", f"auth deploy failed: token {i}")
                         for u in users for i in range(4)]))
        wait_for(lambda: all(w.stats(u).get("episodes") == 4 for u in users), 30, "every user's episodes")

        assert _cycle_of(w, "acme:1")["outcome"] == "ok"  # under budget: runs, and spends acme's share
        calls = len(api.requests)
        refused = _cycle_of(w, "acme:2")  # another user of acme: the user's budget has no limit here
        assert refused["outcome"] == "refused" and "tenant's share" in refused["why_nothing"]
        assert len(api.requests) == calls  # refused: no call
        assert _cycle_of(w, "globex:1")["outcome"] == "ok" and len(api.requests) > calls  # its neighbour runs

        audits = {e["user_id"]: e for e in run(read_opened(s, s.topic_reflections))
                  if e["type"] == "ReflectionCycleCompleted"}
        assert audits["acme:2"]["outcome"] == "refused" and "tenant's share" in audits["acme:2"]["error"]
        assert audits["acme:2"]["usage"].get("calls", 0) == 0
        assert [audits[u]["outcome"] for u in ("acme:1", "globex:1")] == ["ok", "ok"]
        assert w.get("/v1/reasoner")["budget"]["tenant_partition_daily_tokens"] == 1
    finally:
        api.close()
