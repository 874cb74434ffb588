"""Public recall: evidence recall of hybrid against plain cosine and BM25 alone
on public data (REALTALK, tests/benchmarks/realtalk.py), in the same run.

    python tests/benchmarks/public_recall.py [--embedder minilm|e5-small|hashing]
        [--conversations 1,2,3] [--no-beliefs] [--data DIR] [--json]

Each conversation is one user's memory: every turn one episode ("<speaker>:
<message>", at the turn's time), projected through the EpisodeProjector into
one real Qdrant Edge view. The unit is the turn because that is what the
annotations name, and a ~40-word turn fits the embedders' windows where a
session (20–150 turns) would be cut off. The questions are REALTALK's
memory probes, each with the turns that answer it; recall@k is the share of
those turns in the top k, over min(k, |evidence|) (retrieval_quality.py's).

Methods, one view, one embedder, every question: `cosine` (VectorStore.search),
`bm25` (the sparse half alone, engine IDF), `hybrid` (recall(), mode=instance)
and `auto` (recall(), mode=auto: the learned router, beliefs when it routes
there). Unless --no-beliefs, the view also holds the beliefs Reflect itself
makes of each conversation: the offline reasoner's cycles run in-process
every CYCLE_EVERY turns over the turns since the last cycle, as the
accumulator would fire them, so `auto` meets the beliefs it would meet in
production; a served belief's cited evidence counts as retrieved in its place.
Every question here is about what was said (an instance question), so `auto`
should lose nothing against `hybrid`.

Also: latency p50/p95 per method (one question: embed + search) and the
embedder's rate over the turns (texts/s, batches of 64).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

import realtalk  # noqa: E402
from processors.embedders import EMBEDDERS, RECALL_MIN_SCORE, Precomputed  # noqa: E402
from streams.adapters.factory import make_embedder  # noqa: E402
from processors.projector import EpisodeProjector, ReflectionProjector  # noqa: E402
from processors.reasoners import OfflineReasoner  # noqa: E402
from processors.reflector import GROUNDING_COSINE, CycleConfig, cycle_window, run_cycle  # noqa: E402
from processors.retrieval import recall  # noqa: E402
from streams.adapters.view.edge import EdgeView  # noqa: E402
from retrieval_quality import bm25_alone, ids, recall_figures, score  # noqa: E402
from schemas import EpisodeRecorded, ReflectionRequested, parse_time  # noqa: E402
from suite_figures import figure, print_scenario, target  # noqa: E402

METHODS = ("cosine", "bm25", "hybrid", "auto")
IMPORTANCE = 0.5  # the data rates no turn above another: every episode alike, so the boost ranks none higher
CYCLE_EVERY = 100  # turns between two in-process reflection cycles of one conversation
EMBED_BATCH = 64


def episodes(conv: realtalk.Conversation) -> list[EpisodeRecorded]:
    return [EpisodeRecorded(user_id=conv.id, episode_id=t.id, text=t.text, importance=IMPORTANCE,
                            occurred_at=t.occurred_at) for t in conv.turns]


def asked_at(conv: realtalk.Conversation):
    """The questions are asked a day after the conversation's last turn (the data gives no time)."""
    return parse_time(conv.turns[-1].occurred_at) + timedelta(days=1)


def reflect(view, embedder, conv: realtalk.Conversation, config: CycleConfig, reasoner) -> int:
    """Reflect's own beliefs of one conversation: an offline cycle every
    CYCLE_EVERY turns over those turns (and the earlier beliefs, as the
    reflector reads them), each cycle's beliefs projected before the next."""
    made = 0
    for n, start in enumerate(range(0, len(conv.turns), CYCLE_EVERY)):
        window = conv.turns[start:start + CYCLE_EVERY]
        request = ReflectionRequested(user_id=conv.id, cycle_id=f"{conv.id}:bench:{n}", why="threshold",
                                      window_episode_ids=tuple(t.id for t in window),
                                      occurred_at=window[-1].occurred_at)
        events = run_cycle(request, cycle_window(view, request, []), view, embedder, reasoner, config)
        made += ReflectionProjector(view, embedder).apply(events)
    return made


