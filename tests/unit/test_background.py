"""A side worker's process leaves the cores to the live worker: its threads
SCHED_IDLE, and its session's autogroup (its own: it runs in a session of
its own) at nice 19, without which the policy orders nothing between groups."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

AUTOGROUP = Path("/proc/self/autogroup")
PROBE = ("import os; from streams.cli.main import background; background(); "
         "print(os.sched_getscheduler(0) == os.SCHED_IDLE); print(open('/proc/self/autogroup').read().strip())")


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="no autogroups here (kernel.sched_autogroup_enabled, Linux)")
def test_a_backgrounded_process_in_a_session_of_its_own_is_idle_and_its_group_nice_19():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
                          start_new_session=True, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    idle, group = done.stdout.split("\n")[:2]
    assert idle == "True"
    assert group.endswith("nice 19"), group
