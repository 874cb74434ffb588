"""Dead letters back onto the topic they came from, after a fix.

A dead letter keeps the original key and bytes, and its `__connect.errors.*`
headers name the topic, partition and offset it was read from and the stage
that refused it (processors/dlq.py). A replay publishes the key and bytes
again to that topic, unchanged, with one header saying where the copy came
from. Replaying is safe to repeat: every effect downstream is idempotent by
event id (point ids, deterministic cycle and belief ids, a terminal
retraction), so a second replay of the same dead letters leaves the view as
the first left it. What still fails is dead-lettered again, with its reason.

Selection (which dead letters, and why not the others) is pure, over the
headers and the dead letter's Kafka timestamp; the reading and publishing
around it are thin.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable

from aiokafka import AIOKafkaProducer

from schemas import parse_time
from streams.security import client_options
from streams.settings import Settings
from streams.topics import read_to_end

ERRORS = "__connect.errors."  # the prefix of processors/dlq.py's headers
REPLAYED_FROM = "reflect.replayed-from"

REPLAY, FILTERED, FOREIGN = "replay", "filtered", "foreign"


class SelectionError(ValueError):
    """A filter that can select nothing by construction (a flag to fix)."""


def instant(raw: str) -> datetime:
    """An RFC 3339 time with its offset; a bare date or local time would be
    read in whatever zone the operator's machine is in."""
    try:
        at = parse_time(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not an RFC 3339 time (e.g. 2025-06-01T09:00:00Z)") from None
    if at.tzinfo is None:
        raise ValueError(f"{raw!r} has no offset: add Z or +HH:MM")
    return at


@dataclass(frozen=True)
class DeadLetter:
    topic: str  # the dead-letter topic
    partition: int
    offset: int
    timestamp: int  # ms: when it was dead-lettered (the record's Kafka timestamp)
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]

    @classmethod
    def of(cls, record) -> "DeadLetter":
        headers = {name: value.decode("utf-8", "replace") for name, value in record.headers or ()}
        return cls(record.topic, record.partition, record.offset, record.timestamp, record.key, record.value,
                   headers)

    def error(self, name: str, default: str = "") -> str:
        return self.headers.get(ERRORS + name, default)

    @property
    def source(self) -> str:
        return self.error("topic")

    @property
    def stage(self) -> str:
        return self.error("stage")

    @property
    def at(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp / 1000, timezone.utc)

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def describe(self) -> str:
        """One line: where it is, when, where from, whose, and why it was refused."""
        at = self.at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        origin = f"{self.source}[{self.error('partition', '?')}]@{self.error('offset', '?')}"
        user = (self.key or b"").decode("utf-8", "replace")
        reason = f"{self.error('exception.class.name', '?')}: {self.error('exception.message')}"[:200]
        return f"{self.where} {at} from {origin} key={user} stage={self.stage} {reason}"


@dataclass(frozen=True)
class Selection:
    """Which dead letters to replay; an empty set means any."""

    topics: frozenset[str] = frozenset()  # source topics
    stages: frozenset[str] = frozenset()
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive

    def takes(self, letter: DeadLetter) -> bool:
        return ((not self.topics or letter.source in self.topics)
                and (not self.stages or letter.stage in self.stages)
                and (self.since is None or letter.at >= self.since)
                and (self.until is None or letter.at < self.until))


def dead_letter_topics(settings: Settings) -> dict[str, str]:
    """Each of Reflect's input topics → the topic its dead letters go to, as
    the worker routes them (requests share the reflections' DLQ)."""
    return {settings.topic_episodes: settings.dlq_episodes, settings.topic_requests: settings.dlq_reflections,
            settings.topic_reflections: settings.dlq_reflections}


def check(selection: Selection, settings: Settings) -> None:
    """SelectionError naming the flag whose value can select nothing: a topic
    Reflect does not read, or an empty time range."""
    sources = dead_letter_topics(settings)
    if unknown := sorted(selection.topics - set(sources)):
        raise SelectionError(f"--topic {', '.join(unknown)}: not one of Reflect's topics ({', '.join(sources)})")
    if selection.since and selection.until and selection.since >= selection.until:
        raise SelectionError("--since must be before --until")


def judge(letter: DeadLetter, selection: Selection, sources: Iterable[str]) -> str:
    """REPLAY, FILTERED (not asked for) or FOREIGN: its source is not a topic
    Reflect reads, so publishing it there would feed someone else's topic."""
    if not selection.takes(letter):
        return FILTERED
    return REPLAY if letter.source in sources else FOREIGN


def summary(counts: Counter, verb: str) -> list[str]:
    """`counts` is by (outcome, source, stage)."""
    total = Counter()
    for (outcome, _, _), n in counts.items():
        total[outcome] += n
    lines = [f"{verb} {total[REPLAY]}, skipped {total[FILTERED]} by filter, "
             f"{total[FOREIGN]} from a topic that is not Reflect's"]
    names = {REPLAY: verb, FILTERED: "filtered", FOREIGN: "foreign"}
    lines += [f"  {names[outcome]:14} {source or '(no source)'} stage={stage or '(none)'}: {n}"
              for (outcome, source, stage), n in sorted(counts.items())]
    return lines




async def replay(settings: Settings, selection: Selection, *, publish: bool, verb: str,
                 timeout: float = 30.0, say: Callable[[str], None] = print) -> Counter:
    """Read the dead-letter topics the selection can concern, say one line per
    selected dead letter, publish them when `publish`, and say the summary.
    Returns the counts by (outcome, source, stage)."""
    routes = dead_letter_topics(settings)
    check(selection, settings)
    dlqs = {dlq for source, dlq in routes.items() if not selection.topics or source in selection.topics}
    letters = sorted((DeadLetter.of(r) for r in await read_to_end(settings, dlqs, timeout)),
                     key=lambda d: (d.topic, d.partition, d.offset))  # each user's order, as dead-lettered
    counts: Counter = Counter()
    chosen = []
    for letter in letters:
        outcome = judge(letter, selection, routes)
        counts[outcome, letter.source, letter.stage] += 1
        if outcome == FOREIGN:
            say(f"skipped {letter.where}: its source topic {letter.source!r} is not one of Reflect's "
                f"({', '.join(routes)}); not published anywhere")
        elif outcome == REPLAY:
            say(f"{verb} {letter.describe()}")
            chosen.append(letter)
    if publish and chosen:
        await _publish(settings, chosen)
    for line in summary(counts, verb):
        say(line)
    return counts


async def _publish(settings: Settings, letters: list[DeadLetter]) -> None:
    producer = AIOKafkaProducer(**client_options(settings), acks="all", linger_ms=5)
    try:
        await producer.start()
        # Sent in order and awaited together: aiokafka keeps one request in
        # flight per broker, so each user's events land in the order they were
        # dead-lettered (one user's dead letters share a DLQ partition).
        sent = [await producer.send(letter.source, letter.value, key=letter.key,
                                    headers=[(REPLAYED_FROM, letter.where.encode())]) for letter in letters]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
