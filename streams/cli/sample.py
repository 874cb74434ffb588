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
    "day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday"),
    "weekday": ("Monday", "Tuesday", "Wednesday", "Thursday"),
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
    "Profiled the {sub} {thing}; most time went into {hot}.",
    "Removed {n} lines of dead code from {sub}.",
    "Drafted a short design note on {topic} for {sub}.",
    "Put the new {sub} {feature} behind a feature flag.",
    "Set up a read replica for the {sub} database; queries now go there.",
    "Wrote a migration that adds a {new} column to the {sub} tables.",
    "Explained to the user how the {sub} {thing} handles {topic}.",
    "Cleaned up {n} stale branches left over from the {sub} work.",
    "Renamed the {sub} environment variables to follow one prefix.",
    "Answered a question from support about {sub} {feature}.",
    "Tuned the {sub} connection pool from 10 to {mins} connections.",
    "Split the {sub} settings into one file per environment.",
    "Archived {n} old tickets about {sub} that nobody had touched in a year.",
    "Added a dashboard panel for {sub} request latency.",
    "Translated the {sub} error messages into German and French.",
    "Measured the {sub} page weight: {n} KB, mostly images.",
    "Wrote a small script to export {sub} metrics to a spreadsheet for the user.",
    "Sketched the API for the {sub} {feature} on the whiteboard with the user.",
    "Upgraded the {sub} Docker base image to a slimmer one.",
    "Estimated the {sub} {feature} at {mins} story points with the user.",
    "Recorded a short screencast of the {sub} {feature} for the changelog.",
    "Replaced the {sub} cron entry with a scheduled task in the job runner.",
    "Checked the {sub} licence headers; {n} files were missing one.",
    "Configured the {sub} alerts to page only during working hours.",
    "Added pagination to the {sub} admin list of {new}.",
    "Compared two {dep} releases for the {sub} service and picked the older one.",
    "Backfilled {n} missing rows in the {sub} reporting table.",
    "Helped the user write the {sub} section of the quarterly plan.",
    "Made the {sub} {thing} configurable through a single settings object.",
    "Cached the {sub} exchange rates for an hour to save API calls.",
    "Reviewed the {sub} accessibility report; {n} contrast issues to fix.",
    "Moved the {sub} secrets into the vault and rotated them.",
    "Added structured fields to the {sub} request records.",
    "Opened a ticket with the vendor about the {sub} webhook signatures.",
    # The planted patterns' words, in episodes that are not the patterns.
    "Added an automatic retry with backoff to the {sub} HTTP client.",
    "Rotated the {sub} log files and trimmed the logs older than {n} days.",
    "Updated the auth documentation to {doc}.",
    "Reverted a whitespace-only commit in {sub} at the user's request; nothing else changed.",
    "Wrote {n} new unit tests for the {sub} {thing}; all of them pass.",
    "Deployed {sub} to staging on {day}; the smoke tests passed.",
    "Shipped the {sub} {feature} to production on {weekday} without issues.",
    "Reviewed the auth/{file} pull request with the user; it was approved.",
    "The flaky {sub} test failed once in CI and passed on the second run.",
    "Fixed the failing lint step in the {sub} pipeline ({lint}).",
    "Planned the {day} demo of the {sub} {feature} with the team.",
    "Looked at the {kind} logs of {sub} to size the disk usage; {n} MB a day.",
)
# Each pattern: its description (what a belief should say) and paraphrases
# with no fixed vocabulary: no word but the topic's own recurs in every one.
PATTERNS = {
    "reverts-touch-auth": ("Every reverted pull request touched the auth subsystem.", (
        "Reverted pull request #{pr}: the change to auth/{file} broke {symptom}.",
        "The user rolled back PR #{pr}; its edit to the authentication code ({file}) broke {symptom}.",
        "PR #{pr} was backed out after {symptom} stopped working; the diff had touched auth/{file}.",
        "Undid the merge of #{pr}: it changed how sign-in works in {file} and {symptom} failed.",
        "The user asked to revert #{pr} because its login changes in {file} broke {symptom}.",
        "Another rollback, #{pr}: a tweak to the auth layer in {file} left {symptom} broken.",
        "#{pr} had to be reverted: {symptom} broke after it modified the authentication module.",
        "We reverted the change to auth/{file} from PR #{pr}; {symptom} was failing in production.")),
    "logs-before-retry": ("The user always asks to see the logs before retrying a failed job.", (
        "Before retrying the failed {job} of {sub}, the user asked to see the {kind} logs first.",
        "The {sub} {job} failed; the user wanted the {kind} logs before any retry.",
        "The user would not rerun the {sub} {job} until the {kind} output had been read.",
        "{sub} {job} broke again; the user said to pull the {kind} logs before kicking it off again.",
        "No blind restart of the {sub} {job}: the user first wanted to read what the {kind} printed.",
        "When the {job} in {sub} crashed, the user insisted on reading the {kind} logs before trying again.",
        "The user held off on rerunning the {sub} {job} until we had gone through its {kind} logs.",
        "Asked to retry the {sub} {job}, the user first wanted the failure's {kind} log output.")),
    "failing-test-first": ("When debugging, the user first writes a failing test that reproduces the bug.", (
        "Before fixing the {bug} in {sub}, the user wrote a failing test that reproduces it.",
        "The user reproduced the {bug} in {sub} with a red test first, then fixed it.",
        "A test that fails on the {bug} in {sub} came first; the fix followed.",
        "The user would not touch the {sub} code for the {bug} until a test showed it failing.",
        "For the {bug} in {sub}, the user started by writing a test case that catches it.",
        "The user captured the {sub} {bug} in a regression test before changing any code.",
        "First a failing test for the {bug}, then the patch: the user's way of fixing {sub}.",
        "The {bug} in {sub} got a reproducing test before the user let anyone write the fix.")),
    "no-friday-deploys": ("The user refuses to deploy on Fridays.", (
        "The user postponed the {sub} deploy: no deploys on a Friday.",
        "It is Friday, so the user moved the {sub} release to Monday.",
        "The user declined to ship {sub} today because it is the end of the week.",
        "No production push for {sub} this Friday: the user wants it out on Monday morning.",
        "The user held back the {sub} rollout until after the weekend.",
        "We were ready to release {sub}, but the user said not on a Friday.",
        "The {sub} deployment was pushed to next week; the user never ships on Fridays.",
        "End of the week again, so the user kept {sub} off production until Monday.")),
}
# How many episodes each pattern gets: one spread thinly over the three months.
PLANTED = {"no-friday-deploys": (15, 18), "reverts-touch-auth": (34, 42), "logs-before-retry": (34, 42),
           "failing-test-first": (34, 42)}


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


