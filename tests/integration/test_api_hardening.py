"""The worker's HTTP API at its edge, against a real `reflect worker`: the bearer
token on every route but /healthz, the request body limit (declared and
read), and 422 naming the field on every route that takes input."""

from __future__ import annotations

import json

import orjson
import pytest

from support.api import EPISODE, TOKEN, call, error_of

pytestmark = pytest.mark.integration

LIMIT = 2048


@pytest.fixture
def guarded(worker, settings):
    worker(env={"REFLECT_API_TOKEN": TOKEN, "REFLECT_MAX_REQUEST_BYTES": str(LIMIT)})
    return settings.web_port


# (method, path, body, status with the token); POST /v1/admin/rebuild is refused
# without the token below but not started with it (a rebuild is its own test).
ROUTES = [
    ("POST", "/v1/users/ann/episodes", EPISODE, {202}),
    ("GET", "/v1/users/ann/episodes/e1", None, {200, 404}),  # 404 until projected
    ("POST", "/v1/users/ann/episodes/e1/retract", b'{"reason": "incorrect"}', {202}),
    ("POST", "/v1/users/ann/reflect", None, {202}),
    ("GET", "/v1/users/ann/beliefs", None, {200}),
    ("GET", "/v1/users/ann/recall?q=deploys", None, {200}),
    ("GET", "/v1/users/ann/reflections/r1", None, {404}),
    ("GET", "/v1/users/ann/stats", None, {200}),
    ("GET", "/v1/reasoner", None, {200}),
    ("GET", "/v1/admin/rebuild", None, {200}),
    ("POST", "/v1/admin/rebuild", None, None),
    ("GET", "/metrics", None, {200}),
    ("GET", "/table/", None, {200}),  # Faust's own pages (table contents by key) are guarded as well
    ("GET", "/no/such/route", None, {404}),
]


def test_every_route_but_healthz_wants_the_bearer_token(guarded):
    port = guarded
    wrong = TOKEN[:-1] + ("x" if TOKEN[-1] != "x" else "y")  # same length: only the compare can tell
    for method, path, body, _ in ROUTES:
        for token, headers in ((None, None), (wrong, None), (None, {"Authorization": f"Basic {TOKEN}"})):
            status, got, raw = call(port, method, path, body, token=token, headers=headers)
            assert status == 401, (method, path, token, status, raw)
            assert got["www-authenticate"].startswith("Bearer"), got
            assert error_of(raw)["code"] == "unauthorized"
        assert 'error="invalid_token"' in call(port, method, path, body, token=wrong)[1]["www-authenticate"]

    for method, path, body, expected in ROUTES:
        if expected is None:
            continue
        status, got, raw = call(port, method, path, body)
        assert status in expected, (method, path, status, raw)
        if path == "/metrics":
            assert got["content-type"].startswith("text/plain; version=0.0.4")
            assert b"# TYPE reflect_events_total counter" in raw
        else:
            json.loads(raw)  # every answer is JSON, the router's 404 too
    # The scheme is case-insensitive (RFC 7235); the token is not.
    assert call(port, "GET", "/v1/reasoner", headers={"Authorization": f"bearer {TOKEN}"}, token=None)[0] == 200
    assert call(port, "GET", "/v1/reasoner", token=TOKEN.upper())[0] == 401

    status, _, raw = call(port, "GET", "/healthz", token=None)  # probes carry no token
    assert (status, json.loads(raw)) == (200, {"status": "ok"})


def padded(size: int) -> bytes:
    """A valid episode body of exactly `size` bytes (JSON allows trailing blanks)."""
    body = orjson.dumps({"text": "a body at the limit", "importance": 0.5})
    return body + b" " * (size - len(body))


def test_a_body_over_the_limit_is_413_whether_declared_or_streamed(guarded):
    port = guarded
    assert call(port, "POST", "/v1/users/ann/episodes", padded(LIMIT))[0] == 202  # the limit itself is fine

    for chunked in (False, True):  # Content-Length checked first; a chunked body while it is read
        status, _, raw = call(port, "POST", "/v1/users/ann/episodes", padded(LIMIT + 1), chunked=chunked)
        assert status == 413, (chunked, raw)
        error = error_of(raw)
        assert error["code"] == "too_large" and str(LIMIT) in error["message"] and error["field"] == "(body)"
    status, _, raw = call(port, "POST", "/v1/users/ann/episodes", padded(4 * LIMIT), chunked=True)
    assert status == 413
    # Routes that read no body refuse a declared oversized one too, and the token comes first.
    assert call(port, "POST", "/v1/users/ann/reflect", b"x" * (LIMIT + 1))[0] == 413
    assert call(port, "POST", "/v1/users/ann/episodes", padded(LIMIT + 1), token=None)[0] == 401


BAD = [
    ("POST", "/v1/users/ann/episodes", {"text": "x", "importance": "high"}, "importance"),
    ("POST", "/v1/users/ann/episodes", {"text": "x"}, "importance"),
    ("POST", "/v1/users/ann/episodes", {"text": 5, "importance": 0.5}, "text"),
    ("POST", "/v1/users/ann/episodes", {"text": "x", "importance": 0.5, "occurred_at": "yesterday"}, "occurred_at"),
    ("POST", "/v1/users/ann/episodes", {"text": "x", "importance": 0.5, "colour": "red"}, "colour"),
    ("POST", "/v1/users/ann/episodes", [1, 2], "(body)"),
    ("POST", f"/v1/users/{'u' * 200}/episodes", {"text": "x", "importance": 0.5}, "user_id"),
    ("POST", "/v1/users/ann/episodes/e1/retract", {"reason": "because"}, "reason"),
    ("POST", "/v1/users/ann/episodes/e1/retract", {"why": "typo"}, "why"),
    ("GET", "/v1/users/ann/beliefs?limit=abc", None, "limit"),
    ("GET", "/v1/users/ann/beliefs?limit=0", None, "limit"),
    ("GET", "/v1/users/ann/beliefs?as_of=yesterday", None, "as_of"),
    ("GET", "/v1/users/ann/beliefs?as_of=2026-06-01T09:00:00", None, "as_of"),
    ("GET", "/v1/users/ann/beliefs?format=xml", None, "format"),
    ("GET", "/v1/users/ann/beliefs?format=prompt&budget=1", None, "budget"),
    ("GET", "/v1/users/ann/beliefs?refresh=sometimes", None, "refresh"),
    ("GET", "/v1/users/ann/recall", None, "q"),
    ("GET", "/v1/users/ann/recall?q=deploys&k=0", None, "k"),
    ("GET", "/v1/users/ann/recall?q=deploys&mode=guess", None, "mode"),
    ("GET", "/v1/users/ann/recall?q=deploys&refresh=later", None, "refresh"),
]


def test_bad_input_is_422_naming_the_field_on_every_route(guarded):
    port = guarded
    for method, path, body, field in BAD:
        raw_body = None if body is None else orjson.dumps(body)
        status, got, raw = call(port, method, path, raw_body)
        assert status == 422, (path, body, status, raw)
        assert got["content-type"].startswith("application/json")
        error = error_of(raw)
        assert (error["code"], error["field"]) == ("invalid", field), (path, body, error)
        assert b"Traceback" not in raw
