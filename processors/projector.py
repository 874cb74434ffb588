"""Projector: episodes → the view, idempotently.

Point ids are UUIDv5 of (kind, user, record id): a redelivery or a replay
writes the same points again and the view is unchanged. The user is part of
the name so two tenants that reuse an episode id never share a point.
A retraction is terminal: a later (redelivered or reordered) EpisodeRecorded
of a retracted episode never brings its text back. So is a forget, for what
was logged before it (`forgotten_point`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from processors.ports import GONE, POSITION, Embedder, VectorStore, ViewPoint
from schemas import (EpisodeRecorded, EpisodeRetracted, ErasureCompleted, Event, ReflectionChallenged,
                     ReflectionCreated, ReflectionCycleCompleted, ReflectionInvalidated, ReflectionReinforced,
                     ReflectionStaled, UserForgotten)

POINTS = uuid.UUID("6f3c9a52-6b1e-4d55-9a8e-6c1f4e0b7a11")  # namespace of view point ids
EPISODE_TYPES = (EpisodeRecorded, EpisodeRetracted, UserForgotten)
REFLECTION_TYPES = (ReflectionCreated, ReflectionReinforced, ReflectionInvalidated, ReflectionChallenged,
                    ReflectionStaled, ErasureCompleted, ReflectionCycleCompleted)
CHANGES = (ReflectionReinforced, ReflectionInvalidated, ReflectionChallenged, ReflectionStaled)  # of a projected belief
FORGOTTEN_WITH_USER = (ReflectionCreated, ReflectionCycleCompleted, *CHANGES)  # not the proofs of erasures


def point_id(kind: str, user_id: str, record_id: str) -> str:
    # Ids may hold ':', so the user's is escaped: else user "acme" with
    # episode "bob:e1" and user "acme:bob" with "e1" named one point. ('%'
    # cannot occur in an id; ids without ':' keep the points they had.)
    return str(uuid.uuid5(POINTS, f"{kind}:{user_id.replace(':', '%3A')}:{record_id}"))


def episode_point(event: Any) -> str:
    """The point of an episode event (EpisodeRecorded, EpisodeRetracted)."""
    return point_id("episode", event.user_id, event.episode_id)


def forgotten_point(user_id: str) -> str:
    """The marker of a user's latest forget: no vector, found by id. An
    EpisodeRecorded logged before its `before` is never projected again,
    however late a batch that opened it before the keys were destroyed
    comes (streams/worker/pipeline/requests.py)."""
    return point_id("forgotten", user_id, "")


def proof_point(erasure: EpisodeRetracted) -> str:
    """Where the proof of an erasure's walk lies: its erasure_id is the
    retraction's own event id (processors/invalidator.py)."""
    return point_id("erasure", erasure.user_id, erasure.event_id)


def forgotten_payload(event: UserForgotten, before: int | None, reflections_before: int | None = None) -> dict:
    """`before`, `reflections_before`: past the last record the user's old
    life has in their partition of `episodes`, of `reflections`."""
    return {"user_id": event.user_id, "kind": "forgotten", "forget_id": event.event_id, "before": before,
            "reflections_before": reflections_before, "occurred_at": event.occurred_at}


def remembered(events: Sequence[Event], positions: Sequence[int] | None, markers: dict[str, dict],
               topic_before: str, forgets: tuple[type, ...]) -> tuple[list[Event], list[int] | None]:
    """The events, and their positions, less those of type `forgets` logged
    before their user's latest forget (`markers`: the view's, by point id;
    `topic_before`: the marker's field for this topic)."""
    if not positions or not markers:
        return list(events), None if positions is None else list(positions)

    def forgotten(event: Event, at: int | None) -> bool:
        before = markers.get(forgotten_point(event.user_id), {}).get(topic_before)
        return isinstance(event, forgets) and at is not None and before is not None and at < before
    kept = [(e, at) for e, at in zip(events, positions) if not forgotten(e, at)]
    return [e for e, _ in kept], [at for _, at in kept]


@dataclass
class Plan:
    upserts: list[EpisodeRecorded] = field(default_factory=list)
    retractions: list[EpisodeRetracted] = field(default_factory=list)
    # The EpisodeRecorded that came before a retraction in the same batch: the
    # retraction leaves what it would have left had they come in two batches.
    retracted_records: dict[str, EpisodeRecorded] = field(default_factory=dict)


