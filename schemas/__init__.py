"""Reflect's public event contracts.

The JSON Schema files in ``schemas/v1/`` are the contract downstream subscribers
rely on; this module holds the matching Python records and the one validator
every edge uses (producer API, HTTP, the workers' decoders), so a record the
Python side accepts is exactly one the schema files accept.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from typing import Any, ClassVar

import fastjsonschema
import orjson

SCHEMA_VERSION = 1
EVENT_TYPES = (
    "EpisodeRecorded",
    "EpisodeRetracted",
    "ReflectionRequested",
    "ReflectionCreated",
    "ReflectionReinforced",
    "ReflectionInvalidated",
    "ReflectionCycleCompleted",
    "ChallengeRequested",
    "ReflectionChallenged",
    "ReflectionStaled",
    "InvalidationRequested",
    "GateRequested",
    "ErasureCompleted",
    "UserForgotten",
)
PAYLOAD = "(payload)"  # the field name used when the bytes themselves are wrong
# Levels of objects and arrays in one event, the event object itself included.
# The view stores a payload nested 127 levels deep but cannot read it back
# (Qdrant's payload decoder stops at 128: every search and scroll of that user
# then fails), orjson writes at most 254, and Python's recursion limit ends
# near 1000: an event nested deeper than this is refused here, naming its field.
MAX_NESTING = 64


class ContractError(ValueError):
    """An event that breaks its contract; ``field`` names where (dotted path)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def now() -> str:
    """RFC 3339 UTC timestamp with microseconds, the format every event uses."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def new_id() -> str:
    return uuid.uuid4().hex


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, kw_only=True)
class Event:
    TYPE: ClassVar[str] = ""
    event_id: str = field(default_factory=new_id)
    user_id: str
    occurred_at: str = field(default_factory=now)
    recorded_at: str = field(default_factory=now)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def encode(self) -> bytes:
        """Validated orjson bytes; raises ContractError naming the bad field."""
        data = self.to_dict()
        check(data)
        return orjson.dumps(data)


class SealedText:
    """An event whose texts may travel sealed (streams/shredding.py): then
    they are empty here and absent on the wire."""
    TYPE: ClassVar[str]
    sealed: dict[str, str] | None

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()  # type: ignore[misc]
        if self.sealed is not None:
            for name in SEALED_FIELDS[self.TYPE]:
                if not out.get(name):
                    out.pop(name, None)
        return out


@dataclass(frozen=True, kw_only=True)
class EpisodeRecorded(SealedText, Event):
    TYPE: ClassVar[str] = "EpisodeRecorded"
    episode_id: str = field(default_factory=new_id)
    text: str = ""  # "" only while sealed
    importance: float
    source: str | None = None
    metadata: dict[str, Any] | None = None
    sealed: dict[str, str] | None = None  # text, source and metadata under the episode's key: streams/shredding.py


@dataclass(frozen=True, kw_only=True)
class EpisodeRetracted(Event):
    TYPE: ClassVar[str] = "EpisodeRetracted"
    episode_id: str
    reason: str = "incorrect"


@dataclass(frozen=True, kw_only=True)
class ReflectionRequested(Event):
    TYPE: ClassVar[str] = "ReflectionRequested"
    cycle_id: str
    why: str
    pending_importance: float | None = None
    reflection_id: str | None = None
    evidence_ids: tuple[str, ...] | None = None
    window_episode_ids: tuple[str, ...] | None = None
    window_reflection_ids: tuple[str, ...] | None = None
    sequence: int | None = None
    position: int | None = None  # the offset in `episodes` of the record that asked for it


@dataclass(frozen=True, kw_only=True)
class ReflectionCreated(SealedText, Event):
    TYPE: ClassVar[str] = "ReflectionCreated"
    reflection_id: str
    cycle_id: str
    text: str = ""  # "" only while sealed
    evidence_ids: tuple[str, ...]
    depth: int
    importance: float
    confidence: float
    reasoner: str
    prompt_version: str
    question: str | None = None
    support: int | None = None  # distinct evidence ever cited (evidence_ids keeps a bounded part)
    supersedes: str | None = None  # a challenge's successor: the belief it replaces
    supported_at: str | None = None  # valid time of its newest evidence
    lineage_ids: tuple[str, ...] | None = None  # every record cited, when evidence_ids shows fewer
    sealed: dict[str, str] | None = None  # text and question under the belief's key: streams/shredding.py


@dataclass(frozen=True, kw_only=True)
class ReflectionReinforced(Event):
    TYPE: ClassVar[str] = "ReflectionReinforced"
    reflection_id: str
    cycle_id: str
    evidence_ids: tuple[str, ...]
    added_evidence_ids: tuple[str, ...]
    confidence: float
    similarity: float | None = None
    support: int | None = None  # distinct evidence ever cited, this reinforcement's included
    supported_at: str | None = None  # valid time of the newest evidence it adds


@dataclass(frozen=True, kw_only=True)
class ReflectionInvalidated(Event):
    TYPE: ClassVar[str] = "ReflectionInvalidated"
    reflection_id: str
    cause: str
    path: tuple[str, ...]
    status: str
    invalid_at: str
    expired_at: str
    confidence: float | None = None
    surviving_evidence_ids: tuple[str, ...] | None = None
    erased: bool | None = None


@dataclass(frozen=True, kw_only=True)
class ReflectionCycleCompleted(SealedText, Event):
    TYPE: ClassVar[str] = "ReflectionCycleCompleted"
    cycle_id: str
    why: str
    questions: tuple[str, ...] = ()  # () while sealed
    kept: int
    dropped: int
    duration_ms: float
    outcome: str
    reasoner: str
    usage: dict[str, Any]
    reinforced: int | None = None
    error: str | None = None
    drops: tuple[dict[str, str], ...] | None = None  # why each dropped insight was dropped (the first 64)
    read_ids: tuple[str, ...] | None = None  # every record the cycle read: its window and the evidence shown
    sealed: dict[str, str] | None = None  # questions, drops and error under the cycle's key: streams/shredding.py


@dataclass(frozen=True, kw_only=True)
class ChallengeRequested(Event):
    """The contradiction gate asks for a challenge cycle: does a live belief
    still hold, given new episodes that bear on it (processors/challenge.py)?"""
    TYPE: ClassVar[str] = "ChallengeRequested"
    cycle_id: str
    reflection_id: str
    challenger_ids: tuple[str, ...]
    similarity: float
    sequence: int | None = None
    position: int | None = None  # as in ReflectionRequested


@dataclass(frozen=True, kw_only=True)
class InvalidationRequested(Event):
    """A retraction forwarded to the reflector's queue: its provenance walk
    runs in the user's request order (streams/worker/pipeline/requests.py)."""
    TYPE: ClassVar[str] = "InvalidationRequested"
    episode_id: str
    reason: str
    retraction_id: str
    sequence: int | None = None
    position: int | None = None

    def retraction(self) -> EpisodeRetracted:
        return EpisodeRetracted(event_id=self.retraction_id, user_id=self.user_id, episode_id=self.episode_id,
                                reason=self.reason, occurred_at=self.occurred_at, recorded_at=self.recorded_at)


