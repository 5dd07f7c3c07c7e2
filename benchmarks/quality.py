"""Section 2: the CFP plan against DP, Megatron, FSDP and the Alpa-style ILP, all judged by
the same whole-program truth; out-of-memory flagged against the platform's device memory."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import pandas as pd

from benchmarks.cases import Run, analyze_case, build_step

BASELINE_NAMES = ("dp", "megatron", "fsdp", "alpa")


def quality(run: Run) -> None:
    from explorer.plan import evaluate_on
    from explorer.platforms import load_platform

    for case in run.settings.quality:
        start = time.perf_counter()
        step, args = build_step(case)
        evaluated: dict[str, dict[str, Any]] = {}  # plan JSON (platform-free) -> truths
        devices = math.prod(case.mesh)
        platforms = [p for p in run.settings.platforms if load_platform(p).devices >= devices]
        for platform in sorted(set(run.settings.platforms) - set(platforms)):
            run.skipped.append(f"{case.label} on {platform}: the platform has fewer devices")
        for platform in platforms:
            capacity = load_platform(platform).device.memory_bytes
            try:
                analysis = analyze_case(run, case, step, args, platform)
            except Exception as err:
                run.failed(f"quality {case.label} on {platform}", err)
                continue
            plans: dict[str, Any] = {}
            try:
                plans["cfp"] = analysis.plan(memory_budget=capacity)
            except Exception as err:
                run.failed(f"quality {case.label} on {platform}: cfp", err)
            for name in BASELINE_NAMES:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # a time-limited ILP says so; noted below
                        plans[name] = analysis.baseline(name)
                except Exception as err:
                    run.failed(f"quality {case.label} on {platform}: {name}", err)
            for name, plan in plans.items():
                key = layout_key(plan)
                if key not in evaluated:
                    try:
                        evaluated[key] = dict(evaluate_on(plan, platforms, step, *args))
                    except Exception as err:
                        run.failed(f"quality {case.label} on {platform}: evaluate {name}", err)
                        continue
                truth = evaluated[key][platform]
                run.quality.append(
                    {
                        "case": case.label,
                        "model": case.model,
                        "preset": case.preset,
                        "mesh": "x".join(map(str, case.mesh)),
                        "batch": case.batch or "preset",
                        "platform": platform,
                        "plan": name,
                        "predicted_s": plan.time,
                        "evaluated_s": truth.time,
                        "evaluated_comm_s": truth.t_comm,
                        "evaluated_memory": truth.memory,
                        "device_memory": capacity,
                        "fits": truth.memory <= capacity,
                        "strategies": strategy_mix(plan),
                        "note": plan.ilp.status if plan.ilp is not None else "",
                    }
                )
        run.log(f"   {case.label}: {time.perf_counter() - start:.0f} s")
        run.checkpoint()


def layout_key(plan: Any) -> str:
    """What decides a plan's compiled program: its layouts, not its platform or predictions."""
    import json

    from explorer.evaluation_store import PRICING_FIELDS
    from explorer.plan_document import plan_to_json

    kept = {k: v for k, v in plan_to_json(plan).items() if k not in PRICING_FIELDS}
    return json.dumps(kept, sort_keys=True)


def strategy_mix(plan: Any) -> str:
    counts: dict[str, int] = {}
    for name in plan.strategies:
        counts[name] = counts.get(name, 0) + 1
    return " ".join(f"{k}:{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def quality_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per case and platform: each plan's evaluated time over the CFP plan's (> 1: CFP wins)."""
    rows = []
    for (case, platform), group in frame.groupby(["case", "platform"], sort=False):
        by_plan = {r["plan"]: r for r in group.to_dict("records")}
        if "cfp" not in by_plan:
            continue
        cfp = by_plan["cfp"]
        row: dict[str, Any] = {
            "case": case,
            "platform": platform,
            "cfp_ms": 1e3 * cfp["evaluated_s"],
            "cfp_fits": bool(cfp["fits"]),
        }
        for name in BASELINE_NAMES:
            other = by_plan.get(name)
            if other is None:
                row[name] = "failed"
            else:
                ratio = other["evaluated_s"] / cfp["evaluated_s"]
                row[name] = f"{ratio:.2f}" + ("" if other["fits"] else " (OOM)")
                row[f"{name}_ratio"] = ratio
        rows.append(row)
    return pd.DataFrame(rows)


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    if not values:
        return math.nan
    return math.exp(sum(math.log(v) for v in values) / len(values))
