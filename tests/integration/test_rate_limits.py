"""Rate limits per credential (issue 33, item 5): the token bucket's rule,
then a real worker — one token's flood meets 429 with Retry-After while
another token's read still answers, and /metrics shows the limit."""

from __future__ import annotations

import concurrent.futures
import re
import time

import pytest

from streams import auth
from streams.http.routes.limits import MAX_CALLERS, Limiter
from support.api import call

SECRET = "r" * 40


def token(users: list[str], scope: str) -> str:
    return auth.mint(auth.claims_for(users, scope, 600, time.time()), SECRET)


def test_a_bucket_lets_a_burst_through_then_paces_its_caller_only():
    limiter = Limiter(rate=10, burst=5)
    assert [limiter.wait("ann", 100.0) for _ in range(5)] == [0.0] * 5
    assert limiter.wait("ann", 100.0) == pytest.approx(0.1)  # one request's worth of refill
    assert limiter.wait("bob", 100.0) == 0.0  # another caller has a bucket of its own
    assert limiter.wait("ann", 100.1) == 0.0 and limiter.wait("ann", 100.1) > 0  # refilled by 0.1 s, one only
    assert limiter.wait("ann", 200.0) == 0.0  # a long pause refills to the burst, never beyond
    assert [limiter.wait("ann", 200.0) for _ in range(4)] == [0.0] * 4 and limiter.wait("ann", 200.0) > 0
    assert Limiter(rate=0.5, burst=0).burst == 1 and Limiter(rate=50, burst=0).burst == 100


def test_callers_kept_are_bounded():
    limiter = Limiter(rate=1, burst=1)
    for n in range(MAX_CALLERS + 10):
        limiter.wait(f"caller-{n}", 0.0)
    assert len(limiter._buckets) == MAX_CALLERS and limiter.wait("caller-0", 0.0) == 0.0  # forgotten: a full bucket


@pytest.mark.integration
def test_one_token_flooding_meets_429_and_another_token_is_served(worker, settings):
    worker(env={"REFLECT_AUTH_SECRET": SECRET, "REFLECT_RATE_LIMIT": "20", "REFLECT_RATE_BURST": "40"})
    flood, other = token(["ann"], "read"), token(["bob"], "read admin")
    port = settings.web_port

    def read(_):
        return call(port, "GET", "/v1/users/ann/stats", token=flood)[:2]

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(read, range(300)))
    took = time.monotonic() - started
    served = sum(status == 200 for status, _ in answers)
    limited = [headers for status, headers in answers if status == 429]
    print(f"300 reads in {took:.1f} s: {served} served, {len(limited)} refused")
    assert served + len(limited) == 300 and limited
    assert served <= 40 + 20 * took + 1  # the burst and the refill, nothing more
    assert all(int(h["retry-after"]) >= 1 for h in limited)
    assert call(port, "GET", "/v1/users/bob/stats", token=other)[0] == 200
    status, _, raw = call(port, "GET", "/metrics", token=other)
    text = raw.decode()
    assert status == 200 and 'reflect_rate_limit{kind="requests_per_second"} 20' in text
    assert int(re.search(r"^reflect_rate_limited_total (\d+)", text, re.M).group(1)) >= len(limited)
    assert call(port, "GET", "/healthz", token=None)[0] == 200  # probes are never limited
