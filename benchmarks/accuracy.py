"""Section 1: the composed prediction against the whole step compiled (or run, in
`measured` mode) under the same plan; the paper's Fig. 9 symbolic costs beside the profiles."""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.cases import REPO, Case, Run, analyze_case, build_step, relative_error


def accuracy(run: Run) -> None:
    platform = run.settings.platforms[0]
    for case in run.settings.accuracy:
        accuracy_case(run, case, platform, "compiled", run.settings.plans_per_case)
    for case in run.settings.measured:
        _measured_in_child(run, case)


# The measured backend times the step on the devices JAX sees, which must be the mesh's: a
# child process gets exactly that many CPU devices (this one may have more, for 8-device cases).
_MEASURED_CHILD = """
import json, sys
from pathlib import Path
from benchmarks.accuracy import accuracy_case
from benchmarks.cases import Case, Run, full_settings
fields = json.loads(sys.argv[1])
case = Case(**{**fields, "mesh": tuple(fields["mesh"])})
# its checkpoints go to the parent's scratch folder: the parent writes the report
run = Run(full_settings(), Path(sys.argv[2]), Path(sys.argv[3]), print)
accuracy_case(run, case, "cpu-local", "measured", int(sys.argv[4]))
Path(sys.argv[5]).write_text(json.dumps({"rows": run.accuracy, "failures": run.failures}))
"""


def _measured_in_child(run: Run, case: Case) -> None:
    import json
    import subprocess
    import sys

    devices = math.prod(case.mesh)
    flags = os.environ.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if "xla_force_host_platform_device_count" not in f)
    env = {**os.environ, "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices}"}
    # the child imports this package from the checkout, wherever it was started
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    fields = {"model": case.model, "preset": case.preset, "mesh": list(case.mesh),
              "batch": case.batch, "layers": case.layers, "abstract": case.abstract}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "result.json"
        command = [sys.executable, "-c", _MEASURED_CHILD, json.dumps(fields), scratch,
                   str(run.cache), str(run.settings.measured_plans), str(result)]  # fmt: skip
        try:
            subprocess.run(command, env=env, check=True, timeout=3600, capture_output=True)
            found = json.loads(result.read_text())
        except (subprocess.SubprocessError, OSError, ValueError) as err:
            detail = (getattr(err, "stderr", b"") or b"").decode(errors="replace").strip()
            last = detail.splitlines()[-1] if detail else f"{type(err).__name__}: {err}"
            run.failed(f"accuracy {case.label} (measured, child process)", RuntimeError(last))
            return
    run.accuracy.extend(found["rows"])
    run.failures.extend(found["failures"])
    run.log(f"   {case.label} (measured): {len(found['rows'])} plans, in a child process")
    run.checkpoint()


def accuracy_case(run: Run, case: Case, platform: str, backend: str, count: int) -> None:
    from explorer.accuracy import sample_selections
    from explorer.plan import evaluate_each

    start = time.perf_counter()
    if backend == "measured":  # real arrays for the timed runs
        case = replace(case, abstract=False)
    step, args = build_step(case)
    try:
        analysis = analyze_case(run, case, step, args, platform, backend=backend)
    except Exception as err:
        run.failed(f"accuracy {case.label}", err)
        return
    if backend == "compiled" and not run.symbolic:
        _symbolic_vs_profiled(run, case, analysis)
    selections = sample_selections(analysis, count)
    plans = [analysis.plan_of(selection, source=kind) for kind, selection in selections]

    def failed(index: int, err: Exception) -> None:
        run.failed(f"accuracy {case.label} {selections[index][0]} plan", err)

    truths = evaluate_each(plans, [platform], step, *args, backend=backend, on_error=failed)
    for (kind, _), plan, evaluated in zip(selections, plans, truths, strict=True):
        if evaluated is None:
            continue
        truth = evaluated[platform]
        run.accuracy.append(
            {
                "case": case.label,
                "model": case.model,
                "preset": case.preset,
                "mesh": "x".join(map(str, case.mesh)),
                "backend": backend,
                "platform": platform,
                "plan": kind,
                "predicted_s": plan.time,
                "evaluated_s": truth.time,
                "time_error": relative_error(plan.time, truth.time),
                "predicted_memory": plan.memory,
                "predicted_memory_eq9": plan.predicted.memory_eq9,
                "evaluated_memory": truth.memory,
                "memory_error": relative_error(plan.memory, truth.memory),
                "memory_error_eq9": relative_error(plan.predicted.memory_eq9, truth.memory),
            }
        )
    run.log(
        f"   {case.label} ({backend}): {len(selections)} plans, "
        f"{analysis.program_count} programs, {time.perf_counter() - start:.0f} s"
    )
    run.checkpoint()


