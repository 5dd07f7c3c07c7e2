"""`python -m explorer bench --paper [--quick]`: plan quality at the paper's scale.

The paper's models (GPT-2.6B, GPT-6.7B, LLaMA-7B, GShard MoE-7.1B, BERT-large; bf16 mixed
precision, from abstract shapes) on its platforms and meshes, at the paper's batch and a
quarter of it. For each case the CFP plan (the fastest of its frontier whose compiled step fits
the platform's device memory, fastest predicted first: `fastest_plan_that_fits`, since the
fastest predicted within the budget sits at its edge, where the prediction's percent decides)
and the baselines (DP, Megatron, FSDP/ZeRO-3, the Alpa-style ILP with Alpa's 600 s
limit) are all judged by the same truth: the whole step compiled under the plan and priced on
the platform. Where a baseline beats the CFP plan, the report names the blocks whose strategy
differs and the collectives of the two compiled steps that differ.

Cases run most informative first (every model on the 8-GPU A100 node at the smaller batch,
then at the paper's, then the other meshes), and the report is written after every case,
so a run stopped early leaves a valid partial report that lists the cases it did not reach.
Evaluations are kept by plan digest (`evaluation_store`) and the Alpa ILP's answers by problem
digest (`explorer.alpa.kept`) beside the profile cache, so a warm run compiles and solves
nothing it compiled or solved before.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.paper_grid import (
    ALPA_TIME_LIMIT,
    APPROXIMATE_RESOLUTIONS,
    BASELINES,
    DEFAULT_CACHE,
    KEPT_CACHE,
    PAPER_DIR,
    WIDER_SPACES,
    PaperCase,
    PaperRun,
    WiderSpace,
    paper_cases,
    select_cases,
)
from benchmarks.paper_pending import PendingCase
from benchmarks.paper_report import write_report
from benchmarks.quality import strategy_mix


def run_case(run: PaperRun, case: PaperCase) -> None:
    """Analyse, plan, price every baseline and evaluate every plan of one case."""
    from explorer.pipeline import analyze
    from explorer.platforms import load_platform

    platform = load_platform(case.platform)
    if platform.devices < math.prod(case.mesh):
        run.skipped.append(
            f"{case.label}: the platform has {platform.devices} devices, the mesh needs "
            f"{math.prod(case.mesh)}"
        )
        return
    capacity = platform.device.memory_bytes
    began = time.perf_counter()
    traced = run.steps.of(case)  # traced here, or by the last case of the same step
    step, args = traced.step, traced.args
    start = time.perf_counter()
    analysis = analyze(
        step,
        *args,
        mesh=case.mesh,
        platform=platform,
        cache=run.cache,
        progress=False,
        config_cap=run.segment_cap(),
        traced=traced.graph,
    )
    # the trace's seconds count in every case of the step, as if each had traced it
    cost = _search_cost(analysis, traced.trace_s + time.perf_counter() - start)
    _count_frontier(run, analysis)
    plans: dict[str, Any] = {}
    notes: dict[str, str] = {}
    verified: dict[str, Any] = {}  # the CFP plans' truths, compiled while choosing them
    # the fastest predicted within the device memory: the CFP plan unless its compiled step
    # is over (`_cfp_plan`; the row's note then says what was compiled instead)
    fitting = [p.time for p in analysis.frontier.points if p.memory <= capacity]
    _cfp_plan(
        run, analysis, "cfp", capacity, plans=plans, notes=notes, verified=verified,
        step=step, args=args,
    )  # fmt: skip
    for name in BASELINES:
        begun = time.perf_counter()
        try:
            plans[name], notes[name] = _baseline(run, analysis, name, capacity)
        except Exception as err:
            run.failed(f"{case.label}: {name}", err)
        if name == "alpa":
            cost["alpa_total_s"] = time.perf_counter() - begun
    gpu = _on_gpu(run, case, analysis, plans=plans, notes=notes, step=step, args=args)
    costs = {"cfp": cost, "cfp_gpu": cost}
    analyses = {"cfp": analysis}  # the space each CFP row's plan was chosen from
    for space in WIDER_SPACES:
        wider = _with_wider_space(
            run, case, platform, space, plans=plans, notes=notes, gpu=gpu, step=step, args=args,
            paper=analysis, verified=verified,
        )  # fmt: skip
        if wider is not None:
            costs[space.row] = costs[space.gpu_row] = wider.cost
            analyses[space.row] = wider.analysis
    truths = _evaluate_all(run, case, plans, step, args, known=verified)
    wider_rows = (row for space in WIDER_SPACES for row in (space.row, space.gpu_row))
    for name in ("cfp", *BASELINES, "cfp_gpu", *wider_rows):
        plan, truth = plans.get(name), truths.get(name)
        if name.startswith("cfp") and name not in costs:
            continue  # a wider space not profiled for this case
        if name.endswith("_gpu") and plan is None and notes[name].startswith("not compiled"):
            continue  # nothing judged on the GPU yet: the row would say only that
        run.rows.append(
            _row(
                case,
                name,
                plan,
                truth,
                capacity=capacity,
                note=notes.get(name, ""),
                cost=costs.get(name, cost),
            )
        )
        memory = gpu.get(name)
        run.rows[-1].update(
            gpu_memory=memory.peak if memory is not None else math.nan,
            fits_gpu=(memory.peak <= capacity) if memory is not None else None,
        )
        if name == "cfp" and plan is not None:
            run.rows[-1]["cfp_space_min_s"] = min(fitting) if fitting else math.nan
    for row, space_analysis in analyses.items():
        _explain_losses(
            run, case, space_analysis, plans, truths=truths, capacity=capacity, cfp_row=row
        )
    run.done.append(case.label)
    run.log(f"   {case.label}: {time.perf_counter() - began:.0f} s")


def _cfp_plan(
    run: PaperRun,
    analysis: Any,
    name: str,
    capacity: int,
    *,
    plans: dict[str, Any],
    notes: dict[str, str],
    verified: dict[str, Any],
    step: Any,
    args: Any,
) -> None:
    """The fastest frontier plan whose compiled whole step fits the device memory
    (`fastest_plan_that_fits`, from the fastest predicted within it) as `plans[name]`, its
    truth as `verified[name]`, and in `notes[name]` how it was found where the fastest
    predicted was over. Where no plan compiled fits, the fastest predicted within the budget
    stands (its compiled step over, the note says so); where no plan is predicted within it,
    `notes[name]` says how far the leanest is over."""
    from explorer.compiled_fit import fastest_plan_that_fits
    from explorer.errors import NoPlanFitsError

    if analysis.frontier.min_memory > capacity:
        notes[name] = (
            f"no plan fits {capacity / 2**30:.0f} GiB: the smallest predicted needs "
            f"{analysis.frontier.min_memory / 2**30:.1f} GiB"
        )
        return
    try:
        fit = fastest_plan_that_fits(
            analysis, step, *args, memory_budget=capacity, store=run.evaluations
        )
    except NoPlanFitsError as none_fits:  # compiled, each over the budget
        plans[name] = analysis.plan(memory_budget=capacity)
        notes[name] = str(none_fits).split(". ")[0]
        return
    plans[name], verified[name] = fit.plan, fit.truth
    if fit.rejected:
        notes[name] = fit.summary()


def _count_frontier(run: PaperRun, analysis: Any) -> None:
    """Whether `analysis` read its frontier back from the store or solved it."""
    run.frontiers_kept += analysis.frontier_kept
    run.computed["frontiers solved"] += not analysis.frontier_kept


def _search_cost(analysis: Any, analyse_s: float) -> dict[str, Any]:
    """What finding the case's plans cost: its programs, and the seconds they took."""
    from explorer.profile.runner import distinct_programs

    table = analysis.profiles
    programs = table[table["program"] != ""].drop_duplicates("program")
    return {
        "programs": distinct_programs(table),  # a boundary where nothing moves has none
        "programs_from_cache": distinct_programs(table[table["cached"]]),
        # what profiling and solving cost when they were done, kept or not: a warm run
        # reports its cold run's
        "profiling_s": float(programs["seconds"].sum()),
        "solve_s": analysis.solve_seconds,
        # an approximate frontier (a space too wide for the exact one): its memory resolution,
        # and how much more memory than an exact plan its counterpart may need
        "frontier_resolution_mib": analysis.memory_resolution / 2**20,
        "frontier_slack_mib": analysis.frontier.memory_slack / 2**20,
        "analyse_s": analyse_s,  # trace, blocks, segments, profiling and the frontier
    }


