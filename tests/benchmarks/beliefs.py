"""Belief quality over many histories: `reflect demo --json` per seed, scored, and the distribution.

    reflect bench --only beliefs [--seeds 20 | --seeds 7,8,11,12] [--stub]
    python tests/benchmarks/beliefs.py [--seeds 20] [--stub] [--reasoner offline|standin|stub] [--json]
    python tests/benchmarks/beliefs.py --seeds dev --in-process     # developing: no broker, no child

Each seed is one run of `reflect demo --json --seed S` as a user runs it: a
child process with an embedded broker and `reflect up` (the real worker),
under the settings of this environment (so `REFLECT_CHALLENGE=on reflect
bench --only beliefs` measures the gate on). Per seed: patterns found (of 4),
precision (the mean over the patterns of their best belief's citation
precision, 0 where no belief cites ≥ 2 of its episodes), live beliefs, noise
(beliefs resting mostly on background) and its share of the live beliefs,
duplicates; then the distribution over the seeds (mean, min, median, max).

Seeds are split so the figures cannot be tuned to: `DEVELOPMENT` (7, 8, 11,
12: the seeds the reasoner was built and is tuned on; 7 and 8 since issue 21,
11 and 12 those issue 34 was filed from) and `REPORT` (100–119, never looked
at while tuning). `--seeds N` takes the first N report seeds; a list takes
those seeds (`7,`: seed 7 alone). The baseline, in the same run with `--stub`: the same demo on
the Anthropic path against a stand-in Messages API server
(tests/support/messages_api.py) answering as a stub — one fixed sentence
citing the first eight statements found for each question, asked the planted
patterns' own descriptions as its questions — which a score that tells a
result from a stub must hold to at most 1 of 4. `--reasoner standin` runs the
Anthropic path on the stand-in that answers as the offline reasoner.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]  # this checkout measured, whatever is installed

from suite_figures import figure, print_scenario, target  # noqa: E402

DEVELOPMENT = (7, 8, 11, 12)
REPORT = tuple(range(100, 120))
TIMEOUT = 900.0  # seconds a seed's demo may take (the gate on a loaded box: minutes)


def seeds_of(spec: str | int | None) -> list[int]:
    """`20` → the first 20 report seeds (a lone number is a count); `7,8` → those, and `7,` seed 7
    alone; `dev` → the development seeds."""
    if spec is None:
        return list(REPORT)
    if isinstance(spec, int) or str(spec).isdigit():
        n = int(spec)
        if not 1 <= n <= len(REPORT):
            raise ValueError(f"--seeds N takes 1–{len(REPORT)} report seeds")
        return list(REPORT[:n])
    if spec == "dev":
        return list(DEVELOPMENT)
    return [int(s) for s in str(spec).split(",") if s.strip()]


def demo_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    root = str(HERE.parents[1])
    path = os.pathsep.join([root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def run_demo(seed: int, env: dict[str, str], flags: tuple[str, ...] = ()) -> dict:
    done = subprocess.run([sys.executable, "-m", "streams.cli", "demo", "--json", "--seed", str(seed),
                           "--timeout", str(TIMEOUT), *flags], env=env, capture_output=True, text=True,
                          cwd=str(HERE.parents[1]), timeout=TIMEOUT + 120)
    if done.returncode != 0:
        raise RuntimeError(f"demo seed {seed} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def row(seed: int, result: dict) -> dict:
    s = result["score"]
    return {"seed": seed, "found": s["found"], "of": s["of"],
            "precision": round(statistics.fmean(p["precision"] if p["cited"] >= 2 else 0.0
                                                for p in result["patterns"]), 3),
            "beliefs": s["beliefs"], "noise": s["noise"],
            "noise_share": round(s["noise"] / s["beliefs"], 3) if s["beliefs"] else 0.0,
            "duplicates": s["duplicates"], "challenges": result.get("challenges", {}).get("cycles", 0),
            "seconds": result["seconds"],
            "patterns": {p["pattern"]: {k: p[k] for k in ("found", "cited", "precision", "about")}
                         for p in result["patterns"]}}


def distribution(rows: list[dict], key: str) -> dict:
    values = [r[key] for r in rows]
    return {"mean": round(statistics.fmean(values), 3), "min": min(values),
            "median": statistics.median(values), "max": max(values)}


def reasoner_flags(reasoner: str, seed: int):
    """The demo's flags and environment for a reasoner, and the stand-in server to close after."""
    if reasoner == "offline":
        return (), {}, None
    from streams.adapters.minilm import MiniLMEmbedder
    from streams.cli.sample import history
    from support.messages_api import MessagesServer, OfflineModel, StubModel

    model = StubModel([p.description for p in history(seed=seed).patterns]) if reasoner == "stub" \
        else OfflineModel(MiniLMEmbedder())
    server = MessagesServer(model)
    return ("--reasoner", "anthropic"), {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": server.url}, server


def in_process(seed: int) -> dict:
    """The demo's loop without a broker or a child (tests/support/sample_loop.py: the worker's own
    pipelines over a real Edge view), under this environment's REFLECT_ settings, offline: about
    half a demo's time, for developing on; the figures reported come from the demo itself."""
    import tempfile

    from processors.reasoners import OfflineReasoner
    from streams.adapters.minilm import MiniLMEmbedder
    from streams.cli.sample import history
    from streams.cli.score import score
    from support.sample_loop import live_beliefs

    hist, embedder, started = history(seed=seed), MiniLMEmbedder(), time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k.startswith("REFLECT_")}
    with tempfile.TemporaryDirectory() as tmp:
        held = live_beliefs(hist, Path(tmp), embedder, OfflineReasoner(embedder), env=env)
    scored = score(hist, held, embedder)
    return {"score": scored, "patterns": scored["patterns"], "challenges": {"cycles": None},  # not counted here
            "seconds": round(time.perf_counter() - started, 1)}


