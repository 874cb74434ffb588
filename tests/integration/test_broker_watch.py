"""The broker watch: the pure state change, and the probe against a real
broker and against a port where none listens. The outage itself (SIGSTOP of
the broker, the log lines and the gauge) is in tests/faults/test_faults_outage.py."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import pytest

from streams.broker import free_port
from streams.worker import metrics
from streams.worker.broker_watch import PROBE_TIMEOUT, BrokerProbe, BrokerWatch, report


def test_a_change_reports_the_silence_since_the_last_answer_and_nothing_else_does():
    watch = BrokerWatch(last_answer=100.0)
    assert watch.observe(True, 105.0) is None  # still reachable
    assert watch.observe(False, 110.0) == 5.0  # lost: silent since the answer at 105
    assert watch.observe(False, 115.0) is None  # still lost: no second line
    assert watch.observe(True, 131.0) == 26.0  # back: the outage, from the last answer
    assert (watch.reachable, watch.last_answer) == (True, 131.0)


def test_report_logs_each_change_once_and_sets_the_gauge(caplog):
    watch = BrokerWatch(last_answer=0.0)
    with caplog.at_level(logging.WARNING, logger="streams.worker.broker_watch"):
        for error, now in ((None, 5), ("TimeoutError", 10), ("TimeoutError", 15), (None, 30), (None, 35)):
            report(watch, error, now, "kafka-0:9092")
            assert metrics.BROKER_REACHABLE.value() == (0.0 if error else 1.0)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "broker kafka-0:9092 unreachable: no answer for 5 s (TimeoutError); "
                  "writes answer 503 until it is back"),
        ("WARNING", "broker kafka-0:9092 reachable again after 25.0 s without an answer"),
    ]
    assert caplog.records[1].outage_s == 25.0


@pytest.mark.integration
def test_the_probe_answers_against_a_broker_and_fails_within_its_bound_without_one(settings):
    async def probe(s):
        p = BrokerProbe(s)
        started = time.monotonic()
        try:
            return await p.answers(), time.monotonic() - started
        finally:
            await p.close()

    assert asyncio.run(probe(settings))[0] is None
    nobody = replace(settings, broker=f"kafka://127.0.0.1:{free_port()}")
    error, seconds = asyncio.run(probe(nobody))
    assert error and seconds < PROBE_TIMEOUT + 1, (error, seconds)