def _on_gpu(
    run: PaperRun,
    case: PaperCase,
    analysis: Any,
    *,
    plans: dict[str, Any],
    notes: dict[str, str],
    step: Any,
    args: Any,
    chosen: str = "cfp_gpu",
) -> dict[str, Any]:
    """XLA:GPU's memory of every plan on the platform's GPU (`target_memory`), and the CFP
    plan chosen by it (`fastest_plan_on_gpu`, added to `plans` as `chosen`). In "kept" mode
    only what the store holds; a plan it does not hold has none. A GPU this machine has no
    compiler for judges no plan: the case is listed under "Not run" with the reason, once
    (not a failure: nothing went wrong that a run here could fix)."""
    from explorer.errors import ExplorerError, TargetCompilerError
    from explorer.target_memory import fastest_plan_on_gpu, target_memory

    store, compile_missing = run.gpu_memories, run.gpu_memory == "compile"
    found: dict[str, Any] = {}
    for name, plan in plans.items():
        try:
            found[name] = target_memory(
                plan, case.platform, step, *args, store=store, compile_missing=compile_missing
            )
        except LookupError:
            pass
        except TargetCompilerError as err:
            _not_on_gpu(run, case, notes, chosen, err)
            return found
        except Exception as err:
            run.failed(f"{case.label}: XLA:GPU memory of {name}", err)
    try:
        fit = fastest_plan_on_gpu(
            analysis, step, *args, store=store, compile_missing=compile_missing
        )
    except LookupError:
        notes[chosen] = "not compiled for the GPU (run with --gpu-memory)"
    except TargetCompilerError as err:
        _not_on_gpu(run, case, notes, chosen, err)
    except ExplorerError as err:  # no plan fits the GPU
        notes[chosen] = str(err).splitlines()[0]
    else:
        plans[chosen], found[chosen] = fit.plan, fit.memory
        notes[chosen] = (
            f"fastest frontier plan within {fit.budget / 2**30:.0f} GiB on XLA:GPU; "
            f"{len(fit.compiled)} frontier plans compiled for the GPU to find it"
        )
    return found


