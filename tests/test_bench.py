"""The benchmark harness on a real (small) case: rows come from real analyses and evaluations,
and the report and README section are generated from them."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pandas as pd
import pytest
from helpers import SHARED_CACHE

from benchmarks.accuracy import accuracy_case
from benchmarks.cases import README_END, README_START, Case, Run, build_step, quick_settings
from benchmarks.paper import run_paper
from benchmarks.paper_grid import (
    APPROXIMATE_RESOLUTIONS,
    BASELINES,
    KEPT_CACHE,
    PAPER_DIR,
    WIDER_SPACES,
    PaperCase,
    paper_cases,
    select_cases,
)
from benchmarks.paper_grid import README_END as PAPER_END
from benchmarks.paper_grid import README_START as PAPER_START
from benchmarks.paper_pending import PendingCase, count_pending, pending_table
from benchmarks.paper_report import (
    as_cfp,
    best_of_spaces,
    case_table,
    cold_cost,
    edge_lines,
    goals,
    judged_on_gpu,
    unfitted,
    warm_cost,
    with_best_of_spaces,
)
from benchmarks.quality import geomean, quality_summary
from benchmarks.report import write_report
from explorer.errors import ExplorerError, InputError
from explorer.platforms import load_platform


def _run(tmp_path: Path) -> Run:
    return Run(quick_settings(), tmp_path / "bench", SHARED_CACHE, lambda line: None)


@pytest.mark.slow
def test_accuracy_rows_compare_real_predictions_with_whole_step_truth(tmp_path: Path) -> None:
    run = _run(tmp_path)
    # tiny GPT (2 layers) on 4 devices: the profiles the plan tests made, from the session cache
    accuracy_case(run, Case("gpt", "tiny", (4,)), "a100-pcie-8", "compiled", 4)
    assert not run.failures
    frame = pd.DataFrame(run.accuracy)
    assert len(frame) == 4
    assert set(frame["plan"]) <= {"frontier", "random"}
    assert (frame["predicted_s"] > 0).all() and (frame["evaluated_s"] > 0).all()
    assert (frame["evaluated_memory"] > 0).all()
    expected = (frame["predicted_s"] - frame["evaluated_s"]) / frame["evaluated_s"]
    assert list(frame["time_error"]) == pytest.approx(list(expected))

    # Fig. 9 rows: every profiled configuration of every unique segment, priced symbolically
    symbolic = pd.DataFrame(run.symbolic)
    assert symbolic.groupby("segment").size().max() == 81  # the GPT layer: 3**4
    assert (symbolic["symbolic_s"] >= 0).all() and (symbolic["profiled_s"] > 0).all()

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_START}\nold\n{README_END}\n\ntail\n")
    report = write_report(run, 12.0, readme)
    text = report.read_text()
    assert "gpt-tiny 4" in text and "median abs. error" in text
    assert (run.out / "accuracy.csv").read_text().count("\n") == 5  # header + 4 rows
    assert (run.out / "accuracy.png").stat().st_size > 1000
    assert (run.out / "symbolic.png").stat().st_size > 1000
    assert "Spearman" in text
    updated = readme.read_text()
    assert "old" not in updated and "tail" in updated and "gpt-tiny 4" in updated

    readme.write_text("# no markers\n")
    with pytest.raises(ExplorerError, match="expected the markers"):
        write_report(run, 12.0, readme)


def test_quality_summary_gives_ratios_over_the_cfp_plan_and_flags_oom() -> None:
    rows = [
        {"case": "c", "platform": "p", "plan": "cfp", "evaluated_s": 2.0, "fits": True},
        {"case": "c", "platform": "p", "plan": "dp", "evaluated_s": 3.0, "fits": True},
        {"case": "c", "platform": "p", "plan": "fsdp", "evaluated_s": 1.0, "fits": False},
    ]
    summary = quality_summary(pd.DataFrame(rows)).iloc[0]
    assert summary["dp"] == "1.50" and summary["fsdp"] == "0.50 (OOM)"
    assert summary["megatron"] == "failed"
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert math.isnan(geomean([]))


def test_the_paper_case_table_says_by_how_much_a_baseline_is_over_the_device() -> None:
    def row(plan: str, seconds: float, fits: bool, gib: float) -> dict[str, Any]:
        return {
            "case": "c", "plan": plan, "evaluated_s": seconds, "fits": fits,
            "evaluated_memory": gib * 2**30, "time_error": 0.01,
        }  # fmt: skip

    frame = pd.DataFrame([row("cfp", 2.0, True, 39.0), row("dp", 1.5, False, 42.25)])
    table = case_table(frame).iloc[0]
    assert table["dp"] == "0.75 (OOM, 42.2 GiB)" and table["megatron"] == "failed"
    no_plan = pd.DataFrame([row("cfp", math.nan, False, math.nan), row("dp", 3.3, False, 84.0)])
    assert case_table(no_plan).iloc[0]["dp"] == "3300 ms (OOM, 84.0 GiB)"


def test_a_case_where_only_a_baseline_fits_the_device_counts_as_a_loss() -> None:
    def row(case: str, plan: str, seconds: float, fits: bool) -> dict[str, Any]:
        return {
            "case": case, "model": "m", "plan": plan, "evaluated_s": seconds, "fits": fits,
            "evaluated_memory": 30 * 2**30, "time_error": 0.01, "note": "no plan fits",
        }  # fmt: skip

    won = [row("won", "cfp", 1.0, True), row("won", "alpa", 1.2, True)]
    unfit = [row("unfit", "cfp", math.nan, False), row("unfit", "alpa", 1.4, True),
             row("unfit", "dp", 0.9, False)]  # fmt: skip
    frame = pd.DataFrame(won + unfit)
    assert [(u["case"], [name for name, _ in u["baselines"]]) for u in unfitted(frame)] == [
        ("unfit", ["alpa"])
    ]
    assert goals(frame)[0].startswith(
        "CFP at least as fast as every baseline that fits: 1 of 2 cases; in 1 of them a "
        "baseline fits the device and no CFP plan does"
    )
    neither = pd.DataFrame([*won, row("oom", "cfp", math.nan, False), row("oom", "dp", 2.0, False)])
    assert unfitted(neither) == [] and "1 of 1 cases (goal" in goals(neither)[0]


def test_the_report_lists_each_cfp_plan_that_met_the_budgets_edge() -> None:
    def row(case: str, plan: str, note: Any) -> dict[str, Any]:
        return {"case": case, "plan": plan, "note": note}

    stepped = "2 plans compiled to find one that fits 40.00 GiB: the faster ones need more (x)"
    over = "no plan compiled fits 40.00 GiB per device: 8 compiled (y)"
    frame = pd.DataFrame(
        [
            row("a", "cfp", math.nan),
            row("a", "cfp_gpu", stepped),  # XLA:GPU's choice: its own section says how
            row("a", "dp", stepped),  # no CFP row
            row("b", "cfp_whole", stepped),
            row("c", "cfp", over),
            row("c", "cfp_seq_default_cap", "no plan fits 40 GiB: the smallest predicted needs"),
            row("c", "cfp_best", over),  # the best over spaces: one of the rows above
        ]
    )
    lines = edge_lines(frame)
    assert lines[1] == "## At the budget's edge"
    assert lines[3].endswith("is bisected; 8 compiles at most. The predicted memory is within "
                             "a few per cent of the compiled step's, and the fastest plan within "
                             "a budget sits at its edge. 2 of the 4 CFP rows met it:")  # fmt: skip
    assert lines[5:] == [f"- **b**, `cfp_whole`: {stepped}.", f"- **c**, `cfp`: {over}."]
    assert edge_lines(frame.iloc[:1])[-1].endswith("None of the 1 CFP rows met it.")
    assert edge_lines(frame.iloc[0:0]) == []


def test_the_cold_goal_adds_each_cases_profiling_and_names_the_batches_that_do_not_split() -> None:
    columns = ["case", "plan", "batch", "mesh", "programs", "profiling_s"]
    frame = pd.DataFrame([
        ("a", "cfp", 8, "8", 90, 900.0),
        ("a", "cfp_whole", 8, "8", 400, 5000.0),  # a wider space: not the grid's cost
        ("b", "cfp", 4, "2x4", 954, 9000.0),  # 4 does not split 8 ways
        ("c", "cfp", 32, "16", 92, 900.0),
        ("c", "dp", 32, "16", math.nan, math.nan),
    ], columns=columns)  # fmt: skip
    first, second = cold_cost(frame, grid_cases=70, cores=2)
    assert first == (
        "The grid cold in under 90 minutes on this machine: not met. Profiling the paper "
        "space's programs of the 3 cases here (1136 programs) took 10800 CPU-seconds: 1.5 hours "
        "at one program per core on 2 cores, before the whole steps are compiled (goal: the "
        "grid's 70 cases)."
    )
    assert second == (
        "The one case whose batch does not split over every device holds 954 of those programs "
        "and 83% of those seconds (954 to 954 programs a case; the other cases' median: 91)."
    )
    done = cold_cost(frame[frame["case"] != "b"], grid_cases=2, cores=2)
    assert done == [done[0]] and done[0].startswith("The grid cold in under 90 minutes on this "
                                                    "machine: met. ")  # fmt: skip
    assert cold_cost(frame[frame["plan"] == "dp"], grid_cases=2, cores=2) == []


def test_the_warm_goal_is_judged_only_on_a_finished_run_that_computed_nothing() -> None:
    columns = ["case", "plan", "programs", "programs_from_cache"]
    frame = pd.DataFrame([
        ("a", "cfp", 90, 90),
        ("a", "cfp_gpu", 90, 0),  # the same space's plan on the GPU: not its own programs
        ("a", "dp", math.nan, math.nan),
        ("b", "cfp", 93, 93),
        ("b", "cfp_whole", 400, 397),  # a wider space compiled 3
    ], columns=columns)  # fmt: skip
    nothing = {"whole steps compiled": 0, "frontiers solved": 0}
    warm = frame[frame["plan"] != "cfp_whole"]
    assert warm_cost(warm, 2.5, 2, counted=0, computed=nothing, finished=True) == (
        "The grid warm in under 5 minutes: met. This run computed nothing (every program, "
        "whole step, Alpa ILP answer, XLA:GPU memory figure and frontier read back) and took "
        "2.5 minutes for 2 cases."
    )
    assert warm_cost(warm, 2.5, 3, counted=1, computed=nothing, finished=True) == (
        "The grid warm in under 5 minutes: not met. This run computed nothing (every program, "
        "whole step, Alpa ILP answer, XLA:GPU memory figure and frontier read back) and took "
        '2.5 minutes for 2 of the grid\'s 3 cases, the 1 other counted (section "Not run") '
        "(goal: the grid's 3 cases; the others' programs are not in the profile cache)."
    )
    assert ": not met. " in warm_cost(warm, 5.5, 2, counted=0, computed=nothing, finished=True)
    solved = {"whole steps compiled": 4, "frontiers solved": 1}
    assert warm_cost(frame, 2.5, 2, counted=0, computed=solved, finished=True) == (
        "The grid warm in under 5 minutes: not judged: this run was not warm (3 programs "
        "compiled, 4 whole steps compiled, 1 frontiers solved)."
    )
    assert warm_cost(warm, 1.0, 2, counted=0, computed=nothing, finished=False) == (
        "The grid warm in under 5 minutes: not judged yet: the run has not finished."
    )


def test_cases_left_out_are_priced_by_the_cases_run_that_stand_for_them() -> None:
    columns = ["case", "plan", "model", "batch", "mesh", "programs", "profiling_s"]
    frame = pd.DataFrame([
        ("a8", "cfp", "m", 8, "8", 100, 1000.0),  # 10 s a program
        ("a16", "cfp", "m", 32, "2x8", 400, 6000.0),  # 15 s a program
        ("a16", "dp", "m", 32, "2x8", math.nan, math.nan),
        ("b4", "cfp", "n", 8, "4", 50, 200.0),  # 4 s a program
    ], columns=columns)  # fmt: skip
    pending = [
        PendingCase("m16", "m", devices=16, batch=8, programs=456, to_compile=120),
        PendingCase("m4", "m", devices=4, batch=8, programs=90, to_compile=0),
        PendingCase("o8", "o", devices=8, batch=16, programs=55, to_compile=55),
        PendingCase("x", "m", devices=8, batch=8, programs=0, to_compile=0, error="E: why"),
    ]
    done = frame[frame["plan"] == "cfp"]
    table = pending_table(done, pending).set_index("case")
    # the same model on as many devices, else the same model, else every case run
    assert table.loc["m16", "CPU-h cold"] == pytest.approx(456 * 15 / 3600)
    assert table.loc["m16", "CPU-h now"] == pytest.approx(120 * 15 / 3600)
    assert table.loc["m16", "s per program, from"] == "15.0 (m on 16 devices, 1 case)"
    assert table.loc["m4", "CPU-h cold"] == pytest.approx(90 * 7000 / 500 / 3600)
    assert table.loc["m4", "s per program, from"] == "14.0 (m, 2 cases)"
    assert table.loc["o8", "CPU-h cold"] == pytest.approx(55 * 7200 / 550 / 3600)
    assert table.loc["o8", "s per program, from"].endswith("(every case run, 3 cases)")
    assert not table.loc["m16", "batch splits every device"]
    assert table.loc["o8", "batch splits every device"]
    assert table.loc["x", "note"] == "not counted: E: why"
    assert math.isnan(table.loc["x", "CPU-h cold"])
    *_, last = cold_cost(frame, grid_cases=7, cores=2, pending=pending)
    added = (456 * 15 + 90 * 14 + 55 * 7200 / 550) / 3600
    assert last == (
        f"The 3 cases not run have 601 programs (175 not in the profile cache): about "
        f"{added:.1f} CPU-hours more cold, at the seconds per program of the cases run (section "
        f'"Not run" prices each). The grid\'s paper spaces in all: about '
        f"{(7200 / 3600 + added) / 2:.1f} hours at one program per core on 2 cores; 1 more "
        "case could not be counted."
    )
    assert pending_table(done.iloc[0:0], pending[:1]).loc[0, "s per program, from"] == (
        "nan (no case run)"
    )


@pytest.mark.slow
def test_the_quick_paper_grid_judges_every_plan_on_the_whole_step(tmp_path: Path) -> None:
    """`bench --paper --quick` end to end, twice: cold, then warm from the same caches.

    "Cold" for everything but the segment programs: their profiles start as a copy of the
    committed full grid's (`kept/`: from two repeats of its layer pattern on, a model's
    programs are the same at any depth), which spares CI about 15 of this test's 22 minutes
    on two cores (the tiny models' tests profile cold). Every whole-step evaluation, ILP
    answer and frontier is computed here."""
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{PAPER_START}\nold\n{PAPER_END}\n\ntail\n")
    cache = tmp_path / "paper.sqlite"
    shutil.copy(KEPT_CACHE, cache)
    cases = paper_cases(quick=True)
    assert {c.model for c in cases} == {"gpt", "llama", "moe", "bert"}  # one per family
    assert {(c.platform, c.mesh) for c in cases} == {("a100-pcie-8", (8,))}  # one platform
    # `kept/` holds whole wider spaces of some cases, which a cold cache would not: off
    wider = {space.row: "off" for space in WIDER_SPACES}
    report = run_paper(
        True, out=tmp_path / "cold", cache=cache, readme=readme, log=print, wider=wider
    )
    frame = pd.read_csv(tmp_path / "cold" / "paper.csv")
    text = report.read_text()
    assert "--paper --quick` in " in text and "minutes" in text  # finished, with its time
    assert "## Failures\n\nNone." in text, text
    assert ", 0 Alpa ILP answers from the ILP store and 0 CFP frontiers from" in text

    # every case has the CFP plan and every baseline, each judged by the compiled step
    assert len(frame) == len(cases) * 5
    assert (frame.groupby("case")["plan"].apply(set) == {"cfp", *BASELINES}).all()
    assert (frame["evaluated_s"] > 0).all() and (frame["evaluated_memory"] > 0).all()
    assert list(frame["fits"]) == list(frame["evaluated_memory"] <= frame["device_memory"])

    cfp = frame[frame["plan"] == "cfp"].set_index("case")
    # by construction: the CFP plan is the fastest predicted plan of the profiled space
    # within the device memory, unless its compiled step was over it (the note then says
    # what was compiled to find a slower one that fits); so where the fastest predicted one
    # fits compiled, no profiled template within it is predicted faster
    stepped = cfp["note"].fillna("").str.contains("plans compiled to find")
    first = cfp[~stepped]
    assert list(first["predicted_s"]) == pytest.approx(list(first["cfp_space_min_s"]), rel=1e-12)
    assert (cfp.loc[stepped, "predicted_s"] > cfp.loc[stepped, "cfp_space_min_s"]).all()
    assert (cfp["predicted_memory"] <= cfp["device_memory"]).all()
    # and its compiled step was checked to fit: only where none of the plans compiled fits
    # does the fastest predicted stand, over the device, and the note says so
    assert (cfp["fits"] | cfp["note"].fillna("").str.startswith("no plan compiled fits")).all()
    templates = frame[frame["plan"].isin(["dp", "megatron"])]
    fitting = templates[
        (templates["predicted_memory"] <= templates["device_memory"])
        & templates["case"].isin(first.index)
    ]
    for row in fitting.to_dict("records"):
        assert cfp.loc[row["case"], "predicted_s"] <= row["predicted_s"] * (1 + 1e-12), row
    # FSDP and the ILP are priced by compiling their whole step: prediction is the truth
    compiled = frame[frame["plan"].isin(["fsdp", "alpa"])]
    assert list(compiled["predicted_s"]) == list(compiled["evaluated_s"])
    assert (cfp["programs"] > 0).all() and (cfp["analyse_s"] > 0).all()
    assert (cfp["profiling_s"] > 0).all()
    # the quick depth is the full depth's programs: a miss would profile cold (CI's minutes)
    assert list(cfp["programs_from_cache"]) == list(cfp["programs"])
    assert frame.loc[frame["plan"] == "alpa", "alpa_variables"].gt(0).all()

    updated = readme.read_text()
    assert "old" not in updated and "tail" in updated
    assert "llama_7b_bf16" in updated and "Geometric mean" in updated

    # warm: every profile, whole-step evaluation, ILP answer and frontier comes from the
    # caches
    again = run_paper(True, out=tmp_path / "warm", cache=cache, log=print, wider=wider)
    warm = pd.read_csv(tmp_path / "warm" / "paper.csv")
    assert list(warm["evaluated_s"]) == list(frame["evaluated_s"])
    warm_cfp = warm[warm["plan"] == "cfp"]
    assert list(warm_cfp["programs_from_cache"]) == list(warm_cfp["programs"])
    assert list(warm_cfp["profiling_s"]) == list(cfp["profiling_s"])  # the cold run's cost
    warm_text = again.read_text()
    assert f"; {len(cases) * 5 + 2 * len(cases)} whole-step evaluations read" in warm_text
    alpa = frame["plan"] == "alpa"
    # an ILP with no plan within the device is asked again without the budget: two answers
    asked = len(cases) + frame.loc[alpa, "note"].str.contains("without the budget").sum()
    kept = f", {asked} Alpa ILP answers from the ILP store and {len(cases)} CFP frontiers from"
    assert kept in warm_text
    assert list(warm.loc[alpa, "alpa_solve_s"]) == list(frame.loc[alpa, "alpa_solve_s"])
    assert list(warm_cfp["solve_s"]) == list(cfp["solve_s"])  # the cold run's solve


@pytest.mark.slow
@pytest.mark.parametrize("refused_approximately", range(len(APPROXIMATE_RESOLUTIONS)))
def test_a_wider_space_refused_exactly_is_solved_approximately_and_reported_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_approximately: int
) -> None:
    """The bench's retry: a whole-mesh space whose exact frontier the solver refuses is solved
    again at the first of `APPROXIMATE_RESOLUTIONS` it does not refuse, and the report and CSV
    say how far from exact it may be. No space this small is refused, so the refusals are
    injected where the exact solve of the wider space (and, in the second case, the finest
    approximate one) would raise them; the solve that follows is the real one, made coarse at
    every step (`APPROXIMATE_ABOVE` 0) so that it has a slack to report."""
    from explorer import pipeline, solve
    from explorer.errors import FrontierTooLargeError

    real = pipeline.analyze
    refusing = (0, *APPROXIMATE_RESOLUTIONS[:refused_approximately])
    refused: list[int] = []

    def analyze(*args: Any, **options: Any) -> Any:
        resolution = options.get("memory_resolution") or 0
        if options.get("whole_mesh") and resolution in refusing:
            refused.append(resolution)
            raise FrontierTooLargeError("the frontier of this space is too large (injected)")
        return real(*args, **options)

    monkeypatch.setattr(pipeline, "analyze", analyze)
    monkeypatch.setattr(solve, "APPROXIMATE_ABOVE", 0)
    case = PaperCase("gpt", "tiny", "a100-pcie-8", (2, 2), batch=8, paper_batch=True, layers=1)
    report = run_paper(
        False,
        out=tmp_path,
        cache=SHARED_CACHE,  # the paper space's programs: those of the accuracy tests' 2x2 GPT
        cases=[case],
        log=print,
        wider={"cfp_whole": "compile"},
    )
    frame = pd.read_csv(tmp_path / "paper.csv")
    whole = frame[frame["plan"] == "cfp_whole"].iloc[0]
    assert refused == list(refusing)  # each refused once, in the order tried
    solved_at = APPROXIMATE_RESOLUTIONS[refused_approximately]
    assert whole["frontier_resolution_mib"] == solved_at / 2**20
    # every step is coarse: the slack is the resolution times a whole number of steps
    steps = whole["frontier_slack_mib"] / whole["frontier_resolution_mib"]
    assert steps >= 1 and steps == int(steps)
    paper_space = frame[frame["plan"] == "cfp"].iloc[0]
    assert paper_space["frontier_slack_mib"] == 0  # the paper's own space stays exact
    text = report.read_text()
    assert f"Approximate frontier: **{case.label}**" in text, text
    assert f"less than {whole['frontier_slack_mib']:.0f} MiB more" in text
    # the section names exactly the baselines that fit and beat this space's plan
    section = text.split("Where a baseline beats this space's CFP plan:")[1].split("\n\n")[1]
    faster = frame[
        frame["plan"].isin(BASELINES)
        & frame["fits"]
        & (frame["evaluated_s"] < whole["evaluated_s"])
    ]
    named = sorted(line.split(", ")[1].split(" (")[0] for line in section.splitlines()
                   if line.startswith("- **"))  # fmt: skip
    assert named == sorted(faster["plan"]), section
    if faster.empty:
        assert section == "Nowhere among the cases done."


def test_the_default_cap_space_is_searched_where_it_cuts_the_step_otherwise(
    tmp_path: Path,
) -> None:
    """A run at another cap also searches the paper's strategies cut at `analyze`'s default
    cap: its own programs, plan and whole step, and the best over spaces picks between the
    two cuts by prediction alone. At the default cap itself the space is the paper's and
    has no rows."""
    from explorer.segments import DEFAULT_CONFIG_CAP

    case = PaperCase("gpt", "tiny", "a100-pcie-8", (2, 2), batch=8, paper_batch=True, layers=1)
    only_cap = {space.row: "off" for space in WIDER_SPACES} | {"cfp_default_cap": "compile"}
    report = run_paper(
        False, out=tmp_path / "fine", cache=SHARED_CACHE, cases=[case], log=print,
        wider=only_cap, config_cap=9,
    )  # fmt: skip
    frame = pd.read_csv(tmp_path / "fine" / "paper.csv")
    paper, other = (frame[frame["plan"] == row].iloc[0] for row in ("cfp", "cfp_default_cap"))
    # cut at 9 the layer's blocks are segments of their own; at the default cap they are not
    assert paper["programs"] > 0 and other["programs"] > 0
    assert paper["programs"] != other["programs"]
    assert other["evaluated_s"] > 0 and math.isfinite(other["predicted_s"])
    text = report.read_text()
    section = text.split("## CFP with the paper's space cut at the default cap")[1]
    assert f"`analyze(..., config_cap={DEFAULT_CONFIG_CAP})`" in section.split("\n\n")[1]
    best = best_of_spaces(frame).set_index("plan").loc["cfp_best"]
    fastest = min((paper, other), key=lambda row: row["predicted_s"])
    assert best["predicted_s"] == fastest["predicted_s"]
    assert best["space"] == ("paper" if fastest is paper else "default-cap")

    run_paper(
        False, out=tmp_path / "default", cache=SHARED_CACHE, cases=[case], log=print,
        wider=only_cap,
    )  # fmt: skip
    plans = set(pd.read_csv(tmp_path / "default" / "paper.csv")["plan"])
    assert "cfp" in plans and not plans & {"cfp_default_cap", "cfp_default_cap_gpu"}


def _tiny_case_with_one_wider_space(
    tmp_path: Path,
    row: str,
    batch: int,
    *,
    model: str = "gpt",
    mesh: tuple[int, ...] = (2, 2),
    layers: int = 1,
) -> tuple[pd.DataFrame, pd.Series, pd.Series, str]:
    """Tiny GPT (or another tiny `model`) of `layers` layers on `mesh` at `batch`, the
    paper's space and the wider space of `row` alone: the run's rows, the paper's CFP row
    and the wider one's, and that space's report section."""
    case = PaperCase(
        model, "tiny", "a100-pcie-8", mesh, batch=batch, paper_batch=True, layers=layers
    )
    only = {space.row: "off" for space in WIDER_SPACES} | {row: "compile"}
    report = run_paper(False, out=tmp_path, cache=SHARED_CACHE, cases=[case], log=print, wider=only)
    frame = pd.read_csv(tmp_path / "paper.csv")
    paper, wider = (frame[frame["plan"] == name].iloc[0] for name in ("cfp", row))
    assert wider["evaluated_s"] > 0 and math.isfinite(wider["predicted_s"])
    assert wider["predicted_memory"] <= wider["device_memory"]
    title = next(space.title for space in WIDER_SPACES if space.row == row)
    return frame, paper, wider, report.read_text().split(f"## {title}")[1]


def test_the_free_axes_space_offers_the_batch_on_the_inner_axis_and_is_judged_alike(
    tmp_path: Path,
) -> None:
    """`--free-axes` searches every axis-to-role assignment on a 2-D mesh beside the
    paper's space: its own programs (more of them: the paper's rule pins M, here the batch,
    which divides into the 4 devices, to the outer axis), its own plan judged by its whole
    step, and a section of its own."""
    frame, paper, free, section = _tiny_case_with_one_wider_space(tmp_path, "cfp_free", 8)
    assert free["programs"] > paper["programs"] > 0
    assert "`analyze(..., free_axes=True)`" in section.split("\n\n")[1], section[:600]
    best = best_of_spaces(frame).set_index("plan").loc["cfp_best"]
    fastest = min((paper, free), key=lambda row: row["predicted_s"])
    assert best["space"] == ("paper" if fastest is paper else "free-axes")


def test_the_batch_inner_space_is_profiled_and_judged_beside_the_paper_s(tmp_path: Path) -> None:
    """`--batch-inner` at batch 2 on 2x2, where the batch does not split over the 4
    devices: the space primes it for the inner axis and pins it there. It is the paper's
    rule with the axes swapped, so it profiles programs of its own (as many types as the
    paper's space, other layouts), its plan is judged by its own whole step, and the
    fastest over every space is the faster prediction of the two."""
    frame, paper, inner, section = _tiny_case_with_one_wider_space(tmp_path, "cfp_inner", 2)
    assert inner["programs"] > 0 and paper["programs"] > 0
    assert "`analyze(..., batch_inner=True)`" in section.split("\n\n")[1], section[:600]
    best = best_of_spaces(frame).set_index("plan").loc["cfp_best"]
    fastest = min((paper, inner), key=lambda row: row["predicted_s"])
    assert best["predicted_s"] == fastest["predicted_s"]
    assert best["space"] == ("paper" if fastest is paper else "batch-inner")


def test_the_contract_last_space_is_profiled_and_judged_beside_the_paper_s(tmp_path: Path) -> None:
    """`--contract-last` on tiny MoE (a dense and an MoE layer) on 4 devices: the combine
    einsum's K moves to its experts' dim. The space cuts the step as the paper's does, into
    as many programs (those of the combine's K its own, the rest the paper's), its plan is
    judged by its own whole step, and the fastest over every space is the faster prediction
    of the two (the paper's where they tie)."""
    frame, paper, last, section = _tiny_case_with_one_wider_space(
        tmp_path, "cfp_klast", 8, model="moe", mesh=(4,), layers=2
    )
    assert last["programs"] == paper["programs"] > 0
    assert "`analyze(..., contract_last=True)`" in section.split("\n\n")[1], section[:600]
    best = best_of_spaces(frame).set_index("plan").loc["cfp_best"]
    fastest = min((paper, last), key=lambda row: row["predicted_s"])
    assert best["predicted_s"] == fastest["predicted_s"]
    assert best["space"] == ("paper" if fastest is paper else "contract-last")


def test_a_paper_case_on_a_platform_with_too_few_devices_is_skipped_with_its_reason(
    tmp_path: Path,
) -> None:
    case = PaperCase("gpt", "tiny", "v100-nvlink-4", (8,), batch=8, paper_batch=True, layers=2)
    report = run_paper(
        False,
        out=tmp_path,
        cache=tmp_path / "c.sqlite",
        cases=[case],
        log=print,
        only=["tiny"],
        config_cap=27,
    )
    text = report.read_text()
    assert "v100-nvlink-4 mesh 8: the platform has 4 devices, the mesh needs 8" in text
    assert "0 of 1 cases done" in text and "## Failures\n\nNone." in text
    # says what it ran
    assert "`python -m explorer bench --paper --only 'tiny' --config-cap 27` in" in text


def test_a_gpu_no_compiler_here_targets_is_said_once_and_judges_no_plan(tmp_path: Path) -> None:
    """`--gpu-memory` on a V100 case: the CUDA plugin installed here compiles for no GPU of
    compute capability 7.0, so no plan is judged on XLA:GPU. The report says so once, with
    the reason, under "Not run", and lists no failure; the CPU-judged rows stand."""
    case = PaperCase("gpt", "tiny", "v100-nvlink-4", (4,), batch=8, paper_batch=True, layers=2)
    report = run_paper(
        False, out=tmp_path, cache=SHARED_CACHE, cases=[case], log=print, gpu_memory="compile"
    )
    text = report.read_text()
    assert "1 of 1 cases done" in text and "## Failures\n\nNone." in text, text
    reasons = [line for line in text.splitlines() if "not judged on XLA:GPU's memory" in line]
    assert len(reasons) == 1 and "compute capability 7.0" in reasons[0], reasons
    frame = pd.read_csv(tmp_path / "paper.csv")
    assert set(frame["plan"]) == {"cfp", *BASELINES}  # no row judged on the GPU
    assert frame["gpu_memory"].isna().all() and (frame["evaluated_s"] > 0).all()


def test_the_paper_grid_runs_bf16_presets_in_float16_on_a_device_without_bf16_units() -> None:
    grid = paper_cases(quick=False)
    for case in grid:
        device = load_platform(case.platform).device
        no_bf16 = device.peak("bf16") is None and device.peak("f16") is not None
        assert case.dtype == ("float16" if no_bf16 else None), case.label
        assert (" in float16 batch " in case.label) == no_bf16, case.label
    on_v100 = [case for case in grid if case.dtype is not None]
    assert len(on_v100) == 10  # every model, at both batches, on the V100 node
    # the case's step is built in that dtype: every floating parameter is float16
    case = on_v100[0]
    _, args = build_step(
        Case(case.model, case.preset, case.mesh, batch=4, layers=1, dtype=case.dtype)
    )
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(args[0])}
    assert dtypes == {jnp.dtype("float16")}, dtypes


def test_only_picks_paper_cases_by_label_in_its_order_and_refuses_a_stray_pattern() -> None:
    grid = paper_cases(quick=False)
    chosen = select_cases(
        grid,
        ["llama_7b_bf16 batch 2 on a100-pcie-8 mesh 8", "bert_large_bf16 batch 8 on a100-pcie-8"],
    )
    assert [c.label for c in chosen] == [
        "llama_7b_bf16 batch 2 on a100-pcie-8 mesh 8",
        "bert_large_bf16 batch 8 on a100-pcie-8 mesh 8",
        "bert_large_bf16 batch 8 on a100-pcie-8 mesh 2x4",
        "bert_large_bf16 batch 8 on a100-pcie-8 mesh 4x2",
    ]
    assert select_cases(grid, ["llama_7b", "llama_7b_bf16 batch 2"]) == select_cases(
        grid, ["llama_7b"]
    )
    with pytest.raises(InputError, match="found 'gpt-2', which matches none of the 70 cases"):
        select_cases(grid, ["llama_7b", "gpt-2"])


def test_a_report_of_chosen_cases_says_which_cases_of_the_grid_it_left_out(
    tmp_path: Path,
) -> None:
    from benchmarks.paper_grid import PaperRun
    from benchmarks.paper_report import write_report

    only = ("bert_large_bf16 batch 8 on a100-pcie-8 mesh 8",)
    grid = paper_cases(quick=False)
    run = PaperRun(False, select_cases(grid, only), tmp_path, tmp_path / "c.sqlite", print, only)
    report = write_report(run, finished=True).read_text()
    assert f"0 of 1 cases done (chosen by `--only` from the grid's {len(grid)})" in report
    assert f"- {len(grid) - 1} of the grid's {len(grid)} cases, not chosen by `--only`: " in report
    left_out = report.split("not chosen by `--only`: ")[1].splitlines()[0].split("; ")
    assert left_out == [c.label for c in grid if c.label != only[0]]
    assert f"- {only[0]}: not reached before the run ended" in report
    assert "What each would cost" not in report  # nothing counted, nothing priced
    run.pending = [PendingCase(grid[1].label, grid[1].preset, 8, grid[1].batch, 90, 90)]
    report = write_report(run, finished=True).read_text()
    not_run = report.split("## Not run")[1].split("## Failures")[0]
    assert "What each would cost" in not_run
    assert f"| {grid[1].label} | True | 90 | 90 |" in not_run  # no case run: no price


def test_a_case_left_out_is_counted_by_tracing_it_and_compiling_nothing(tmp_path: Path) -> None:
    from explorer.pipeline import analyze
    from explorer.profile.cache import ProfileCache
    from explorer.profile.runner import distinct_programs

    case = PaperCase("gpt", "tiny", "a100-pcie-8", (2, 2), batch=8, paper_batch=True, layers=1)
    step, args = build_step(Case("gpt", "tiny", (2, 2), batch=8, layers=1))
    profiled = analyze(step, *args, mesh=(2, 2), platform="a100-pcie-8", cache=SHARED_CACHE)
    programs = distinct_programs(profiled.profiles)
    assert count_pending(case, SHARED_CACHE) == PendingCase(
        case.label, "tiny", devices=4, batch=8, programs=programs, to_compile=0
    )
    empty = tmp_path / "empty.sqlite"
    assert count_pending(case, empty).to_compile == programs > 0
    with ProfileCache(empty) as cache:
        assert len(cache) == 0  # counted, not compiled
    nowhere = count_pending(dataclasses.replace(case, platform="no-such-platform"), empty)
    assert (nowhere.programs, nowhere.to_compile) == (0, 0)
    assert nowhere.error.startswith("PlatformError: platform: expected a preset name")


def test_the_cases_of_one_step_share_its_trace_in_this_process_and_in_workers(
    tmp_path: Path,
) -> None:
    """Three cases of two steps (one step on two meshes, another case between them): run
    here, each step is traced once; run by two workers, the rows are the same, in the grid's
    order. Counted by a worker, each step is traced once too, and the cases give what
    counting here gives, in their order."""
    from benchmarks.paper_worker import Task, WorkerPool, WorkerSettings

    # programs of the seed's (profile_seed): nothing is profiled
    shared = PaperCase("gpt", "tiny", "a100-pcie-8", (2, 2), batch=8, paper_batch=True, layers=2)
    cases = [
        shared,
        dataclasses.replace(shared, layers=1),
        dataclasses.replace(shared, mesh=(4,)),
    ]
    assert len({case.step_key for case in cases}) == 2
    frames = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        report = run_paper(False, out=out, cache=SHARED_CACHE, cases=cases, log=print, jobs=jobs)
        text = report.read_text()
        assert "3 of 3 cases done; " in text and "## Failures\n\nNone." in text, text
        if jobs == 1:
            assert "3 of 3 cases done; 2 steps traced (" in text, text
        else:  # what the first run computed, its workers read back, and their counts say so
            assert "- The grid warm in under 5 minutes: not met. This run computed nothing " in (
                text
            ), text
        frames[jobs] = pd.read_csv(out / "paper.csv")
    assert list(frames[2]["case"].drop_duplicates()) == [case.label for case in cases]
    pd.testing.assert_frame_equal(frames[1][_KEPT_COLUMNS], frames[2][_KEPT_COLUMNS])
    here = [count_pending(case, SHARED_CACHE) for case in cases]
    assert all(counted.programs > 0 and not counted.error for counted in here)
    settings = WorkerSettings(False, tmp_path / "count", SHARED_CACHE, "kept", ())
    results: list[Any] = []
    with WorkerPool(settings, 1, tmp_path) as pool:
        tasks = [Task(case, count=True) for case in cases]
        pool.run(tasks, lambda index, result: results.append((index, result)))
    assert [index for index, _ in results] == [0, 1, 2]
    assert [result.pending for _, result in results] == [(counted,) for counted in here]
    assert sum(result.steps_traced for _, result in results) == 2


def test_only_without_paper_is_refused_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    from explorer.cli import main

    assert main(["bench", "--only", "llama"]) == 2
    assert "--only selects paper cases: expected it with --paper" in capsys.readouterr().err
    for flag in ("--gpu-memory", "--shard-parameters", "--whole-mesh", "--sequence-parallel"):
        assert main(["bench", flag]) == 2
        assert f"{flag} is for paper cases: expected it with --paper" in capsys.readouterr().err
    assert main(["bench", "--paper", "--sequence-parallel"]) == 2
    assert "--sequence-parallel: the paper grid profiles that space cut at the default cap; " in (
        capsys.readouterr().err
    )
    assert main(["bench", "--config-cap", "81"]) == 2
    assert "--config-cap is for paper cases: expected it with --paper" in capsys.readouterr().err
    assert main(["bench", "--paper", "--config-cap", "-3"]) == 2
    assert "--config-cap: expected a whole number of configurations >= 1, found '-3'" in (
        capsys.readouterr().err
    )
    assert main(["bench", "--jobs", "2"]) == 2
    assert "--jobs is for paper cases: expected it with --paper" in capsys.readouterr().err
    for jobs in ("0", "two", "-1"):
        assert main(["bench", "--paper", "--jobs", jobs]) == 2
        err = capsys.readouterr().err
        assert f"--jobs: expected a whole number of processes >= 1, found '{jobs}'" in err
    with pytest.raises(InputError, match="jobs: expected a whole number of processes >= 1"):
        run_paper(True, jobs=0)


def test_judged_on_the_gpu_the_cfp_plan_is_the_one_chosen_by_xla_gpu_memory() -> None:
    def row(case: str, plan: str, seconds: float, fits: bool, gpu: float | None) -> dict[str, Any]:
        return {
            "case": case, "model": "m", "plan": plan, "evaluated_s": seconds, "fits": fits,
            "evaluated_memory": 50 * 2**30, "time_error": 0.01, "note": "",
            "gpu_memory": math.nan if gpu is None else gpu * 2**30,
            "fits_gpu": None if gpu is None else gpu <= 40,
        }  # fmt: skip

    judged = [row("a", "cfp", 2.0, True, 20), row("a", "dp", 1.5, False, 30),
              row("a", "cfp_gpu", 1.2, True, 35)]  # fmt: skip
    # a case where one plan has no XLA:GPU figure is left out, not judged on half its plans
    partial = [row("b", "cfp", 1.0, True, 20), row("b", "dp", 1.0, True, None),
               row("b", "cfp_gpu", 1.0, True, 20)]  # fmt: skip
    frame = judged_on_gpu(pd.DataFrame(judged + partial))
    assert list(frame["case"]) == ["a", "a"] and list(frame["plan"]) == ["dp", "cfp"]
    # dp, over the device on XLA:CPU, fits on the GPU: it is compared with the GPU's CFP plan
    assert list(frame["fits"]) == [True, True]
    assert case_table(frame).iloc[0]["dp"] == "1.25"
    assert goals(frame)[0].startswith("CFP at least as fast as every baseline that fits: 1 of 1")


def test_with_zero_twins_the_cfp_plan_is_that_space_s_and_each_judgement_keeps_its_own() -> None:
    def row(case: str, plan: str, seconds: float, gpu: float) -> dict[str, Any]:
        return {
            "case": case, "model": "m", "plan": plan, "evaluated_s": seconds, "fits": False,
            "evaluated_memory": 50 * 2**30, "time_error": 0.01, "note": "",
            "gpu_memory": gpu * 2**30, "fits_gpu": gpu <= 40,
        }  # fmt: skip

    twins = [row("a", "cfp", 2.0, 39), row("a", "fsdp", 1.5, 30), row("a", "cfp_gpu", 2.0, 39),
             row("a", "cfp_zero", 1.0, 45), row("a", "cfp_zero_gpu", 1.4, 38)]  # fmt: skip
    plain = [row("b", "cfp", 1.0, 20), row("b", "fsdp", 1.0, 20), row("b", "cfp_gpu", 1.0, 20)]
    frame = pd.DataFrame(twins + plain)
    zero = as_cfp(frame, "cfp_zero")  # case b has no such row: left out
    assert list(zero["plan"]) == ["fsdp", "cfp"] and list(zero["evaluated_s"]) == [1.5, 1.0]
    on_gpu = judged_on_gpu(frame, "cfp_zero_gpu")
    assert list(on_gpu["plan"]) == ["fsdp", "cfp"] and list(on_gpu["evaluated_s"]) == [1.5, 1.4]
    assert goals(on_gpu)[0].startswith("CFP at least as fast as every baseline that fits: 1 of 1")
    # the plain space's judgement ignores the twin rows: there FSDP beats CFP
    plain_gpu = judged_on_gpu(frame)
    assert list(plain_gpu.loc[plain_gpu["case"] == "a", "plan"]) == ["fsdp", "cfp"]
    assert goals(plain_gpu)[0].startswith(
        "CFP at least as fast as every baseline that fits: 1 of 2"
    )


def test_each_space_says_where_a_baseline_beats_its_own_cfp_plan() -> None:
    """A loss belongs to the CFP plan it was found against: the paper space's in the main
    section, a wider space's in that space's section; a case where a baseline fits and no
    plan of a space does is that space's loss only."""
    from benchmarks.paper_report import _loss_lines

    def row(case: str, plan: str, seconds: float, note: str = "") -> dict[str, Any]:
        return {
            "case": case, "model": "m", "plan": plan, "evaluated_s": seconds,
            "fits": math.isfinite(seconds), "evaluated_memory": 30 * 2**30, "note": note,
        }  # fmt: skip

    rows = [row("a", "cfp", 2.0), row("a", "alpa", 1.5), row("a", "cfp_whole", 1.4),
            row("b", "cfp", math.nan, "no plan fits 40 GiB"), row("b", "fsdp", 3.0),
            row("b", "cfp_whole", 2.5)]  # fmt: skip
    frame = pd.DataFrame(rows)

    def loss(cfp: str) -> dict[str, Any]:
        return {"case": "a", "cfp": cfp, "baseline": "alpa", "ratio": 0.75, "blocks": "B",
                "collectives": "C", "time": "T"}  # fmt: skip

    paper = _loss_lines([loss("cfp")], frame, "cfp")
    assert paper == [
        "- **a**, alpa (0.75x): B. Collectives: C. T.",
        "- **b**: no plan fits 40 GiB; fsdp 3000 ms in 30.0 GiB fits.",
    ]
    # the whole-mesh plans beat every baseline and fit: nothing is that space's loss
    assert _loss_lines([loss("cfp")], frame, "cfp_whole") == ["Nowhere among the cases done."]
    assert _loss_lines([loss("cfp_whole")], frame, "cfp_whole")[0].startswith("- **a**, alpa")


def test_over_every_space_the_plan_predicted_fastest_is_chosen_never_the_truth_s() -> None:
    """The best plan over CFP's spaces is chosen by prediction alone: a space whose plan runs
    faster but is predicted slower loses; a space with no plan within the device memory, or
    none that fits on XLA:GPU, is passed over; equals keep the paper's; a case no space has a
    plan for keeps the paper space's note; a loss of the chosen space is the best plan's."""

    def row(case: str, plan: str, predicted: float, truth: float, **more: Any) -> dict[str, Any]:
        return {
            "case": case, "model": "m", "plan": plan, "predicted_s": predicted,
            "evaluated_s": truth, "fits": math.isfinite(truth), "evaluated_memory": 30 * 2**30,
            "time_error": 0.0, "note": "", **more,
        }  # fmt: skip

    nan = math.nan
    rows = [
        # a: the whole-mesh plan is predicted fastest; the batch-outer one runs faster
        row("a", "cfp", 2.0, 2.0), row("a", "alpa", 1.8, 1.8), row("a", "cfp_whole", 1.5, 1.6),
        row("a", "cfp_outer", 1.55, 1.4),
        # on XLA:GPU's memory the whole-mesh plan does not fit: the paper's is chosen
        row("a", "cfp_gpu", 1.9, 1.9, fits_gpu=True), row("a", "cfp_whole_gpu", 1.0, 1.0,
        fits_gpu=False),
        # b: a tie keeps the paper's; c: no space has a plan, the paper's note stands
        row("b", "cfp", 1.0, 1.0), row("b", "cfp_whole", 1.0, 1.01),
        row("c", "cfp", nan, nan, note="no plan fits 40 GiB"), row("c", "cfp_whole", nan, nan),
        row("c", "dp", 3.0, 3.0),
    ]  # fmt: skip
    best = best_of_spaces(pd.DataFrame(rows)).set_index(["case", "plan"])
    assert best.loc[("a", "cfp_best"), "space"] == "whole-mesh"
    assert best.loc[("a", "cfp_best"), "evaluated_s"] == 1.6  # not the faster-running 1.4
    assert best.loc[("a", "cfp_best_gpu"), "space"] == "paper"
    assert best.loc[("b", "cfp_best"), "space"] == "paper"
    assert best.loc[("c", "cfp_best"), "note"] == "no plan fits 40 GiB"
    assert ("b", "cfp_best_gpu") not in best.index  # no row judged on the GPU: none chosen

    lost = {"case": "a", "cfp": "cfp_whole", "baseline": "alpa", "ratio": 0.9}
    other = {"case": "a", "cfp": "cfp", "baseline": "alpa", "ratio": 0.9}
    frame, losses = with_best_of_spaces(pd.DataFrame(rows), [lost, other])
    assert [loss["cfp"] for loss in losses] == ["cfp_whole", "cfp", "cfp_best"]
    view = as_cfp(frame, "cfp_best")
    assert case_table(view).set_index("case").loc["a", "space"] == "whole-mesh"
    # a is won (1.6 s against the ILP's 1.8 s); in c only DP fits: lost on memory
    assert goals(view)[0].startswith(
        "CFP at least as fast as every baseline that fits: 1 of 2 cases; in 1 of them"
    )


def test_the_library_imports_no_benchmark_harness() -> None:
    """The harness (writing under assets/, running the app) lives in benchmarks/, outside the
    package: no module of `explorer` imports it, and only the command line names it (lazily,
    refusing clearly where it is not installed)."""
    import ast

    import explorer

    root = Path(explorer.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if "bench" in n]
    assert offenders == []
    assert not (root / "bench.py").exists() and not (root / "bench_paper.py").exists()


# what a warm run reads back or recomputes the same; analyse_s and alpa_total_s are this
# run's own seconds
_KEPT_COLUMNS = [
    "plan",
    "predicted_s",
    "predicted_memory",
    "evaluated_s",
    "evaluated_comm_s",
    "evaluated_memory",
    "fits",
    "time_error",
    "strategies",
    "note",
    "programs",
    "programs_from_cache",
    "profiling_s",
    "solve_s",  # the kept frontier's: the seconds of the run that solved it
    "cfp_space_min_s",
    "alpa_solve_s",
    "alpa_variables",
    "gpu_memory",  # XLA:GPU's, read back from the kept figures
]


@pytest.mark.slow
def test_the_committed_paper_report_is_what_its_kept_caches_give(tmp_path: Path) -> None:
    """The committed report's rows of two cases, computed again by this code from the
    committed caches (copied: a test writes nothing into the repository), by two worker
    processes (`jobs=2`, as a warm regeneration runs). A change to the engine that
    moves a program, a plan or a price shows here, before the report goes stale."""
    committed = pd.read_csv(PAPER_DIR / "paper.csv")
    labels = [
        "bert_large_bf16 batch 8 on a100-pcie-8 mesh 8",
        "bert_large_bf16 batch 32 on a100-pcie-8 mesh 8",
    ]
    assert set(labels) <= set(committed["case"]), "the committed report holds the cases"
    for kept in KEPT_CACHE.parent.glob("*.sqlite"):
        shutil.copy(kept, tmp_path / kept.name)
    grid = {c.label: c for c in paper_cases(quick=False)}
    report = run_paper(
        False,
        out=tmp_path / "out",
        cache=tmp_path / KEPT_CACHE.name,
        cases=[grid[label] for label in labels],
        log=print,
        jobs=2,
    )
    again = pd.read_csv(tmp_path / "out" / "paper.csv")
    assert list(again["case"].drop_duplicates()) == labels  # the grid's order, not finishing's
    for label in labels:
        mine = committed[committed["case"] == label].reset_index(drop=True)
        theirs = again[again["case"] == label].reset_index(drop=True)
        assert list(theirs["plan"]) == ["cfp", *BASELINES, "cfp_gpu"]
        for column in _KEPT_COLUMNS:  # exactly; the committed file's dtypes follow its others
            pd.testing.assert_series_equal(
                theirs[column], mine[column], check_dtype=False, check_exact=True, obj=column
            )
    text = report.read_text()
    assert "--jobs 2` in " in text and "2 of 2 cases done" in text, text
    assert "## Failures\n\nNone." in text, text
    # per case, the five plans and CFP's plan on the GPU, and FSDP's and the ILP's once more:
    # each is priced by its whole step; the workers' counts add up
    assert "; 16 whole-step evaluations read from the evaluation store" in text, text
    # XLA:GPU's memory of the five plans, and of the fastest frontier plan (it fits)
    assert "(12 figures read from the store" in text, text
    assert ", 2 Alpa ILP answers from the ILP store and 2 CFP frontiers from" in text, text
