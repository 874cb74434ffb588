"""The worker's metrics (GET /metrics) and the hooks the agents call, plus the
optional OpenTelemetry spans around cycles and projector batches.

A small registry rather than prometheus_client: the whole need is counters,
gauges and histograms with labels rendered as the text exposition format
0.0.4, and one process per worker (no multiprocess mode to support).
Names follow Prometheus conventions: the `reflect_` prefix, counters end in
`_total`, durations are histograms in seconds. No label ever names a user —
the registry refuses one: per-user series grow without bound, and user ids do
not belong in a monitoring system. Counters are per process and start at 0
when a worker starts, which is what rate() expects.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import orjson

from schemas import RECORDS, ReflectionInvalidated
from streams.settings import Settings, SettingsError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FORBIDDEN_LABELS = frozenset({"user", "user_id"})
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    pairs = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    return "{" + ",".join(pairs) + "}" if pairs else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, doc: str, labels: Sequence[str] = (),
                 initial: Iterable[Mapping[str, str]] = ()) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a Prometheus metric name: {name!r}")
        for label in labels:
            if not _LABEL.fullmatch(label) or label.startswith("__") or label == "le":
                raise ValueError(f"not a usable label name: {label!r}")
            if label in FORBIDDEN_LABELS:
                raise ValueError(f"{name}: no per-user labels ({label!r})")
        self.name, self.doc, self.labels = name, doc, tuple(labels)
        self._lock = threading.Lock()  # projector applies run in threads
        self._children: dict[tuple[str, ...], Any] = {}
        if not self.labels:
            self._child(())
        for given in initial:  # known label values show as 0 before their first event
            self._child(self._key(given))

    def _key(self, labels: Mapping[str, Any]) -> tuple[str, ...]:
        if set(labels) != set(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.labels)

    def _child(self, key: tuple[str, ...]) -> Any:
        raise NotImplementedError

    def lines(self) -> list[str]:
        raise NotImplementedError

    def render(self) -> str:
        doc = self.doc.replace("\\", r"\\").replace("\n", r"\n")
        head = [f"# HELP {self.name} {doc}", f"# TYPE {self.name} {self.kind}"]
        return "\n".join(head + self.lines())


class _Single(_Metric):
    """One number per label set."""

    def _child(self, key):
        return self._children.setdefault(key, 0.0)

    def value(self, **labels: Any) -> float:
        return self._children.get(self._key(labels), 0.0)

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._children.items())
        return [f"{self.name}{_labels(self.labels, key)} {_number(v)}" for key, v in items]


class Counter(_Single):
    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: Any) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._children[key] = self._children.get(key, 0.0) + amount


class Gauge(_Single):
    kind = "gauge"

    def set(self, value: float, **labels: Any) -> None:
        key = self._key(labels)
        with self._lock:
            self._children[key] = float(value)

    def replace(self, values: Mapping[tuple[str, ...], float]) -> None:
        """Every child at once: a partition no longer assigned disappears."""
        with self._lock:
            self._children = {tuple(map(str, k)): float(v) for k, v in values.items()}


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, doc: str, labels: Sequence[str] = (), *, buckets: Sequence[float],
                 initial: Iterable[Mapping[str, str]] = ()) -> None:
        self.buckets = tuple(sorted(float(b) for b in buckets))
        super().__init__(name, doc, labels, initial)

    def _child(self, key):
        # [count per bucket..., sum, count]
        return self._children.setdefault(key, [0] * len(self.buckets) + [0.0, 0])

    def observe(self, value: float, **labels: Any) -> None:
        key = self._key(labels)
        with self._lock:
            child = self._child(key)
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    child[i] += 1
            child[-2] += value
            child[-1] += 1

    def count(self, **labels: Any) -> int:
        child = self._children.get(self._key(labels))
        return child[-1] if child else 0

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._children.items())
        out = []
        for key, child in items:
            for bound, n in zip(self.buckets + (math.inf,), child[:-2] + [child[-1]]):
                labels = _labels(self.labels + ("le",), key + (_number(bound),))
                out.append(f"{self.name}_bucket{labels} {n}")
            out.append(f"{self.name}_sum{_labels(self.labels, key)} {_number(child[-2])}")
            out.append(f"{self.name}_count{_labels(self.labels, key)} {child[-1]}")
        return out


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def add(self, metric: _Metric) -> Any:
        if metric.name in self._metrics:
            raise ValueError(f"{metric.name} is registered already")
        self._metrics[metric.name] = metric
        return metric

    def render(self) -> str:
        return "\n".join(m.render() for m in self._metrics.values()) + "\n"


def _each(label: str, values: Iterable[str]) -> list[dict[str, str]]:
    return [{label: v} for v in values]


CYCLE_OUTCOMES = ("ok", "empty", "failed", "unavailable", "refused")
# usage keys of a ReflectionCycleCompleted → the `kind` of reflect_reasoner_tokens_total
TOKEN_KINDS = {"input_tokens": "input", "output_tokens": "output", "cached_tokens": "cache_read",
               "cache_write_tokens": "cache_write"}

REGISTRY = Registry()
EVENTS = REGISTRY.add(Counter(
    "reflect_events_total",
    "Events the projectors and the reflector read, by topic, event type and how admission ended "
    "(ok: decoded and handed on; dead_lettered: undecodable or on the wrong topic, sent to the DLQ).",
    ("topic", "type", "outcome")))
DLQ_EVENTS = REGISTRY.add(Counter(
    "reflect_dlq_events_total",
    "Events sent to a dead-letter topic, by source topic and stage (decode, project, reflect, invalidate).",
    ("topic", "stage")))
CYCLES = REGISTRY.add(Counter(
    "reflect_cycles_total", "Reflection cycles completed, by outcome.", ("outcome",),
    initial=_each("outcome", CYCLE_OUTCOMES)))
CYCLE_SECONDS = REGISTRY.add(Histogram(
    "reflect_cycle_duration_seconds", "Duration of a reflection cycle (its audit event's duration_ms).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)))
REASONER_CALLS = REGISTRY.add(Counter(
    "reflect_reasoner_calls_total", "Calls to the reasoner's API (the offline reasoner makes none)."))
REASONER_TOKENS = REGISTRY.add(Counter(
    "reflect_reasoner_tokens_total", "Tokens the reasoner's API billed, by kind.", ("kind",),
    initial=_each("kind", TOKEN_KINDS.values())))
REASONER_ERRORS = REGISTRY.add(Counter(
    "reflect_reasoner_errors_total",
    "Cycles the reasoner failed after its retries: an unusable answer (failed) or none (unavailable)."))
UPSERT_SECONDS = REGISTRY.add(Histogram(
    "reflect_projector_upsert_seconds", "Duration of one projector apply (embed and upsert a batch), by kind.",
    ("kind",), buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    initial=_each("kind", ("episode", "reflection"))))
INVALIDATIONS = REGISTRY.add(Counter(
    "reflect_invalidations_total", "ReflectionInvalidated events the invalidator emitted, by new status.",
    ("status",), initial=_each("status", ("invalid", "weakened"))))
CONSUMER_LAG = REGISTRY.add(Gauge(
    "reflect_consumer_lag",
    "Records not yet committed by this worker's consumer group (highwater - committed offset), per "
    "assigned partition of the topics it reads, at scrape time.",
    ("topic", "partition")))

BROKER_REACHABLE = REGISTRY.add(Gauge(
    "reflect_broker_reachable",
    "1 while the broker answers this worker's metadata probe within its bound (every 5 s), 0 while it "
    "does not (streams/worker/broker_watch.py)."))
BROKER_REACHABLE.set(1.0)  # as the watch starts: the worker got as far as serving by talking to the broker
PIPELINE_STALLED = REGISTRY.add(Gauge(
    "reflect_pipeline_stalled",
    "1 while a pipeline stage retries a transient fault (view, broker or embedder not answering) and its "
    "partitions wait, 0 once it goes on (streams/worker/pipeline/policy.py).",
    ("stage",)))
RATE_LIMIT = REGISTRY.add(Gauge(
    "reflect_rate_limit",
    "The per-credential limit of this worker's API (REFLECT_RATE_LIMIT, REFLECT_RATE_BURST), by kind: "
    "requests_per_second and burst; 0 when no limit is set (streams/http/routes/limits.py).",
    ("kind",), initial=_each("kind", ("requests_per_second", "burst"))))
RATE_LIMITED = REGISTRY.add(Counter(
    "reflect_rate_limited_total", "Requests answered 429 because their credential was over its rate limit."))


# --- hooks: one call each from streams/worker/app.py --------------------------------

def _event_type(value: bytes | None) -> str:
    """The event type an undecodable value claims, if it is a known one (the
    label stays bounded whatever bytes arrive), else "unknown"."""
    try:
        kind = orjson.loads(value).get("type") if value else None
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return "unknown"
    return kind if isinstance(kind, str) and kind in RECORDS else "unknown"


def event(message, outcome: str, kind: str | None = None) -> None:
    """An event's admission by a projector or the reflector: ok or dead_lettered."""
    EVENTS.inc(topic=message.topic, type=kind or _event_type(message.value), outcome=outcome)


