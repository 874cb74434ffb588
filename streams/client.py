"""Commands that talk to a running Reflect API: explain, rebuild, recall, beliefs."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def render(node: dict[str, Any], indent: str = "") -> list[str]:
    """One line per node: status, kind, id, text; lost evidence marked."""
    mark = " (lost)" if node.get("lost") else " (again)" if node.get("repeated") else ""
    text = node.get("text")
    line = f"{indent}[{node.get('status', '?')}] {node['kind']} {node['id']}{mark}"
    lines = [line + (f": {text[:100]}" if text else "")]
    for child in node.get("evidence", ()):
        lines += render(child, indent + "    ")
    return lines


def auth_headers(env=os.environ) -> dict[str, str]:
    """The bearer token of an API started with REFLECT_API_TOKEN, from the same variable."""
    token = env.get("REFLECT_API_TOKEN", "").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def _call(api: str, path: str, method: str = "GET") -> dict[str, Any]:
    """The API's JSON answer; a clear error for a refusal or no API at all."""
    request = urllib.request.Request(api.rstrip("/") + path, data=b"" if method == "POST" else None, method=method,
                                     headers=auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        error = json.loads(exc.read() or b"{}").get("error", {})
        raise RuntimeError(error.get("message", str(exc))) from None
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeError(f"no Reflect API at {api} ({exc}); start one with `reflect up`") from None


def explain(args) -> int:
    path = "/v1/users/{}/reflections/{}".format(*(urllib.parse.quote(x, safe="") for x in (args.user, args.reflection_id)))
    found = _call(args.api, path)
    print(json.dumps(found, indent=2) if args.json else "\n".join(render(found["provenance"])))
    return 0


def rebuild(args) -> int:
    """Start a rebuild in the running worker and follow it to the swap."""
    started = _call(args.api, "/v1/admin/rebuild", "POST")
    print(f"rebuilding {started['old_view']} from the log; reads keep answering from it", file=sys.stderr)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        progress = _call(args.api, "/v1/admin/rebuild")
        done, total = progress["events"], max(progress["total"], 1)
        bar = "#" * int(30 * min(done / total, 1))
        print(f"\r{progress['state']:<9} [{bar:<30}] {done}/{progress['total']} events, "
              f"{progress['rate']:,.0f}/s", end="", file=sys.stderr, flush=True)
        if progress["state"] in ("done", "failed"):
            print(file=sys.stderr)
            if progress["state"] == "failed":
                raise RuntimeError(f"rebuild failed ({progress['error']}); the old view keeps serving")
            print(f"{progress['new_view']} now serves {progress['old_view']}'s reads: {done} events in "
                  f"{progress['seconds']} s ({progress['rate']:,.0f}/s), {progress['skipped']} undecodable skipped")
            return 0
        time.sleep(0.2)  # polling interval of a progress display, not a synchronization
    raise RuntimeError(f"the rebuild did not finish within {args.timeout} s (it goes on in the worker)")


def _user_path(user: str, tail: str, **query: Any) -> str:
    params = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
    return f"/v1/users/{urllib.parse.quote(user, safe='')}/{tail}" + (f"?{params}" if params else "")


def recall(args) -> int:
    found = _call(args.api, _user_path(args.user, "recall", q=args.query, mode=args.mode, k=args.k,
                                       refresh=args.refresh))
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    print(f"route {found['route']}: {found['reason']}")
    for r in found["results"]:
        print(f"  {r['score']:.3f}  {r['kind']:<10} {r['id']}  {(r.get('occurred_at') or '')[:10]}  {r['text'][:100]}")
        for e in r.get("evidence", ()):
            print(f"           evidence {e['id']}  {(e.get('occurred_at') or '')[:10]}  {e['text'][:90]}")
    return 0


def beliefs(args) -> int:
    found = _call(args.api, _user_path(args.user, "beliefs", limit=args.limit, format=args.format,
                                       budget=args.budget, refresh=args.refresh, as_of=args.as_of))
    if args.format == "prompt":
        print(found["prompt"])
    else:
        print(json.dumps(found, indent=2))
    return 0
