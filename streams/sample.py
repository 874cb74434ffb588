"""A synthetic three-month history between a coding agent and its user, for `reflect demo`.

It is the demo's bundled sample: ordinary background work with four planted patterns
whose expected beliefs are known, so a reflector's output can be checked against ground truth.
Pure and deterministic: the same seed always gives the same history (stdlib only).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

DAYS = 92
SUBSYSTEMS = ("billing", "search", "payments", "notifications", "profile", "export", "cache", "scheduler",
              "reporting", "uploads", "onboarding", "analytics", "invoicing", "webhooks", "email", "settings",
              "dashboard", "admin", "inventory", "checkout", "feeds", "localization", "media", "geocoding")
FILL = {
    "thing": ("serializer", "query builder", "HTTP client", "pagination helper", "config loader",
              "validation layer", "date utilities", "price formatter", "event handler", "repository class"),
    "goal": ("drop a global variable", "split a 400-line function", "remove a circular import",
             "make it easier to read", "share one code path", "isolate the database calls"),
    "change": ("added an index", "tidied error messages", "moved constants to one module",
               "replaced a hand-written loop", "introduced a dataclass", "simplified a conditional"),
    "verdict": ("approved with two nits", "asked for a clearer docstring", "merged after one round",
                "suggested splitting it in two", "requested a benchmark", "approved as is"),
    "dep": ("requests", "pydantic", "sqlalchemy", "httpx", "numpy", "orjson", "pytest", "ruff", "celery"),
    "doc": ("describe the new endpoint", "fix a broken example", "explain the config keys",
            "add a diagram of the data flow", "document the rate limits", "clarify the setup steps"),
    "old": ("data", "mgr", "tmp", "handle_it", "obj", "do_work", "info", "stuff"),
    "new": ("invoice_rows", "quota_tracker", "pending_items", "apply_discount", "shipment", "normalise_email"),
    "meeting": ("weekly planning", "sprint retro", "architecture sync", "standup", "roadmap review"),
    "outcome": ("two tickets were reprioritised", "the team agreed on a naming scheme",
                "a spike on caching was scheduled", "nothing blocking came up", "a new owner was assigned"),
    "lint": ("unused import", "shadowed name", "line-length", "missing type hint", "mutable default"),
    "symbol": ("get_user_prefs", "TaxRate", "parse_csv", "build_query", "send_digest", "CurrencyField"),
    "small": ("off-by-one in pagination", "typo in an error message", "wrong default timezone",
              "missing null check", "stale cache key", "rounding issue in totals"),
    "pair": ("a tricky edge case got a comment", "the plan for the migration got clearer",
             "a helper was extracted", "they sketched the new schema together"),
    "hot": ("JSON encoding", "a nested loop", "regex compilation", "an N+1 query", "string concatenation"),
    "topic": ("sharding", "idempotency keys", "batch sizes", "rate limiting", "schema versioning"),
    "feature": ("filters", "bulk editor", "CSV import", "dark mode", "weekly digest", "saved views"),
    "file": ("session.py", "tokens.py", "middleware.py", "oauth.py", "permissions.py", "password_reset.py"),
    "symptom": ("token refresh", "login redirects", "session expiry", "SSO callbacks", "password reset links"),
    "job": ("deploy", "migration", "nightly job", "build", "backfill"),
    "kind": ("worker", "container", "build", "application", "scheduler"),
    "bug": ("duplicate charge", "missing row", "timezone shift", "encoding error", "race condition",
            "wrong total", "empty response"),
}
BACKGROUND = (
    "Refactored the {thing} in {sub} to {goal}.",
    "Reviewed a pull request that {change} in {sub}; the user {verdict}.",
    "Merged pull request #{pr}, which {change} in {sub}.",
    "Bumped {dep} to the latest minor version in {sub}; nothing else needed to change.",
    "Updated the {sub} documentation to {doc}.",
    "Ran the {sub} test suite: {n} tests passed in {secs} seconds.",
    "Discussed naming with the user: {old} became {new} in the {sub} module.",
    "Joined the {meeting} with the user; {outcome}.",
    "CI for the {sub} branch finished green in {mins} minutes.",
    "CI flagged a {lint} warning in {sub}, which was cleaned up right away.",
    "Searched the codebase for usages of {symbol} across {sub} and {sub2}.",
    "Fixed a small bug in {sub} ({small}).",
    "Paired with the user on {sub}; {pair}.",
    "Added type hints to the {sub} {thing}.",
    "Listed open issues in {sub} for the user; there were {n}.",
    "Profiled the {sub} {thing}; most time went into {hot}.",
    "Removed {n} lines of dead code from {sub}.",
    "Drafted a short design note on {topic} for {sub}.",
    "Put the new {sub} {feature} behind a feature flag.",
    "Moved shared helpers from {sub} into a common package used by {sub2}.",
)
PATTERNS = {
    "reverts-touch-auth": ("Every reverted pull request touched the auth subsystem.", (
        "Reverted pull request #{pr}: the change to auth/{file} broke {symptom}.",
        "The user reverted PR #{pr} because its edit to auth/{file} broke {symptom}.",
        "Pull request #{pr} was reverted; it modified the auth subsystem ({file}) and broke {symptom}.")),
    "logs-before-retry": ("The user always asks to see the logs before retrying a failed job.", (
        "Before retrying the failed {job} of {sub}, the user asked to see the {kind} logs first.",
        "The {sub} {job} failed; the user wanted the {kind} logs before any retry.",
        "The user would not retry the {sub} {job} until the {kind} logs had been read.")),
    "failing-test-first": ("When debugging, the user first writes a failing test that reproduces the bug.", (
        "Before fixing the {bug} in {sub}, the user wrote a failing test that reproduces it.",
        "The user reproduced the {bug} in {sub} with a failing test first, then fixed it.",
        "A failing test reproducing the {bug} in {sub} came first; the fix followed.")),
    "no-friday-deploys": ("The user refuses to deploy on Fridays.", (
        "The user postponed the {sub} deploy: no deploys on a Friday.",
        "It is Friday, so the user postponed the {sub} deploy to Monday.",
        "The user declined to deploy {sub} on a Friday and postponed it to next week.")),
}


@dataclass(frozen=True)
class SampleEpisode:
    episode_id: str
    occurred_at: str
    text: str
    importance: float
    source: str
    pattern: str | None


@dataclass(frozen=True)
class Pattern:
    name: str
    description: str
    episode_ids: tuple[str, ...]


@dataclass(frozen=True)
class History:
    user_id: str
    episodes: tuple[SampleEpisode, ...]
    patterns: tuple[Pattern, ...]


def _spread(rng: random.Random, pool: list[int], n: int) -> list[int]:
    """Pick n items from pool, one per equal stratum, so picks cover the whole range."""
    step = len(pool) / n
    return [pool[int(i * step + rng.random() * step)] for i in range(n)]


def _times(rng: random.Random, start: date, episodes: int) -> list[datetime]:
    """Spread episodes evenly over DAYS days, at sorted random minutes in working hours (09:00-18:00 UTC)."""
    out: list[datetime] = []
    per_day = [0] * DAYS
    for k in range(episodes):
        per_day[k * DAYS // episodes] += 1
    for day, count in enumerate(per_day):
        base = datetime.combine(start + timedelta(days=day), time(9))
        out += [base + timedelta(minutes=m) for m in sorted(rng.randrange(9 * 60) for _ in range(count))]
    return out


def history(seed: int = 7, episodes: int = 2100, user_id: str = "maya", start: str = "2026-06-01") -> History:
    rng = random.Random(seed)
    times = _times(rng, date.fromisoformat(start), episodes)
    ids = [f"demo-{k + 1:04d}" for k in range(episodes)]
    fridays = [k for k, t in enumerate(times) if t.weekday() == 4]
    chosen: dict[int, str] = {}
    for name in ("no-friday-deploys", "reverts-touch-auth", "logs-before-retry", "failing-test-first"):
        pool = [k for k in (fridays if name == "no-friday-deploys" else range(episodes)) if k not in chosen]
        for k in _spread(rng, pool, min(rng.randint(32, 42), len(pool) // 2)):
            chosen[k] = name
    out: list[SampleEpisode] = []
    pr = 300
    for k, t in enumerate(times):
        pr += rng.random() < 0.3
        fields = {key: rng.choice(values) for key, values in FILL.items()}
        sub, sub2 = rng.sample(SUBSYSTEMS, 2)
        fields.update(sub=sub, sub2=sub2, pr=pr, n=rng.randint(3, 400), secs=rng.randint(4, 90),
                      mins=rng.randint(3, 25))
        name = chosen.get(k)
        if name is None:
            text = rng.choice(BACKGROUND).format(**fields)
            importance = min(0.7, max(0.1, rng.gauss(0.45, 0.13)))
        else:
            text = rng.choice(PATTERNS[name][1]).format(**fields)
            importance = rng.uniform(0.6, 0.95)
        out.append(SampleEpisode(ids[k], t.strftime("%Y-%m-%dT%H:%M:%SZ"), text, round(importance, 2),
                                 "coding-agent", name))
    patterns = tuple(Pattern(name, description, tuple(ids[k] for k in sorted(chosen) if chosen[k] == name))
                     for name, (description, _) in PATTERNS.items())
    return History(user_id, tuple(out), patterns)
