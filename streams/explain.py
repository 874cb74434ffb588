"""`reflect explain`: a belief and its provenance, from a running API."""

from __future__ import annotations

import json
import sys
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


def explain(args) -> int:
    path = "/v1/users/{}/reflections/{}".format(*(urllib.parse.quote(x, safe="") for x in (args.user, args.reflection_id)))
    try:
        with urllib.request.urlopen(args.api.rstrip("/") + path, timeout=10) as answer:
            found = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        error = json.loads(exc.read() or b"{}").get("error", {})
        print(f"reflect: error: {error.get('message', exc)}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"reflect: error: no Reflect API at {args.api} ({exc}); start one with `reflect up`", file=sys.stderr)
        return 1
    print(json.dumps(found, indent=2) if args.json else "\n".join(render(found["provenance"])))
    return 0