def plan_episodes(events: Sequence[Event], retracted: set[str]) -> Plan:
    """What a batch does to the view, given the point ids already retracted there.

    The last EpisodeRecorded of a point wins; a retraction anywhere in the batch
    (or already in the view) suppresses every upsert of that point. The result
    does not depend on where batch boundaries fall, so a replay in other batches
    (a rebuild) builds the same view.
    """
    recorded: dict[str, EpisodeRecorded] = {}
    retractions: dict[str, EpisodeRetracted] = {}
    before: dict[str, EpisodeRecorded] = {}
    for event in events:
        pid = episode_point(event)
        if isinstance(event, EpisodeRetracted):
            if pid not in retractions and pid in recorded:
                before[pid] = recorded[pid]
            if pid not in retractions or erases(event) and not erases(retractions[pid]):
                retractions[pid] = event
        elif isinstance(event, EpisodeRecorded) and pid not in retractions:
            recorded[pid] = event
    gone = retracted | retractions.keys()
    return Plan(
        upserts=[e for pid, e in recorded.items() if pid not in gone],
        # An erasure still applies to an episode retracted before: that one kept its text.
        retractions=[e for pid, e in retractions.items() if pid not in retracted or erases(e)],
        retracted_records={pid: e for pid, e in before.items() if pid not in retracted},
    )


def erases(event: EpisodeRetracted) -> bool:
    return event.reason == "erasure"


def episode_payload(event: EpisodeRecorded) -> dict:
    payload = {
        "user_id": event.user_id,
        "kind": "episode",
        "episode_id": event.episode_id,
        "text": event.text,
        "importance": event.importance,
        "occurred_at": event.occurred_at,
        "recorded_at": event.recorded_at,
        "status": "recorded",
        "depth": 0,
    }
    if event.source is not None:
        payload["source"] = event.source
    if event.metadata is not None:
        payload["metadata"] = event.metadata
    return payload


def first_positions(events: Sequence[Event], positions: Sequence[int] | None,
                    known: dict[str, dict]) -> dict[str, int]:
    """Point id → the earliest position it was recorded at, in the view or in this batch."""
    first = {pid: p[POSITION] for pid, p in known.items() if p.get(POSITION) is not None}
    for event, at in zip(events, positions or ()):
        pid = episode_point(event)
        if isinstance(event, EpisodeRecorded) and at is not None:
            first[pid] = min(first.get(pid, at), at)
    return first


def first_logged(view: VectorStore, records: Sequence[EpisodeRecorded]) -> dict[tuple[str, str], int]:
    """(user id, episode id) → the position its point was first logged at, as
    projected. By user: an episode id is the user's, and two users may
    both send one (an agent numbering each user's episodes)."""
    pids = {episode_point(r): (r.user_id, r.episode_id) for r in records}
    return {pids[pid]: p[POSITION] for pid, p in view.get(list(pids)).items() if p.get(POSITION) is not None}


def positioned(payload: dict, first: dict[str, int], event: EpisodeRecorded) -> dict:
    at = first.get(episode_point(event))
    return payload if at is None else {**payload, POSITION: at}


def served(payload: dict) -> dict:
    """A point as reads show it: a retracted episode without its text, which
    the view keeps only for the cycles asked before the retraction."""
    if payload.get("kind") == "episode" and payload.get("status") == "retracted":
        return {k: v for k, v in payload.items() if k != "text"}
    return payload


def retraction_payload(event: EpisodeRetracted) -> dict:
    return {
        "user_id": event.user_id,
        "kind": "episode",
        "episode_id": event.episode_id,
        "status": "retracted",
        "retraction_reason": event.reason,
        "retracted_at": event.occurred_at,
        "depth": 0,
    }


def stripped(recorded: EpisodeRecorded | None, retraction: EpisodeRetracted) -> dict:
    """A retracted episode's payload: what stripping its point would leave."""
    kept = {k: v for k, v in episode_payload(recorded).items() if k != "text"} if recorded else {}
    return {**kept, **retraction_payload(retraction)}


@dataclass
class Projected:
    upserted: int = 0
    retracted: int = 0

    def __add__(self, other: "Projected") -> "Projected":
        return Projected(self.upserted + other.upserted, self.retracted + other.retracted)