@dataclass(frozen=True, kw_only=True)
class GateRequested(Event):
    """A run of a user's new episodes forwarded to the reflector's queue for
    the contradiction and staleness gates, which judge it in the user's
    request order: against the beliefs of every cycle asked before it, with
    ingest never waiting for one (streams/worker/pipeline/requests.py)."""
    TYPE: ClassVar[str] = "GateRequested"
    episodes: tuple[dict[str, Any], ...]  # the run in log order: {"id", "occurred_at", "position"}
    recent: tuple[dict[str, Any], ...]  # the user's recent window as of the run's last episode: {"id", "occurred_at"}
    sequence: int | None = None  # among the user's gate runs (not the request sequence: see the schema)
    position: int | None = None  # the offset of the run's last episode


@dataclass(frozen=True, kw_only=True)
class ReflectionChallenged(SealedText, Event):
    """The audit record and verdict of one challenge cycle; with verdict refined
    or contradicted it also supersedes the belief (no longer served)."""
    TYPE: ClassVar[str] = "ReflectionChallenged"
    cycle_id: str
    reflection_id: str
    challenger_ids: tuple[str, ...]
    outcome: str  # ok | moot | failed | unavailable | refused
    reasoner: str
    usage: dict[str, Any]
    duration_ms: float
    verdict: str | None = None  # holds | refined | contradicted | unrelated (outcome ok only)
    cited_ids: tuple[str, ...] | None = None  # the challengers the verdict rests on
    successor_id: str | None = None
    status: str | None = None  # the belief's status after it: live | stale | superseded
    heuristic: bool | None = None
    reason: str | None = None
    error: str | None = None
    sealed: dict[str, str] | None = None  # reason and error under the cycle's key: streams/shredding.py


