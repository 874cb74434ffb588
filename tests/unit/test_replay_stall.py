"""A replay's stall clock (streams/worker/replay.py): time its side worker
waits for a core is not time it was stuck."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from streams.worker.replay import kept_waiting, stalled
from support.harness import wait_for


def test_waiting_for_a_core_does_not_count_as_a_stall():
    assert stalled(20.0, kept_off=2.0, bound=15.0)  # it could have run for 18 s and did nothing
    assert not stalled(20.0, kept_off=10.0, bound=15.0)  # it ran 10 s of the 20: starved, not stuck
    assert not stalled(10.0, kept_off=0.0, bound=15.0)


def test_an_unknown_process_has_waited_for_nothing():
    assert kept_waiting(2**22 + 12345) == 0.0


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="the kernel keeps no schedstat here")
def test_a_process_that_shares_one_core_with_another_is_counted_waiting():
    spin = [sys.executable, "-c", "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"]
    spinners = [subprocess.Popen(spin) for _ in range(2)]
    try:
        wait_for(lambda: all(kept_waiting(p.pid) > 0 for p in spinners), 10, "both spinners sharing the core")
        before, started = kept_waiting(spinners[0].pid), time.monotonic()
        time.sleep(1.0)  # the span measured
        waited, wall = kept_waiting(spinners[0].pid) - before, time.monotonic() - started
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert 0.2 * wall < waited <= wall + 0.05, (waited, wall)  # half the core each, give or take