class EpisodeProjector:
    """Applies batches of validated episode events to the view (the I/O shell).

    An erasure takes the episode's text once the proof of its walk is in
    the view (ReflectionProjector takes it when the proof comes second):
    until the walk, which runs after the cycles asked before the erasure,
    they still read the text, so an erasure does not make beliefs depend on
    timing, and no read serves the episode meanwhile. The same holds for a
    replay (a rebuild, a catch-up, a compaction's copy brought up to date):
    a view swapped in before the walk reads as the live one would.

    `forget_now`: whether a forget (UserForgotten) takes the user's episodes
    here. The live pipeline leaves it to the forget itself, in the user's
    request order; a replay takes it where it was logged: the old life's
    beliefs go with the forget's proof whatever its cycles read."""

    def __init__(self, view: VectorStore, embedder: Embedder, forget_now: bool = True,
                 unseen: Callable[[str], bool] | None = None) -> None:
        self.view = view
        self.embedder = embedder
        self.forget_now = forget_now
        self.unseen = unseen  # episodes no cycle may read (a replay's `without`): gone where they were logged

    def apply(self, events: Sequence[Event], positions: Sequence[int] | None = None) -> Projected:
        """`positions`: each event's offset in the episodes topic (see
        processors/ports.py, POSITION); an episode keeps the first it was seen
        at, so a redelivery or a retried write never moves it later."""
        if not events:
            return Projected()
        if any(isinstance(e, UserForgotten) for e in events):
            return self._around_forgets(events, positions)
        proofs = [proof_point(e) for e in events if isinstance(e, EpisodeRetracted) and erases(e)]
        held = self.view.get(list({*map(episode_point, events), *(forgotten_point(e.user_id) for e in events),
                                   *proofs}))
        proved = {pid for pid in proofs if pid in held}
        events, positions = remembered(events, positions, held, "before", (EpisodeRecorded,))
        known = {pid: p for pid, p in held.items() if p.get("kind") == "episode"}
        retracted = {pid for pid, p in known.items() if p.get("status") == "retracted"}
        plan = plan_episodes(events, retracted)
        first = first_positions(events, positions, known)
        # A retracted episode keeps its text and vector (an erased one until
        # its walk's proof), marked with the retraction's position:
        # a cycle asked before the retraction still reads it (processors/ports.py,
        # GONE), whenever it runs, and in whatever batches the log was projected.
        kept = [plan.retracted_records[episode_point(e)] for e in plan.retractions
                if not self._proved(e, proved) and episode_point(e) not in known
                and episode_point(e) in plan.retracted_records]
        texts = [*plan.upserts, *kept]
        if texts:
            vectors = self.embedder.embed([e.text for e in texts])
            payloads = [self._hidden(e, positioned(episode_payload(e), first, e)) for e in texts]
            self.view.upsert([ViewPoint(episode_point(e), vec, payload)
                              for e, vec, payload in zip(texts, vectors, payloads)])
        at = dict(zip(map(id, events), positions or ()))
        for event in plan.retractions:
            self._retract(event, known, plan, at.get(id(event)), first, proved)
        # No flush per batch: Qdrant Edge writes each update to its WAL first,
        # which survived SIGKILL here; flushing every batch halved throughput.
        return Projected(len(plan.upserts), len(plan.retractions))

    def _around_forgets(self, events: Sequence[Event], positions: Sequence[int] | None) -> Projected:
        """The batch in the runs between its forgets, each forget where it was logged."""
        done, start = Projected(), 0
        for i, event in enumerate(events):
            if isinstance(event, UserForgotten):
                done += self.apply(events[start:i], positions and positions[start:i])
                if self.forget_now:
                    self.forget(event, positions[i] if positions else None)
                start = i + 1
        return done + self.apply(events[start:], positions and positions[start:])

    def forget(self, event: UserForgotten, before: int | None) -> None:
        """The user's episodes logged before the forget, gone (a replay: the
        live path's forget runs in the user's request order, and destroys the
        keys, so the user's beliefs and cycles never come back in a replay)."""
        self.view.forget([event.user_id], kinds=["episode"], before=before)
        pid = forgotten_point(event.user_id)
        if self.view.get([pid]).get(pid, {}).get("forget_id") != event.event_id:  # the live forget's says more
            self.view.upsert([ViewPoint(pid, None, forgotten_payload(event, before))])

    def _hidden(self, event: EpisodeRecorded, payload: dict) -> dict:
        """As if retracted where it was logged: a cycle asked before never saw
        it (POSITION), one asked after reads it as gone (GONE)."""
        if self.unseen is None or not self.unseen(event.episode_id) or POSITION not in payload:
            return payload
        return {**payload, GONE: payload[POSITION]}

    @staticmethod
    def _proved(event: EpisodeRetracted, proved: set[str]) -> bool:
        """An erasure whose walk is done: its text goes now."""
        return erases(event) and proof_point(event) in proved

    def _retract(self, event: EpisodeRetracted, known: dict, plan: Plan, at: int | None, first: dict,
                 proved: set[str]) -> None:
        pid = episode_point(event)
        gone = known.get(pid, {}).get(GONE, at)  # an erasure after a retraction: still gone since the first
        keys = retraction_payload(event) | ({} if gone is None else {GONE: gone})
        recorded = plan.retracted_records.get(pid)
        if not self._proved(event, proved) and (pid in known or recorded is not None):
            self.view.patch([pid], keys)
        elif pid in known:
            self.view.strip([pid], keys, drop=["text"])
        else:
            # A retraction of an episode the view never saw leaves a tombstone, so
            # the EpisodeRecorded that may still arrive cannot resurrect it.
            payload = stripped(recorded, event)
            if recorded is not None:
                payload = positioned(payload, first, recorded)
            self.view.upsert([ViewPoint(pid, None, payload | keys)])



