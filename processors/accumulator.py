"""Accumulator: the per-user trigger of the reflection loop (step 1), pure.

A cycle fires when the importance summed since the last cycle reaches the
threshold *and* the user has enough high-salience history; after it fires the
pending sum resets unconditionally — even if the cycle then fails — so a
failing reasoner cannot be asked again on every episode.

The recent window (the 100 newest episodes) lives in this state, by id
only, so step 2 never reads the user's whole store. Ids, not texts: the
reflector reads the texts from the view, and every change of this
state is a changelog record (texts made each one ~20 KB, which capped the
worker's ingest, and left erased text in the changelog). It also makes
redelivery harmless: an episode already in the window is not counted twice.
Beliefs join a cycle's window in the reflector, from the view, in the order
their cycles ran: this state sees only the episodes topic, in log order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from schemas import (EpisodeRecorded, EpisodeRetracted, Event, InvalidationRequested, ReflectionRequested,
                     UserForgotten, parse_time)

WINDOW = 100


@dataclass(frozen=True)
class Trigger:
    threshold: float = 15.0
    min_episodes: int = 50
    salience_cut: float = 0.5

    @classmethod
    def from_settings(cls, settings) -> "Trigger":
        return cls(settings.threshold, settings.min_episodes, settings.salience_cut)


@dataclass(frozen=True)
class Accumulator:
    pending: float = 0.0
    episodes: int = 0
    high_salience: int = 0
    cycles: int = 0
    last_cycle_at: str | None = None
    recent: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    asked: int = 0  # requests forwarded so far, of every kind: the last one's sequence
    gate_runs: int = 0  # runs forwarded to the gates: numbered apart, as their count depends on the batches
    forwarded: tuple[str, ...] = field(default_factory=tuple)  # the newest manual cycle ids forwarded
    asked_by: dict[str, int] = field(default_factory=dict)  # requests forwarded by `why` (threshold, manual, …)
    asked_at: str | None = None  # the latest valid time of a request asked so far
    # The offset in `episodes` of the last record folded in: a redelivery at or
    # below it (a crash between the state's write and the commit) is skipped,
    # however many records came between.
    applied: int = -1
    # Events decided but maybe not yet on the log: the state is stored with them
    # before they are published, and a redelivery publishes them again (the
    # transactional outbox), so a request on the log never outruns the state
    # that asked for it.
    outbox: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        # Shallow: the window's records are never mutated (asdict's deep copy
        # of 100 of them per user per batch was 29% of the worker's CPU).
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"recent": list(self.recent),
                                                                         "forwarded": list(self.forwarded),
                                                                         "outbox": list(self.outbox)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Accumulator":
        if not data:
            return cls()
        known = {f.name for f in fields(cls)}  # a state stored by an older build may hold more (the gates' once)
        return cls(**{**{k: v for k, v in data.items() if k in known}, "recent": tuple(data.get("recent", ())),
                      "forwarded": tuple(data.get("forwarded", ())), "outbox": tuple(data.get("outbox", ()))})

    def applied_at(self, offset: int) -> bool:
        return offset <= self.applied

    def holds(self, record_id: str) -> bool:
        return any(r["id"] == record_id for r in self.recent)


def _remember(acc: Accumulator, record: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    return (*acc.recent, record)[-WINDOW:]


def admit(acc: Accumulator, event: Event,
          trigger: Trigger) -> tuple[Accumulator, ReflectionRequested | UserForgotten | None]:
    """Fold one event into the user's accumulator; maybe ask for a cycle."""
    if isinstance(event, EpisodeRetracted):
        return replace(acc, recent=tuple(r for r in acc.recent if r["id"] != event.episode_id)), None
    if isinstance(event, ReflectionRequested):
        return forward(acc, event)
    if isinstance(event, UserForgotten):
        return number(forgotten(acc), event)
    if not isinstance(event, EpisodeRecorded) or acc.holds(event.episode_id):
        return acc, None
    record = {"id": event.episode_id, "kind": "episode", "occurred_at": event.occurred_at}
    acc = replace(acc, pending=acc.pending + event.importance, episodes=acc.episodes + 1,
                  high_salience=acc.high_salience + (event.importance >= trigger.salience_cut),
                  recent=_remember(acc, record))
    if acc.pending < trigger.threshold or acc.high_salience < trigger.min_episodes:
        return acc, None
    # The cycle happens at the valid time of the episode that fired it: the
    # time its evidence is bounded by and its beliefs are valid from.
    return fire(acc, event.user_id, "threshold", event.occurred_at)


FORWARDED = 16  # manual cycle ids remembered: a redelivered one is not forwarded twice


def forward(acc: Accumulator, manual: ReflectionRequested) -> tuple[Accumulator, ReflectionRequested | None]:
    """A manual request, in stream order: with the window as of here and its
    sequence. The pending sum stays: a manual cycle is one more, not a threshold."""
    if manual.cycle_id in acc.forwarded:
        return acc, None
    acc = replace(acc, forwarded=(*acc.forwarded, manual.cycle_id)[-FORWARDED:])
    return number(acc, replace(manual, window_episode_ids=_window(acc), window_reflection_ids=()))


def forgotten(acc: Accumulator) -> Accumulator:
    """The user forgotten: nothing they said counts any more. The numbering
    goes on — sequences tell a redelivered request, and cycle ids name keys
    and stored outcomes, so a new one must never be an old one's."""
    return Accumulator(cycles=acc.cycles, asked=acc.asked, gate_runs=acc.gate_runs, forwarded=acc.forwarded,
                       asked_by=acc.asked_by, asked_at=acc.asked_at, applied=acc.applied)


def kind_of(request) -> str:
    if isinstance(request, InvalidationRequested):
        return "invalidation"
    if isinstance(request, UserForgotten):
        return "forget"
    return getattr(request, "why", "challenge")  # a ChallengeRequested has no `why`: it is one kind


Asked = TypeVar("Asked", ReflectionRequested, InvalidationRequested, UserForgotten)


def number(acc: Accumulator, request: Asked) -> tuple[Accumulator, Asked]:
    """The request with the user's next sequence number."""
    why = kind_of(request)
    by_why = {**acc.asked_by, why: acc.asked_by.get(why, 0) + 1}
    latest = request.occurred_at if acc.asked_at is None or parse_time(request.occurred_at) > parse_time(acc.asked_at) \
        else acc.asked_at
    acc = replace(acc, asked=acc.asked + 1, asked_by=by_why, asked_at=latest)
    return acc, replace(request, sequence=acc.asked)


def _window(acc: Accumulator) -> tuple[str, ...]:
    return tuple(r["id"] for r in acc.recent if r["kind"] == "episode")


def fire(acc: Accumulator, user_id: str, why: str, at: str) -> tuple[Accumulator, ReflectionRequested]:
    """Emit a request and reset the pending sum, whatever the cycle will do."""
    cycles = acc.cycles + 1
    request = ReflectionRequested(
        # Deterministic ids: a replayed episode stream asks for the same cycles.
        event_id=f"request:{user_id}:{cycles}", cycle_id=f"{user_id}:{cycles}",
        user_id=user_id, why=why, pending_importance=round(acc.pending, 6),
        occurred_at=at,
        # The window travels by id: the cycle reflects on what fired it even
        # when it runs later, and a replay asks the same question.
        window_episode_ids=_window(acc), window_reflection_ids=(),  # beliefs: the reflector's, from the view
    )
    return number(replace(acc, pending=0.0, cycles=cycles, last_cycle_at=at), request)
