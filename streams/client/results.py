"""What the Reflect client returns and raises: typed views of the API's JSON.

Each result keeps the whole answer in `raw`, so a field the API gains within
v1 is reachable before this module names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ReflectError(Exception):
    """Anything the client could not get done."""


class ReflectUnreachable(ReflectError):
    """No API answered at the URL (after the retries)."""

    def __init__(self, url: str, cause: BaseException) -> None:
        super().__init__(f"no Reflect API at {url} ({type(cause).__name__}: {cause}); "
                         "start one with `reflect up`, or point REFLECT_API at one")
        self.url = url


class ReflectApiError(ReflectError):
    """The API refused the request: its status, error `code`, message and the
    `field` at fault when it names one (e.g. `importance`, `q`, `user_id`)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 retry_after: float | None = None) -> None:
        where = f" [{field}]" if field else ""
        super().__init__(f"{status} {code}{where}: {message}")
        self.status, self.code, self.message, self.field = status, code, message, field
        self.retry_after = retry_after

    @classmethod
    def from_answer(cls, status: int, body: Any, retry_after: float | None) -> "ReflectApiError":
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):  # not Reflect's error shape: a proxy, or not Reflect at all
            return _BY_STATUS.get(status, cls)(status, "http_error", f"HTTP {status} without Reflect's error body",
                                               None, retry_after)
        kind = _BY_STATUS.get(status, cls)
        return kind(status, str(error.get("code", "error")), str(error.get("message", "")), error.get("field"),
                    retry_after)


class Invalid(ReflectApiError):
    """422: a field of the request is wrong; `field` names it."""


class NotFound(ReflectApiError):
    """404: no such user, episode, belief or route."""


class Unauthorized(ReflectApiError):
    """401: no credential, or one that is expired or badly signed."""


class Forbidden(ReflectApiError):
    """403: the credential does not grant this scope or this user."""


class Unavailable(ReflectApiError):
    """503 still, after the retries: the broker, a rebalance, or a catching-up worker."""


class RateLimited(ReflectApiError):
    """429 still, after the retries: this credential is over the worker's rate limit."""


_BY_STATUS = {401: Unauthorized, 403: Forbidden, 404: NotFound, 422: Invalid, 429: RateLimited, 503: Unavailable}


def _pick(data: dict[str, Any], *names: str) -> dict[str, Any]:
    return {n: data.get(n) for n in names}


@dataclass(frozen=True)
class Accepted:
    """A write the broker acknowledged (202): visible once the worker has applied it."""
    event_id: str
    episode_id: str | None = None
    cycle_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Accepted":
        return cls(**_pick(data, "event_id", "episode_id", "cycle_id"), raw=data)


@dataclass(frozen=True)
class Belief:
    reflection_id: str
    text: str
    evidence_ids: list[str]
    depth: int
    confidence: float
    status: str
    importance: float | None = None
    created_at: str | None = None
    pinned_score: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Belief":
        return cls(**_pick(data, "reflection_id", "text", "depth", "confidence", "status", "importance",
                           "created_at", "pinned_score"),
                   evidence_ids=list(data.get("evidence_ids") or ()), raw=data)


@dataclass(frozen=True)
class Beliefs:
    """A user's live beliefs (or those held `as_of`), most pinned first."""
    user_id: str
    beliefs: list[Belief]
    freshness: dict[str, Any] | None = None
    as_of: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Beliefs":
        return cls(user_id=data["user_id"], beliefs=[Belief.from_json(b) for b in data.get("beliefs", ())],
                   freshness=data.get("freshness"), as_of=data.get("as_of"), raw=data)


@dataclass(frozen=True)
class PromptBlock:
    """Beliefs rendered for a system prompt, as observations, within a token budget."""
    user_id: str
    prompt: str
    shown: int  # beliefs in the block
    withheld: list[str]  # ids of instruction-shaped beliefs kept out of it
    budget_tokens: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "PromptBlock":
        return cls(user_id=data["user_id"], prompt=data["prompt"], shown=data.get("beliefs", 0),
                   withheld=list(data.get("withheld") or ()), budget_tokens=data.get("budget_tokens", 0), raw=data)


@dataclass(frozen=True)
class Memory:
    """One recall result: an episode or a belief (with its evidence)."""
    id: str
    kind: str
    text: str
    score: float
    occurred_at: str | None = None
    evidence_ids: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Memory":
        return cls(**_pick(data, "id", "kind", "text", "score", "occurred_at"),
                   evidence_ids=list(data.get("evidence_ids") or ()), raw=data)


@dataclass(frozen=True)
class Recall:
    """The route a question took (instance: episodes, pattern: beliefs, both when unsure), why, and what it found."""
    route: str
    reason: str
    results: list[Memory]
    freshness: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Recall":
        return cls(route=data["route"], reason=data.get("reason", ""),
                   results=[Memory.from_json(r) for r in data.get("results", ())],
                   freshness=data.get("freshness"), raw=data)


@dataclass(frozen=True)
class Explanation:
    """A belief in any status, and its provenance tree down to the episodes."""
    belief: Belief
    provenance: dict[str, Any]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Explanation":
        return cls(belief=Belief.from_json(data["belief"]), provenance=data["provenance"], raw=data)


@dataclass(frozen=True)
class Stats:
    user_id: str
    episodes: int
    retracted: int
    reflections: int
    pending_importance: float
    high_salience: int
    cycles: int  # threshold cycles (v1's meaning)
    tokens_today: int
    cycles_by_kind: dict[str, int] = field(default_factory=dict)  # threshold, manual, revalidation
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Stats":
        return cls(**_pick(data, "user_id", "episodes", "retracted", "reflections", "pending_importance",
                           "high_salience", "cycles", "tokens_today"),
                   cycles_by_kind=dict(data.get("cycles_by_kind") or {}), raw=data)


@dataclass(frozen=True)
class Health:
    """/healthz: `ok`, or why not yet (`starting`, `degraded` and what stalls)."""
    status: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Health":
        return cls(status=str(data.get("status", "unknown")), raw=data)


@dataclass(frozen=True)
class Answer:
    """What the API said to `request()`, whatever the status: the status, the
    body decoded from JSON (None when it is not JSON) and the headers (names in
    lower case)."""
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300
