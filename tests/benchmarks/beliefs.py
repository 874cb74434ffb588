"""Beliefs on histories nobody tuned on: the demo's score over many seeds.

    python tests/benchmarks/beliefs.py [--seeds 20] [--reasoner offline|anthropic] [--json]
    reflect bench --only beliefs --seeds 20

Each seed is one bundled three-month history (streams/sample.py, 2,100
episodes, four planted patterns) run through the worker's own pipelines in
memory (tests/sample_loop.py) with default settings (`--challenge on|off`
sets the contradiction gate) over a real Qdrant Edge view and MiniLM, then scored as `reflect demo`
scores (streams/score.py): per seed, patterns found, live beliefs, noise
(beliefs resting mostly on background) and duplicates; then their
distribution. The reported seeds start at `FIRST` (101): the offline reasoner
was developed on `DEVELOPED` only, never on these. `--reasoner anthropic`
runs the same seeds through the Anthropic path against the local Messages
API stand-in (tests/messages_api.py, answering as the offline reasoner).
A stub (one fixed sentence over the first statements it is shown) is scored
on the first seed beside them: the score must tell it from a result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]

from sample_loop import Stub, live_beliefs  # noqa: E402
from streams.sample import history  # noqa: E402
from streams.score import score  # noqa: E402

DEVELOPED = (7, 8, 9, 10, 11, 12)  # the seeds the offline reasoner was tuned on (issue 34)
FIRST = 101  # reported seeds: FIRST, FIRST + 1, …, never developed on
TARGETS = {"found_mean": 3.5, "found_min": 3, "noise_share_max": 0.2, "duplicates": 0, "stub_found_max": 1}


@contextlib.contextmanager
def reasoner_of(kind: str, embedder):
    from processors.reasoners import OfflineReasoner

    if kind == "offline":
        yield OfflineReasoner(embedder)
        return
    import anthropic
    from messages_api import MessagesServer, OfflineModel
    from processors.anthropic_reasoner import AnthropicReasoner

    server = MessagesServer(OfflineModel(embedder))
    try:
        client = anthropic.Anthropic(api_key="stand-in", base_url=server.url, max_retries=0, timeout=60)
        yield AnthropicReasoner(client, "claude-haiku-4-5")
    finally:
        server.close()


def one_seed(seed: int, embedder, kind: str = "offline", stub: bool = False, challenge: str | None = None) -> dict:
    hist = history(seed=seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"beliefs-{seed}-") as tmp, reasoner_of(kind, embedder) as reasoner:
        beliefs = live_beliefs(hist, Path(tmp), embedder, Stub(embedder, hist) if stub else reasoner, 3600.0,
                               env={"REFLECT_CHALLENGE": challenge} if challenge else None)
    result = score(hist, beliefs, embedder)
    return {"seed": seed, "found": result["found"], "of": result["of"], "beliefs": result["beliefs"],
            "noise": result["noise"], "noise_share": round(result["noise"] / max(1, result["beliefs"]), 3),
            "duplicates": result["duplicates"], "seconds": round(time.perf_counter() - started, 1),
            "patterns": {p["pattern"]: {k: p[k] for k in ("found", "cited", "precision", "about")}
                         for p in result["patterns"]},
            "texts": [b["text"] for b in beliefs]}


def distribution(rows: list[dict]) -> dict:
    found = [r["found"] for r in rows]
    share = [r["noise_share"] for r in rows]
    return {"seeds": len(rows), "found_mean": round(statistics.mean(found), 2), "found_min": min(found),
            "found_histogram": {k: found.count(k) for k in sorted(set(found))},
            "noise_share_mean": round(statistics.mean(share), 3), "noise_share_max": max(share),
            "beliefs_mean": round(statistics.mean(r["beliefs"] for r in rows), 1),
            "duplicates": sum(r["duplicates"] for r in rows),
            "per_pattern": {p: sum(r["patterns"][p]["found"] for r in rows) for p in rows[0]["patterns"]}}


def measure(seeds: int = 20, kind: str = "offline", first: int = FIRST, stub: bool = True, log=sys.stderr,
            challenge: str | None = None) -> dict:
    from processors.minilm import MiniLMEmbedder

    embedder = MiniLMEmbedder()
    rows = []
    for seed in range(first, first + seeds):
        rows.append(one_seed(seed, embedder, kind, challenge=challenge))
        row = rows[-1]
        print(json.dumps(row), file=log, flush=True)
        print(f"seed {seed}: found {row['found']}/{row['of']}, {row['beliefs']} beliefs, {row['noise']} noise, "
              f"{row['duplicates']} duplicates ({row['seconds']} s)", file=log, flush=True)
    spread = distribution(rows)
    stubbed = one_seed(first, embedder, stub=True, challenge=challenge)["found"] if stub else None
    targets = [{"what": f"beliefs {name}", "value": value, "op": op, "limit": limit, "met": met}
               for name, value, op, limit, met in (
                   ("found, mean of 4", spread["found_mean"], ">=", TARGETS["found_mean"],
                    spread["found_mean"] >= TARGETS["found_mean"]),
                   ("found, every seed", spread["found_min"], ">=", TARGETS["found_min"],
                    spread["found_min"] >= TARGETS["found_min"]),
                   ("noise share, every seed", spread["noise_share_max"], "<=", TARGETS["noise_share_max"],
                    spread["noise_share_max"] <= TARGETS["noise_share_max"]),
                   ("duplicates, all seeds", spread["duplicates"], "<=", TARGETS["duplicates"],
                    spread["duplicates"] <= TARGETS["duplicates"]),
                   *((("stub found", stubbed, "<=", TARGETS["stub_found_max"], stubbed <= TARGETS["stub_found_max"]),)
                     if stub else ()))]
    return {"reasoner": kind, "challenge": challenge or "default", "developed_on": list(DEVELOPED),
            "reported": [r["seed"] for r in rows],
            "distribution": spread, "stub_found": stubbed, "rows": rows, "targets": targets,
            "figures": [{"name": f"patterns found, mean ({kind})", "value": spread["found_mean"], "unit": "of 4",
                         **({"baseline": "stub", "baseline_value": stubbed,
                             "ratio": round(spread["found_mean"] / stubbed, 3) if stubbed else None} if stub else {})},
                        {"name": "patterns found, fewest", "value": spread["found_min"], "unit": "of 4"},
                        {"name": "noise share, mean", "value": spread["noise_share_mean"], "unit": "of live"},
                        {"name": "noise share, most", "value": spread["noise_share_max"], "unit": "of live"},
                        {"name": "duplicates, all seeds", "value": spread["duplicates"], "unit": "beliefs"}]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first", type=int, default=FIRST)
    parser.add_argument("--reasoner", choices=("offline", "anthropic"), default="offline")
    parser.add_argument("--no-stub", action="store_true")
    parser.add_argument("--challenge", choices=("on", "off"), default=None, help="the gate (default: the setting's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.seeds, args.reasoner, args.first, stub=not args.no_stub, challenge=args.challenge)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(json.dumps({k: result[k] for k in ("reasoner", "reported", "distribution", "stub_found")}, indent=2))
    return 0 if all(t["met"] for t in result["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
