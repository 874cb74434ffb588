"""What the episodes log decides, segment by segment, pure.

A batch of the episodes topic is cut into segments: every retraction and
every forget is a segment of its own, so the runs the gates judge end there.
Each segment is projected (the view), then folded into the users'
accumulators in log order by `fold`, which returns everything the episodes
pipeline then writes, each once: every user's state after the segment, and
the events it asks for, in order — cycles asked at the position of the
record that fired them, retractions forwarded to their walk, forgets, and
the runs of new episodes the gates judge.

The pipeline stores each state with its events as an outbox before it
publishes them (streams/worker/pipeline/episodes.py): a request on the log never
outruns the state that decided it, and a redelivered segment decides
nothing twice, as each state carries the offset of the last record it
folded in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from processors.accumulator import Accumulator, Trigger, admit, number
from processors.gate import gate_requests
from processors.invalidator import forwarded
from schemas import EpisodeRecorded, EpisodeRetracted, Event, ReflectionRequested, UserForgotten

ALONE = (EpisodeRetracted, UserForgotten)  # each a segment of its own
FORWARDED = (ReflectionRequested, UserForgotten)  # not projected: forwarded by the accumulator

Run = list[tuple[EpisodeRecorded, Accumulator]]  # a user's new episodes, each with the state as it was admitted


def segments(admitted: list[tuple[Event, Any]]) -> list[list[tuple[Event, Any]]]:
    """The batch in order, cut so that every retraction and forget is a segment of its own."""
    out: list[list[tuple[Event, Any]]] = []
    for item in admitted:
        if isinstance(item[0], ALONE) or not out or isinstance(out[-1][0][0], ALONE):
            out.append([item])
        else:
            out[-1].append(item)
    return out


@dataclass(frozen=True)
class Folded:
    """A segment folded in: what to store and what to publish."""

    states: dict[str, Accumulator]  # every user the segment names, after it
    asks: dict[str, list[Event]] = field(default_factory=dict)  # user → the events decided, in log order
    # user → (the offset the state had folded in, the offsets at or below it): a redelivery, skipped
    redelivered: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    # (user, episode id, offset, first offset): an episode logged again (a retried write), counted once
    again: list[tuple[str, str, int, int]] = field(default_factory=list)


def fold(states: Mapping[str, Accumulator], segment: Sequence[tuple[Event, int]],
         first: Mapping[tuple[str, str], int], trigger: Trigger, gated: bool) -> Folded:
    """The segment's records (each with its offset in `episodes`), folded
    into `states` (each user's accumulator before the segment) in log order.

    `first`: (user, episode id) → the offset it was first logged at, as projected:
    an episode logged before (a retried write, however far back) was counted
    then. `gated`: whether either gate is on; each user's new episodes since
    its last request form a run, forwarded to the gates where a request
    fires or the segment ends. Runs are numbered apart from the user's
    requests: where a run ends depends on the batches, so their count does
    too (never what they decide: a run cut in two is judged as one, as
    nothing is asked between the parts)."""
    changed = dict(states)
    out = Folded(changed)
    runs: dict[str, Run] = {}
    positions = {(r.user_id, r.episode_id): at for r, at in segment if isinstance(r, EpisodeRecorded)}
    for record, at in segment:
        user, acc = record.user_id, changed[record.user_id]
        if acc.applied_at(at):
            out.redelivered.setdefault(user, (acc.applied, []))[1].append(at)
            continue
        acc = replace(acc, applied=at)
        if isinstance(record, EpisodeRecorded) and (was := first.get((user, record.episode_id), at)) < at:
            out.again.append((user, record.episode_id, at, was))
            changed[user] = acc
            continue
        before = acc
        acc, request = admit(acc, record, trigger)
        if isinstance(record, EpisodeRecorded) and not before.holds(record.episode_id):  # new: the run goes on
            runs.setdefault(user, []).append((record, acc))
        asked: list[Event] = []
        if isinstance(record, EpisodeRetracted):  # its walk runs in the user's request order
            acc, invalidation = number(acc, forwarded(record, at))
            asked = [invalidation]
        elif request is not None:  # a cycle asked, or a forget (carried out in the user's request order)
            acc, asked = judged(acc, user, runs.pop(user, []), positions, gated)
            asked.append(replace(request, position=at))
        changed[user] = acc
        out.asks.setdefault(user, []).extend(asked)
    for user, run in runs.items():
        changed[user], asked = judged(changed[user], user, run, positions, gated)
        out.asks.setdefault(user, []).extend(asked)
    return replace(out, asks={user: asks for user, asks in out.asks.items() if asks})


def judged(acc: Accumulator, user: str, run: Run, positions: Mapping[tuple[str, str], int],
           gated: bool) -> tuple[Accumulator, list[Event]]:
    """The run as the gates' requests (GateRequested: judged in the requests
    pipeline, after the cycles asked before it), numbered; none when no gate is on."""
    asked: list[Event] = []
    if gated:
        for request in gate_requests(user, run, {e: at for (u, e), at in positions.items() if u == user}):
            acc = replace(acc, gate_runs=acc.gate_runs + 1)
            asked.append(replace(request, sequence=acc.gate_runs))
    return acc, asked
