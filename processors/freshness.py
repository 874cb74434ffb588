"""Freshness of a read: is a cycle of this user due or running?

A materialized view has two refresh policies. `concurrent` answers from the
view as it is while a cycle runs; `blocking` waits — bounded — until the cycles
the accumulator has asked for are in the view. Due = threshold cycles asked
(the accumulator's count) beyond the last one completed and projected, plus a
manual or revalidation cycle running now.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("concurrent", "blocking")


@dataclass(frozen=True)
class Freshness:
    asked: int  # threshold cycles the accumulator fired
    done: int  # the last of them completed and projected
    running: bool  # any cycle of the user in progress now

    @property
    def due(self) -> int:
        return max(0, self.asked - self.done) or int(self.running)

    def to_dict(self, policy: str, waited_ms: float, timed_out: bool = False) -> dict:
        return {"policy": policy, "fresh": self.due == 0, "cycles_behind": self.due,
                "waited_ms": round(waited_ms, 1), "timed_out": timed_out}


def cycle_number(cycle_id: str, user_id: str) -> int | None:
    """N of a threshold cycle id `user:N`; None for manual and revalidation cycles."""
    tail = cycle_id[len(user_id) + 1:] if cycle_id.startswith(user_id + ":") else ""
    return int(tail) if tail.isdigit() else None