def dead_letter(topic: str, stage: str) -> None:
    DLQ_EVENTS.inc(topic=topic, stage=stage)


def cycle(completed) -> None:
    """A ReflectionCycleCompleted: outcome, duration, and what the reasoner spent."""
    CYCLES.inc(outcome=completed.outcome)
    CYCLE_SECONDS.observe(completed.duration_ms / 1000)
    usage = completed.usage or {}
    REASONER_CALLS.inc(usage.get("calls") or 0)
    for key, kind in TOKEN_KINDS.items():
        REASONER_TOKENS.inc(usage.get(key) or 0, kind=kind)
    if completed.outcome in ("failed", "unavailable"):
        REASONER_ERRORS.inc()


def stalled(stage: str, now: bool) -> None:
    PIPELINE_STALLED.set(1.0 if now else 0.0, stage=stage)


def invalidations(emitted: Iterable) -> None:
    for made in emitted:
        if isinstance(made, ReflectionInvalidated):
            INVALIDATIONS.inc(status=made.status)


def timed_apply(apply: Callable[[list], Any], kind: str) -> Callable[[list], Any]:
    """`apply` timed into reflect_projector_upsert_seconds (and in a span when
    tracing is on). Empty batches are not observed: they would drag the
    histogram towards zero without any upsert."""
    def timed(records: list) -> Any:
        if not records:
            return apply(records)
        started = time.perf_counter()
        try:
            with _span("reflect.project", {"reflect.kind": kind, "reflect.events": len(records)}):
                return apply(records)
        finally:
            UPSERT_SECONDS.observe(time.perf_counter() - started, kind=kind)
    return timed


