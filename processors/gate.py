"""The gates' state and I/O shell. A run of a user's new episodes reaches
the gates as a GateRequested (`gate_request`), judged in the user's request
order (streams/worker/pipeline/requests.py): how the run bears on the user's live
beliefs — one scroll of the beliefs and one read of the vectors of the
run's episodes, the beliefs and the evidence they cite, then exact cosines
(processors/challenge.bearings) — and the challenge requests the user's open
challenges become, within the user's daily challenge budget (`asked`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields, replace
from datetime import timezone
from typing import Any, Mapping, Sequence

from processors.accumulator import Accumulator
from processors.challenge import GATE_SCORE, Challenge, bearings, closed, gather, quorum_of
from processors.ports import VectorStore
from processors.projector import latest, point_id
from processors.staleness import first_stale, went_stale
from schemas import ChallengeRequested, EpisodeRecorded, Event, GateRequested, parse_time

CHALLENGES = uuid.UUID("4b0f7f36-1a8e-4c53-9d1e-5f0c2a7e6b19")  # namespace of challenge cycle ids
GATE_RUNS = uuid.UUID("0d7f1c52-8a43-4f0e-b6a9-3c2e5d1f7a80")  # namespace of gate request ids
RUN_MAX = 256  # episodes of one GateRequested (its schema's bound); a longer run is forwarded in parts


@dataclass(frozen=True)
class Gates:
    """One user's gate state (table `gates`, written by the requests pipeline)."""
    challenge_day: str | None = None  # valid-time day (UTC) of the user's last challenge
    challenged: int = 0  # challenges asked on that day
    challenged_ids: tuple[str, ...] = ()  # the beliefs they challenged
    challenging: tuple[dict[str, Any], ...] = ()  # open challenges (processors/challenge.gather)
    stream_at: str | None = None  # the latest valid time of the user's episodes judged so far (staleness)
    challenges: int = 0  # challenge cycles asked so far, for stats
    done: int = 0  # the last gate request judged to its end and done (GateRequested.sequence)
    # The gate request in hand: its sequence, how many of its episodes are
    # judged, and what they decided that is not done yet (an outbox: after a
    # crash or a handover the next owner does it, then judges on).
    sequence: int | None = None
    judged: int = 0
    outbox: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "Gates":
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in (data or {}).items()
                                  if k in known}
        return cls(**values)

    def at(self, request: GateRequested) -> "Gates":
        """The state for judging `request`: resumed where it was, or from its start."""
        return self if self.sequence == request.sequence else replace(self, sequence=request.sequence, judged=0,
                                                                      outbox=())

    def closed(self, request: GateRequested) -> "Gates":
        """Marked done once `request` is judged to its end and nothing it asked is left to do."""
        if self.outbox or self.judged < len(request.episodes) or request.sequence is None:
            return self
        return replace(self, done=request.sequence)


@dataclass(frozen=True)
class Rules:
    """What the gates are told: the contradiction gate on, its score
    threshold and daily budget; the staleness horizon in days (0: off)."""
    contradiction: bool
    threshold: float
    daily: int
    horizon: float

    @classmethod
    def from_settings(cls, settings) -> "Rules":
        threshold = GATE_SCORE.get(settings.embedder, 0.5) if settings.challenge_min_score is None \
            else settings.challenge_min_score
        return cls(settings.challenge == "on", threshold, settings.challenge_daily, settings.stale_after_days)


def weigh(gates: Gates, user: str, todo: Sequence[Mapping[str, Any]], scores, quorums: Mapping[str, int],
          live: list[dict], recent: Sequence[Mapping[str, Any]], rules: Rules) -> tuple[Gates, list[Event], int]:
    """Judge `todo` (episodes with their `scores`, bearing_of) against the
    same beliefs until something is asked: the state after, what is asked
    (challenges; ReflectionStaled events and the challenges that revalidate
    them), and how many episodes were judged."""
    # An open challenge of a belief no longer live (superseded, invalid, stale) has nothing left to ask.
    gates = replace(gates, challenging=tuple(p for p in gates.challenging if p["id"] in quorums))
    done = 0
    asked_now: list[Event] = []
    while done < len(todo) and not asked_now:
        upto, stale, _ = first_stale(live, todo[done:], gates.stream_at, rules.horizon)
        upto = upto or len(todo) - done
        used = upto
        if rules.contradiction:
            pending, used = gather(gates.challenging, todo[done:done + upto], scores[done:done + upto],
                                   rules.threshold, quorums)
            gates, challenges = asked(replace(gates, challenging=pending), user, rules.daily)
            asked_now = list(challenges)
        gates = replace(gates, stream_at=latest(gates.stream_at, *(e["occurred_at"] for e in todo[done:done + used])))
        done += used
        if stale and used == upto:  # the stream passed their horizon at this episode
            asked_now = [*asked_now, *went_stale(user, [b for b in live if b["reflection_id"] in stale],
                                                 todo[done - 1], rules.horizon, recent)]
    return gates, asked_now, done


