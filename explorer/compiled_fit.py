"""The fastest plan whose compiled whole step fits the memory budget, not only its prediction.

`Analysis.plan` answers by the predicted memory (paper Eq. 9 and its refinements), which is
within a few per cent of what XLA assigns the whole step. The plan it picks is the fastest the
budget admits, so it sits at the budget's edge, where an error of 1 % decides whether the step
fits at all: on the paper grid four such plans predicted at 40.0 GiB needed 40.2 to 41.1 GiB
compiled. Here each candidate is compiled as the whole step (`evaluate`, the truth every
prediction is judged on) before it is offered, fastest first along the frontier, until one fits.
Plans with room to spare cost one compile (read back from a store, none); only plans at the
edge cost more.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from explorer.analysis import Analysis, SegmentedStep
from explorer.errors import InputError, NoPlanFitsError
from explorer.evaluation import Evaluation, evaluate
from explorer.evaluation_store import EvaluationStore
from explorer.plan_types import Plan
from explorer.units import BytesLike, format_bytes, parse_bytes

# Compiles one call may spend stepping down the frontier. The predictions are within 3 % on
# the paper grid; a budget that needs more steps than this is one the predictions do not serve,
# and the error says so rather than compiling the whole frontier.
DEFAULT_MAX_COMPILES = 8


@dataclass(frozen=True, slots=True)
class CompiledTry:
    """One frontier plan compiled on the way: what was predicted and what the step needs."""

    selection: tuple[int, ...]  # the frontier point's option per segment instance
    predicted_time: float  # seconds per step
    predicted_memory: int  # bytes per device
    compiled_memory: int  # bytes per device, XLA's memory analysis of the whole step


@dataclass(frozen=True, slots=True)
class CompiledFit:
    """The fastest frontier plan whose compiled step fits `budget`, its truth, and every plan
    compiled to find it (fastest first; all but the last were over the budget)."""

    plan: Plan
    truth: Evaluation
    budget: int
    tried: tuple[CompiledTry, ...]

    def __post_init__(self) -> None:
        if not self.tried or self.tried[-1].compiled_memory > self.budget:
            raise ValueError("a CompiledFit ends with the plan that fits")
        if any(t.compiled_memory <= self.budget for t in self.tried[:-1]):
            raise ValueError("a CompiledFit stops at the first plan that fits")

    @property
    def rejected(self) -> tuple[tuple[int, ...], ...]:
        """The selections of the faster plans whose compiled step did not fit."""
        return tuple(t.selection for t in self.tried[:-1])

    def summary(self) -> str:
        """One line: how many plans were compiled, and why the faster ones were passed over."""
        if len(self.tried) == 1:
            return (
                f"the fastest plan within {_size(self.budget)} fits it compiled "
                f"({_size(self.truth.memory)})"
            )
        over = "; ".join(
            f"{_size(t.predicted_memory)} predicted, {_size(t.compiled_memory)} compiled"
            for t in self.tried[:-1]
        )
        return (
            f"{len(self.tried)} plans compiled to find one that fits {_size(self.budget)}: "
            f"the faster ones need more ({over})"
        )


def fastest_plan_that_fits(
    analysis: Analysis,
    step: Callable[..., Any],
    *args: Any,
    memory_budget: BytesLike | None = None,
    pins: Mapping[Any, Any] | None = None,
    uniform: bool | None = None,
    store: EvaluationStore | None = None,
    max_compiles: int = DEFAULT_MAX_COMPILES,
) -> CompiledFit:
    """The fastest plan of `analysis`'s frontier (under `pins` and `uniform`, as for
    `Analysis.plan`) whose whole step, compiled under it, needs at most `memory_budget` bytes
    per device (default: the platform's device memory).

    The plans are compiled in the frontier's order, fastest first from the fastest predicted
    within the budget, one at a time, so no faster plan was passed over unless its compiled
    step was over the budget. `store` keeps the evaluations (as for `evaluate`): a plan
    compiled before is read back. Raises `NoPlanFitsError` before compiling anything when no
    plan is predicted within the budget, and after `max_compiles` compiles none of which fit,
    naming what each needed."""
    if not isinstance(analysis, SegmentedStep):  # one without profiles says so below
        raise InputError(
            f"fastest_plan_that_fits: expected an Analysis (from explorer.analyze), found "
            f"{type(analysis).__name__}"
        )
    if isinstance(max_compiles, bool) or not isinstance(max_compiles, int) or max_compiles < 1:
        raise InputError(
            f"fastest_plan_that_fits: max_compiles: expected a whole number >= 1, found "
            f"{max_compiles!r}"
        )
    budget = int(
        analysis.platform.device.memory_bytes
        if memory_budget is None
        else parse_bytes(memory_budget, "memory_budget")
    )
    frontier = analysis.frontier_for(pins, uniform)
    frontier.query(budget)  # NoPlanFitsError before any compile: nothing predicted within it
    index = bisect.bisect_right([p.memory for p in frontier.points], budget) - 1
    tried: list[CompiledTry] = []
    while index >= 0 and len(tried) < max_compiles:
        point = frontier.points[index]  # by increasing memory and decreasing time
        plan = analysis.plan_of(point.selection, source="cfp")
        truth = evaluate(plan, step, *args, store=store)
        tried.append(CompiledTry(point.selection, plan.time, plan.memory, truth.memory))
        if truth.memory <= budget:
            return CompiledFit(plan, truth, budget, tuple(tried))
        index -= 1
    over = "; ".join(
        f"{t.predicted_time * 1e3:.4g} ms predicted in {_size(t.predicted_memory)}, "
        f"compiled {_size(t.compiled_memory)}"
        for t in tried
    )
    left = "no leaner plan is left" if index < 0 else f"{index + 1} leaner plans not compiled"
    raise NoPlanFitsError(
        f"no plan compiled fits {_size(budget)} per device: {len(tried)} compiled, "
        f"fastest first ({over}); {left}. Lower the budget given to the solver by the "
        "predictions' shortfall, raise max_compiles, or add devices."
    )


def _size(amount: float) -> str:
    """Bytes to four digits: at the budget's edge the third decides (40.0 against 40.2 GiB)."""
    return format_bytes(amount, digits=4)