def _not_on_gpu(
    run: PaperRun, case: PaperCase, notes: dict[str, str], chosen: str, err: Exception
) -> None:
    """No plan of `case` judged on its GPU, which no compiler here targets: said once."""
    reason = str(err).splitlines()[0]
    line = f"{case.label}: not judged on XLA:GPU's memory: {reason}"
    if line not in run.skipped:  # once, whichever of the case's spaces met it first
        run.skipped.append(line)
    notes[chosen] = f"not compiled for the GPU: {reason}"


def _with_wider_space(
    run: PaperRun,
    case: PaperCase,
    platform: Any,
    space: WiderSpace,
    *,
    plans: dict[str, Any],
    notes: dict[str, str],
    gpu: dict[str, Any],
    step: Any,
    args: Any,
    paper: Any,
    verified: dict[str, Any],
) -> WiderAnalysis | None:
    """CFP over a space wider than the paper's: its plan within the device memory
    (`space.row`) and the one XLA:GPU's memory chooses (`space.gpu_row`), added to `plans`
    (their XLA:GPU memory to `gpu`); the analysis and its search cost, as `run_case` reports
    it.
    `paper` is the paper space's analysis: its graph is the step, not traced again.
    None where the space is the paper's (a 2-D widening on a 1-D mesh, the batch-outer
    space where the batch splits over every device), or the same space the run's cap gives
    (another cap that cuts the step alike), or where the run
    keeps to the cache ("kept") and the cache lacks a program of that space, or where the
    space's frontier is too large to solve (the report's "Not run" says so)."""
    from explorer.errors import FrontierTooLargeError, ProfilingCancelled
    from explorer.mesh import mesh_spec
    from explorer.pipeline import analyze
    from explorer.plan_space import cuts_alike
    from explorer.segments import build_segments
    from explorer.space import step_blocks, step_space

    traced = paper.graph
    if (space.two_d_only and len(case.mesh) == 1) or run.wider.get(space.row) == "off":
        return None
    if space.batch_outer and not step_blocks(traced, mesh_spec(case.mesh), batch_outer=True).primed:
        return None  # no block primes a role: the batch splits over every device already
    if space.contract_last:
        pinned = {"batch_outer": space.batch_outer, "batch_inner": space.batch_inner}
        moved = step_blocks(traced, mesh_spec(case.mesh), contract_last=True, **pinned)
        if not moved.contracted_last:
            return None  # no block's K moves: the space without contract_last's
    cap = space.config_cap or run.segment_cap()
    if space.config_cap is not None and space.has_run_cap_twin:
        blocks = paper.block_analysis  # the paper's strategies: analysed at the run's cap
        run_cut = paper.segments
        if space.widened:
            blocks = step_space(
                traced,
                mesh_spec(case.mesh),
                whole_mesh=space.whole_mesh,
                free_axes=space.free_axes,
                shard_parameters=space.shard_parameters,
                batch_outer=space.batch_outer,
                sequence_parallel=space.sequence_parallel,
                batch_inner=space.batch_inner,
                contract_last=space.contract_last,
            )
            run_cut = build_segments(traced, blocks, cap=run.segment_cap())
        if cuts_alike(build_segments(traced, blocks, cap=cap), run_cut):
            return None  # the same segments: the same programs and plan as at the run's cap
    capacity = platform.device.memory_bytes
    cancel = threading.Event()
    if run.wider.get(space.row) != "compile":
        cancel.set()  # profile nothing: a program the cache lacks cancels the analysis
    start = time.perf_counter()

    def analysed(memory_resolution: int = 0) -> Any:
        return analyze(
            step,
            *args,
            mesh=case.mesh,
            platform=platform,
            cache=run.cache,
            progress=False,
            cancel=cancel,
            shard_parameters=space.shard_parameters,
            whole_mesh=space.whole_mesh,
            free_axes=space.free_axes,
            batch_outer=space.batch_outer,
            sequence_parallel=space.sequence_parallel,
            batch_inner=space.batch_inner,
            contract_last=space.contract_last,
            memory_resolution=memory_resolution,
            traced=traced,
            config_cap=cap,
        )

    try:
        analysis = _solved_coarser_where_refused(analysed)
    except ProfilingCancelled:
        return None
    except FrontierTooLargeError as err:  # too large even at the coarsest resolution
        run.skipped.append(f"{case.label}: {space.title}: {str(err).splitlines()[0]}")
        return None
    cost = _search_cost(analysis, time.perf_counter() - start)
    _count_frontier(run, analysis)
    mine: dict[str, Any] = {}
    _cfp_plan(
        run, analysis, space.row, capacity, plans=mine, notes=notes, verified=verified,
        step=step, args=args,
    )  # fmt: skip
    gpu.update(
        _on_gpu(
            run, case, analysis, plans=mine, notes=notes, step=step, args=args,
            chosen=space.gpu_row,
        )
    )  # fmt: skip
    plans.update(mine)
    return WiderAnalysis(analysis, cost)


