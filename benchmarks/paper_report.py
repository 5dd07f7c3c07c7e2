"""The paper grid's report: per model, per case, the goals reached, where a baseline beats the
CFP plan; and the README's section at the paper's scale."""

from __future__ import annotations

import math
import os
import platform as host
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.markdown import markdown, replace_section
from benchmarks.paper_grid import (
    BASELINES,
    QUICK_REPEATS,
    README_END,
    README_START,
    WIDER_SPACES,
    PaperCase,
    PaperRun,
    WiderSpace,
    paper_cases,
)
from benchmarks.paper_pending import PendingCase, pending_table
from benchmarks.quality import geomean
from explorer.mesh import mesh_spec
from explorer.profile.compile_flags import FAST_COMPILE_FLAG, compile_flags


def _plans_by_case(frame: pd.DataFrame) -> Iterator[tuple[str, dict[str, dict[Any, Any]]]]:
    """Per case, in the run's order: its rows keyed by plan ("cfp", "dp", ...)."""
    # one pass over the records: a report asks this of its frames thousands of times, and a
    # group's own `to_dict` per case made writing a checkpoint take seconds
    cases: dict[str, dict[str, dict[Any, Any]]] = {}
    for record in frame.to_dict("records"):
        cases.setdefault(str(record["case"]), {})[record["plan"]] = record
    yield from cases.items()


def case_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per case: the CFP plan's evaluated time and error, and each baseline's time over it."""
    rows = []
    for label, by_plan in _plans_by_case(frame):
        cfp = by_plan.get("cfp", {})
        time_ms = 1e3 * cfp.get("evaluated_s", math.nan)
        row: dict[str, Any] = {
            "case": label,
            # where no plan fits, the note says by how much
            "CFP ms": time_ms if math.isfinite(time_ms) else str(cfp.get("note", "")),
            "CFP error": _percent(cfp.get("time_error", math.nan)),
            "CFP fits": bool(cfp.get("fits", False)),
        }
        for name in BASELINES:
            other = by_plan.get(name)
            row[name] = _ratio_cell(cfp, other)
        if isinstance(cfp.get("space"), str):  # the plan over every space: which it came from
            row["space"] = cfp["space"]
        row["programs"] = cfp.get("programs", math.nan)
        row["profiling s"] = cfp.get("profiling_s", math.nan)
        row["analyse s"] = cfp.get("analyse_s", math.nan)
        row["solve s"] = cfp.get("solve_s", math.nan)
        alpa = by_plan.get("alpa", {})
        row["Alpa ILP s"] = alpa.get("alpa_solve_s", math.nan)
        row["Alpa ILP"] = alpa.get("note", "")
        rows.append(row)
    return pd.DataFrame(rows)


def _ratio_cell(cfp: dict[Any, Any], other: dict[Any, Any] | None) -> str:
    if other is None or not math.isfinite(other.get("evaluated_s", math.nan)):
        return "failed"
    # how far over: a baseline OOM by a few percent is another story than one twice the device
    memory = other.get("evaluated_memory", math.nan)
    oom = "" if other["fits"] else f" (OOM, {memory / 2**30:.1f} GiB)"
    if not math.isfinite(cfp.get("evaluated_s", math.nan)):
        return f"{1e3 * other['evaluated_s']:.0f} ms{oom}"
    return f"{other['evaluated_s'] / cfp['evaluated_s']:.2f}{oom}"


def _percent(value: float) -> str:
    return "" if not math.isfinite(value) else f"{100 * value:+.1f}%"


def ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """Per case and baseline: baseline time over CFP time on the truth, where both exist.
    A baseline that does not fit the device counts as it runs: it cannot (so it is left
    out of the means and counted apart)."""
    rows = []
    for label, by_plan in _plans_by_case(frame):
        cfp = by_plan.get("cfp")
        if cfp is None or not math.isfinite(cfp["evaluated_s"]):
            continue
        for name in BASELINES:
            other = by_plan.get(name)
            if other is None or not math.isfinite(other["evaluated_s"]):
                continue
            rows.append(
                {
                    "case": label,
                    "model": cfp["model"],
                    "baseline": name,
                    "ratio": other["evaluated_s"] / cfp["evaluated_s"],
                    "baseline_fits": bool(other["fits"]),
                    "cfp_error": cfp["time_error"],
                }
            )
    return pd.DataFrame(rows)


def headline(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model: geometric mean of baseline / CFP over its cases (baselines that fit), the
    cases where a baseline does not fit, and the CFP plan's prediction error."""
    table = ratios(frame)
    rows = []
    for model, group in frame.groupby("model", sort=False):
        cfp = group[(group["plan"] == "cfp") & group["evaluated_s"].notna()]
        row: dict[str, Any] = {"model": model, "cases": int(group["case"].nunique())}
        mine = table[table["model"] == model] if not table.empty else table
        for name in BASELINES:
            picked = mine[(mine["baseline"] == name)] if not mine.empty else mine
            fits = picked[picked["baseline_fits"]] if not picked.empty else picked
            mean = geomean(list(fits["ratio"])) if not fits.empty else math.nan
            oom = int((~picked["baseline_fits"]).sum()) if not picked.empty else 0
            row[name] = ("" if math.isnan(mean) else f"{mean:.2f}x") + (
                f" ({oom} OOM)" if oom else ""
            )
        errors = cfp["time_error"].abs().dropna()
        row["CFP abs. error median"] = f"{100 * errors.median():.1f}%" if len(errors) else ""
        row["CFP abs. error worst"] = f"{100 * errors.max():.1f}%" if len(errors) else ""
        rows.append(row)
    return pd.DataFrame(rows)


