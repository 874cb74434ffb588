"""/healthz's verdict from a worker's state (streams/http/routes/ops.py)."""

from streams.http.routes.ops import readiness


def test_ready_only_once_every_cause_has_passed():
    assert readiness(False, [], True, {}) == ("ok", {})
    assert readiness(True, [], True, {}) == ("starting", {})
    assert readiness(False, [0, 3], True, {}) == ("starting", {"catching_up": [0, 3]})
    assert readiness(False, [], True, {"project": "view"}) == ("degraded", {"stalled": {"project": "view"}})


def test_not_ready_while_the_router_trains():
    # Its training embeds hundreds of questions: an import let in meanwhile shares the cores with it.
    assert readiness(False, [], False, {}) == ("starting", {"router": "training"})
    assert readiness(False, [], False, {"project": "view"})[0] == "starting"
