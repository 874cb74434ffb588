"""`reflect bench`: every scenario, each figure beside a baseline measured in the same run.

    reflect bench [--quick] [--json] [--only ingest,cycle,...] [--plots DIR]
    python tests/benchmarks/suite.py ...   (the same)

Scenarios (each module also runs alone, see its docstring): ingest, cycle
(overhead vs store size), read (beliefs and recall vs read-time synthesis,
and the worker's memory), invalidation, rebuild, sealing (crypto-shredding
on against off: ingest over HTTP, recall, rebuild), retrieval (evidence recall
of hybrid vs plain cosine vs BM25 alone, by question type, on the demo history)
and public (the same on REALTALK's real conversations; it needs the data, see
tests/benchmarks/realtalk.py). Opt-in, run only when `--only` names it:
import (REALTALK POSTed to the API with cycles off, on a 5 s stand-in model
and offline, and a fresh worker on the same log; tests/benchmarks/realtalk_import.py;
minutes; quick: 2 conversations, full: all 10) and chaos (seeded kill -9,
SIGTERM, joins and leaves among 2–3 workers under load, each run checked
against an uninterrupted reference; tests/benchmarks/chaos.py; quick: 10 runs,
full: 100, ~20 s a run) and beliefs (`reflect demo --json` on each of
`--seeds` N report seeds or a list, found, precision, noise and duplicates
per seed and their distribution, with `--stub` the stub baseline on the same
seeds; tests/benchmarks/beliefs.py; quick: 4 seeds, full: 20, ~1 min a seed).
`--quick` runs smaller sizes
(under 5 minutes on 2 cores); the full run is what tests/benchmarks/README.md shows.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import orjson  # noqa: E402

from suite_figures import print_scenario  # noqa: E402

# Sizes per scenario: (quick, full).
SIZES = {
    "ingest": ({"n": 2000, "minilm": 300, "probes": 20}, {"n": 5000, "minilm": 1000, "probes": 40}),
    "cycle": ({"sizes": [1000, 10000, 50000], "reps": 3}, {"sizes": [1000, 10000, 50000], "reps": 9}),
    "read": ({"users": 20, "episodes": 1000, "n": 100}, {"users": 100, "episodes": 5000, "n": 200}),
    "invalidation": ({"sizes": [1000, 10000], "retractions": 20},
                     {"sizes": [1000, 10000, 100000], "retractions": 40}),
    "rebuild": ({"n": 5000}, {"n": 20000}),
    # crypto-shredding on against off: ingest over HTTP, recall, rebuild (episodes per user, 4 users)
    "sealing": ({"episodes": 250, "rounds": 1}, {"episodes": 500, "rounds": 2}),
    # an Edge view rewritten point by point after an erasure, against a copy of its files
    "scrub": ({"points": 20000, "rounds": 1}, {"points": 50000, "rounds": 3}),
    "retrieval": ({"embedder": "minilm"}, {"embedder": "minilm"}),
    # quick: the four shortest conversations (1,761 turns, 284 questions); full: all ten (8,944 turns, 705)
    "public": ({"embedder": "minilm", "conversations": [1, 2, 3, 4]}, {"embedder": "minilm", "conversations": None}),
    # opt-in (--only import): REALTALK imported over HTTP, cycles off / on the 5 s stand-in / offline (minutes)
    "import": ({"conversations": 2}, {"conversations": 10}),
    # opt-in (--only chaos): runs of the chaos suite against one reference (~20 s a run)
    "chaos": ({"runs": 10}, {"runs": 100}),
    # opt-in (--only beliefs): `reflect demo --json` per report seed, scored (~1 min a seed; --seeds N or a list)
    "beliefs": ({"seeds": 4}, {"seeds": 20}),
}
OPT_IN = {"import", "chaos", "beliefs"}  # scenarios run only when --only names them


def scenario(name: str, size: dict) -> dict:
    if name == "ingest":
        import ingest
        return ingest.measure(size["n"], size["minilm"], size["probes"])
    if name == "cycle":
        import cycle_overhead
        return cycle_overhead.measure(size["sizes"], size["reps"])
    if name == "read":
        import read_latency
        return read_latency.measure(size["users"], size["episodes"], n=size["n"])
    if name == "invalidation":
        import invalidation
        return invalidation.measure(size["sizes"], size["retractions"])
    if name == "rebuild":
        import rebuild
        return rebuild.measure(size["n"])
    if name == "sealing":
        import sealing_cost
        return sealing_cost.measure(size["episodes"], rounds=size["rounds"])
    if name == "scrub":
        import scrub_cost
        return scrub_cost.measure(size["points"], rounds=size["rounds"])
    if name == "retrieval":
        import retrieval_quality
        return retrieval_quality.measure(size["embedder"])
    if name == "public":
        import public_recall
        import realtalk
        try:
            return public_recall.measure(size["embedder"], size["conversations"])
        except realtalk.DataMissing as exc:  # data this checkout cannot ship: say so, fail nothing
            return {"skipped": str(exc), "figures": []}
    if name == "import":
        import realtalk
        import realtalk_import
        try:
            return realtalk_import.measure(size["conversations"])
        except realtalk.DataMissing as exc:
            return {"skipped": str(exc), "figures": []}
    if name == "chaos":
        import chaos
        return chaos.measure(size["runs"])
    if name == "beliefs":
        import beliefs
        return beliefs.measure(beliefs.seeds_of(size["seeds"]), stub=size.get("stub", False))
    raise ValueError(f"no scenario {name!r} (known: {', '.join(SIZES)})")


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    return {"cpus": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "system": f"{platform.system()} {platform.release()}"}


def run(quick: bool, only: list[str] | None = None, overrides: dict | None = None) -> dict:
    doc = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "quick": quick,
           "machine": machine(), "scenarios": {}}
    started = time.perf_counter()
    for name in only or [n for n in SIZES if n not in OPT_IN]:
        t = time.perf_counter()
        try:
            result = scenario(name, {**SIZES[name][0 if quick else 1], **(overrides or {}).get(name, {})})
        except Exception as exc:  # one broken scenario must not cost the others' figures
            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {exc}", "figures": []}
        result["seconds"] = round(time.perf_counter() - t, 1)
        doc["scenarios"][name] = result
        print_scenario(name, result)
        if "memory" in result:  # measured on the read scenario's worker, reported as its own
            doc["scenarios"]["memory"] = result.pop("memory")
            print_scenario("memory", doc["scenarios"]["memory"])
    doc["seconds"] = round(time.perf_counter() - started, 1)
    doc["targets"] = [{"scenario": name, **t} for name, r in doc["scenarios"].items() for t in r.get("targets", [])]
    return doc


def plot(doc: dict, out: Path) -> list[Path]:
    """Cycle overhead vs store size, and read latency against the synthesis baseline (PNG)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plots need matplotlib: pip install -e '.[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written, stamp = [], f"{doc['date'][:10]}, {doc['machine']['cpus']} cores"
    if "cycle" in doc["scenarios"]:
        rows = doc["scenarios"]["cycle"]["rows"]
        fig, ax = plt.subplots(figsize=(6.4, 4))
        sizes = [r["episodes"] for r in rows]
        for key, label in (("offline_ms", "cycle, offline reasoner"),
                           ("anthropic_http_ms", "cycle, anthropic over HTTP"),
                           ("naive_whole_store_ms", "baseline: fetch and sort the whole store")):
            ax.plot(sizes, [r[key] for r in rows], marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="episodes of the user", ylabel="ms per cycle (median)",
               title=f"Reflection cycle overhead vs store size ({stamp})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "cycle_overhead.png", dpi=110)
        written.append(out / "cycle_overhead.png")
    if "read" in doc["scenarios"]:
        read = doc["scenarios"]["read"]
        latency = read["latency_ms"]
        names = list(latency)
        fig, ax = plt.subplots(figsize=(6.4, 4))
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [latency[n]["p50"] for n in names], 0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [latency[n]["p95"] for n in names], 0.4, label="p95")
        ax.set_xticks(list(xs), [n.replace("baseline ", "baseline:\n") for n in names], fontsize=8)
        ax.set(ylabel="ms, in-process", title=f"Read path, {read['users']} users × {read['episodes_per_user']} "
                                                f"episodes ({stamp})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "read_latency.png", dpi=110)
        written.append(out / "read_latency.png")
    plt.close("all")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reflect bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under 5 minutes")
    parser.add_argument("--json", action="store_true", help="print one JSON document (progress goes to stderr)")
    parser.add_argument("--only", default=None, help=f"comma-separated scenarios of {','.join(SIZES)}")
    parser.add_argument("--plots", default=None, metavar="DIR", help="write the PNG plots (and bench.json) there")
    parser.add_argument("--seeds", default=None, help="beliefs: N report seeds, a comma list, or dev")
    parser.add_argument("--stub", action="store_true", help="beliefs: the stub baseline on the same seeds too")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    for name in only or ():
        if name not in SIZES:
            parser.error(f"no scenario {name!r} (known: {', '.join(SIZES)})")
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        beliefs = ({"seeds": args.seeds} if args.seeds else {}) | ({"stub": True} if args.stub else {})
        doc = run(args.quick, only, {"beliefs": beliefs})
        if args.plots:
            for path in plot(doc, Path(args.plots)):
                print(f"wrote {path}")
            (Path(args.plots) / "bench.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        missed = [t for t in doc["targets"] if not t["met"]]
        print(f"{len(doc['targets']) - len(missed)}/{len(doc['targets'])} targets met in {doc['seconds']:.0f} s"
              + "".join(f"\n  not met: {t['what']} = {t['value']} (want {t['op']} {t['limit']})" for t in missed))
    return 1 if any("error" in r for r in doc["scenarios"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