def unfitted(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Cases where no CFP plan fits the device but a baseline's does: CFP loses them outright
    (`ratios` has no ratio to give). Per case, the fitting baselines, fastest first."""
    found = []
    for label, by_plan in _plans_by_case(frame):
        cfp = by_plan.get("cfp")
        if cfp is None or math.isfinite(cfp["evaluated_s"]):
            continue
        fitting = sorted(
            (
                (name, by_plan[name])
                for name in BASELINES
                if name in by_plan
                and math.isfinite(by_plan[name]["evaluated_s"])
                and bool(by_plan[name]["fits"])
            ),
            key=lambda item: item[1]["evaluated_s"],
        )
        if fitting:
            found.append({"case": label, "cfp": cfp, "baselines": fitting})
    return found


def goals(frame: pd.DataFrame) -> list[str]:
    """The issue's goals, each with what this run reached. A case where a baseline fits the
    device and no CFP plan does counts as one CFP loses."""
    table = ratios(frame)
    if table.empty:
        return ["No case has both a CFP plan and a baseline evaluated yet."]
    fits = table[table["baseline_fits"]]
    per_case = fits.groupby("case")["ratio"].min()
    lost_on_memory = unfitted(frame)
    alpa = fits[fits["baseline"] == "alpa"]["ratio"]
    moe = fits[(fits["baseline"] == "alpa") & fits["model"].str.startswith("moe")]["ratio"]
    cfp = frame[(frame["plan"] == "cfp") & frame["evaluated_s"].notna()]
    within = int((cfp["time_error"].abs() <= 0.05).sum())
    unfit_note = (
        f"; in {len(lost_on_memory)} of them a baseline fits the device and no CFP plan does"
        if lost_on_memory
        else ""
    )
    return [
        f"CFP at least as fast as every baseline that fits: {int((per_case >= 1.0).sum())} of "
        f"{len(per_case) + len(lost_on_memory)} cases{unfit_note} (goal: all).",
        "Geometric mean over cases against the Alpa-style ILP: "
        + (f"{geomean(list(alpa)):.2f}x" if len(alpa) else "no case where it fits yet")
        + " (goal: 1.3x); on MoE: "
        + (f"{geomean(list(moe)):.2f}x" if len(moe) else "no case yet")
        + " (goal: 1.5x).",
        f"CFP prediction within 5 % of the truth: {within} of {len(cfp)} cases (goal: all).",
    ]


COLD_GOAL_MINUTES = 90  # the issue's: the whole grid, cold, on the 2-core machine


def cold_cost(
    frame: pd.DataFrame,
    grid_cases: int,
    cores: int,
    pending: Sequence[PendingCase] = (),
) -> list[str]:
    """The goal of a cold grid in under 90 minutes, against what the cases run here cost to
    profile (their paper spaces' programs, each case's once; a program two cases share is
    counted in each, which the paper's batches and meshes make rare), one program per core at
    a time, and what the `pending` cases (those left out) would add at the seconds per program
    of the cases run. Whole-step compiles come on top; their seconds are not kept."""
    cases = _profiled_cases(frame)
    if cases.empty:
        return []
    seconds, programs = float(cases["profiling_s"].sum()), int(cases["programs"].sum())
    hours = seconds / cores / 3600
    whole = len(cases) >= grid_cases and hours * 60 <= COLD_GOAL_MINUTES
    devices = cases["mesh"].astype(str).map(lambda mesh: mesh_spec(mesh).size)
    unsplit = cases[cases["batch"] % devices != 0]
    lines = [
        f"The grid cold in under {COLD_GOAL_MINUTES} minutes on this machine: "
        + ("met" if whole else "not met")
        + f". Profiling the paper space's programs of the {len(cases)} cases here ({programs} "
        f"programs) took {seconds:.0f} CPU-seconds: {hours:.1f} hours at one program per "
        f"core on {cores} cores, before the whole steps are compiled"
        + (f" (goal: the grid's {grid_cases} cases)." if len(cases) < grid_cases else ".")
    ]
    if not unsplit.empty:
        others = cases.drop(unsplit.index)["programs"]
        median = f"; the other cases' median: {others.median():.0f}" if len(others) else ""
        lines.append(
            f"{_cases(len(unsplit))} whose batch does not split over every device "
            f"{'holds' if len(unsplit) == 1 else 'hold'} "
            f"{int(unsplit['programs'].sum())} of those programs and "
            f"{float(unsplit['profiling_s'].sum()) / seconds:.0%} of those seconds "
            f"({unsplit['programs'].min():.0f} to {unsplit['programs'].max():.0f} programs a "
            f"case{median})."
        )
    costs = pending_table(cases, [p for p in pending if not p.error])
    if not costs.empty:
        added = float(costs["CPU-h cold"].sum())
        uncounted = sum(1 for p in pending if p.error)
        lines.append(
            f"The {len(costs)} cases not run have {int(costs['programs'].sum())} programs "
            f"({int(costs['not kept'].sum())} not in the profile cache): about {added:.1f} "
            "CPU-hours more cold, at the seconds per program of the cases run (section "
            f'"Not run" prices each). The grid\'s paper spaces in all: about '
            f"{hours + added / cores:.1f} hours at one program per core on {cores} cores"
            + (f"; {_more(uncounted)} could not be counted." if uncounted else ".")
        )
    return lines


def _profiled_cases(frame: pd.DataFrame) -> pd.DataFrame:
    """The CFP row of each case whose programs were profiled: a case's search cost."""
    return frame[frame["plan"] == "cfp"].dropna(subset=["profiling_s"])


def _more(count: int) -> str:
    return f"{count} more {'case' if count == 1 else 'cases'}"


def _cases(count: int) -> str:
    return "The one case" if count == 1 else f"The {count} cases"


def as_cfp(frame: pd.DataFrame, chosen: str) -> pd.DataFrame:
    """The cases with a `chosen` row, that row standing as the CFP plan ("cfp") and the
    other CFP rows left out: the tables then judge that plan against the baselines."""
    cases = set(frame.loc[frame["plan"] == chosen, "case"])
    other_cfp = frame["plan"].str.startswith("cfp") & (frame["plan"] != chosen)
    view = frame[frame["case"].isin(cases) & ~other_cfp].copy()
    view["plan"] = view["plan"].replace({chosen: "cfp"})
    return view


def judged_on_gpu(frame: pd.DataFrame, chosen: str = "cfp_gpu") -> pd.DataFrame:
    """The cases whose every plan has XLA:GPU's memory (`--gpu-memory`), as the report's
    tables read them: the CFP plan is the one chosen by XLA:GPU's memory (`chosen`), and a
    plan fits where XLA:GPU's program fits the device. Times are the same truth as above."""
    if "fits_gpu" not in frame or chosen not in set(frame["plan"]):
        return frame.iloc[0:0]
    keep = []
    for label, by_plan in _plans_by_case(frame):
        row = by_plan.get(chosen)
        if row is None or str(row.get("note", "")).startswith("not compiled"):
            continue
        evaluated = [
            r
            for name, r in by_plan.items()
            if (name == chosen or not name.startswith("cfp")) and math.isfinite(r["evaluated_s"])
        ]
        if all(r["fits_gpu"] is not None for r in evaluated):
            keep.append(label)
    judged = as_cfp(frame[frame["case"].isin(keep)], chosen)
    judged["fits"] = judged["fits_gpu"].eq(True)  # None (no figure) is no fit
    judged["evaluated_memory"] = judged["gpu_memory"]
    return judged


# CFP's rows of each space it may search: the paper's, then the wider ones, in that order
_SPACE_ROWS = {"cfp": "paper", **{space.row: space.name for space in WIDER_SPACES}}
BEST_ROW = "cfp_best"
BEST_GPU_ROW = "cfp_best_gpu"


def best_of_spaces(frame: pd.DataFrame) -> pd.DataFrame:
    """Per case, the plan CFP predicts fastest over every space it searched for the case (the
    paper's, and each wider one profiled for it), as rows `BEST_ROW` and `BEST_GPU_ROW` whose
    column "space" names the space it came from. Chosen as a user would choose it, by
    prediction alone, never by the truth's time: each space's plan is already the fastest of
    its frontier whose compiled step fits the device memory (on XLA:GPU's memory for the
    GPU's row), and the fastest predicted of them wins, the paper's on a tie. Where no space has
    a plan, the paper space's row stands, with its note."""
    picked = []
    for _, by_plan in _plans_by_case(frame):
        for best, suffix in ((BEST_ROW, ""), (BEST_GPU_ROW, "_gpu")):
            rows = [
                (name, by_plan[name + suffix]) for name in _SPACE_ROWS if name + suffix in by_plan
            ]
            if not rows:
                continue
            planned = [
                (name, row)
                for name, row in rows
                if math.isfinite(row.get("predicted_s", math.nan))
                and (not suffix or row.get("fits_gpu") is True)
            ]
            # min keeps the first of equals: the paper's space before the wider ones
            name, row = (
                min(planned, key=lambda item: item[1]["predicted_s"]) if planned else rows[0]
            )
            picked.append(
                {**row, "plan": best, "space": _SPACE_ROWS[name], "space_row": name + suffix}
            )
    return pd.DataFrame(picked)


def with_best_of_spaces(
    frame: pd.DataFrame, losses: list[dict[str, Any]]
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """`frame` with the `best_of_spaces` rows, and `losses` with each loss of a chosen
    space's plan once more as the best plan's (the same plan, the same comparison)."""
    best = best_of_spaces(frame) if "plan" in frame else frame.iloc[0:0]
    if best.empty:
        return frame, losses
    chosen = {(row["case"], row["space_row"]): row["plan"] for row in best.to_dict("records")}
    again = [
        {**loss, "cfp": chosen[(loss["case"], loss["cfp"])]}
        for loss in losses
        if (loss["case"], loss["cfp"]) in chosen
    ]
    return pd.concat([frame, best], ignore_index=True), losses + again


def _loss_lines(losses: list[dict[str, Any]], frame: pd.DataFrame, cfp_row: str) -> list[str]:
    """Where a baseline beats the CFP plan of `cfp_row` (the paper's space's or a wider
    one's): each such baseline with the blocks and collectives that differ, then each case
    where a baseline fits the device and no plan of that space does."""
    mine = [loss for loss in losses if loss["cfp"] == cfp_row]
    lines = [
        f"- **{loss['case']}**, {loss['baseline']} ({loss['ratio']:.2f}x): "
        f"{loss['blocks']}. Collectives: {loss['collectives']}. {loss['time']}."
        for loss in mine
    ]
    lost_on_memory = unfitted(as_cfp(frame, cfp_row)) if "plan" in frame else []
    for unfit in lost_on_memory:
        fitting = ", ".join(
            f"{name} {1e3 * row['evaluated_s']:.0f} ms in {row['evaluated_memory'] / 2**30:.1f} GiB"
            for name, row in unfit["baselines"]
        )
        verb = "fits" if len(unfit["baselines"]) == 1 else "fit"
        lines.append(f"- **{unfit['case']}**: {unfit['cfp']['note']}; {fitting} {verb}.")
    return lines or ["Nowhere among the cases done."]


def _wider_space_lines(
    frame: pd.DataFrame, done: int, space: WiderSpace, losses: list[dict[str, Any]]
) -> list[str]:
    """The report's section on one of CFP's wider spaces, where some case has it."""
    wider = as_cfp(frame, space.row) if "plan" in frame else frame.iloc[0:0]
    about = (
        f"The same cases with CFP searching another space (`analyze(..., {space.keyword})`, "
        f"`{space.flag}`): {space.about}. The CFP plan here is that space's; the baselines are "
        f"the same rows as above. {wider['case'].nunique() if not wider.empty else 0} of "
        f"{done} cases have it."
    )
    return _space_section(
        frame,
        wider,
        losses,
        rows=(space.row, space.gpu_row),
        title=space.title,
        about=about,
        loss_heading="Where a baseline beats this space's CFP plan:",
        gpu_choice="the CFP plan the fastest of that space's frontier whose XLA:GPU memory fits",
        approximate=True,
    )


def edge_lines(frame: pd.DataFrame) -> list[str]:
    """The section on the CFP plans at the budget's edge: each space's row whose fastest
    predicted plan within the device memory was over it compiled, and what was done."""
    from explorer.compiled_fit import DEFAULT_MAX_COMPILES, NONE_FITS, STEPPED_DOWN

    if frame.empty:
        return []
    spaces = frame["plan"].str.startswith("cfp") & ~frame["plan"].str.endswith("_gpu")
    rows = frame[spaces & (frame["plan"] != BEST_ROW)]  # the best over spaces is one of them
    notes = rows["note"].fillna("").astype(str)
    edge = rows[notes.str.contains(STEPPED_DOWN) | notes.str.startswith(NONE_FITS)]
    about = (
        "Each space's CFP plan is the fastest of its frontier whose whole step, compiled, fits "
        "the device memory (`explorer.fastest_plan_that_fits`): the fastest predicted within "
        "it is compiled first and, where its step needs more, the fastest predicted within the "
        "memory less the shortfall seen, then the frontier between the plans found to fit and "
        f"to be over is bisected; {DEFAULT_MAX_COMPILES} compiles at most. The predicted "
        "memory is within a few per cent of the compiled step's, and the fastest plan within "
        "a budget sits at its edge. "
    )
    heading = ["", "## At the budget's edge", ""]
    if edge.empty:
        return [*heading, about + f"None of the {len(rows)} CFP rows met it."]
    items = [f"- **{row['case']}**, `{row['plan']}`: {row['note']}." for _, row in edge.iterrows()]
    return [*heading, about + f"{len(edge)} of the {len(rows)} CFP rows met it:", "", *items]


def _best_lines(frame: pd.DataFrame, done: int, losses: list[dict[str, Any]]) -> list[str]:
    """The report's section on the plan CFP predicts fastest over every space it searched."""
    best = as_cfp(frame, BEST_ROW) if "plan" in frame else frame.iloc[0:0]
    about = (
        "Per case, the plan CFP predicts fastest among its spaces' plans: the paper's space "
        "and each wider one profiled for the case (the sections above; on a 1-D mesh, for "
        "the batch on the outer axis where the batch splits over every device, and for the "
        "default cap where it cuts the step as the run's cap does, a wider space is one "
        "already searched). "
        "Each space's plan is the fastest of its frontier whose compiled step fits the "
        "device memory (fastest predicted first); the fastest "
        "predicted of them is chosen, by prediction alone, as a user comparing the spaces "
        "would choose (`space` names it). Each space's prediction is of its own cut of the "
        "step, so choosing between them is only as good as those predictions; the error "
        f"column says how good. {best['case'].nunique() if not best.empty else 0} of {done} "
        "cases."
    )
    return _space_section(
        frame,
        best,
        losses,
        rows=(BEST_ROW, BEST_GPU_ROW),
        title="CFP over every space it searched",
        about=about,
        loss_heading="Where a baseline beats this plan:",
        gpu_choice="each space's plan the fastest of its frontier whose XLA:GPU memory fits, "
        "then the fastest predicted of those",
        approximate=False,
    )


def _space_section(
    frame: pd.DataFrame,
    view: pd.DataFrame,
    losses: list[dict[str, Any]],
    *,
    rows: tuple[str, str],
    title: str,
    about: str,
    loss_heading: str,
    gpu_choice: str,
    approximate: bool,
) -> list[str]:
    """A section judging the CFP plan of `rows` (on XLA:CPU's memory, on XLA:GPU's), `view`
    the frame as `as_cfp` reads it: its goals, tables, losses, and the same on the GPU."""
    row, gpu_row = rows
    lines = ["", f"## {title}", "", about, ""]
    if view.empty:
        return lines
    lines += [*(f"- {line}" for line in goals(view)), ""]
    lines += [markdown(headline(view)), markdown(case_table(view))]
    lines += _approximate_lines(view) if approximate else []
    lines += [loss_heading, ""]
    lines += [*_loss_lines(losses, frame, row), ""]
    on_gpu = judged_on_gpu(frame, gpu_row)
    if not on_gpu.empty:
        lines += [
            f"Judged on XLA:GPU's memory ({on_gpu['case'].nunique()} cases; {gpu_choice}):",
            "",
            *(f"- {line}" for line in goals(on_gpu)),
            "",
            markdown(case_table(on_gpu)),
        ]
    return lines


def _approximate_lines(wider: pd.DataFrame) -> list[str]:
    """The cases whose frontier was solved approximately, and how far from exact it may be."""
    if "frontier_slack_mib" not in wider:
        return []
    rows = wider[(wider["plan"] == "cfp") & (wider["frontier_slack_mib"] > 0)]
    return [
        f"Approximate frontier: **{row.case}**. Its exact frontier is too large for the "
        "solver's limits, so it was solved comparing memory in units of "
        f"{row.frontier_resolution_mib:.0f} MiB at its heaviest steps: every plan of the exact "
        f"frontier has one in it no slower needing less than {row.frontier_slack_mib:.0f} MiB "
        "more. Time is never rounded, so its fastest plan is as fast as the exact space's; a "
        "plan chosen under a budget is as fast as the exact one's for that budget less the "
        "slack.\n"
        for row in rows.itertuples()
    ]


def write_report(run: PaperRun, *, finished: bool, readme: Path | None = None) -> Path:
    import jax

    run.out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(run.rows)
    frame.to_csv(run.out / "paper.csv", index=False)  # the run's rows; the best is derived
    frame, losses = with_best_of_spaces(frame, run.losses)
    minutes = (time.perf_counter() - run.started) / 60
    # flags that change what XLA emits change every figure: the command says which were set
    flags = compile_flags()
    others = [f for f in flags if f != FAST_COMPILE_FLAG]
    command = (
        "python -m explorer bench --paper"
        + (" --quick" if run.quick else "")
        + (f" --only '{','.join(run.only)}'" if run.only is not None else "")
        + (f" --jobs {run.jobs}" if run.jobs > 1 else "")
        + (f" --config-cap {run.config_cap}" if run.config_cap is not None else "")
        + (" --fast-compile" if FAST_COMPILE_FLAG in flags else "")
        + (f" (XLA_FLAGS: {' '.join(others)})" if others else "")
    )
    state = (
        f"in {minutes:.1f} minutes"
        if finished
        else f"**not finished**: this checkpoint was written {minutes:.1f} minutes in"
    )
    missing = [c.label for c in run.cases if c.label not in run.done and not _skipped(run, c)]
    grid = paper_cases(run.quick)
    unselected = [c.label for c in grid if c not in run.cases]
    warm = (
        warm_cost(
            frame,
            minutes,
            len(grid),
            counted=len(run.pending),
            computed=run.computed,
            finished=finished,
        )
        if not frame.empty
        else ""
    )
    selected = f" (chosen by `--only` from the grid's {len(grid)})" if run.only is not None else ""
    lines = [
        "# Plan quality at the paper's scale",
        "",
        f"Generated by `{command}` {state}, on {os.cpu_count()} CPU cores ({host.machine()}, "
        f"Python {host.python_version()}, JAX {jax.__version__}); {len(run.done)} of "
        f"{len(run.cases)} cases done{selected}; {run.traced_steps} steps traced (the cases "
        "of one step on other meshes, run or counted, reuse its trace); "
        f"{run.evaluations_kept} whole-step evaluations "
        "read from the evaluation store (plans compiled before, in this run or an earlier one; the "
        f"rest compiled), {run.ilp_answers_kept} Alpa ILP answers from the ILP store and "
        f"{run.frontiers_kept} CFP frontiers from the frontier store (their solve seconds are "
        "those of the run that solved them). Every figure comes from that run; "
        "`paper.csv` holds "
        "every row. Times are the whole training step compiled under each plan and priced on "
        "the platform (the `compiled` backend); ratios are baseline / CFP (> 1: CFP faster); "
        "OOM: the plan's compiled step needs more than the device memory (what it needs, per "
        "device, as XLA:CPU schedules and assigns it; for the same bf16 step that was over twice "
        "what XLA:GPU assigns on one H200, and rematerialising hardly lowered it, see "
        "`assets/bench/gpu/NOTE.md`: these verdicts are likely pessimistic for GPUs). Search "
        "cost: `profiling s` is what "
        "compiling and pricing the case's programs took when they were profiled, summed over "
        "programs (cached or not, so a warm run shows its cold run's), `analyse s` this run's "
        "tracing (the step's trace, where another case of it traced it), segmenting, profiling "
        "and solving (or reading what was kept), `solve s` what "
        "solving the frontier took (kept or not, the run's that solved it), `Alpa ILP s` "
        "HiGHS's." + (_quick_depths(run) if run.quick else ""),
        "",
        "## Goals",
        "",
        *(f"- {line}" for line in (goals(frame) if not frame.empty else [])),
        *_best_goal_lines(frame),
        *(_cold_goal_lines(frame, len(grid), run.pending, warm) if not run.quick else []),
        "",
        "## Per model",
        "",
        markdown(headline(frame)) if not frame.empty else "_(no case done yet)_\n",
        "## Per case",
        "",
        markdown(case_table(frame)) if not frame.empty else "_(no case done yet)_\n",
        "## Where a baseline beats CFP",
        "",
        *_loss_lines(losses, frame, "cfp"),
    ]
    lines += ["", "## Judged on XLA:GPU's memory", ""]
    on_gpu = judged_on_gpu(frame) if not frame.empty else frame
    lines += [
        "The same cases with every fit judged on the platform's GPU: each plan's whole step "
        "compiled by XLA:GPU for that GPU, on this machine, which has none "
        "(`explorer.target_memory`; against one H200's own memory analysis of three steps it "
        "was within -2.2 to +15 %, where XLA:CPU's was 2.2-3.0 times it: "
        "`assets/bench/gpu/NOTE.md`). The CFP plan here is the fastest of CFP's frontier whose "
        "XLA:GPU memory fits (`fastest_plan_on_gpu`); times are the same truth as above. "
        f"{len(on_gpu['case'].unique()) if not on_gpu.empty else 0} of {len(run.done)} cases "
        f"have every plan's XLA:GPU memory ({run.gpu_memories_kept} figures read from the "
        "store, the rest compiled; `--gpu-memory` compiles what is missing).",
        "",
    ]
    if not on_gpu.empty:
        lines += [*(f"- {line}" for line in goals(on_gpu)), ""]
        lines += [markdown(headline(on_gpu)), markdown(case_table(on_gpu))]
        for unfit in unfitted(on_gpu):
            lines.append(f"- **{unfit['case']}**: {unfit['cfp']['note']}.")
    for space in WIDER_SPACES:
        lines += _wider_space_lines(frame, len(run.done), space, losses)
    lines += _best_lines(frame, len(run.done), losses)
    lines += edge_lines(frame)
    lines += ["", "## Not run", ""]
    lines += [f"- {line}" for line in run.skipped]
    lines += [f"- {label}: not reached before the run ended" for label in missing]
    if unselected:
        lines.append(
            f"- {len(unselected)} of the grid's {len(grid)} cases, not chosen by `--only`: "
            + "; ".join(unselected)
        )
    lines += _pending_lines(frame, run.pending)
    if not run.skipped and not missing and not unselected:
        lines.append("Nothing: every case of the grid ran.")
    lines += ["", "## Failures", ""]
    lines += [f"- {line}" for line in run.failures] or ["None."]
    report = run.out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    if readme is not None:
        grid_cases = None if run.quick else len(grid)
        _update_readme(
            readme,
            frame,
            command,
            minutes,
            finished,
            grid_cases=grid_cases,
            pending=run.pending,
            warm=warm,
        )
    return report


def _gpu_lines(frame: pd.DataFrame) -> list[str]:
    """The goals again with every fit judged on XLA:GPU's memory, where some case has it."""
    on_gpu = judged_on_gpu(frame) if not frame.empty else frame
    if on_gpu.empty:
        return []
    cases = on_gpu["case"].nunique()
    return [
        "",
        f"Judged on XLA:GPU's memory instead ({cases} of {frame['case'].nunique()} cases so far; "
        "the CFP plan the fastest of its frontier that fits there; the report's last section):",
        "",
        *(f"- {line}" for line in goals(on_gpu)),
    ]


def _pending_lines(frame: pd.DataFrame, pending: Sequence[PendingCase]) -> list[str]:
    """What each case left out would cost to run, where the run counted them."""
    if not pending:
        return []
    done = _profiled_cases(frame) if "plan" in frame else frame
    return [
        "",
        "What each would cost: its paper space's programs (traced and counted, none compiled), "
        "those the profile cache lacks, and their profiling in CPU-hours at the seconds per "
        "program of the cases run that stand for it best (the same model on as many devices, "
        "else the same model), cold and from the cache as it is. Their whole steps and wider "
        "spaces come on top.",
        "",
        markdown(pending_table(done, pending).round({"CPU-h cold": 2, "CPU-h now": 2})),
    ]


WARM_GOAL_MINUTES = 5  # the issue's: the whole grid, every answer kept


def warm_cost(
    frame: pd.DataFrame,
    minutes: float,
    grid_cases: int,
    *,
    counted: int,
    computed: Mapping[str, int],
    finished: bool,
) -> str:
    """The goal of a warm grid in under 5 minutes, against this run: its minutes where it
    computed nothing (every program from the profile cache, every whole step, Alpa ILP
    answer, XLA:GPU memory figure and frontier from its store), else what it computed.
    `counted`: the grid's cases left out, counted rather than run."""
    goal = f"The grid warm in under {WARM_GOAL_MINUTES} minutes: "
    if not finished:
        return goal + "not judged yet: the run has not finished."
    cfp = frame[frame["plan"].str.startswith("cfp") & ~frame["plan"].str.endswith("_gpu")]
    compiled = int((cfp["programs"] - cfp["programs_from_cache"]).fillna(0).sum())
    work = {"programs compiled": compiled, **computed}
    done = [f"{count} {kind}" for kind, count in work.items() if count]
    if done:
        return goal + f"not judged: this run was not warm ({', '.join(done)})."
    cases = int(frame["case"].nunique())
    met = cases == grid_cases and minutes <= WARM_GOAL_MINUTES
    return (
        goal
        + ("met" if met else "not met")
        + f". This run computed nothing (every program, whole step, Alpa ILP answer, XLA:GPU "
        f"memory figure and frontier read back) and took {minutes:.1f} minutes for {cases} "
        + (f"of the grid's {grid_cases} cases" if cases < grid_cases else "cases")
        + (
            f', the {counted} {"other" if counted == 1 else "others"} counted (section "Not run")'
            if counted
            else ""
        )
        + (
            f" (goal: the grid's {grid_cases} cases; the others' programs are not in the "
            "profile cache)."
            if cases < grid_cases
            else "."
        )
    )


def _cold_goal_lines(
    frame: pd.DataFrame, grid_cases: int, pending: Sequence[PendingCase] = (), warm: str = ""
) -> list[str]:
    """The cold and warm runs' goals, under the goals of plan quality."""
    lines = cold_cost(frame, grid_cases, os.cpu_count() or 1, pending) if "plan" in frame else []
    lines += [warm] if warm and "plan" in frame else []
    return ["", "Affordability:", "", *(f"- {line}" for line in lines)] if lines else []


def _best_goal_lines(frame: pd.DataFrame) -> list[str]:
    """The goals once more for the plan CFP predicts fastest over every space it searched."""
    best = as_cfp(frame, BEST_ROW) if "plan" in frame else frame.iloc[0:0]
    if best.empty:
        return []
    return [
        "",
        "The plan CFP predicts fastest over every space it searched for the case (the paper's "
        'and the wider ones below; section "CFP over every space it searched"):',
        "",
        *(f"- {line}" for line in goals(best)),
    ]


def _wider_readme_lines(
    frame: pd.DataFrame, row: str, gpu_row: str, title: str, about: str
) -> list[str]:
    """The goals once more for the CFP plan of `row` (one of CFP's wider spaces, or the best
    over every space), where some case has it: under `title`, `about` in parentheses."""
    lines = []
    for view, judged in (
        (as_cfp(frame, row), "XLA:CPU's memory"),
        (judged_on_gpu(frame, gpu_row), "XLA:GPU's memory"),
    ):
        if view.empty:
            continue
        lines += [
            "",
            f"{title} ({about}; {view['case'].nunique()} of {frame['case'].nunique()} cases so "
            f"far), judged on {judged}:",
            "",
            *(f"- {line}" for line in goals(view)),
        ]
    return lines


def _quick_depths(run: PaperRun) -> str:
    depths = ", ".join(f"{case.preset} {case.layers}" for case in run.cases)
    return f" Quick grid: {QUICK_REPEATS} repeats of each model's layer pattern ({depths} layers)."


def _skipped(run: PaperRun, case: PaperCase) -> bool:
    return any(line.startswith(case.label + ":") for line in run.skipped)


def _update_readme(
    readme: Path,
    frame: pd.DataFrame,
    command: str,
    minutes: float,
    done: bool,
    *,
    grid_cases: int | None,
    pending: Sequence[PendingCase] = (),
    warm: str = "",
) -> None:
    status = f"{minutes:.0f} min" + ("" if done else ", stopped before the end")
    lines = [
        README_START,
        "",
        f"From `{command}` ({status}); the report with every case, the losses and their "
        "causes is [`assets/bench/paper/report.md`](assets/bench/paper/report.md). Baseline "
        "time over CFP time, geometric mean over the cases where the baseline fits the device:",
        "",
        markdown(headline(frame)) if not frame.empty else "_(no case done yet)_\n",
        *(f"- {line}" for line in (goals(frame) if not frame.empty else [])),
        *(_cold_goal_lines(frame, grid_cases, pending, warm) if grid_cases is not None else []),
        *_gpu_lines(frame),
        *(
            line
            for space in WIDER_SPACES
            for line in (
                _wider_readme_lines(frame, space.row, space.gpu_row, space.title, f"`{space.flag}`")
                if not frame.empty
                else []
            )
        ),
        *(
            _wider_readme_lines(
                frame,
                BEST_ROW,
                BEST_GPU_ROW,
                "The plan CFP predicts fastest over every space it searched",
                "the paper's and the wider ones above",
            )
            if not frame.empty
            else []
        ),
        "",
        README_END,
    ]
    replace_section(readme, README_START, README_END, lines)
