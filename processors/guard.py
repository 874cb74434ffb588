"""What stands between a cycle and the reasoner's API: daily token budgets and
a circuit breaker. Pure state; the reflector agent keeps it (spend in a Faust
table, so it survives restarts; the breaker in memory, as an outage is seen
per process).

The global budget is split evenly over the request partitions: each partition
is owned by one worker, so the fleet can never spend more than the budget and
no worker has to coordinate with another. The price is that one hot partition
is cut off at its share while others have tokens left. A tenant's budget is
split the same way, and counted per partition, so the users of one tenant
that hash to a partition cannot spend all of it: the tenants beside them keep
theirs. Budgets are checked before a cycle: one already running finishes, so
a day's spend can pass a limit by at most one cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def day_of(at: datetime) -> str:
    return at.date().isoformat()


@dataclass(frozen=True)
class Spend:
    day: str = ""
    tokens: int = 0
    last: str = ""  # the cycle charged last: a rerun of it (after a crash) is not charged again

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Spend":
        return cls(**data) if data else cls()

    def to_dict(self) -> dict[str, Any]:
        return {"day": self.day, "tokens": self.tokens, "last": self.last}

    def today(self, day: str) -> int:
        return self.tokens if self.day == day else 0

    def charged(self, day: str, tokens: int, cycle: str) -> "Spend":
        """A key's cycles are charged in log order, one at a time, so only
        the last one charged can come again."""
        return self if cycle == self.last else Spend(day, self.today(day) + tokens, cycle)


def partition_share(daily: int, partitions: int) -> int:
    """A partition's share of a daily budget (0: no limit); never 0 when there is a limit."""
    return max(1, daily // partitions) if daily else 0


@dataclass(frozen=True)
class Budget:
    user_tokens: int = 0  # 0: no limit
    partition_tokens: int = 0
    tenant_tokens: int = 0  # a tenant's share of one partition

    @classmethod
    def from_settings(cls, settings) -> "Budget":
        return cls(settings.user_daily_tokens, partition_share(settings.daily_tokens, settings.partitions),
                   partition_share(settings.tenant_daily_tokens, settings.partitions))

    def refusal(self, user_spent: int, partition_spent: int, tenant_spent: int = 0) -> str | None:
        """Why a cycle may not run, the narrowest budget first, or None.
        `tenant_spent` is the user's tenant's spend in this partition."""
        if self.user_tokens and user_spent >= self.user_tokens:
            return f"budget: this user's daily tokens are spent ({user_spent}/{self.user_tokens})"
        if self.tenant_tokens and tenant_spent >= self.tenant_tokens:
            return ("budget: this tenant's share of its daily tokens in this partition is spent "
                    f"({tenant_spent}/{self.tenant_tokens})")
        if self.partition_tokens and partition_spent >= self.partition_tokens:
            return (f"budget: this partition's share of the daily tokens is spent "
                    f"({partition_spent}/{self.partition_tokens})")
        return None


@dataclass
class Breaker:
    """Opens after `failures` consecutive cycles the API did not answer; while
    open, cycles fail at once; after `cooldown` seconds one cycle may try, and
    a failure reopens it."""

    failures: int
    cooldown: float
    consecutive: int = 0
    opened_at: float | None = None

    def refusal(self, now: float) -> str | None:
        if self.opened_at is not None and now - self.opened_at < self.cooldown:
            return f"breaker open: the reasoner API failed {self.consecutive} cycles in a row; " \
                   f"next try in {self.cooldown - (now - self.opened_at):.0f} s"
        return None

    def record(self, unavailable: bool, now: float) -> None:
        if not unavailable:
            self.consecutive, self.opened_at = 0, None
            return
        self.consecutive += 1
        if self.consecutive >= self.failures:
            self.opened_at = now

    @property
    def state(self) -> str:
        return "closed" if self.opened_at is None else "open"


@dataclass
class Tally:
    """This worker's reasoner figures since it started: what /v1/reasoner serves."""

    cycles: dict[str, int] = field(default_factory=dict)  # by outcome
    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    last_error: str | None = None

    def add(self, completed) -> None:
        self.cycles[completed.outcome] = self.cycles.get(completed.outcome, 0) + 1
        usage = completed.usage
        self.calls += usage.get("calls", 0)
        self.tokens += tokens_of(usage)
        self.cost_usd += usage.get("cost_usd") or 0.0
        if completed.error:
            self.last_error = completed.error


def tokens_of(usage: dict[str, Any]) -> int:
    """Every token an audit event's usage bills: the unit of the budgets."""
    return sum(usage.get(k, 0) for k in ("input_tokens", "output_tokens", "cached_tokens", "cache_write_tokens"))
