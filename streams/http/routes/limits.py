"""Rate limits per credential (REFLECT_RATE_LIMIT, REFLECT_RATE_BURST): one
caller cannot flood a worker's API and slow every other caller.

Each credential (the bearer token as sent; without auth, the peer address)
has a token bucket of `burst` requests refilled at `rate` per second. A
request past it is answered 429 with Retry-After (whole seconds, RFC 9110)
and never reaches a handler; other credentials are unaffected. The guard runs
first, so only admitted requests are counted: a flood of bad tokens is
refused there and never fills the map. Probes are never limited, nor (with
auth on) is a forwarded read: its caller was counted by the worker it reached,
and the guard admitted it on that worker's assertion. Limits are
per worker: behind a load balancer over N workers a credential gets up to N
times the rate.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

import orjson
from aiohttp import web

from streams.auth import OPEN
from streams.http.forwarding import HEADER as ASSERTION
from streams.worker import metrics

MAX_CALLERS = 10_000  # buckets kept; the least recently seen goes first (a full bucket is no loss)


@dataclass
class Bucket:
    tokens: float
    at: float


class Limiter:
    """Token buckets by caller: pure state over a clock the caller passes."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst or max(1, math.ceil(2 * rate))
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()

    def wait(self, caller: str, now: float) -> float:
        """0 if the caller may go now (and it is counted), else the seconds until it may."""
        bucket = self._buckets.pop(caller, None) or Bucket(float(self.burst), now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        self._buckets[caller] = bucket
        if len(self._buckets) > MAX_CALLERS:
            self._buckets.popitem(last=False)
        if bucket.tokens >= 1 - 1e-9:  # a refill of exactly one request, less float rounding
            bucket.tokens = max(0.0, bucket.tokens - 1)
            return 0.0
        return (1 - bucket.tokens) / self.rate


def caller_of(request: web.Request) -> str:
    """Who is counted: a digest of the credential (no token is kept), else the peer."""
    credential = request.headers.get("Authorization")
    if credential:
        return "token:" + hashlib.sha256(credential.encode()).hexdigest()[:32]
    return f"peer:{request.remote}"


def limit(settings):
    """aiohttp middleware after the guard; None when no limit is set."""
    if not settings.rate_limit:
        return None
    limiter = Limiter(settings.rate_limit, settings.rate_burst)
    # With auth on, a forwarded read without a bearer got past the guard on the entry worker's
    # assertion, and its caller was counted there; with auth off anyone can send the header.
    asserted = bool(settings.api_token or settings.auth_secret or settings.auth_public_key_file)
    metrics.RATE_LIMIT.set(limiter.rate, kind="requests_per_second")
    metrics.RATE_LIMIT.set(limiter.burst, kind="burst")

    @web.middleware
    async def middleware(request: web.Request, handler):
        if request.path in OPEN or (asserted and ASSERTION in request.headers
                                    and "Authorization" not in request.headers):
            return await handler(request)
        wait = limiter.wait(caller_of(request), time.monotonic())
        if not wait:
            return await handler(request)
        metrics.RATE_LIMITED.inc()
        error = {"code": "rate_limited", "message": f"over {settings.rate_limit:g} requests a second for this "
                                                    "credential (REFLECT_RATE_LIMIT); retry after Retry-After"}
        return web.Response(body=orjson.dumps({"error": error}), status=429, content_type="application/json",
                            headers={"Retry-After": str(max(1, math.ceil(wait)))})
    return middleware
