"""Whether the broker answers: one log line when it stops, one when it is back.

While a broker is away, aiokafka reconnects quietly and Faust only says that
its commit timer overlaps; nothing tells an operator "the broker is gone" or
"it is back, after 20 s". A probe asks the broker for its cluster metadata
every PROBE_INTERVAL seconds, bounded by PROBE_TIMEOUT (shorter, so probes
never overlap), and `BrokerWatch.observe` turns the answers into those two
lines and the `reflect_broker_reachable` gauge.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient

from streams.security import client_options
from streams.settings import Settings
from streams.worker import metrics

log = logging.getLogger(__name__)

PROBE_INTERVAL = 5.0
PROBE_TIMEOUT = 4.0


@dataclass
class BrokerWatch:
    """The broker's last known state, and when it last answered (monotonic
    seconds). It starts reachable: the worker got this far by talking to it."""

    reachable: bool = True
    last_answer: float = 0.0

    def observe(self, ok: bool, now: float) -> float | None:
        """Record a probe's answer. On a change of state, the seconds since the
        broker last answered (when an outage ends: its length, over-counted
        by at most two probe intervals); otherwise None."""
        changed, silent = ok != self.reachable, now - self.last_answer
        self.reachable = ok
        if ok:
            self.last_answer = now
        return silent if changed else None


class BrokerProbe:
    """The probe's I/O: one admin client, rebuilt after a failure so a probe
    never reuses a connection left half-open by the outage."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admin: AIOKafkaAdminClient | None = None

    async def answers(self) -> str | None:
        """None if the broker answered within the bound, else why not."""
        try:
            await asyncio.wait_for(self._ask(), PROBE_TIMEOUT)
            return None
        except Exception as exc:  # any failure to answer is the broker being unreachable
            await self.close()
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    async def _ask(self) -> None:
        if self.admin is None:
            self.admin = AIOKafkaAdminClient(**client_options(self.settings),
                                             request_timeout_ms=int(PROBE_TIMEOUT * 1000))
            await self.admin.start()
        # Not describe_topics([ours]): a request naming a topic lets Kafka
        # (auto.create.topics.enable, on by default) create it with the
        # broker's partition count, before `reflect topics create` has run.
        await self.admin.describe_cluster()

    async def close(self) -> None:
        admin, self.admin = self.admin, None
        if admin is not None:
            try:
                await asyncio.wait_for(admin.close(), PROBE_TIMEOUT)
            except Exception:  # closing what the outage broke may fail too; it is dropped either way
                pass


def report(watch: BrokerWatch, probe_error: str | None, now: float, broker: str) -> None:
    """Record a probe's answer: the gauge, and a log line when the state changed."""
    silent = watch.observe(probe_error is None, now)
    metrics.BROKER_REACHABLE.set(1.0 if watch.reachable else 0.0)
    if silent is None:
        return
    if probe_error is not None:
        log.error("broker %s unreachable: no answer for %.0f s (%s); writes answer 503 until it is back",
                  broker, silent, probe_error, extra={"broker": broker})
    else:
        log.warning("broker %s reachable again after %.1f s without an answer", broker, silent,
                    extra={"broker": broker, "outage_s": round(silent, 1)})