@dataclass(frozen=True, kw_only=True)
class ReflectionStaled(Event):
    """A belief's newest support fell behind the user's stream by the staleness
    horizon (stale=True), or a revalidation found fresh support (stale=False).
    occurred_at is valid time: when the stream passed the horizon."""
    TYPE: ClassVar[str] = "ReflectionStaled"
    reflection_id: str
    stale: bool
    supported_at: str  # valid time of the belief's newest support
    horizon_days: float
    cause: str  # the episode that moved the stream past the horizon, or the revalidating cycle


@dataclass(frozen=True, kw_only=True)
class ErasureCompleted(Event):
    """The proof of an erasure (an EpisodeRetracted with reason erasure, or a
    UserForgotten), published once it is carried out: what it took the text
    of — for an episode's, the episode, if the view held it, and every belief
    invalidated for resting on it, at any depth the walk reaches; for a
    user's, how many points left the view — and the key scopes destroyed
    (its text on the log no longer opens). Ids only: it carries no text."""
    TYPE: ClassVar[str] = "ErasureCompleted"
    erasure_id: str  # the EpisodeRetracted's (or UserForgotten's) event id
    episode_id: str | None = None  # None when a whole user was forgotten
    episodes: tuple[str, ...]  # episodes whose text and vector left the view
    beliefs: tuple[str, ...]  # beliefs invalidated, their text and vector gone
    keys: tuple[str, ...] = ()  # key scopes destroyed: episode:<id>, belief:<id>, cycle:<id>, user:<id>
    cycles: tuple[str, ...] = ()  # cycles that read the episode or a belief it took
    scope: str = "episode"  # episode | user (`reflect forget`)
    points: int | None = None  # a user's: the points that left the view


@dataclass(frozen=True, kw_only=True)
class UserForgotten(Event):
    """Everything of a user forgotten (`reflect forget`, DELETE /v1/users/{user}).
    Put on `episodes`, so that it is in the user's stream order, and forwarded
    to the reflector's queue numbered among the user's requests: carried out
    after the cycles asked before it (streams/worker/pipeline/requests.py)."""
    TYPE: ClassVar[str] = "UserForgotten"
    event_id: str = field(default_factory=lambda: f"forget:{new_id()}")
    sequence: int | None = None
    position: int | None = None  # its offset in the user's partition of `episodes`


RECORDS: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        EpisodeRecorded,
        EpisodeRetracted,
        ReflectionRequested,
        ReflectionCreated,
        ReflectionReinforced,
        ReflectionInvalidated,
        ReflectionCycleCompleted,
        ChallengeRequested,
        ReflectionChallenged,
        ReflectionStaled,
        InvalidationRequested,
        GateRequested,
        ErasureCompleted,
        UserForgotten,
    )
}
assert tuple(RECORDS) == EVENT_TYPES


# --------------------------------------------------------------------------- schemas


def schema_text(name: str, version: int = SCHEMA_VERSION) -> str:
    return resources.files(__name__).joinpath(f"v{version}/{name}.json").read_text("utf-8")


@cache
def _documents() -> dict[str, dict]:
    """Every schema file of this version, by its $id."""
    docs = (json.loads(schema_text(name)) for name in ("envelope", *EVENT_TYPES))
    return {doc["$id"]: doc for doc in docs}


def _inline(node: Any, doc: dict) -> Any:
    """Resolve every $ref so the compiled validator needs no resolver at run time."""
    if isinstance(node, list):
        return [_inline(x, doc) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        uri, _, pointer = node["$ref"].partition("#")
        target = _documents()[uri] if uri else doc
        owner = target
        for part in filter(None, pointer.split("/")):
            target = target[part]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **rest}, owner)
    return {k: _inline(v, doc) for k, v in node.items() if k not in ("$id", "$defs", "$schema")}


@cache
def _validator(kind: str):
    # fastjsonschema compiles the schema file to Python: ~8 µs an event where
    # jsonschema took ~350 µs, which would have capped ingest below Faust's rate.
    doc = _documents()[f"urn:reflect:schemas:v{SCHEMA_VERSION}:{kind}"]
    return fastjsonschema.compile(_inline(doc, doc), formats={"date-time": _parse_time})