def _symbolic_vs_profiled(run: Run, case: Case, analysis: Any) -> None:
    """Fig. 9 of the paper: the Alpa-style symbolic cost of every configuration of every
    unique segment beside its profiled time."""
    try:
        from explorer.alpa import symbolic_config_costs

        symbolic = symbolic_config_costs(analysis)[["segment", "config", "symbolic_cost"]]
        profiles = analysis.profiles
        profiled = profiles[(profiles["kind"] == "segment") & (profiles["status"] == "ok")]
        joined = profiled.merge(symbolic, on=["segment", "config"])
    except Exception as err:
        run.failed(f"symbolic costs {case.label}", err)
        return
    for row in joined.to_dict("records"):
        run.symbolic.append(
            {
                "case": case.label,
                "segment": row["label"],
                "config": row["config"],
                "profiled_s": row["t_total"],
                "profiled_comm_s": row["t_comm"],
                "symbolic_s": row["symbolic_cost"],
            }
        )


def rank_agreement(frame: pd.DataFrame) -> pd.DataFrame:
    """Per segment: Spearman correlation of symbolic and profiled cost, and whether the
    symbolic cost's favourite is the profiled favourite."""
    rows = []
    for (case, segment), group in frame.groupby(["case", "segment"], sort=False):
        if len(group) < 3:
            continue
        profiled = group["profiled_s"].rank()
        symbolic = group["symbolic_s"].rank()
        records = group.to_dict("records")
        best = min(records, key=lambda r: r["profiled_s"])
        picked = min(records, key=lambda r: r["symbolic_s"])
        rows.append(
            {
                "case": case,
                "segment": segment,
                "configurations": len(group),
                "Spearman (symbolic vs profiled)": float(profiled.corr(symbolic)),
                "profiled best": best["config"],
                "symbolic best": picked["config"],
                "symbolic pick / profiled best": picked["profiled_s"] / best["profiled_s"],
            }
        )
    return pd.DataFrame(rows)


def accuracy_table(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (case, backend), group in frame.groupby(["case", "backend"], sort=False):
        err = group["time_error"].dropna()
        mem = group["memory_error"].dropna()
        mem9 = group["memory_error_eq9"].dropna()
        worst = float(err.iloc[int(err.abs().to_numpy().argmax())]) if len(err) else math.nan
        rows.append(
            {
                "case": case,
                "backend": backend,
                "plans": len(group),
                "time: median abs. error": f"{100 * err.abs().median():.1f}%",
                "time: RMS error": f"{100 * math.sqrt((err**2).mean()):.1f}%",
                "time: worst error": f"{100 * worst:+.1f}%",
                # what a planner needs: the order of plans, and the best one
                "rank correlation": float(
                    group["predicted_s"].rank().corr(group["evaluated_s"].rank())
                ),
                "predicted best is evaluated best": bool(
                    group["evaluated_s"].to_numpy()[group["predicted_s"].to_numpy().argmin()]
                    <= group["evaluated_s"].min() * (1 + 1e-9)
                ),
                "memory: median abs. error": f"{100 * mem.abs().median():.1f}%",
                "memory (Eq. 9): median abs. error": f"{100 * mem9.abs().median():.1f}%",
            }
        )
    return pd.DataFrame(rows)
