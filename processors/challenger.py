"""A challenge cycle: does a live belief still hold, given the episodes that
challenged it (processors/challenge.py asks for one)?

`run_challenge` reads through the view and reasoner ports and returns the
events to publish, ending — always — with the cycle's audit record,
ReflectionChallenged, which carries the verdict:

* holds — the cited challengers support the belief: a ReflectionReinforced
  adds them to its evidence (a repeat adds nothing);
* refined / contradicted — the belief is superseded: no longer served, kept
  with its history; where the new evidence supports one (the citation floor,
  the depth cap, the grounding and instruction screens of any belief), a
  successor ReflectionCreated (`supersedes` the old one) is emitted first;
* unrelated — the gate's false alarm: nothing changes.

Like `reflector.run_cycle`, the cycle happens at its request's valid time and
its ids are deterministic, so a redelivered request emits the same events.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from processors.challenge import VERDICTS, Answer
from processors.injection import instruction_cue
from processors.ports import Embedder, Reasoner, Usage, VectorStore
from processors.projector import latest, point_id, support_of
from processors.reflection import reflection_id, ungrounded
from processors.staleness import refreshed
from processors.reflector import TIE_MARGIN, CycleConfig, _asked, confidence, kept_evidence, top, window_records
from schemas import ChallengeRequested, Event, ReflectionChallenged, ReflectionCreated, ReflectionReinforced


class Unusable(Exception):
    """The reasoner's answer cannot be used (fails the cycle, never the worker)."""
    from_reasoner = True


def run_challenge(request: ChallengeRequested, view: VectorStore, embedder: Embedder, reasoner: Reasoner,
                  config: CycleConfig) -> list[Event]:
    started = time.perf_counter()
    user, rid = request.user_id, request.reflection_id
    pid = point_id("reflection", user, rid)
    belief = view.get([pid]).get(pid)
    if not belief or belief.get("user_id") != user or belief.get("status") not in ("live", "stale") \
            or not belief.get("text"):
        return [audit(request, reasoner, "moot", started, reason="the belief is no longer served")]
    challengers = window_records(view, user, [("episode", e) for e in request.challenger_ids], request.position)
    if not challengers:
        return [audit(request, reasoner, "moot", started, reason="every challenger was retracted")]
    cited_refs = [(kind, e) for e in belief.get("evidence_ids", ()) for kind in ("episode", "reflection")]
    evidence = window_records(view, user, cited_refs, request.position)
    usage = Usage()
    try:
        answer, usage = _asked(reasoner.verdict, belief["text"], [r["text"] for r in evidence],
                               [c["text"] for c in challengers])
        cited = _checked(answer, len(challengers))
    except Exception as exc:
        if not getattr(exc, "from_reasoner", False):
            raise  # the view's or a bug's: the pipeline's error policy decides
        outcome = "unavailable" if getattr(exc, "unavailable", False) else "failed"
        return [audit(request, reasoner, outcome, started, usage=getattr(exc, "spent", usage),
                      error=f"{type(exc).__name__}: {exc}"[:2000])]
    chosen = [challengers[n - 1] for n in cited]
    out: list[Event] = []
    status, successor, why = belief["status"], None, answer.reason
    if answer.verdict == "holds":
        reinforced = _reinforcement(request, belief, chosen, config)
        out += [reinforced, *refreshed(belief, reinforced, config.stale_after_days, request.cycle_id)] \
            if reinforced else []
        status = "live" if len(out) > 1 or status == "live" else status
    elif answer.verdict in ("refined", "contradicted"):
        status = "superseded"
        made, successor, dropped = _successor(request, belief, evidence, chosen, answer, reasoner, view, embedder,
                                              config)
        out += made
        if not successor and dropped:
            why = f"{why}; no successor: {dropped}"[:2000]
    out.append(audit(request, reasoner, "ok", started, usage=usage, answer=answer,
                     cited=tuple(c["id"] for c in chosen), status=status, successor=successor, reason=why))
    return out


def _checked(answer: Answer, shown: int) -> tuple[int, ...]:
    """The answer's citations, in range and once each; a verdict that changes
    or supports the belief must cite at least one challenger."""
    if answer.verdict not in VERDICTS:
        raise Unusable(f"verdict {answer.verdict!r} is not one of {', '.join(VERDICTS)}")
    cited = tuple(dict.fromkeys(n for n in answer.cited if isinstance(n, int) and 1 <= n <= shown))
    if answer.verdict != "unrelated" and not cited:
        raise Unusable(f"verdict {answer.verdict} cites none of the {shown} challengers")
    return cited


