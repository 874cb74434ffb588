"""The shape every scenario of `reflect bench` reports in.

A figure is a measurement and, where it has one, the baseline measured in the
same run and their ratio (the machines are shared and noisy: the ratio is what
holds from run to run). A target is a ratio or time the project promises.
"""

from __future__ import annotations

import statistics


def figure(name: str, value: float, unit: str, baseline: str | None = None,
           baseline_value: float | None = None) -> dict:
    out = {"name": name, "value": round(value, 3), "unit": unit}
    if baseline is not None:
        out |= {"baseline": baseline, "baseline_value": round(baseline_value, 3),
                "ratio": round(value / baseline_value, 3) if baseline_value else None}
    return out


def target(what: str, value: float, op: str, limit: float) -> dict:
    met = value >= limit if op == ">=" else value <= limit
    return {"what": what, "value": round(value, 3), "op": op, "limit": limit, "met": met}


def quantile(values: list[float], p: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def print_scenario(name: str, result: dict) -> None:
    print(f"{name}:" + (f" FAILED: {result['error']}" if "error" in result else "")
          + (f" skipped: {result['skipped']}" if "skipped" in result else ""))
    for f in result["figures"]:
        line = f"  {f['name']:<40} {f['value']:>12,.2f} {f['unit']}"
        if "baseline" in f:
            ratio = "n/a" if f["ratio"] is None else f"{f['ratio']:.3f}"
            line += f"   vs {f['baseline']} {f['baseline_value']:,.2f}: ratio {ratio}"
        print(line)
    for t in result.get("targets", []):
        print(f"  target {t['what']} {t['op']} {t['limit']}: {t['value']:.3f} "
              f"{'met' if t['met'] else 'NOT MET'}")
