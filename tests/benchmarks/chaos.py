"""The chaos suite as a benchmark (issue 30, item 9): N seeded runs of
tests/faults/test_chaos.py's chaos — one fixed history published under load to 2–3
workers of one group while kill -9, SIGTERM, joins and leaves hit them —
each checked against one uninterrupted reference run; violations by kind,
time per run.

    python tests/benchmarks/chaos.py [--runs 100] [--shape short|full] [--seed N] [--keep] [--json]
    reflect bench --only chaos          (opt-in; --quick: 10 runs, else 100)

One embedded Tansu broker (noida-db cannot rejoin a group after a SIGKILL),
one reference, run i with seed `--seed` + i (random when not given; printed).
`short` is the CI shape (4 users × 36 episodes, 2–3 faults a run); `full`
has twice the users, more episodes, 3–5 faults and the contradiction gate on.
Every run with a violation is reported with its seed and schedule; the
figures are the runs, the runs with a violation beside the same among
`--control` runs with no fault (two workers, the same feed and check: what
the comparison alone would call a violation), violations by kind (see
support.chaos.KINDS), model calls paid again before the first answer reached
the log (not a violation: see test_chaos's docstring) and seconds per run
beside a control run's.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1]),
                str(Path(__file__).resolve().parents[2])]

import orjson  # noqa: E402

from streams.broker import EmbeddedBroker  # noqa: E402
from suite_figures import figure, print_scenario, quantile, target  # noqa: E402
from support.chaos import KINDS, SHAPES, Chaos, seeds  # noqa: E402


def measure(runs: int, shape: str = "short", seed: int | None = None, control: int = 2, echo=print,
            keep: bool = False) -> dict:
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = tempfile.mkdtemp(prefix="reflect-chaos-") if keep else \
            stack.enter_context(tempfile.TemporaryDirectory(prefix="reflect-chaos-"))
        if keep:
            echo(f"chaos: the runs' worker logs and data are kept in {tmp}")
        broker = stack.enter_context(EmbeddedBroker(kind="tansu", log_path=str(Path(tmp) / "tansu.log"),
                                                    ready_timeout=60))
        chaos = Chaos(broker, Path(tmp), SHAPES[shape])
        reference = chaos.reference.outcome
        echo(f"chaos: reference run {reference.seconds:.1f} s, "
             f"{sum(len(b) for b in reference.beliefs.values())} beliefs, {len(reference.calls)} model calls")
        controls = [chaos.run(s, faults=False) for s in range(control)]
        for result in controls:
            echo(result.report() if result.violations else f"control run (no fault): ok in {result.seconds:.1f} s")
        results = []
        for s in seeds(runs, None if seed is None else str(seed)):
            result = chaos.run(s)
            results.append(result)
            if keep and not result.violations:  # a clean run's logs stay; its views and data go (disk)
                for data in (Path(tmp) / f"seed-{s}").glob("data*"):
                    shutil.rmtree(data, ignore_errors=True)
            echo(result.report() if result.violations else
                 f"chaos run seed={s}: ok in {result.seconds:.1f} s ({'; '.join(result.ran)})")
    by_kind = {k: sum(1 for r in results for v in r.violations if v.kind == k) for k in KINDS}
    bad = [r for r in results if r.violations]
    times = [r.seconds for r in results]
    figures = [figure("runs", len(results), "runs"),
               figure("runs with a violation", len(bad), "runs", "control runs (no fault) with one",
                      sum(1 for r in controls if r.violations)),
               *(figure(f"violations: {k}", n, "violations") for k, n in by_kind.items()),
               figure("model calls paid again before the log had the answer",
                      sum(r.figures["repaid_before_log"] for r in results), "calls"),
               figure("seconds per run, median", statistics.median(times), "s",
                      "a control run (two workers, no fault)", statistics.median(r.seconds for r in controls))
               if controls else figure("seconds per run, median", statistics.median(times), "s"),
               figure("seconds per run, p95", quantile(times, 95), "s")]
    return {"runs": len(results), "shape": shape, "seeds": [r.seed for r in results],
            "controls": [{"violations": [v.kind for v in r.violations], "seconds": round(r.seconds, 1)}
                         for r in controls], "reference_seconds": round(reference.seconds, 1),
            "violations": by_kind, "failed": [{"seed": r.seed, "report": r.report()} for r in bad],
            "figures": figures, "targets": [target("chaos runs with a violation", len(bad), "<=", 0)],
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="short")
    parser.add_argument("--seed", type=int, default=None, help="the first run's seed (default: random, printed)")
    parser.add_argument("--control", type=int, default=2, help="runs with no fault first, as the baseline (2)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout (progress on stderr)")
    parser.add_argument("--keep", action="store_true",
                        help="keep each run's worker logs, and the data of runs with a violation (path printed)")
    args = parser.parse_args(argv)
    echo = (lambda line: print(line, file=sys.stderr)) if args.json else print
    result = measure(args.runs, args.shape, args.seed, args.control, echo=echo, keep=args.keep)
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_scenario("chaos", result)
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