def _solved_coarser_where_refused(analysed: Callable[..., Any]) -> Any:
    """`analysed(resolution)` exactly (resolution 0), then, where the solver refuses it
    (profiled, but its frontier too large), at each of `APPROXIMATE_RESOLUTIONS` in turn: the
    first answer. The last refusal is raised where every one was refused."""
    from explorer.errors import FrontierTooLargeError

    *finer, coarsest = (0, *APPROXIMATE_RESOLUTIONS)
    for resolution in finer:
        with contextlib.suppress(FrontierTooLargeError):
            return analysed(resolution)
    return analysed(coarsest)


@dataclass(frozen=True, slots=True)
class WiderAnalysis:
    """A wider space's analysis of a case (for the blocks where a baseline beats its plan)
    and what searching it cost."""

    analysis: Any
    cost: dict[str, Any]


def _baseline(run: PaperRun, analysis: Any, name: str, capacity: int) -> tuple[Any, str]:
    """A baseline plan and a note on how it was obtained."""
    from explorer.alpa import AlpaBudgetError, AlpaTimeLimitWarning

    kept = dict(evaluations=run.evaluations, ilp_answers=run.ilp_answers)
    if name != "alpa":
        return analysis.baseline(name, **kept), ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AlpaTimeLimitWarning)
        try:
            plan = analysis.baseline(
                name, memory_budget=capacity, time_limit=ALPA_TIME_LIMIT, **kept
            )
            note = ""
        except AlpaBudgetError:
            plan = analysis.baseline(name, time_limit=ALPA_TIME_LIMIT, **kept)
            note = "no ILP solution within the device memory: solved without the budget"
    status = plan.ilp.status if plan.ilp is not None else ""
    if any(issubclass(w.category, AlpaTimeLimitWarning) for w in caught):
        status += f" (hit the {ALPA_TIME_LIMIT:.0f} s limit: best feasible plan)"
    return plan, "; ".join(part for part in (f"ILP {status}", note) if part)