LIVE_HISTORY = 32  # newest "live" entries (reinforcements) a belief's history keeps: see bounded_history


def lineage(payload: dict) -> list[str]:
    """Every record a belief has ever cited (evidence_ids shows the newest
    part): the walk of a retraction follows it. A belief projected before
    lineage was kept has its shown evidence only."""
    return payload.get("lineage_ids") or list(payload.get("evidence_ids", ()))


def support_of(support: int | None, evidence_ids) -> int:
    """Distinct evidence a belief has ever cited. A belief (or event) from
    before `support` was counted merged all its evidence into evidence_ids."""
    return support or len(evidence_ids)


def reflection_payload(event: ReflectionCreated) -> dict:
    return ({"supersedes": event.supersedes} if event.supersedes else {}) | {
        "user_id": event.user_id,
        "kind": "reflection",
        "reflection_id": event.reflection_id,
        "cycle_id": event.cycle_id,
        "text": event.text,
        "evidence_ids": list(event.evidence_ids),
        "lineage_ids": list(dict.fromkeys((*event.evidence_ids, *(event.lineage_ids or ())))),
        "support": support_of(event.support, event.evidence_ids),
        "depth": event.depth,
        "importance": event.importance,
        "confidence": event.confidence,
        "question": event.question,
        "reasoner": event.reasoner,
        "prompt_version": event.prompt_version,
        "status": "live",
        "occurred_at": event.occurred_at,
        "valid_from": event.occurred_at,
        "supported_at": event.supported_at or event.occurred_at,  # the staleness horizon counts from it
        "recorded_at": event.recorded_at,
        "created_at": event.recorded_at,
        # Transaction-time changes, for reads as of an earlier time; each names
        # its event, so applying an event again is recognised (see change).
        "history": [{"at": event.recorded_at, "status": "live", "confidence": event.confidence,
                     "event_id": event.event_id}],
    }


def erasure_payload(event: ErasureCompleted) -> dict:
    payload = {"user_id": event.user_id, "kind": "erasure", "erasure_id": event.erasure_id, "scope": event.scope,
               "episode_id": event.episode_id, "episodes": list(event.episodes), "beliefs": list(event.beliefs),
               "keys": list(event.keys), "cycles": list(event.cycles), "occurred_at": event.occurred_at,
               "completed_at": event.recorded_at}
    return payload if event.points is None else {**payload, "points": event.points}


def cycle_payload(event: ReflectionCycleCompleted | ReflectionChallenged) -> dict:
    """A cycle as the view keeps it: what it read, by id (an erasure of any of
    them finds the cycle, and destroys the key its texts are sealed under). A
    challenge cycle read the belief, which an erasure of its evidence takes,
    and the challengers."""
    read = event.read_ids if isinstance(event, ReflectionCycleCompleted) else \
        (event.reflection_id, *event.challenger_ids)
    return {"user_id": event.user_id, "kind": "cycle", "cycle_id": event.cycle_id,
            "read_ids": list(read or ()), "occurred_at": event.occurred_at}