def _importance(rng: random.Random) -> float:
    """One distribution for every episode: being a pattern says nothing of importance."""
    return round(min(0.95, max(0.1, rng.gauss(0.48, 0.16))), 2)


def history(seed: int = 7, episodes: int = 2100, user_id: str = "maya", start: str = "2026-06-01") -> History:
    rng = random.Random(seed)
    times = _times(rng, date.fromisoformat(start), episodes)
    ids = [f"demo-{k + 1:04d}" for k in range(episodes)]
    fridays = [k for k, t in enumerate(times) if t.weekday() == 4]
    chosen: dict[int, str] = {}
    for name, (low, high) in PLANTED.items():
        pool = [k for k in (fridays if name == "no-friday-deploys" else range(episodes)) if k not in chosen]
        for k in _spread(rng, pool, min(rng.randint(low, high), len(pool) // 2)):
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
        text = rng.choice(PATTERNS[name][1] if name else BACKGROUND).format(**fields)
        out.append(SampleEpisode(ids[k], t.strftime("%Y-%m-%dT%H:%M:%SZ"), text[0].upper() + text[1:],
                                 _importance(rng), "coding-agent", name))
    patterns = tuple(Pattern(name, description, tuple(ids[k] for k in sorted(chosen) if chosen[k] == name))
                     for name, (description, _) in PATTERNS.items())
    return History(user_id, tuple(out), patterns)