def _evaluate_all(
    run: PaperRun,
    case: PaperCase,
    plans: dict[str, Any],
    step: Any,
    args: Any,
    *,
    known: dict[str, Any],
) -> dict[str, Any]:
    """Every plan's whole step, compiled or read back; `known` holds the truths already
    found (the CFP plans', compiled to choose them), each read once."""
    from explorer.plan import evaluate_each

    names = [name for name in plans if name not in known]

    def failed(index: int, err: Exception) -> None:
        run.failed(f"{case.label}: evaluate {names[index]}", err)

    evaluated = evaluate_each(
        [plans[name] for name in names], [case.platform], step, *args,
        store=run.evaluations, on_error=failed,
    )  # fmt: skip
    found = {
        name: truth[case.platform]
        for name, truth in zip(names, evaluated, strict=True)
        if truth is not None
    }
    return {**known, **found}


def _row(
    case: PaperCase,
    name: str,
    plan: Any,
    truth: Any,
    *,
    capacity: int,
    note: str,
    cost: dict[str, Any],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "case": case.label,
        "model": case.preset,
        "platform": case.platform,
        "mesh": "x".join(map(str, case.mesh)),
        "batch": case.batch,
        "paper_batch": case.paper_batch,
        "layers": case.layers if case.layers is not None else "preset",
        "dtype": case.dtype if case.dtype is not None else "preset",
        "plan": name,
        "predicted_s": plan.time if plan is not None else math.nan,
        "predicted_memory": plan.memory if plan is not None else math.nan,
        "evaluated_s": truth.time if truth is not None else math.nan,
        "evaluated_comm_s": truth.t_comm if truth is not None else math.nan,
        "evaluated_memory": truth.memory if truth is not None else math.nan,
        "device_memory": capacity,
        "fits": bool(truth is not None and truth.memory <= capacity),
        "time_error": (plan.time - truth.time) / truth.time
        if plan is not None and truth is not None and truth.time
        else math.nan,
        "strategies": strategy_mix(plan) if plan is not None else "",
        "note": note,
    }
    if name.startswith("cfp"):
        row.update(cost)
    if name == "alpa" and plan is not None:
        ilp = plan.ilp
        row.update(
            alpa_solve_s=ilp.solve_seconds if ilp is not None else math.nan,
            alpa_variables=ilp.variables if ilp is not None else math.nan,
            alpa_total_s=cost.get("alpa_total_s", math.nan),
        )
    return row


def _explain_losses(
    run: PaperRun,
    case: PaperCase,
    analysis: Any,
    plans: dict[str, Any],
    *,
    truths: dict[str, Any],
    capacity: int,
    cfp_row: str = "cfp",
) -> None:
    """For every baseline that fits and beats the CFP plan of `cfp_row` (the paper's space's
    or a wider one's, chosen from `analysis`) on the truth: the blocks whose strategy differs
    and the collectives of the two compiled steps that differ."""
    cfp, cfp_truth = plans.get(cfp_row), truths.get(cfp_row)
    if cfp is None or cfp_truth is None:
        return
    for name in BASELINES:
        other, truth = plans.get(name), truths.get(name)
        if other is None or truth is None or truth.memory > capacity:
            continue
        if truth.time >= cfp_truth.time:
            continue
        run.losses.append(
            {
                "case": case.label,
                "cfp": cfp_row,
                "baseline": name,
                "ratio": truth.time / cfp_truth.time,
                "blocks": _block_difference(analysis, cfp, other),
                "collectives": _collective_difference(cfp_truth, truth),
                "time": (
                    f"communication {1e3 * cfp_truth.t_comm:.1f} vs {1e3 * truth.t_comm:.1f} ms, "
                    f"computation {1e3 * cfp_truth.t_comp:.1f} vs {1e3 * truth.t_comp:.1f} ms "
                    "(CFP vs baseline)"
                ),
            }
        )


