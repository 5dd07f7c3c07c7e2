"""The fastest plan over several spaces CFP searched for one step.

A wider space (`whole_mesh`, `batch_outer`, `shard_parameters`) offers every block the
paper's strategies and more (the batch-inner space swaps the paper's axes instead), but it
also cuts the step into its own segments, and each plan is priced, and applied, with its own
space's cut. So a wider space's plans are not a superset of
the paper's as they run: a whole-mesh plan that keeps every paper strategy may run slower than
the paper's own plan, and the wider space's fastest plan may be slower than the paper's.
Searching several spaces and keeping the plan predicted fastest is what a user comparing them
would do; `fastest_plan` does it, by prediction alone, and `fastest_fit_on_gpu` does it among
the plans that fit the platform's GPU by XLA:GPU's memory.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from explorer.analysis import Analysis
from explorer.errors import InputError, NoPlanFitsError
from explorer.evaluation_store import EvaluationStore
from explorer.plan_build import model_fingerprint
from explorer.plan_types import Plan
from explorer.target_memory import GpuFit, fastest_plan_on_gpu
from explorer.units import BytesLike, parse_bytes


def fastest_plan(analyses: Sequence[Analysis], memory_budget: BytesLike | None = None) -> Plan:
    """The plan predicted fastest within `memory_budget` bytes per device (see
    `Analysis.plan`) over `analyses`: analyses of one step on one mesh and platform, each of
    its own space. Equal predictions keep the earlier analysis's plan. Where no space has a
    plan within the budget, `NoPlanFitsError` names the leanest over every space."""
    budget = None if memory_budget is None else parse_bytes(memory_budget, "memory_budget")
    return fastest_of(analyses, plans_by_space(analyses, budget), budget)


def plans_by_space(analyses: Sequence[Analysis], budget: float | None) -> list[Plan | None]:
    """Each analysis's fastest plan within `budget` bytes per device, None where it has none;
    the analyses checked to be of one step on one mesh and platform before any is solved."""
    _check_same_step(analyses)
    plans: list[Plan | None] = []
    for analysis in analyses:
        try:
            plans.append(analysis.plan(memory_budget=budget))
        except NoPlanFitsError:
            plans.append(None)
    return plans


def fastest_of(
    analyses: Sequence[Analysis], plans: Sequence[Plan | None], budget: float | None
) -> Plan:
    """The fastest predicted of `plans_by_space(analyses, budget)`, the earlier on a tie."""
    found = [plan for plan in plans if plan is not None]
    if not found:
        assert budget is not None  # without a budget every space has its fastest plan
        least = min(a.frontier.min_memory for a in analyses)
        raise NoPlanFitsError(
            f"no plan of the {len(analyses)} spaces fits a memory budget of "
            f"{budget / 2**30:.2f} GiB per device: the smallest plan of any needs "
            f"{least / 2**30:.2f} GiB ({least} bytes). Raise the budget, use more devices, or "
            "add a mesh axis."
        )
    # min keeps the first of equals: the order the caller gave the spaces in
    return min(found, key=lambda plan: plan.predicted.time)


def fastest_fit_on_gpu(
    analyses: Sequence[Analysis],
    step: Callable[..., Any],
    *args: Any,
    memory_budget: BytesLike | None = None,
    store: EvaluationStore | None = None,
) -> GpuFit:
    """`fastest_plan` judged on the platform's GPU: each space's fastest plan that fits
    `memory_budget` (default: the device's memory) by XLA:GPU's memory (`fastest_plan_on_gpu`),
    and of those the one predicted fastest, the earlier space's on a tie. Where no space has
    one, `NoPlanFitsError` says what each space's leanest plan needs there."""
    return fastest_fit_of(
        fits_on_gpu_by_space(analyses, step, *args, memory_budget=memory_budget, store=store)
    )


def fits_on_gpu_by_space(
    analyses: Sequence[Analysis],
    step: Callable[..., Any],
    *args: Any,
    memory_budget: BytesLike | None = None,
    store: EvaluationStore | None = None,
) -> list[GpuFit | NoPlanFitsError]:
    """Each analysis's `fastest_plan_on_gpu`, or the error saying why it has none; the
    analyses checked to be of one step on one mesh and platform before anything is compiled.
    Spaces often share plans (a 1-D mesh's whole-mesh space is the paper's): without a
    `store`, a scratch one for the call compiles each program once."""
    _check_same_step(analyses)
    if store is None:
        with (
            tempfile.TemporaryDirectory() as folder,
            EvaluationStore(Path(folder) / "gpu-memory.sqlite") as scratch,
        ):
            return fits_on_gpu_by_space(
                analyses, step, *args, memory_budget=memory_budget, store=scratch
            )
    fits: list[GpuFit | NoPlanFitsError] = []
    for analysis in analyses:
        try:
            fits.append(
                fastest_plan_on_gpu(analysis, step, *args, memory_budget=memory_budget, store=store)
            )
        except NoPlanFitsError as none_fits:
            fits.append(none_fits)
    return fits


def fastest_fit_of(fits: Sequence[GpuFit | NoPlanFitsError]) -> GpuFit:
    """The fit of `fits_on_gpu_by_space` whose plan is predicted fastest, the earlier on a tie."""
    found = [fit for fit in fits if isinstance(fit, GpuFit)]
    if not found:
        why = "; ".join(f"space {n}: {err}" for n, err in enumerate(fits, start=1))
        raise NoPlanFitsError(f"no plan of the {len(fits)} spaces fits the GPU. {why}")
    return min(found, key=lambda fit: fit.plan.predicted.time)


def _check_same_step(analyses: Sequence[Analysis]) -> None:
    """Refuse, before solving anything, what is not several analyses of one step on one mesh
    and platform: their plans would not be one user's choice."""
    if isinstance(analyses, Analysis) or not isinstance(analyses, Sequence) or not analyses:
        raise InputError(
            "fastest_plan: expected a non-empty sequence of Analysis (one per space, from "
            f"analyze(...)), found {type(analyses).__name__} {analyses!r}"[:300]
        )
    for position, analysis in enumerate(analyses):
        if not isinstance(analysis, Analysis):
            raise InputError(
                f"fastest_plan: analyses[{position}]: expected an Analysis (analyze(...) with "
                f"profile=True), found {type(analysis).__name__}"
            )
    first = analyses[0]
    step = model_fingerprint(first.graph)
    for position, analysis in enumerate(analyses[1:], start=1):
        # spaces analysed from one trace (`analyze(traced=...)`) share the graph: no hashing
        mine_step = step if analysis.graph is first.graph else model_fingerprint(analysis.graph)
        for what, mine, theirs in (
            ("mesh", analysis.mesh, first.mesh),
            ("platform", analysis.platform.name, first.platform.name),
            ("backend", analysis.backend, first.backend),
            ("traced step (model fingerprint)", mine_step, step),
        ):
            if mine != theirs:
                raise InputError(
                    f"fastest_plan: analyses[{position}] is of another {what} than "
                    f"analyses[0]: expected {theirs}, found {mine}; compare spaces of one step "
                    "on one mesh and platform"
                )
