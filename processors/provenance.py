"""Provenance: what a retraction does to the beliefs resting on it, pure.

A belief cites evidence (episodes, or beliefs one level down): the newest
part shown in `evidence_ids`, all of it in its lineage. When evidence
goes — an episode retracted, a belief invalidated — every belief reachable
over the reverse citations is reconsidered once, deepest last, so a belief is
judged after everything it cites has been:

* invalid when fewer than the citation floor of its evidence remain (or when
  the cause is an erasure: whatever was derived from erased text goes);
* weakened otherwise: still served, confidence scaled by what survives.

Reachability is a breadth-first walk that never revisits a node, so cycles
and diamonds (two paths to one belief) yield one decision per belief.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from processors.projector import lineage, served
from schemas import parse_time

Dependents = Callable[[str], Iterable[dict[str, Any]]]  # id → payloads of beliefs citing it


@dataclass(frozen=True)
class Decision:
    reflection_id: str
    status: str  # invalid | weakened
    path: tuple[str, ...]  # from the cause to this belief
    confidence: float
    surviving: tuple[str, ...]
    lost: tuple[str, ...]


def reach(seeds: Sequence[tuple[str, dict[str, Any]]], dependents: Dependents, max_depth: int,
          root: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Beliefs reachable from `seeds` (each with the node it was reached from),
    breadth first, at most max_depth levels: (payload by id, parent by id)."""
    reached: dict[str, dict[str, Any]] = {}
    parent: dict[str, str] = {}
    frontier = []
    for via, payload in seeds:
        rid = payload["reflection_id"]
        if rid not in reached and rid != root:
            reached[rid], parent[rid] = payload, via
            frontier.append(rid)
    for _ in range(max_depth):  # no belief is deeper: a bound, not a cut
        following = []
        for node in frontier:
            for payload in dependents(node):
                rid = payload["reflection_id"]
                if rid in reached or rid == root:  # never revisit: cycles, diamonds
                    continue
                reached[rid], parent[rid] = payload, node
                following.append(rid)
        frontier = following
    return reached, parent


def path_to(rid: str, parent: Mapping[str, str], root: str) -> tuple[str, ...]:
    path = [rid]
    while path[-1] != root and path[-1] in parent:
        path.append(parent[path[-1]])
    return tuple(reversed(path))


def decide(reached: Mapping[str, dict[str, Any]], parent: Mapping[str, str], root: str,
           gone: set[str], lost_before: Mapping[str, Sequence[str]], floor: int,
           erasure: bool) -> list[Decision]:
    """One decision per reached belief whose evidence lost something new,
    shallowest first (what a belief cites is decided before it)."""
    gone = set(gone)
    out = []
    for rid in sorted(reached, key=lambda r: (int(reached[r].get("depth", 1)), r)):
        payload = reached[rid]
        evidence, cited = list(payload.get("evidence_ids", ())), lineage(payload)  # shown; ever cited
        lost = tuple(e for e in cited if e in gone)
        # An erasure reaches beliefs already invalid or already weakened by the
        # same episode too: their text still has to go.
        if not erasure and (payload.get("status") == "invalid" or set(lost) <= set(lost_before.get(rid, ()))):
            continue  # nothing it rests on changed
        if not lost:
            continue
        surviving = tuple(e for e in evidence if e not in gone)
        invalid = erasure or len(surviving) < floor
        standing = sum(e not in gone for e in cited) / len(cited)
        confidence = 0.0 if invalid else float(payload.get("confidence", 0.5)) * standing
        out.append(Decision(rid, "invalid" if invalid else "weakened", path_to(rid, parent, root),
                            round(confidence, 6), surviving, lost))
        if invalid:
            gone.add(rid)
    return out


# --------------------------------------------------------------- bi-temporal reads

# Keys a change of status sets (a challenge superseding the belief, staleness):
# a read as of a time before that change shows the belief without them.
CHANGE_KEYS = ("superseded_at", "superseded_by", "superseded_cause", "superseded_verdict", "superseded_cycle",
               "stale_at", "refreshed_at")


def as_of(payload: dict[str, Any], at: str) -> dict[str, Any] | None:
    """The belief as the system held it at transaction time `at`, or None if it
    did not hold it then (not yet created, or already expired). A superseded or
    stale belief is still held, with that status, from the change on."""
    when = parse_time(at)
    created = payload.get("created_at")
    if created is None or parse_time(created) > when:
        return None
    expired = payload.get("expired_at")
    if expired is not None and parse_time(expired) <= when:
        return None
    state = {"status": "live", "confidence": payload.get("confidence")}
    for change in payload.get("history", ()):
        if parse_time(change["at"]) <= when:
            state = {"status": change["status"], "confidence": change["confidence"]}
    status = "live" if state["status"] == "weakened" else state["status"]
    if status not in ("superseded", "stale"):
        payload = {k: v for k, v in payload.items() if k not in CHANGE_KEYS}
    return {**payload, **state, "status": status}


def tree(get: Callable[[str, str], dict[str, Any] | None], kind: str, rid: str, max_depth: int,
         seen: set[str] | None = None) -> dict[str, Any]:
    """A belief's provenance down to the episodes, each node with its status;
    a node met again (a diamond) is shown once more but not expanded."""
    seen = set() if seen is None else seen
    payload = get(kind, rid)
    node: dict[str, Any] = {"id": rid, "kind": kind}
    if payload is None:
        return {**node, "status": "unknown"}
    payload = served(payload)
    node.update({k: payload[k] for k in ("status", "text", "confidence", "depth", "occurred_at",
                                          "retraction_reason", "expired_at") if k in payload})
    if kind == "reflection" and rid not in seen and max_depth > 0:
        seen.add(rid)
        lost = set(payload.get("lost_evidence_ids", ()))
        node["evidence"] = []
        for eid in payload.get("evidence_ids", ()):
            child_kind = "reflection" if get("reflection", eid) is not None else "episode"
            child = tree(get, child_kind, eid, max_depth - 1, seen)
            if eid in lost:
                child["lost"] = True
            node["evidence"].append(child)
    elif rid in seen:
        node["repeated"] = True
    return node


def chain(get: Callable[[str, str], dict[str, Any] | None], payload: dict[str, Any]) -> dict[str, Any]:
    """A belief's place in a change of mind: belief → the challenger episodes
    that superseded it → its successor; and the belief it superseded, if any."""
    def brief(kind: str, rid: str | None) -> dict[str, Any] | None:
        found = get(kind, rid) if rid else None
        if found is None:
            return {"id": rid, "kind": kind, "status": "unknown"} if rid else None
        found = served(found)
        return {"id": rid, "kind": kind, **{k: found[k] for k in ("status", "text", "occurred_at") if k in found}}

    out: dict[str, Any] = {}
    if payload.get("status") == "superseded":
        out.update(verdict=payload.get("superseded_verdict"), superseded_at=payload.get("superseded_at"),
                   cycle_id=payload.get("superseded_cycle"),
                   challengers=[brief("episode", e) for e in payload.get("superseded_cause", ())],
                   successor=brief("reflection", payload.get("superseded_by")))
    if payload.get("supersedes"):
        out["supersedes"] = brief("reflection", payload["supersedes"])
    return out