def _block_difference(analysis: Any, cfp: Any, other: Any) -> str:
    if other.per_op:
        return _per_op_difference(analysis, cfp, other)
    pairs = Counter(
        f"{block.scope}: {mine} (CFP) vs {theirs}"
        for block, mine, theirs in zip(cfp.blocks, cfp.strategies, other.strategies, strict=True)
        if mine != theirs
    )
    if not pairs:
        if cfp.parameters != other.parameters:
            return "same block strategies; the parameter layouts differ (sharded parameters)"
        return "same block strategies"
    return f"{sum(pairs.values())} blocks differ: {_listed(pairs)}"


def _per_op_difference(analysis: Any, cfp: Any, other: Any) -> str:
    """A per-op plan through the block space: the blocks it lays out as another strategy
    than CFP's, the blocks it lays out as a strategy the space does not offer, the blocks
    where it splits a dim no role of the block takes, the blocks no split lays out as it does
    (it reshards inside them), and its nearest offered block plan priced by the cost model
    beside CFP's."""
    from explorer.explain import closest_selection, project_onto_blocks
    from explorer.explain.counterfactual import select

    projections = project_onto_blocks(analysis.graph, analysis.blocks, other)
    differ = Counter(
        f"{p.scope}: {choice.strategy} (CFP) vs {p.strategy_name}"
        for p, choice in zip(projections, cfp.blocks, strict=True)
        if p.exact and p.strategy_name != choice.strategy
    )
    unoffered = Counter(
        f"{p.scope}: {p.unoffered} (CFP {choice.strategy})"
        for p, choice in zip(projections, cfp.blocks, strict=True)
        if not p.exact and p.unoffered is not None
    )

    def closest(p: Any) -> str:
        return f"{p.scope} (closest {p.strategy_name}: {p.agreeing} of {p.values} values"

    unmatched = [p for p in projections if not p.exact and p.unoffered is None]
    roleless = Counter(
        f"{closest(p)}; splits {', '.join(p.roleless)})" for p in unmatched if p.roleless
    )
    inside = Counter(f"{closest(p)})" for p in unmatched if not p.roleless)
    parts = [
        f"per-op plan; {sum(p.exact for p in projections)} of {len(projections)} blocks are "
        "laid out as one block strategy"
    ]
    if differ:
        parts.append(f"{sum(differ.values())} of them differ from CFP's: {_listed(differ)}")
    if unoffered:
        parts.append(
            f"{sum(unoffered.values())} blocks as a strategy the block space does not offer: "
            + _listed(unoffered)
        )
    if roleless:
        parts.append(
            f"{sum(roleless.values())} blocks split a dim none of the block's roles takes (no "
            "block strategy can): " + _listed(roleless)
        )
    if inside:
        parts.append(
            f"{sum(inside.values())} blocks as no strategy (the plan reshards inside them): "
            + _listed(inside)
        )
    selection = select(analysis.cost_model, closest_selection(projections))
    if isinstance(selection, str):
        parts.append(f"its nearest block plan is not in the profiled space ({selection})")
    else:
        nearest = analysis.plan_of(selection, source="nearest")
        parts.append(
            f"its nearest block plan is predicted at {1e3 * nearest.time:.1f} ms and "
            f"{nearest.memory / 2**30:.1f} GiB (CFP's: {1e3 * cfp.time:.1f} ms, "
            f"{cfp.memory / 2**30:.1f} GiB)"
        )
    return "; ".join(parts)


def _listed(differences: Counter[str]) -> str:
    """The six commonest block differences, with how many blocks each."""
    listed = ", ".join(what + (f" x{n}" if n > 1 else "") for what, n in differences.most_common(6))
    more = len(differences) - 6
    return listed + (f", and {more} more" if more > 0 else "")