def bounded_history(history: list[dict], live: int = LIVE_HISTORY) -> list[dict]:
    """A belief's history without its oldest reinforcements, in order. Kept:
    every entry that is not "live" (weakenings, the invalidation: few, and
    what a read as of an earlier time must not miss), the first (the creation,
    so a read as of a time whose reinforcements were dropped shows the
    confidence held before them, never the current one) and the newest `live`
    reinforcements. A repeat of a dropped reinforcement is still recognised:
    its support is not above the belief's."""
    lives = [i for i, entry in enumerate(history) if entry["status"] == "live"]
    dropped = set(lives[1:-live])
    return [entry for i, entry in enumerate(history) if i not in dropped]


def change(payload: dict, event) -> tuple[dict, bool]:
    """The payload keys an event sets on a projected belief, and whether its
    text and vector go (an erasure); ({}, False) when it changes nothing.

    Idempotent and order-safe: an event already in the history (a redelivery,
    or the writer's own write to the view before publishing) changes nothing,
    nor does a reinforcement that does not raise the belief's support (an older
    one arriving late, which would undo a newer reinforcement or weakening).
    Invalid is terminal: later events of an invalid belief change nothing."""
    if any(entry.get("event_id") == event.event_id for entry in payload.get("history", ())):
        return {}, False
    if payload.get("status") == "invalid":  # terminal, but an erasure still takes the text
        erased = isinstance(event, ReflectionInvalidated) and bool(event.erased)
        return ({"erased_at": event.expired_at}, True) if erased else ({}, False)
    if isinstance(event, ReflectionChallenged):
        return challenged(payload, event), False
    if isinstance(event, ReflectionStaled):
        return staled(payload, event), False
    if isinstance(event, ReflectionReinforced):
        support = support_of(event.support, event.evidence_ids)
        held = lineage(payload)
        grown = list(dict.fromkeys((*held, *event.evidence_ids, *event.added_evidence_ids)))
        if support <= support_of(payload.get("support"), payload.get("evidence_ids", ())):
            return ({"lineage_ids": grown} if len(grown) > len(held) else {}), False  # late, but cited all the same
        return {"evidence_ids": list(event.evidence_ids), "lineage_ids": grown, "confidence": event.confidence,
                "support": support,
                "reinforced_at": event.recorded_at,
                "supported_at": latest(payload.get("supported_at"), event.supported_at),
                "history": _logged(payload, event, event.recorded_at, "live", event.confidence)}, False
    keys = {"confidence": event.confidence or 0.0,
            "history": _logged(payload, event, event.expired_at, event.status, event.confidence or 0.0),
            "lost_evidence_ids": sorted({*payload.get("lost_evidence_ids", ()),
                                         *(e for e in payload.get("evidence_ids", ())
                                           if e not in (event.surviving_evidence_ids or ()))})}
    if event.status == "invalid":
        keys.update(status="invalid", invalid_at=event.invalid_at, expired_at=event.expired_at,
                    invalidated_by=event.cause, invalidation_path=list(event.path))
    else:
        keys.update(weakened_at=event.expired_at)
    return keys, bool(event.erased) and event.status == "invalid"


def latest(*times: str | None) -> str | None:
    """The latest of RFC 3339 times (None where none is given): order-free, so
    events applied late or twice leave the same answer."""
    from schemas import parse_time

    given = [t for t in times if t]
    return max(given, key=parse_time) if given else None


def challenged(payload: dict, event: ReflectionChallenged) -> dict:
    """A challenge that superseded the belief (refined, contradicted): its
    cause and successor, the belief kept with its history so `as_of` before
    the change still shows it held. Superseded is terminal here. Other
    verdicts change nothing in the view (holds reinforces by its own event):
    a key set by every challenge would be set back by a catch-up replay."""
    if event.outcome != "ok" or event.status != "superseded" or payload.get("status") not in ("live", "stale"):
        return {}
    return {"status": "superseded", "superseded_at": event.occurred_at, "superseded_by": event.successor_id,
            "superseded_cause": list(event.cited_ids or ()), "superseded_verdict": event.verdict,
            "superseded_cycle": event.cycle_id,
            "history": _logged(payload, event, event.recorded_at, "superseded", float(payload.get("confidence", 0.0)))}


def staled(payload: dict, event: ReflectionStaled) -> dict:
    """Stale (the stream passed the horizon) or live again (fresh support);
    only a live belief goes stale, only a stale one comes back."""
    if payload.get("status") != ("live" if event.stale else "stale"):
        return {}
    status = "stale" if event.stale else "live"
    return {"status": status, "supported_at": event.supported_at,
            ("stale_at" if event.stale else "refreshed_at"): event.occurred_at,
            "history": _logged(payload, event, event.recorded_at, status, float(payload.get("confidence", 0.0)))}