# --- consumer lag, computed at scrape time -----------------------------------

def lag_of(assigned: Iterable, highwater: Callable[[Any], int | None], committed: Mapping[Any, int | None],
           topics: Iterable[str]) -> dict[tuple[str, str], float]:
    """highwater − committed per assigned partition of `topics`. A partition
    with no highwater yet (not fetched since the assignment) is left out; one
    never committed counts from offset 0 (the group reads from the earliest)."""
    wanted, lag = set(topics), {}
    for tp in assigned:
        if tp.topic not in wanted:
            continue
        high = highwater(tp)
        if high is None:
            continue
        lag[(tp.topic, str(tp.partition))] = max(high - (committed.get(tp) or 0), 0)
    return lag


def consumer_lag(app, committed: Mapping[Any, int], topics: Iterable[str]) -> dict[tuple[str, str], float]:
    """The fetch highwater from the Faust consumer (right on Tansu, where
    ListOffsets is not), against the offsets the worker committed
    (streams/worker/commits.py)."""
    try:
        consumer = app.consumer
        return lag_of(consumer.assignment(), consumer.highwater, dict(committed), topics)
    except Exception:  # not started, or between assignments: no figures rather than a failed scrape
        return {}


def scrape(app, committed: Mapping[Any, int], topics: Iterable[str]) -> str:
    CONSUMER_LAG.replace(consumer_lag(app, committed, topics))
    return REGISTRY.render()


# --- tracing (REFLECT_TRACING=on) ----------------------------------------------

_tracer = None


def configure_tracing(settings: Settings, app=None) -> None:
    """With tracing on, spans around cycles and projector batches, and Faust's
    own per-event spans where the installed faust-streaming has them. The
    spans go wherever the process's OpenTelemetry SDK sends them (none
    configured: the API makes them no-ops)."""
    global _tracer
    if settings.tracing != "on":
        _tracer = None
        return
    try:
        from opentelemetry import trace
    except ImportError:
        raise SettingsError("invalid setting tracing (REFLECT_TRACING=on): OpenTelemetry is not installed; "
                            "pip install opentelemetry-api (and an SDK with an exporter to see the spans)") from None
    _tracer = trace.get_tracer("reflect")
    if app is not None:
        try:
            from faust.contrib.opentelemetry import setup_opentelemetry
        except ImportError:  # older faust-streaming: only Reflect's own spans
            return
        setup_opentelemetry(app)


def _span(name: str, attributes: dict[str, Any]):
    return _tracer.start_as_current_span(name, attributes=attributes) if _tracer else contextlib.nullcontext()


def traced_cycle(run: Callable) -> Callable:
    """`run_cycle` in a span carrying the cycle id, why, and the outcome."""
    if _tracer is None:
        return run

    @functools.wraps(run)
    def traced(request, *args, **kwargs):
        with _span("reflect.cycle", {"reflect.cycle_id": request.cycle_id, "reflect.why": request.why}) as span:
            made = run(request, *args, **kwargs)
            span.set_attribute("reflect.outcome", made[-1].outcome)
            return made
    return traced