def measure(embedder_name: str = "minilm", conversations: list[int] | None = None, beliefs: bool = True,
            k: int = 10, data: str | None = None) -> dict:
    convs = realtalk.load(data)
    convs = [convs[i - 1] for i in conversations] if conversations else convs
    embedder = make_embedder(embedder_name)
    floor = RECALL_MIN_SCORE[embedder_name]
    texts = [t.text for c in convs for t in c.turns]
    started = time.perf_counter()
    vectors = {}
    for i in range(0, len(texts), EMBED_BATCH):
        chunk = texts[i:i + EMBED_BATCH]
        vectors.update(zip(chunk, embedder.embed(chunk)))
    rate = len(texts) / (time.perf_counter() - started)
    ahead = Precomputed(embedder, vectors)  # the projector finds every turn's vector already made
    qs = [{"type": q.type, "q": q.text, "evidence": set(q.evidence), "user": c.id, "now": asked_at(c)}
          for c in convs for q in c.questions]
    answers: dict[str, list[list[str]]] = {m: [] for m in METHODS}
    latency: dict[str, list[float]] = {m: [] for m in METHODS}
    routes: dict[str, int] = {}
    made = 0
    with tempfile.TemporaryDirectory() as tmp:
        view = EdgeView(Path(tmp) / "view", "bench", embedder.dim)
        t = time.perf_counter()
        for c in convs:
            EpisodeProjector(view, ahead).apply(episodes(c))
        projected = time.perf_counter() - t
        if beliefs:
            config = CycleConfig(grounding_cosine=GROUNDING_COSINE.get(embedder_name))
            reasoner = OfflineReasoner(embedder)  # as the worker makes it: grouping with its own embedder
            made = sum(reflect(view, ahead, c, config, reasoner) for c in convs)

        def routed(q):
            out = recall(view, embedder, q["user"], q["q"], mode="auto", k=k, now=q["now"], min_belief_score=floor)
            routes[out["route"]] = routes.get(out["route"], 0) + 1
            return ids(out["results"])

        methods = {
            "cosine": lambda q: [h.payload["episode_id"] for h in view.search(
                q["user"], embedder.embed([q["q"]])[0], k, kind="episode", status="recorded")],
            "bm25": lambda q: [h.payload["episode_id"] for h in bm25_alone(view, q["user"], q["q"], k)],
            "hybrid": lambda q: ids(recall(view, embedder, q["user"], q["q"], mode="instance", k=k, now=q["now"],
                                           min_belief_score=floor)["results"]),
            "auto": routed,
        }
        for q in qs:
            for name, run in methods.items():  # the same order every question: noise hits all alike
                t = time.perf_counter()
                answers[name].append(run(q))
                latency[name].append((time.perf_counter() - t) * 1000)
        view.close()
    table = score(answers, qs)
    overall = score(answers, [{**q, "type": "all"} for q in qs])
    for m in METHODS:
        table[m]["all"] = overall[m]["all"]
    kinds = ["all", *sorted({q["type"] for q in qs})]
    figures = [figure("embedding rate", rate, "texts/s"), *recall_figures(table, kinds, latency)]
    for kind in kinds:  # the differences the targets speak in: points of recall@10
        r10 = {m: 100 * table[m][kind]["r@10"] for m in METHODS}
        figures += [figure(f"{kind} r@10 hybrid − cosine", r10["hybrid"] - r10["cosine"], "points"),
                    figure(f"{kind} r@10 hybrid − bm25", r10["hybrid"] - r10["bm25"], "points"),
                    figure(f"{kind} r@10 auto − hybrid", r10["auto"] - r10["hybrid"], "points")]
    gain = 100 * (table["hybrid"]["all"]["r@10"] - table["cosine"]["all"]["r@10"])
    auto_cost = 100 * (table["hybrid"]["all"]["r@10"] - table["auto"]["all"]["r@10"])
    return {"data": f"{realtalk.SOURCE}@{realtalk.SOURCE_COMMIT[:12]}", "embedder": embedder_name,
            "conversations": [c.name for c in convs], "episodes": len(texts),
            "questions": {kind: sum(q["type"] == kind or kind == "all" for q in qs) for kind in kinds},
            "beliefs": made, "routes": routes, "project_s": round(projected, 1), "recall": table,
            "figures": figures,
            "targets": [target("hybrid − cosine recall@10 (points)", gain, ">=", 10.0),
                        target("instance − auto recall@10 (points)", auto_cost, "<=", 1.0)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedder", default="minilm", choices=EMBEDDERS)
    parser.add_argument("--conversations", default=None, help="comma-separated numbers of 1–10 (default: all)")
    parser.add_argument("--no-beliefs", action="store_true", help="no reflection cycles: episodes only")
    parser.add_argument("--data", default=None, help="REALTALK's data/ files, or a git snapshot (realtalk.py)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    chosen = [int(x) for x in args.conversations.split(",")] if args.conversations else None
    result = measure(args.embedder, chosen, beliefs=not args.no_beliefs, data=args.data)
    if args.json:
        import json
        print(json.dumps(result, default=str))
        return
    print_scenario(f"public recall ({result['embedder']}, {result['episodes']} turns, {result['questions']}, "
                   f"{result['beliefs']} beliefs, routes {result['routes']})", result)


if __name__ == "__main__":
    main()