def gate_requests(user: str, run: Sequence[tuple[EpisodeRecorded, Accumulator]],
                  positions: Mapping[str, int]) -> list[GateRequested]:
    """The run (each episode with the state as it was admitted) as gate
    requests of at most RUN_MAX episodes. Ids derive from the log position of
    each part's last episode: a redelivery forwards the same events."""
    out = []
    for start in range(0, len(run), RUN_MAX):
        part = run[start:start + RUN_MAX]
        last, acc = part[-1]
        at = positions[last.episode_id]
        out.append(GateRequested(
            event_id=f"gate:{uuid.uuid5(GATE_RUNS, f'{user}:{at}')}", user_id=user, occurred_at=last.occurred_at,
            episodes=tuple({"id": e.episode_id, "occurred_at": e.occurred_at, "position": positions[e.episode_id]}
                           for e, _ in part),
            recent=tuple({"id": r["id"], "occurred_at": r["occurred_at"]} for r in acc.recent
                         if r.get("kind", "episode") == "episode"),
            position=at))
    return out


def bearing_of(view: VectorStore, user: str, episodes: Sequence[Mapping[str, Any]], quorum: int,
               scored: bool = True,
               cache: dict | None = None) -> tuple[list[dict[str, float]], dict[str, int], list[dict]]:
    """Per episode ({"id", "occurred_at"}), belief id → score (see
    challenge.bearings; none unless `scored`, none for an episode the view
    no longer holds), for the live and the stale beliefs (fresh support
    brings a stale one back through a challenge that holds); each one's
    quorum of challengers (challenge.quorum_of); and the live beliefs."""
    beliefs = sorted((p for status in ("live", "stale") for _, p in view.scroll(user, kind="reflection", status=status)
                      if p.get("user_id") == user and p.get("reflection_id")), key=lambda p: p["reflection_id"])
    quorums = {p["reflection_id"]: quorum_of(p, quorum) for p in beliefs}
    live = [p for p in beliefs if p.get("status") == "live"]
    out: list[dict[str, float]] = [{} for _ in episodes]
    if not beliefs or not episodes or not scored:
        return out, quorums, live
    own = {point_id("reflection", user, p["reflection_id"]): p["reflection_id"] for p in beliefs}
    # An evidence id names an episode, or (in a belief of depth 2) possibly a belief: ask for both points then.
    cited = {point_id(kind, user, e): e for p in beliefs for e in p.get("evidence_ids", ())
             if e not in p.get("lost_evidence_ids", ())
             for kind in (("episode", "reflection") if int(p.get("depth", 1)) > 1 else ("episode",))}
    found = _vectors(view, [*own, *cited], cache)
    # The run's own vectors, as projected: read once, never cached (each episode is judged once).
    run = view.vectors([point_id("episode", user, e["id"]) for e in episodes])
    held = [i for i, e in enumerate(episodes) if point_id("episode", user, e["id"]) in run]
    if held:
        scores = bearings([episodes[i] for i in held],
                          [run[point_id("episode", user, episodes[i]["id"])] for i in held],
                          beliefs, {rid: found[pid] for pid, rid in own.items() if pid in found},
                          {eid: found[pid] for pid, eid in cited.items() if pid in found})
        for i, score in zip(held, scores):
            out[i] = score
    return out, quorums, live


CACHED = 200_000  # vectors the gate keeps between runs (a point's vector never changes while it is served)


def _vectors(view: VectorStore, ids: list[str], cache: dict | None) -> dict:
    """The vectors of `ids`: from `cache` where it has them, the rest in one
    read. A point without a vector is remembered as such too: the ids asked
    for are of served beliefs and their evidence, and an id that names no
    belief (an episode's, asked for as a belief's too) never comes to."""
    if cache is None:
        return view.vectors(ids)
    missing = [i for i in dict.fromkeys(ids) if i not in cache]
    if missing:
        if len(cache) + len(missing) > CACHED:
            cache.clear()
        found = view.vectors(missing)
        cache.update({i: found.get(i) for i in missing})
    return {i: cache[i] for i in ids if cache.get(i) is not None}


def day_of(at: str) -> str:
    return parse_time(at).astimezone(timezone.utc).date().isoformat()


def asked(gates: Gates, user: str, daily: int) -> tuple[Gates, list[ChallengeRequested]]:
    """The user's open challenges that reached their quorum, as requests,
    within the budget of the user's current day of valid time (UTC, so a
    replay counts the same): at most `daily` challenges, and each belief at
    most once. What does not fit stays open."""
    out = []
    for c in closed(gates.challenging):
        day = max(day_of(c.occurred_at), gates.challenge_day or "")  # the stream's day: never back
        if day != gates.challenge_day:
            gates = replace(gates, challenge_day=day, challenged=0, challenged_ids=())
        if gates.challenged >= daily or c.reflection_id in gates.challenged_ids:
            continue  # stays open
        gates = replace(gates, challenged=gates.challenged + 1, challenged_ids=(*gates.challenged_ids, c.reflection_id))
        out.append(request_of(user, c))
    asked_now = {r.reflection_id for r in out}
    return replace(gates, challenging=tuple(p for p in gates.challenging if p["id"] not in asked_now),
                   challenges=gates.challenges + len(out)), out


def request_of(user: str, c: Challenge) -> ChallengeRequested:
    # Deterministic: the same log asks the same challenge, a redelivery publishes the same ids.
    cycle = f"{user}:challenge:{uuid.uuid5(CHALLENGES, '|'.join((c.reflection_id, *c.challenger_ids)))}"
    return ChallengeRequested(event_id=f"request:{cycle}", user_id=user, cycle_id=cycle,
                              reflection_id=c.reflection_id, challenger_ids=c.challenger_ids,
                              similarity=max(-1.0, min(1.0, c.similarity)), occurred_at=c.occurred_at)