def _collective_difference(cfp: Any, other: Any) -> str:
    """Per collective kind and group: count and bytes in each step, where they differ."""

    def tally(evaluation: Any) -> dict[tuple[str, int], tuple[int, int]]:
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for kind, nbytes, _axes, group in evaluation.emitted:
            count, total = out.get((kind, group), (0, 0))
            out[(kind, group)] = (count + 1, total + nbytes)
        return out

    mine, theirs = tally(cfp), tally(other)
    parts = []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key, (0, 0)), theirs.get(key, (0, 0))
        if a != b:
            parts.append(
                f"{key[0]} (groups of {key[1]}): {a[0]} x {a[1] / 2**20:.1f} MiB (CFP) vs "
                f"{b[0]} x {b[1] / 2**20:.1f} MiB"
            )
    return "; ".join(parts) or "the same collectives"


def run_paper(
    quick: bool,
    *,
    out: Path = PAPER_DIR,
    cache: Path | None = None,
    log: Callable[[str], None] = print,
    readme: Path | None = None,
    cases: Sequence[PaperCase] | None = None,
    only: Sequence[str] | None = None,
    gpu_memory: str = "kept",
    wider: dict[str, str] | None = None,
    jobs: int = 1,
    config_cap: int | None = None,
) -> Path:
    """Run the paper grid (or `cases`), writing the report after every case; returns its
    path. `cache` keeps profiles, and beside it whole-step evaluations and the Alpa ILP's
    answers (default: the committed `KEPT_CACHE` for the full grid, the user's cache folder for
    the quick one, so that a second run is warm). `only` keeps
    the cases whose label contains one of its patterns, in its order. `gpu_memory`:
    "compile" compiles every plan for the platform's GPU to judge its fit there (about a
    minute a plan at the paper's scale), "kept" shows what the store kept from such a run.
    `wider` (by row of `WIDER_SPACES`): "compile" also profiles that space of CFP's (rows
    "cfp_zero" and "cfp_zero_gpu" for ZeRO twins, say), "kept" (the default) shows its rows
    where the profile cache holds that whole space, "off" leaves it out.
    `jobs` runs that many cases at once, by as many worker processes (`paper_worker`), each
    keeping the step it traced last for that step's other cases: a warm case keeps one core
    busy, so a warm run on N cores takes about 1/N of the time.
    Cold, each process compiles with its own workers: more memory, no faster on 2 cores.
    The report is the same either way; rows keep the grid's order. `config_cap` is
    `analyze`'s for every CFP space (None: its default).
    After a run of the full grid's cases chosen by `only`, the cases left out are counted
    (`paper_pending`: a few seconds each) so the report can say what they would cost."""
    from explorer.errors import InputError

    if not (isinstance(jobs, int) and jobs >= 1):
        raise InputError(f"jobs: expected a whole number of processes >= 1, found {jobs!r}")
    grid = tuple(cases) if cases is not None else paper_cases(quick)
    if only is not None:
        grid = select_cases(grid, only)
    if cache is None:
        cache = DEFAULT_CACHE.expanduser() if quick else KEPT_CACHE
    run = PaperRun(quick, grid, out, cache, log, tuple(only) if only is not None else None)
    run.gpu_memory, run.wider, run.jobs = gpu_memory, dict(wider or {}), jobs
    run.config_cap = config_cap
    # after a run of the full grid's cases chosen by `only`, what the rest would cost
    left_out = () if cases is not None or quick else _left_out(run)
    if jobs == 1:
        _run_here(run, grid, readme)
        if left_out:
            _say_counting(run, left_out)
            _count_here(run, left_out)
    else:
        _run_in_processes(run, grid, left_out, readme)
    report = write_report(run, finished=True, readme=readme)
    minutes = (time.perf_counter() - run.started) / 60
    log(f"paper grid: {len(run.done)} of {len(grid)} cases in {minutes:.1f} min")
    return report


def _left_out(run: PaperRun) -> tuple[PaperCase, ...]:
    """The grid's cases `run` does not run: each one's programs are counted without
    compiling (a few seconds a case), after the cases run have added theirs."""
    return tuple(case for case in paper_cases(run.quick) if case not in run.cases)