def _logged(payload: dict, event: Event, at: str, status: str, confidence: float) -> list[dict]:
    entry = {"at": at, "status": status, "confidence": confidence, "event_id": event.event_id}
    return bounded_history([*payload.get("history", ()), entry])


class ReflectionProjector:
    """ReflectionCreated → a point (kind=reflection); Reinforced → the evidence it
    keeps and its support; Invalidated → weakened, or invalid (and, after an
    erasure, without text); ErasureCompleted → its proof (kind=erasure);
    CycleCompleted → what the cycle read (kind=cycle).
    Applying an event again changes nothing.

    `erase_now`: whether the proof of a forget (ErasureCompleted, scope user)
    drops the user's beliefs and cycles here. The live pipeline's forget did
    already, and a belief of the user's new life may be in the view before
    this reads the proof; a replay (a rebuild, a catch-up, a compaction's
    copy) reads the user's partition in order, so drops what came before."""

    def __init__(self, view: VectorStore, embedder: Embedder, erase_now: bool = True) -> None:
        self.view = view
        self.embedder = embedder
        self.erase_now = erase_now

    def apply(self, events: Sequence[Event], positions: Sequence[int] | None = None) -> int:
        """`positions`: each event's offset in `reflections`, if read from
        there: what a forget took is not brought back by a batch read before
        it and projected after (`forgotten_point`)."""
        at, done, start = list(positions) if positions else None, 0, 0
        for i, event in enumerate(events):
            if self.erase_now and isinstance(event, ErasureCompleted) and event.scope == "user":
                done += self._apply(events[start:i], at and at[start:i])
                self.view.forget([event.user_id], kinds=["reflection", "cycle"])  # what came before it
                start = i
        done += self._apply(events[start:], at and at[start:])
        if self.erase_now:
            self._erased([e for e in events if isinstance(e, ErasureCompleted) and e.scope == "episode"])
        return done

    def _erased(self, proofs: list[ErasureCompleted]) -> None:
        """The episodes a proof says lost their text, without it: a copy of
        the view taken before the walk stripped them (a compaction's) and
        brought up to date from the log reads so from the proof."""
        pids = [point_id("episode", p.user_id, e) for p in proofs for e in p.episodes]
        held = [pid for pid, payload in self.view.get(pids).items() if "text" in payload]
        self.view.strip(held, {"retraction_reason": "erasure"}, drop=["text"])

    def _apply(self, events: Sequence[Event], positions: Sequence[int] | None) -> int:
        if positions:
            markers = self.view.get(list({forgotten_point(e.user_id) for e in events}))
            events, _ = remembered(events, positions, markers, "reflections_before", FORGOTTEN_WITH_USER)
        created = {point_id("reflection", e.user_id, e.reflection_id): e
                   for e in events if isinstance(e, ReflectionCreated)}
        known = self.view.get(list(created))
        fresh = {pid: e for pid, e in created.items() if pid not in known}  # replay: leave status as is
        if fresh:
            vectors = self.embedder.embed([e.text for e in fresh.values()])
            self.view.upsert([ViewPoint(pid, vec, reflection_payload(e))
                              for (pid, e), vec in zip(fresh.items(), vectors)])
        proofs = [e for e in events if isinstance(e, ErasureCompleted)]
        if proofs:  # no vector: found by id only (`reflect explain --erasure`), never by a search
            self.view.upsert([ViewPoint(point_id("erasure", e.user_id, e.erasure_id), None, erasure_payload(e))
                              for e in proofs])
        cycles = [e for e in events if isinstance(e, ReflectionCycleCompleted) and e.read_ids
                  or isinstance(e, ReflectionChallenged) and (e.reason or e.error)]
        if cycles:  # no vector either: found by what they read, by an erasure's walk
            self.view.upsert([ViewPoint(point_id("cycle", e.user_id, e.cycle_id), None, cycle_payload(e))
                              for e in cycles])
        for e in events:
            if isinstance(e, CHANGES):
                pid = point_id("reflection", e.user_id, e.reflection_id)
                payload = self.view.get([pid]).get(pid)
                if payload is None:
                    continue  # not projected (its Created was dead-lettered): nothing to change
                keys, erase = change(payload, e)
                if erase:
                    self.view.strip([pid], keys, drop=["text", "question"])
                elif keys:
                    self.view.patch([pid], keys)
        return len(events)
