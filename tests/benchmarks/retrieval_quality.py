"""Retrieval quality: evidence recall of hybrid (dense + BM25 in the engine)
against plain cosine and BM25 alone, on the demo history, in the same run.

    python tests/benchmarks/retrieval_quality.py [--embedder minilm|e5-small|hashing] [--query-prefix] [--json]

The store is `reflect demo`'s bundled history (2,100 episodes of one user,
four planted patterns; streams/cli/sample.py), projected into a real Qdrant Edge
view. Two kinds of question, each with its evidence known:
* instance: questions about one event, generated from the slots of a specific
  episode and phrased differently from it (its evidence: that episode);
* pattern: hand-written questions about each planted habit (its evidence:
  the pattern's episodes; recall@k counts them over min(k, |evidence|)).
Methods, one view, one embedder: `cosine` (VectorStore.search), `bm25` (the
sparse half alone, engine IDF), `hybrid` (recall(), mode=instance: the
engine's fused formula with recency × importance), and `auto` (recall()
routed by the question, with the planted patterns' beliefs in the view; a
belief's cited evidence counts as retrieved). Latency p50/p95 per method.
`--query-prefix` embeds the questions with the embedder's `embed_query` (e5's
"query: " prefix; the episodes keep "passage: ") where recall() embeds them
with `embed` today: what wiring it into the read path would gain. Beliefs are
served from the embedder's own recall floor (processors/embedders.py).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

from processors.embedders import EMBEDDERS, RECALL_MIN_SCORE  # noqa: E402
from streams.adapters.factory import make_embedder  # noqa: E402
from streams.adapters.lexical import query_terms  # noqa: E402
from processors.projector import EpisodeProjector, ReflectionProjector  # noqa: E402
from processors.retrieval import recall  # noqa: E402
from processors.ports import Hit  # noqa: E402
from streams.adapters.view.edge import EdgeView  # noqa: E402
from schemas import EpisodeRecorded, ReflectionCreated  # noqa: E402
from streams.cli.sample import history  # noqa: E402
from suite_figures import figure, print_scenario, quantile, target  # noqa: E402

# (pattern of an episode's text, question about it): the question keeps the
# facts that single the event out (a number, a name) in other words.
INSTANCE = [
    (r"Merged pull request #(?P<pr>\d+), which (?P<change>.+) in (?P<sub>\w+)\.",
     "What did PR {pr} change in the {sub} code?"),
    (r"Ran the (?P<sub>\w+) test suite: (?P<n>\d+) tests passed in (?P<secs>\d+) seconds\.",
     "How long did the {sub} tests take the time {n} of them passed?"),
    (r"Discussed naming with the user: (?P<old>\w+) became (?P<new>\w+) in the (?P<sub>\w+) module\.",
     "What was {new} called before we renamed it?"),
    (r"Fixed a small bug in (?P<sub>\w+) \((?P<small>.+)\)\.", "When did we repair the {small} in {sub}?"),
    (r"Bumped (?P<dep>\w+) to the latest minor version in (?P<sub>\w+);",
     "When was {dep} upgraded for {sub}?"),
    (r"Profiled the (?P<sub>\w+) (?P<thing>.+); most time went into (?P<hot>.+)\.",
     "What was slow when we measured the {sub} {thing}?"),
    (r"Cleaned up (?P<n>\d+) stale branches left over from the (?P<sub>\w+) work\.",
     "How many old branches did we delete after the {sub} project?"),
    (r"Added an automatic retry with backoff to the (?P<sub>\w+) HTTP client\.",
     "When did the {sub} client start retrying requests on its own?"),
]
PATTERN = {
    "no-friday-deploys": ("Does the user ship releases at the end of the week?",
                          "What is the user's rule about deploying on Fridays?",
                          "On which day does the user refuse to release?"),
    "reverts-touch-auth": ("Which kind of pull requests tend to get reverted?",
                           "What do the changes the user rolled back have in common?",
                           "Is there a pattern in which PRs get reverted?"),
    "logs-before-retry": ("What does the user want before a failed job is retried?",
                          "How does the user usually handle a failed deploy or build?",
                          "Does the user retry failures right away?"),
    "failing-test-first": ("How does the user usually start fixing a bug?",
                           "What does the user do first when debugging?",
                           "Does the user write tests when fixing bugs?"),
}
PER_TEMPLATE = 12
NOW = datetime(2026, 9, 1, tzinfo=timezone.utc)


def questions(hist, seed: int = 5) -> list[dict]:
    """[{"type", "q", "evidence": set of episode ids}] for the history."""
    rng, out = random.Random(seed), []
    for pattern, template in INSTANCE:
        matched = [(e, m) for e in hist.episodes for m in [re.match(pattern, e.text)] if m]
        for e, m in rng.sample(matched, min(PER_TEMPLATE, len(matched))):
            out.append({"type": "instance", "q": template.format(**m.groupdict()), "evidence": {e.episode_id}})
    for p in hist.patterns:
        out += [{"type": "pattern", "q": q, "evidence": set(p.episode_ids)} for q in PATTERN[p.name]]
    return out


def evidence_recall(found: list[str], evidence: set[str], k: int) -> float:
    """Share of the evidence in the top k, over what k could hold at best."""
    return len(set(found[:k]) & evidence) / min(k, len(evidence))


def score(answers: dict[str, list[list[str]]], qs: list[dict], ks=(5, 10)) -> dict:
    """{method: {type: {"r@5", "r@10"}}}: mean evidence recall by question type."""
    out = {}
    for method, found in answers.items():
        out[method] = {}
        for kind in sorted({q["type"] for q in qs}):
            rows = [(f, q["evidence"]) for f, q in zip(found, qs) if q["type"] == kind]
            out[method][kind] = {f"r@{k}": sum(evidence_recall(f, e, k) for f, e in rows) / len(rows) for k in ks}
    return out


def recall_figures(table: dict, kinds, latency: dict[str, list[float]]) -> list[dict]:
    """Each method's recall@5/@10 by question kind beside plain cosine's, then latency p50/p95 per method."""
    out = [figure(f"{kind} {at} {name}", 100 * table[name][kind][at], "%", "cosine", 100 * table["cosine"][kind][at])
           for kind in kinds for at in ("r@5", "r@10") for name in ("hybrid", "auto", "bm25")]
    for name in latency:
        out += [figure(f"latency p{p} {name}", quantile(latency[name], p), "ms") for p in (50, 95)]
    return out


def bm25_alone(view: EdgeView, user: str, text: str, k: int) -> list[Hit]:
    """The sparse half alone, engine IDF over the user's points (the BM25 baseline)."""
    q = view._q
    where = view._filter(user, {"kind": "episode", "status": "recorded"})
    indices, values = query_terms(text)
    if not indices:
        return []
    found = view._shard.query(q.QueryRequest(
        limit=k, query=q.Query.Nearest(q.SparseVector(indices, values), using="bm25"), filter=where,
        with_payload=True, params=q.SearchParams(idf=q.IdfParams(corpus=view._filter(user, {})))))
    return [Hit(str(p.id), p.score, dict(p.payload)) for p in found]


