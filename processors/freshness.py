"""Freshness of a read: is a cycle of this user due or running?

A materialized view has two refresh policies. `concurrent` answers from the
view as it is while a cycle runs; `blocking` waits — bounded — until the cycles
the worker has asked for are in the view. Due = requests asked (every kind:
the accumulator numbers them) beyond the last one whose cycle is done and in
the view, or a cycle running now.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("concurrent", "blocking")


@dataclass(frozen=True)
class Freshness:
    asked: int  # requests the episodes pipeline forwarded: the last one's sequence number
    done: int  # the sequence number of the last request whose cycle is done and in the view
    running: bool  # any cycle of the user in progress now

    @property
    def due(self) -> int:
        return max(0, self.asked - self.done) or int(self.running)

    def to_dict(self, policy: str, waited_ms: float, timed_out: bool = False) -> dict:
        return {"policy": policy, "fresh": self.due == 0, "cycles_behind": self.due,
                "waited_ms": round(waited_ms, 1), "timed_out": timed_out}