def _say_counting(run: PaperRun, left_out: Sequence[PaperCase]) -> None:
    run.log(f"counting the programs of the {len(left_out)} cases not run")


@contextlib.contextmanager
def open_stores(run: PaperRun) -> Iterator[tuple[Any, Any, Any]]:
    """The stores kept beside `run.cache` (whole-step evaluations, ILP answers, XLA:GPU
    memory), open on `run` while the block runs; it is given the three."""
    from explorer.alpa import IlpAnswerStore
    from explorer.evaluation_store import EvaluationStore

    cache = run.cache
    with (
        EvaluationStore(cache.with_suffix(".evaluations.sqlite")) as store,
        IlpAnswerStore(cache.with_suffix(".alpa.sqlite")) as answers,
        EvaluationStore(cache.with_suffix(".gpu-memory.sqlite")) as gpu_memories,
    ):
        run.evaluations, run.ilp_answers, run.gpu_memories = store, answers, gpu_memories
        try:
            yield store, answers, gpu_memories
        finally:
            run.evaluations = run.ilp_answers = run.gpu_memories = None


def count_hits(run: PaperRun, stores: tuple[Any, Any, Any]) -> None:
    """What `open_stores`' stores have answered from what they kept, and what they were
    given to keep (what the run computed), so far, on `run`."""
    evaluations, ilp_answers, gpu_memories = stores
    run.evaluations_kept = evaluations.hits
    run.ilp_answers_kept = ilp_answers.hits
    run.gpu_memories_kept = gpu_memories.hits
    run.computed["whole steps compiled"] = evaluations.written
    run.computed["Alpa ILP answers solved"] = ilp_answers.written
    run.computed["XLA:GPU memory figures compiled"] = gpu_memories.written


def _run_here(run: PaperRun, grid: tuple[PaperCase, ...], readme: Path | None) -> None:
    with open_stores(run) as stores:
        for case in grid:
            run.log(f"== {case.label}")
            try:
                run_case(run, case)
            except Exception as err:
                run.failed(case.label, err)
            count_hits(run, stores)
            write_report(run, finished=False, readme=readme)  # a stopped run says so


def _count_here(run: PaperRun, left_out: Sequence[PaperCase]) -> None:
    """The cases `left_out` counted in this process (`paper_pending.count_pending`), those
    of one step one after another so that each step is traced once; `run.pending` keeps
    the grid's order."""
    from benchmarks.paper_pending import count_pending

    first: dict[tuple[Any, ...], int] = {}
    for case in left_out:
        first.setdefault(case.step_key, len(first))
    counted = {
        case: count_pending(case, run.cache, run.segment_cap(), run.steps)
        for case in sorted(left_out, key=lambda case: first[case.step_key])
    }
    run.pending += [counted[case] for case in left_out]


def _run_in_processes(
    run: PaperRun,
    grid: tuple[PaperCase, ...],
    left_out: Sequence[PaperCase],
    readme: Path | None,
) -> None:
    """`run.jobs` tasks at a time, by `paper_worker` processes that each keep the step they
    traced last for the next case of it: first the cases, each joining the run in the grid's
    order as it and those before it finish (the report is written after each: a stopped run
    says so), then the cases `left_out` are counted."""
    from benchmarks.paper_worker import CaseResult, Task, WorkerPool, WorkerSettings

    def joined(index: int, outcome: CaseResult | str) -> None:
        if isinstance(outcome, CaseResult):
            outcome.add_to(run)
        else:
            run.failed(grid[index].label, RuntimeError(outcome))
        write_report(run, finished=False, readme=readme)

    def counted(index: int, outcome: CaseResult | str) -> None:
        if isinstance(outcome, CaseResult):
            outcome.add_to(run)
        else:
            run.pending.append(PendingCase.of(left_out[index], error=outcome))

    with (
        tempfile.TemporaryDirectory(prefix="paper-workers-") as folder,
        WorkerPool(WorkerSettings.of(run), run.jobs, Path(folder)) as pool,
    ):
        pool.run(
            [Task(case) for case in grid],
            joined,
            started=lambda task: run.log(f"== {task.case.label}"),
        )
        if left_out:
            _say_counting(run, left_out)
            pool.run([Task(case, count=True) for case in left_out], counted)