def parse_time(value: str) -> datetime:
    """An RFC 3339 time of an event (Z or an offset); ValueError if it is not one."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _parse_time(value: str) -> bool:
    try:
        parse_time(value)
    except ValueError:
        return False
    return True


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    # Bounded, and text: a field name goes into headers and answers, and keys
    # can be long or carry bytes that are not UTF-8 (shown as U+FFFD).
    out = _SURROGATE.sub("\ufffd", out)
    return (out if len(out) <= 200 else out[:199] + "…") or PAYLOAD


def _field_of(error: fastjsonschema.JsonSchemaValueException) -> str:
    path = list(error.path[1:])  # path[0] is fastjsonschema's name for the root
    if error.rule == "required" and isinstance(error.value, dict):
        path.append(next(k for k in error.rule_definition if k not in error.value))
    return _path(path)


def _unencodable(value: Any, path: tuple = ()) -> tuple[str, str] | None:
    """The first value JSON cannot carry faithfully: text with bytes that are not
    UTF-8 (lone surrogates), or a number that is NaN or infinite."""
    if isinstance(value, str):
        return (_path(path), "is not valid UTF-8") if _SURROGATE.search(value) else None
    if isinstance(value, float):
        return None if math.isfinite(value) else (_path(path), f"must be a finite number (got {value})")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        if isinstance(k, str) and _SURROGATE.search(k):
            return _path((*path, k)), "is not valid UTF-8"
        found = _unencodable(v, (*path, k))
        if found:
            return found
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _too_deep(data: Any) -> str | None:
    """The top-level field holding a value nested past MAX_NESTING, if any
    (iterative: a recursive walk is what deep nesting would break)."""
    stack: list[tuple[Any, int, Any]] = [(data, 1, None)]
    while stack:
        value, depth, top = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_NESTING:
                return _path((top,)) if isinstance(top, str) else PAYLOAD
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((v, depth + 1, k if top is None else top) for k, v in items)
    return None


def check(data: Any) -> str:
    """Validate one decoded event against its schema file; returns its type."""
    if not isinstance(data, dict):
        raise ContractError(PAYLOAD, f"an event is a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    if kind is None:
        raise ContractError("type", "is missing")
    if not isinstance(kind, str):
        raise ContractError("type", f"must be a string (got {type(kind).__name__})")
    if kind not in RECORDS:
        raise ContractError("type", f"unknown event type {str(kind)[:64]!r}")
    version = data.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise ContractError(
            "schema_version", f"unsupported schema_version {version} (this build reads {SCHEMA_VERSION})"
        )
    deep = _too_deep(data)
    if deep:
        raise ContractError(deep, f"is nested more than {MAX_NESTING} levels deep")
    bad = _unencodable(data) or _sealed_problem(data)
    if bad:
        raise ContractError(*bad)
    try:
        _validator(kind)(data)
    except fastjsonschema.JsonSchemaValueException as error:
        raise ContractError(_field_of(error), _reason(error)) from None
    return kind


SEALED_FIELDS = {"EpisodeRecorded": ("text", "source", "metadata"), "ReflectionCreated": ("text", "question"),
                 "ReflectionCycleCompleted": ("questions", "drops", "error"),
                 "ReflectionChallenged": ("reason", "error")}
OPTIONAL_TEXT = {"ReflectionChallenged"}  # sealed or not, its texts may be absent


def _sealed_problem(data: dict) -> tuple[str, str] | None:
    """The schemas' oneOf for a sealed text, said with the field it is about."""
    fields = SEALED_FIELDS.get(data["type"])
    if fields is None:
        return None
    if "sealed" not in data:
        return None if fields[0] in data or data["type"] in OPTIONAL_TEXT else (fields[0], "is missing")
    clear = [name for name in fields if name in data]
    return ("sealed", f"comes instead of {', '.join(fields)} (got {', '.join(clear)} too)") if clear else None


def _reason(error: fastjsonschema.JsonSchemaValueException) -> str:
    if error.rule == "required":
        return "is missing"
    shown = repr(error.value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{error.message.split(' ', 1)[-1]} (got {shown})"


def from_dict(data: Any) -> Event:
    kind = check(data)
    cls = RECORDS[kind]
    known = {f.name for f in fields(cls)}
    values: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in known}
    return cls(**values)


def decode(raw: bytes) -> Event:
    """Bytes from a topic → a validated record, or ContractError naming the field."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ContractError(PAYLOAD, f"expected bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as utf:
            # Parse leniently only to say *which* field carries the bad bytes.
            try:
                lenient = json.loads(raw.decode("utf-8", "surrogateescape"))
            except (ValueError, RecursionError):
                lenient = None
            where = _unencodable(lenient) if lenient is not None and _too_deep(lenient) is None else None
            field = where[0] if where else PAYLOAD
            raise ContractError(field, f"is not valid UTF-8 (byte {utf.start})") from None
        raise ContractError(PAYLOAD, f"is not valid JSON: {exc}") from None
    return from_dict(data)