def run_seeds(seeds: list[int], reasoner: str = "offline", log=sys.stderr, local: bool = False) -> list[dict]:
    rows = []
    for seed in seeds:
        flags, extra, server = reasoner_flags(reasoner, seed)
        try:
            r = row(seed, in_process(seed) if local else run_demo(seed, demo_env(extra), flags))
        finally:
            if server is not None:
                server.close()
        rows.append(r)
        print(f"  {reasoner} seed {seed}: found {r['found']}/{r['of']}, precision {r['precision']:.2f}, "
              f"{r['beliefs']} beliefs, noise {r['noise']} ({r['noise_share']:.0%}), duplicates "
              f"{r['duplicates']}, challenges {r['challenges']}, {r['seconds']} s", file=log, flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    return {key: distribution(rows, key) for key in ("found", "precision", "beliefs", "noise", "noise_share",
                                                     "duplicates")} | {
        "pooled_noise_share": round(sum(r["noise"] for r in rows) / max(1, sum(r["beliefs"] for r in rows)), 3)}


def measure(seeds: list[int], stub: bool = False, reasoner: str = "offline", local: bool = False) -> dict:
    started = time.perf_counter()
    print(f"beliefs: seeds {seeds}, reasoner {reasoner}, REFLECT_CHALLENGE="
          f"{os.environ.get('REFLECT_CHALLENGE', '(default)')}{', in process' if local else ''}",
          file=sys.stderr, flush=True)
    rows = run_seeds(seeds, reasoner, local=local)
    dist = summary(rows)
    out = {"seeds": seeds, "reasoner": reasoner, "challenge": os.environ.get("REFLECT_CHALLENGE"),
           "rows": rows, "distribution": dist}
    stub_dist = None
    if stub:
        out["stub_rows"] = run_seeds(seeds, "stub")
        stub_dist = out["stub_distribution"] = summary(out["stub_rows"])
    f = dist["found"]
    out["figures"] = [
        figure("patterns found, mean of 4", f["mean"], "patterns", *(
            ("stub (same seeds)", stub_dist["found"]["mean"]) if stub_dist else ())),
        figure("patterns found, min", f["min"], "patterns"),
        figure("patterns found, median", f["median"], "patterns"),
        figure("precision, mean", dist["precision"]["mean"], "share"),
        figure("live beliefs, mean", dist["beliefs"]["mean"], "beliefs"),
        figure("noise share, pooled", dist["pooled_noise_share"], "share"),
        figure("noise share, max seed", dist["noise_share"]["max"], "share"),
        figure("duplicates, total", sum(r["duplicates"] for r in rows), "beliefs"),
        figure("seconds a seed, median", statistics.median(r["seconds"] for r in rows), "s"),
    ]
    out["targets"] = [target("patterns found, mean", f["mean"], ">=", 3.5),
                      target("patterns found, every seed", f["min"], ">=", 3),
                      target("noise share of live beliefs, pooled", dist["pooled_noise_share"], "<=", 0.2),
                      target("duplicates, every seed", dist["duplicates"]["max"], "<=", 0)]
    if stub_dist:
        out["targets"].append(target("stub's patterns found, every seed", stub_dist["found"]["max"], "<=", 1))
    out["seconds_total"] = round(time.perf_counter() - started, 1)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| seed | found | precision | beliefs | noise | duplicates | challenges | s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['seed']} | {r['found']}/{r['of']} | {r['precision']:.2f} | {r['beliefs']} | "
              f"{r['noise']} ({r['noise_share']:.0%}) | {r['duplicates']} | {r['challenges']} | {r['seconds']} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="20",
                        help="N report seeds, a comma list (7, for one seed), or dev (default 20)")
    parser.add_argument("--stub", action="store_true", help="the stub baseline on the same seeds too")
    parser.add_argument("--reasoner", choices=("offline", "standin", "stub"), default="offline")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--in-process", action="store_true",
                        help="the demo's loop in this process, offline (for development: no broker, no child)")
    args = parser.parse_args(argv)
    if args.in_process and (args.stub or args.reasoner != "offline"):
        parser.error("--in-process runs the offline reasoner only")
    result = measure(seeds_of(args.seeds), args.stub, args.reasoner, local=args.in_process)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result["rows"]))
        if "stub_rows" in result:
            print("\nstub:\n" + table(result["stub_rows"]))
        print_scenario("beliefs", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