def build(root: Path, embedder, hist, beliefs: bool) -> EdgeView:
    view = EdgeView(root, "bench", embedder.dim)
    EpisodeProjector(view, embedder).apply([
        EpisodeRecorded(user_id=hist.user_id, episode_id=e.episode_id, text=e.text, importance=e.importance,
                        occurred_at=e.occurred_at) for e in hist.episodes])
    if beliefs:  # what a good reflector would have found: one belief per planted pattern
        ReflectionProjector(view, embedder).apply([
            ReflectionCreated(user_id=hist.user_id, reflection_id=f"belief-{p.name}", cycle_id="bench:1",
                              text=p.description, evidence_ids=p.episode_ids[:32], depth=1, importance=0.8,
                              confidence=0.9, reasoner="offline", prompt_version="v1",
                              occurred_at=hist.episodes[-1].occurred_at) for p in hist.patterns])
    return view


def ids(results: list[dict]) -> list[str]:
    """A recall answer's ids, a belief standing for the evidence it cites (in its place)."""
    out = []
    for r in results:
        out += [r["id"]] if r["kind"] == "episode" else [e["id"] for e in r.get("evidence", ())]
    return list(dict.fromkeys(out))


class Questions:
    """The embedder as the read path would use it for questions: its `embed_query`."""

    def __init__(self, embedder) -> None:
        self.name, self.dim, self.embed = embedder.name, embedder.dim, embedder.embed_query