def _reinforcement(request: ChallengeRequested, belief: dict[str, Any], supporting: Sequence[dict[str, Any]],
                   config: CycleConfig, similarity: float | None = None) -> ReflectionReinforced | None:
    previous = list(belief.get("evidence_ids", ()))
    added = tuple(r["id"] for r in supporting if r["id"] not in previous)
    if not added or int(belief.get("depth", 1)) > 1:  # episodes are no evidence of a belief about beliefs
        return None
    support = support_of(belief.get("support"), previous) + len(added)
    standing = support - len(belief.get("lost_evidence_ids", ()))
    return ReflectionReinforced(
        event_id=f"reinforced:{request.cycle_id}:{belief['reflection_id']}", user_id=request.user_id,
        reflection_id=belief["reflection_id"], cycle_id=request.cycle_id,
        evidence_ids=kept_evidence((*previous, *added), config.max_evidence), added_evidence_ids=added,
        confidence=confidence(standing), support=support, similarity=similarity,
        supported_at=latest(*(r["occurred_at"] for r in supporting if r["id"] in added)),
        occurred_at=request.occurred_at)


def _successor(request: ChallengeRequested, belief: dict[str, Any], evidence: Sequence[dict[str, Any]],
               chosen: Sequence[dict[str, Any]], answer: Answer, reasoner: Reasoner, view: VectorStore,
               embedder: Embedder, config: CycleConfig) -> tuple[list[Event], str | None, str]:
    """The belief that replaces a superseded one: (its events, its id, why
    none). A refined belief still rests on the old evidence, narrowed by the
    new; a contradicted one only on the new. Where a live belief of the same
    depth already says it (another challenge of the same change formed it),
    that one is reinforced and named the successor: one change, one belief."""
    text = answer.statement.strip()
    if not text:
        return [], None, "the reasoner stated none"
    resting = [*(evidence if answer.verdict == "refined" else ()), *chosen]
    resting = list({r["id"]: r for r in resting}.values())
    ids = [r["id"] for r in resting]
    depth = 1 + max(int(r.get("depth", 0)) for r in resting)
    vectors = embedder.embed([text, *(r["text"] for r in resting)])
    near = view.search(request.user_id, vectors[0], 5 * TIE_MARGIN, kind="reflection", status="live")
    same = [h for h in top(near, 5)
            if h.score >= config.duplicate_cosine and h.payload.get("user_id") == request.user_id
            and int(h.payload.get("depth", 1)) == depth and h.payload.get("reflection_id") != request.reflection_id]
    if same:  # already grounded when it was formed: one more challenger is support, whatever the floor
        kept = same[0].payload
        reinforced = _reinforcement(request, kept, resting, config, round(min(1.0, same[0].score), 6))
        return ([reinforced] if reinforced else []), kept["reflection_id"], ""
    if len(resting) < config.citation_floor:
        return [], None, f"cites {len(resting)} record(s), floor is {config.citation_floor}"
    if depth > config.max_depth:
        return [], None, f"depth {depth} exceeds max_depth {config.max_depth}"
    cue = instruction_cue(text)
    why = f"instruction-shaped text ({cue})" if cue else ungrounded(
        text, vectors[0], [(r["text"], v) for r, v in zip(resting, vectors[1:])], [], config.grounding_cosine,
        config.citation_floor)
    if why:
        return [], None, why
    rid = reflection_id(request.user_id, request.cycle_id, ids)
    return [ReflectionCreated(
        event_id=f"created:{rid}", user_id=request.user_id, reflection_id=rid, cycle_id=request.cycle_id,
        text=text[:16000], evidence_ids=kept_evidence(tuple(ids), config.max_evidence), depth=depth,
        importance=max(float(r.get("importance", 0.0)) for r in resting), confidence=confidence(len(ids)),
        support=len(ids), reasoner=reasoner.name, prompt_version=reasoner.prompt_version,
        question=f"Does this still hold: {belief['text']}"[:2000], supersedes=request.reflection_id,
        supported_at=latest(*(r["occurred_at"] for r in resting)), occurred_at=request.occurred_at)], rid, ""


def audit(request: ChallengeRequested, reasoner: Reasoner, outcome: str, started: float, usage: Usage = Usage(),
          answer: Answer | None = None, cited: tuple[str, ...] | None = None, status: str | None = None,
          successor: str | None = None, reason: str | None = None, error: str | None = None) -> ReflectionChallenged:
    """The challenge cycle's audit record (its verdict when there is one)."""
    return ReflectionChallenged(
        event_id=f"challenged:{request.cycle_id}", user_id=request.user_id, cycle_id=request.cycle_id,
        reflection_id=request.reflection_id, challenger_ids=request.challenger_ids, outcome=outcome,
        reasoner=reasoner.name, usage=usage.to_dict(), duration_ms=round((time.perf_counter() - started) * 1000, 3),
        verdict=answer.verdict if answer else None, cited_ids=cited, successor_id=successor, status=status,
        heuristic=answer.heuristic if answer else None, reason=(reason or None) and reason[:2000], error=error,
        occurred_at=request.occurred_at)


def refused_challenge(request: ChallengeRequested, reasoner: Reasoner, reason: str) -> ReflectionChallenged:
    return audit(request, reasoner, "refused", time.perf_counter(), error=reason)
