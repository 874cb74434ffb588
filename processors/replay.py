"""Replay lab: what a replay of the log keeps, what it would cost, and what
changed between two views' beliefs (pure; the side worker and the routes
are in streams/worker/replay.py).

A replay re-derives beliefs from the episodes log into a side view, under
another reasoner or prompt, or another history: only some users
(`users`), the log as it stood at a time (`until`: records logged after it
are left out), or without some episodes (`without`). An episode left out by
`without` is still counted by the trigger, so every cycle is asked where the
live one was and reads the same window less that episode: what changes is
what the episode's words decided, which is what its retraction would undo.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable

from processors.accumulator import Accumulator, Trigger, admit
from schemas import EpisodeRecorded, Event, ReflectionInvalidated, parse_time

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
REASONERS = ("offline", "anthropic")
CHARS_PER_TOKEN = 4  # the usual rough rate for English text
PROMPT_TOKENS = 1_500  # a call's instructions and tool schema, beside the statements
CALLS_PER_CYCLE = 2  # questions, then insights
MAX_BUDGET = 10**12  # tokens: beyond any real budget, within a JSON integer


class ReplayError(ValueError):
    """A replay asked for with a setting that cannot be honoured."""


@dataclass(frozen=True)
class ReplaySpec:
    name: str
    reasoner: str = "offline"
    users: tuple[str, ...] = ()
    without: tuple[str, ...] = ()
    until: str | None = None  # RFC 3339: records logged after it are left out
    budget_tokens: int = 0  # 0: no limit
    prompt_version: str | None = None  # the anthropic reasoner's prompt set, by version or library folder

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ReplayError("a replay's name is 1 to 40 of a-z 0-9 _ -, starting with a letter or digit")
        if self.reasoner not in REASONERS:
            raise ReplayError(f"reasoner must be one of {', '.join(REASONERS)}")
        if self.prompt_version is not None and (self.reasoner != "anthropic" or not NAME.fullmatch(
                self.prompt_version)):
            raise ReplayError("prompt_version chooses among the anthropic reasoner's prompt sets (the offline "
                              "reasoner has one): a version or a folder name, 1 to 40 of a-z 0-9 _ -")
        if self.until is not None:
            try:
                at = parse_time(self.until)
            except ValueError:
                at = None
            if at is None or at.tzinfo is None:
                raise ReplayError("until must be an RFC 3339 time with a zone, e.g. 2026-06-01T09:00:00Z")

    @property
    def until_ts(self) -> float | None:
        return None if self.until is None else parse_time(self.until).timestamp()

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ReplaySpec":
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ReplayError(f"unknown field(s): {', '.join(sorted(unknown))}")
        values = dict(raw)
        for key in ("users", "without"):
            items = values.get(key, ())
            if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) and i for i in items):
                raise ReplayError(f"{key} must be a list of ids")
            values[key] = tuple(dict.fromkeys(items))
        if not isinstance(values.get("name"), str):
            raise ReplayError("a replay needs a name")
        for key in ("reasoner", "until", "prompt_version"):
            if values.get(key) is not None and not isinstance(values[key], str):
                raise ReplayError(f"{key} must be a string")
        budget = values.get("budget_tokens", 0)
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget != int(budget) \
                or not 0 <= budget <= MAX_BUDGET:
            raise ReplayError(f"budget_tokens must be an integer from 0 (no limit) to {MAX_BUDGET}")
        values["budget_tokens"] = int(budget)
        return cls(**values)

    def keeps(self, user_id: str, logged_at: float | None) -> bool:
        """Whether a record of `user_id`, logged at `logged_at` (epoch
        seconds), is part of the replayed history at all."""
        if self.users and user_id not in self.users:
            return False
        until = self.until_ts
        return until is None or logged_at is None or logged_at <= until

    def unseen(self, episode_id: str) -> bool:
        """Whether the cycles must never read this episode (`without`)."""
        return episode_id in self.without


@dataclass
class Estimate:
    """What a replay of a log would ask of its reasoner, before it runs."""
    users: list[str] = field(default_factory=list)
    episodes: int = 0
    cycles: int = 0
    tokens: int = 0  # estimated; 0 for the offline reasoner, which pays none

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(spec: ReplaySpec, records: Iterable[tuple[Event, float | None]], trigger: Trigger) -> Estimate:
    """Users, episodes and cycles of the replayed history, folded as the
    trigger folds them, and the tokens its cycles would take: each cycle's
    window of statements, twice (questions, then insights), and a prompt."""
    states: dict[str, Accumulator] = {}
    chars: dict[str, int] = {}
    out = Estimate()
    tokens = 0
    for event, logged_at in records:
        if not spec.keeps(event.user_id, logged_at):
            continue
        user = event.user_id
        acc, request = admit(states.get(user, Accumulator()), event, trigger)
        states[user] = acc
        if isinstance(event, EpisodeRecorded):
            out.episodes += 1
            chars[user] = chars.get(user, 0) + len(event.text)
        if request is not None:
            out.cycles += 1
            window = len(acc.recent) * chars.get(user, 0) / max(acc.episodes, 1)  # at the mean length
            tokens += CALLS_PER_CYCLE * (PROMPT_TOKENS + int(window / CHARS_PER_TOKEN))
    out.users = sorted(states)
    out.tokens = tokens if spec.reasoner != "offline" else 0
    return out


SHOWN = ("text", "status", "evidence_ids")  # what makes two versions of a belief differ
LIVE = ("live", "weakened")  # statuses of a belief a view holds


@dataclass
class Diff:
    added: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    same: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def empty(self) -> bool:
        return not (self.added or self.dropped or self.changed)


def _shown(belief: dict[str, Any]) -> dict[str, Any]:
    return {"user_id": belief["user_id"], "reflection_id": belief["reflection_id"], "text": belief.get("text"),
            "status": belief.get("status"), "evidence_ids": sorted(belief.get("evidence_ids") or ())}


def _overlap(one: set[str], other: set[str]) -> float:
    return len(one & other) / len(one | other) if one | other else 0.0


PAIRED = 0.5  # evidence overlap (Jaccard) at which two beliefs of one user are one belief, renamed


def diff(base: Iterable[dict[str, Any]], other: Iterable[dict[str, Any]]) -> Diff:
    """`other`'s beliefs against `base`'s.

    A belief's id names its cycle and evidence, so a belief re-derived with
    other evidence has another id, and so has every belief citing it. So,
    depth by depth: a belief of `base` without its id in `other` is paired
    with the belief of `other` of the same user whose evidence, read through
    the pairs found so far, overlaps it most (PAIRED or more); that is one
    belief renamed. A pair, or a belief with the same id in both, is `same`
    if its text, status and evidence (through the pairs) are, else
    `changed` (with `before`: what differed). What is left is `dropped`
    (held only in base) or `added` (held only in other); a belief one view
    no longer holds and the other never had is in neither. Sorted by user,
    then id."""
    mine = {(b["user_id"], b["reflection_id"]): b for b in base}
    theirs = {(b["user_id"], b["reflection_id"]): b for b in other}
    # A belief no longer held (invalid, superseded) that the other view never had: neither holds it.
    mine = {k: b for k, b in mine.items() if k in theirs or b.get("status") in LIVE}
    theirs = {k: b for k, b in theirs.items() if k in mine or b.get("status") in LIVE}
    renamed: dict[tuple[str, str], str] = {}  # other's key → base's id

    def evidence(key: tuple[str, str]) -> set[str]:
        return {renamed.get((key[0], e), e) for e in theirs[key].get("evidence_ids") or ()}

    pairs = [(key, key) for key in mine.keys() & theirs.keys()]
    left = sorted(mine.keys() - theirs.keys(), key=lambda k: (mine[k].get("depth", 1), k))
    right = sorted(theirs.keys() - mine.keys())
    for key in left:
        own = set(mine[key].get("evidence_ids") or ())
        score, match = max(((_overlap(own, evidence(k)), k) for k in right if k[0] == key[0]),
                           default=(0.0, None))
        if match is not None and score >= PAIRED:
            right.remove(match)
            renamed[match] = key[1]
            pairs.append((key, match))
    out = Diff()
    paired = {a for a, _ in pairs}
    for key, match in sorted(pairs):
        before = _shown(mine[key])
        after = {**_shown(theirs[match]), "evidence_ids": sorted(evidence(match))}
        if before == {**after, "reflection_id": before["reflection_id"]}:
            out.same += 1
            continue
        differs = {k: before[k] for k in ("reflection_id", *SHOWN) if before[k] != after[k]}
        out.changed.append({**after, "before": differs})  # evidence named as in base, through the pairs
    out.dropped = [_shown(mine[k]) for k in left if k not in paired]
    out.added = [_shown(theirs[k]) for k in right]
    return out


def promotion(name: str, live: Iterable[dict[str, Any]], side: Iterable[dict[str, Any]],
              side_events: Iterable[Event], at: str) -> list[Event]:
    """What the live reflections log needs so that projecting it holds the
    side view's beliefs: every event the side logged for a belief the live
    view lacks (each keeps its event id, so a second promotion changes
    nothing), and an invalidation of every live belief the side view does
    not hold. By id, not by the diff's pairs: a belief re-derived under
    another id replaces the old one, and so does every belief citing it. A
    belief both hold under one id is the same cycle's over the same
    evidence: the live log keeps its own later events (a reinforcement
    cannot be taken back by an event)."""
    mine = {(b["user_id"], b["reflection_id"]): _shown(b) for b in live}
    theirs = {(b["user_id"], b["reflection_id"]): _shown(b) for b in side}
    out: list[Event] = [e for e in side_events
                        if (e.user_id, getattr(e, "reflection_id", None)) in theirs.keys() - mine.keys()]
    cause = f"replay:{name}"
    for (user, rid), shown in sorted(mine.items()):
        if (user, rid) not in theirs and shown["status"] in LIVE:
            out.append(ReflectionInvalidated(event_id=f"invalidated:{rid}:{cause}", user_id=user, reflection_id=rid,
                                             cause=cause, path=(cause, rid), status="invalid", invalid_at=at,
                                             expired_at=at))
    return out