def measure(embedder_name: str = "minilm", k: int = 10, query_prefix: bool = False) -> dict:
    hist, embedder = history(), make_embedder(embedder_name)
    asker = Questions(embedder) if query_prefix else embedder
    floor = RECALL_MIN_SCORE[embedder_name]
    qs = questions(hist)
    answers: dict[str, list[list[str]]] = {m: [] for m in ("cosine", "bm25", "hybrid", "auto")}
    latency: dict[str, list[float]] = {m: [] for m in answers}
    routes = []
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        view = build(Path(tmp) / "view", embedder, hist, beliefs=True)
        built = time.perf_counter() - t
        user = hist.user_id
        methods = {
            "cosine": lambda q: [h.payload["episode_id"] for h in view.search(
                user, asker.embed([q])[0], k, kind="episode", status="recorded")],
            "bm25": lambda q: [h.payload["episode_id"] for h in bm25_alone(view, user, q, k)],
            "hybrid": lambda q: ids(recall(view, asker, user, q, mode="instance", k=k, now=NOW,
                                           min_belief_score=floor)["results"]),
            "auto": lambda q: ids(_routed(view, asker, user, q, k, routes, floor)),
        }
        for q in qs:
            for name, run in methods.items():  # same order every question: noise hits all alike
                t = time.perf_counter()
                answers[name].append(run(q["q"]))
                latency[name].append((time.perf_counter() - t) * 1000)
        view.close()
    table = score(answers, qs)
    figures = recall_figures(table, ("instance", "pattern"), latency)
    patterned = [r for r, q in zip(routes, qs) if q["type"] == "pattern"]
    figures.append(figure("pattern questions answered by a belief", 100 * sum(patterned) / len(patterned), "%"))
    gain = 100 * (table["hybrid"]["instance"]["r@10"] - table["cosine"]["instance"]["r@10"])
    auto_cost = 100 * (table["hybrid"]["instance"]["r@10"] - table["auto"]["instance"]["r@10"])
    return {"embedder": embedder_name + (" (query prefix)" if query_prefix else ""),
            "questions": {t: sum(q["type"] == t for q in qs) for t in ("instance", "pattern")},
            "build_s": round(built, 1), "recall": table, "figures": figures,
            "targets": [target("hybrid − cosine instance recall@10 (points)", gain, ">=", 10.0),
                        target("instance − auto instance recall@10 (points)", auto_cost, "<=", 1.0)]}


def _routed(view, embedder, user, q, k, routes, floor: float) -> list[dict]:
    out = recall(view, embedder, user, q, mode="auto", k=k, now=NOW, min_belief_score=floor)
    routes.append(any(r["kind"] == "reflection" for r in out["results"][:3]))
    return out["results"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedder", default="minilm", choices=EMBEDDERS)
    parser.add_argument("--query-prefix", action="store_true",
                        help="embed the questions with embed_query (e5's 'query: ' prefix)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    result = measure(args.embedder, query_prefix=args.query_prefix)
    if args.json:
        import json
        print(json.dumps(result))
        return
    print_scenario(f"retrieval ({result['embedder']}, {result['questions']})", result)


if __name__ == "__main__":
    main()
