"""The CLI's commands against a running Reflect API (explain, rebuild, recall,
beliefs), through the public client (streams/client/)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from streams.client import ReflectClient
from streams.client.results import ReflectApiError


def render(node: dict[str, Any], indent: str = "") -> list[str]:
    """One line per node: status, kind, id, text; lost evidence marked."""
    mark = " (lost)" if node.get("lost") else " (again)" if node.get("repeated") else ""
    text = node.get("text")
    line = f"{indent}[{node.get('status', '?')}] {node['kind']} {node['id']}{mark}"
    lines = [line + (f": {text[:100]}" if text else "")]
    for child in node.get("evidence", ()):
        lines += render(child, indent + "    ")
    return lines


def erasure_lines(proof: dict) -> list[str]:
    keys = f"  keys destroyed: {len(proof['keys'])}: {', '.join(proof['keys']) or '-'}"
    if proof.get("scope") == "user":
        return [f"user {proof['user_id']} forgotten ({proof['erasure_id']}), completed {proof['completed_at']}",
                f"  points gone from the view: {proof.get('points', 0)}", keys]
    return [f"erasure {proof['erasure_id']} of episode {proof['episode_id']}, completed {proof['completed_at']}",
            f"  text gone from {len(proof['episodes'])} episode(s): {', '.join(proof['episodes']) or '-'}",
            f"  beliefs invalidated, text gone: {len(proof['beliefs'])}: {', '.join(proof['beliefs']) or '-'}", keys]


def explain(client: ReflectClient, args) -> int:
    if args.erasure:
        proof = client.erasure(args.user, args.erasure)
        print(json.dumps(proof, indent=2) if args.json else "\n".join(erasure_lines(proof)))
        return 0
    found = client.explain(args.user, args.reflection_id)
    print(json.dumps(found.raw, indent=2) if args.json else "\n".join(render(found.provenance)))
    return 0


def started(client: ReflectClient, deadline: float) -> dict:
    """A rebuild started in the running worker, once the scrub or compaction
    it is running (after an erasure, say) is over; another rebuild is refused."""
    waiting = None
    while True:
        try:
            return client.start_rebuild()
        except ReflectApiError as refused:
            kind = client.rebuild_progress().get("kind")
            if refused.status != 409 or kind == "rebuild" or time.monotonic() > deadline:
                raise
            if kind != waiting:
                print(f"waiting for the running {kind} to end", file=sys.stderr)
                waiting = kind
        time.sleep(0.2)  # polling the worker's state, as the progress display below does


def rebuild(client: ReflectClient, args) -> int:
    """Start a rebuild in the running worker and follow it to the swap."""
    deadline = time.monotonic() + args.timeout
    began = started(client, deadline)
    print(f"rebuilding {began['old_view']} from the log; reads keep answering from it", file=sys.stderr)
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


def replay(client: ReflectClient, args) -> int:
    """List, drop, or start a replay and follow it to its end."""
    if args.list:
        for r in client.replays():
            progress = r.get("progress") or {}
            print(f"{r['spec']['name']:<20} {r['state']:<8} {r['spec']['reasoner']:<9} "
                  f"{progress.get('episodes', 0)}/{r['estimate']['episodes']} episodes  "
                  f"{r['bytes'] / 1e6:,.1f} MB  {r['age_s'] / 3600:,.1f} h old")
        return 0
    if args.drop:
        client.drop_replay(args.drop)
        print(f"replay {args.drop} dropped: its side worker, topics and view")
        return 0
    if not args.name:
        raise RuntimeError("name the replay (reflect replay NAME), or --list, or --drop NAME")
    spec = {"reasoner": args.reasoner, "prompt_version": args.prompt_version, "users": args.user,
            "without": args.without, "until": args.until, "budget_tokens": args.budget_tokens}
    planned = client.start_replay(args.name, estimate_only=True, **spec)
    est, cost = planned["estimate"], planned["estimated_cost_usd"]
    print(f"replay {args.name}: {est['episodes']} episodes of {len(est['users'])} user(s), ~{est['cycles']} "
          f"cycles with the {args.reasoner} reasoner"
          + (f" (prompts {planned['spec']['prompt_version']})" if args.prompt_version else "")
          + f", ~{est['tokens']:,} tokens"
          + ("" if cost is None else f", ~${cost:,.2f}")
          + (f"; budget {args.budget_tokens:,} tokens" if args.budget_tokens else ""), file=sys.stderr)
    if est["tokens"] and not args.yes:
        if not sys.stdin.isatty() or input("start it? [y/N] ").strip().lower() not in ("y", "yes"):
            print("not started (--yes starts it without asking)", file=sys.stderr)
            return 1
    client.start_replay(args.name, **spec)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        state = client.replay(args.name)
        progress = state.get("progress") or {}
        done, total = progress.get("episodes", 0), max(progress.get("episodes_total", 0), 1)
        print(f"\r{state['state']:<8} [{'#' * int(30 * min(done / total, 1)):<30}] {done}/{total} episodes, "
              f"{progress.get('requests', 0)}/{progress.get('requests_total', 0)} requests", end="",
              file=sys.stderr, flush=True)
        if state["state"] != "running":
            print(file=sys.stderr)
            if state["state"] == "failed":
                raise RuntimeError(f"replay {args.name} failed: {state.get('error')}")
            print(f"replay {args.name} done in {state.get('seconds')} s: reflect diff {args.name}")
            return 0
        time.sleep(0.5)  # polling interval of a progress display, not a synchronization
    raise RuntimeError(f"replay {args.name} did not finish within {args.timeout} s (it goes on in the worker)")


def report(found: dict[str, Any], name: str, against: str) -> list[str]:
    """The diff as a reader takes it in: counts, then each change with its evidence."""
    lines = [f"{name} against {against}: {len(found['added'])} added, {len(found['dropped'])} dropped, "
             f"{len(found['changed'])} changed, {found['same']} the same"]
    for mark, key in (("+", "added"), ("-", "dropped")):
        for b in found[key]:
            lines.append(f"{mark} [{b['status']}] {b['user_id']} {b['reflection_id']}: {b['text']}")
            lines.append(f"      evidence {', '.join(b['evidence_ids'])}")
    for b in found["changed"]:
        before = b["before"]
        lines.append(f"~ [{b['status']}] {b['user_id']} {b['reflection_id']}: {b['text']}")
        if "text" in before:
            lines.append(f"      was: {before['text']}")
        if "status" in before:
            lines.append(f"      status was {before['status']}")
        if "evidence_ids" in before:
            was, now = set(before["evidence_ids"]), set(b["evidence_ids"])
            lines.append(f"      evidence {', '.join(b['evidence_ids'])}"
                         + (f"; lost {', '.join(sorted(was - now))}" if was - now else "")
                         + (f"; gained {', '.join(sorted(now - was))}" if now - was else ""))
    return lines


def diff(client: ReflectClient, args) -> int:
    found = client.replay_diff(args.name, against=args.against, users=args.user)
    print(json.dumps(found, indent=2) if args.json else "\n".join(report(found, args.name, args.against)))
    return 0


def promote(client: ReflectClient, args) -> int:
    done = client.promote_replay(args.name)
    print(f"replay {args.name} promoted: {done['published']} event(s) on the live reflections log, "
          f"{done['invalidated']} of them invalidating a live belief the replay does not hold; the live view "
          "shows its beliefs")
    return 0


COMMANDS = {"explain": explain, "rebuild": rebuild, "recall": recall, "beliefs": beliefs, "stats": stats,
            "replay": replay, "diff": diff, "promote": promote}
