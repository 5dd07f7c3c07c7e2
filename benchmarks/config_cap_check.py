"""CFP's plan of paper cases with segments cut at another configuration cap, against the report.

Where a paper case's batch does not split over every device, its layer takes far more
programs (456 to 954 at a cap of 256, the default before stop 57, against about 90 where it
splits): its blocks have more strategies, and its programs depend on another instance's
block. A lower cap cuts such a layer into smaller types. This check analyses each case's
paper space at `--cap` from the committed caches (profiling what they lack into them), takes
the fastest plan within the device, compiles its whole step (kept in the evaluation store)
and prints it beside the committed report's CFP and Alpa-style ILP rows, with the programs
and their profiling seconds. The baselines are not evaluated again: their figures are the
report's, at the report's cap.

    python benchmarks/config_cap_check.py --cap 81 --only 'label,label'

A JSON line per case is appended to `--out` (default: none) as each finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# the paper's two-node platform has 16 devices; JAX reads this when it first touches one
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=16"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from benchmarks.paper_grid import KEPT_CACHE, PAPER_DIR, paper_cases


def check_case(label: str, cap: int, report: pd.DataFrame) -> dict[str, Any]:
    """The case at `cap`, and the report's CFP and ILP rows of it."""
    from benchmarks.paper import _search_cost
    from benchmarks.quality import strategy_mix
    from explorer.errors import NoPlanFitsError
    from explorer.evaluation import evaluate
    from explorer.evaluation_store import EvaluationStore
    from explorer.pipeline import analyze
    from explorer.platforms import load_platform

    exact = [c for c in paper_cases(False) if c.label == label]
    if not exact:
        raise SystemExit(f"--only: expected a paper case's whole label, found {label!r}")
    case = exact[0]
    platform = load_platform(case.platform)
    step, args = case.build_step()
    began = time.perf_counter()
    analysis = analyze(
        step, *args, mesh=case.mesh, platform=platform, cache=KEPT_CACHE, config_cap=cap,
        progress=False,
    )  # fmt: skip
    cost = _search_cost(analysis, time.perf_counter() - began)
    rows: dict[str, dict[Any, Any]] = {
        str(r["plan"]): r for r in report[report["case"] == case.label].to_dict("records")
    }
    found: dict[str, Any] = {
        "case": case.label,
        "cap": cap,
        **{key: cost[key] for key in ("programs", "profiling_s", "analyse_s")},
        "report_programs": float(rows["cfp"]["programs"]),
        "report_profiling_s": float(rows["cfp"]["profiling_s"]),
        "report_cfp_s": float(rows["cfp"]["evaluated_s"]),
        "report_cfp_error": float(rows["cfp"]["time_error"]),
        "report_alpa_s": float(rows["alpa"]["evaluated_s"]),
        "report_alpa_fits": bool(rows["alpa"]["fits"]),
    }
    try:
        plan = analysis.plan(memory_budget=platform.device.memory_bytes)
    except NoPlanFitsError:
        found["note"] = (
            f"no plan fits: the smallest needs {analysis.frontier.min_memory / 2**30:.1f} GiB"
        )
        return found
    with EvaluationStore(KEPT_CACHE.with_suffix(".evaluations.sqlite")) as store:
        truth = evaluate(plan, step, *args, store=store)
    found |= {
        "predicted_s": plan.time,
        "evaluated_s": truth.time,
        "evaluated_memory": truth.memory,
        "time_error": (plan.time - truth.time) / truth.time,
        "strategies": strategy_mix(plan),
    }
    return found


def line(found: dict[str, Any]) -> str:
    cost = (
        f"{found['programs']} programs in {found['profiling_s']:.0f} s (report: "
        f"{found['report_programs']:.0f} in {found['report_profiling_s']:.0f} s)"
    )
    if "note" in found:
        return f"{found['case']}: {cost}; {found['note']}"
    return (
        f"{found['case']}: {cost}; CFP {1e3 * found['evaluated_s']:.1f} ms (error "
        f"{found['time_error']:+.2%}; report {1e3 * found['report_cfp_s']:.1f} ms, "
        f"{found['report_cfp_error']:+.2%}), ILP/CFP "
        f"{found['report_alpa_s'] / found['evaluated_s']:.2f}x"
        f"{'' if found['report_alpa_fits'] else ' (ILP OOM)'}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, required=True)
    parser.add_argument("--only", required=True, help="comma-separated case labels")
    parser.add_argument("--out", type=Path, default=None, help="JSON lines, appended")
    args = parser.parse_args(argv)
    report = pd.read_csv(PAPER_DIR / "paper.csv")
    for label in (p.strip() for p in args.only.split(",")):
        found = check_case(label, args.cap, report)
        print(line(found), flush=True)
        if args.out is not None:
            with args.out.open("a") as out:
                out.write(json.dumps(found) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
