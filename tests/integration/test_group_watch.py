"""The group watch: which refusals it names, and a worker that a real broker
refuses into its group exits non-zero, at once, saying what to change."""

from __future__ import annotations

from dataclasses import replace

import pytest
from aiokafka import errors

from streams.broker import EmbeddedBroker
from streams.settings import Settings
from streams.worker.group_watch import refusal
from support.harness import Worker

SETTINGS = Settings.load(env={})  # the pure cases need no broker


@pytest.mark.parametrize("error, names", [
    (errors.InvalidSessionTimeoutError(), "REFLECT_SESSION_TIMEOUT"),
    (errors.GroupAuthorizationFailedError(), "READ on the group"),
    (errors.InvalidGroupIdError(), "REFLECT_APP_ID"),
    (errors.InconsistentGroupProtocolError(), "another application shares REFLECT_APP_ID"),
])
def test_each_refusal_of_the_group_says_what_to_change(error, names):
    why = refusal(error, SETTINGS)
    assert names in why and repr(SETTINGS.app_id) in why


@pytest.mark.parametrize("error", [None, errors.KafkaConnectionError(), errors.RebalanceInProgressError(),
                                   errors.RequestTimedOutError()])
def test_errors_a_worker_recovers_from_are_not_refusals(error):
    assert refusal(error, SETTINGS) is None


@pytest.mark.integration
@pytest.mark.broker
def test_a_worker_the_broker_refuses_into_its_group_exits_with_the_reason(settings, tmp_path):
    # noida-db, like Apache Kafka, refuses a session below 6 s
    # (group.min.session.timeout.ms); Tansu accepts any, so this case brings
    # its own noida-db whatever the session broker is.
    with EmbeddedBroker(kind="noida", log_path=str(tmp_path / "noida.log"), ready_timeout=60) as noida:
        worker = Worker(replace(settings, broker=noida.url, session_timeout=3.0), tmp_path / "worker.log").launch()
        try:
            code = worker.process.wait(60)  # before this watch: up, unhealthy, until killed
        finally:
            worker.stop()
    text = worker.log_path.read_text(errors="replace")
    assert code == 1, text[-3000:]
    [line] = [ln for ln in text.splitlines() if "cannot join the consumer group" in ln]
    assert "session timeout of 3 s" in line and "REFLECT_SESSION_TIMEOUT" in line, line
