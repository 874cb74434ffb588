"""The CLI's commands against a running Reflect API (explain, rebuild, recall,
beliefs), through the public client (streams/client.py)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from streams.client import ReflectClient


def render(node: dict[str, Any], indent: str = "") -> list[str]:
    """One line per node: status, kind, id, text; lost evidence marked."""
    mark = " (lost)" if node.get("lost") else " (again)" if node.get("repeated") else ""
    text = node.get("text")
    line = f"{indent}[{node.get('status', '?')}] {node['kind']} {node['id']}{mark}"
    lines = [line + (f": {text[:100]}" if text else "")]
    for child in node.get("evidence", ()):
        lines += render(child, indent + "    ")
    return lines


def explain(client: ReflectClient, args) -> int:
    found = client.explain(args.user, args.reflection_id)
    print(json.dumps(found.raw, indent=2) if args.json else "\n".join(render(found.provenance)))
    return 0


def rebuild(client: ReflectClient, args) -> int:
    """Start a rebuild in the running worker and follow it to the swap."""
    started = client.start_rebuild()
    print(f"rebuilding {started['old_view']} from the log; reads keep answering from it", file=sys.stderr)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        progress = client.rebuild_progress()
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


def recall(client: ReflectClient, args) -> int:
    found = client.recall(args.user, args.query, mode=args.mode, k=args.k, refresh=args.refresh)
    if args.json:
        print(json.dumps(found.raw, indent=2))
        return 0
    print(f"route {found.route}: {found.reason}")
    for r in found.results:
        print(f"  {r.score:.3f}  {r.kind:<10} {r.id}  {(r.occurred_at or '')[:10]}  {r.text[:100]}")
        for e in r.raw.get("evidence", ()):
            print(f"           evidence {e['id']}  {(e.get('occurred_at') or '')[:10]}  {e['text'][:90]}")
    return 0


def beliefs(client: ReflectClient, args) -> int:
    if args.format == "prompt":
        print(client.beliefs_prompt(args.user, budget=args.budget, limit=args.limit, as_of=args.as_of,
                                    refresh=args.refresh).prompt)
    else:
        found = client.beliefs(args.user, limit=args.limit, as_of=args.as_of, refresh=args.refresh)
        print(json.dumps(found.raw, indent=2))
    return 0


def stats(client: ReflectClient, args) -> int:
    print(json.dumps(client.stats(args.user).raw, indent=2))
    return 0


COMMANDS = {"explain": explain, "rebuild": rebuild, "recall": recall, "beliefs": beliefs, "stats": stats}
