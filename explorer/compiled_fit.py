"""The fastest plan whose compiled whole step fits the memory budget, not only its prediction.

`Analysis.plan` answers by the predicted memory (paper Eq. 9 and its refinements), which is
within a few per cent of what XLA assigns the whole step. The plan it picks is the fastest the
budget admits, so it sits at the budget's edge, where an error of 1 % decides whether the step
fits at all: on the paper grid four such plans predicted at 40.0 GiB needed 40.2 to 41.1 GiB
compiled. Here candidates are compiled as the whole step (`evaluate`, the truth every
prediction is judged on) before one is offered.

The fastest predicted within the budget is compiled first; a plan with room to spare costs that
one compile (none where a store holds it). Where it is over, stepping down the frontier one plan
at a time does not serve: near the edge the frontier is dense (GPT-6.7B at batch 8 on 8
devices: 262 plans within 40 GiB, each step down saving about 50 MiB) and the predictions' error
there is nearly constant (0.42 to 0.43 GiB short over its 8 fastest). So the next candidate is
the fastest plan predicted within the budget less the shortfall just seen, and once one fits,
the frontier between it and the leanest plan found over is bisected for the fastest that fits,
assuming the compiled memory grows with the predicted along the frontier (as
`target_memory.fastest_plan_on_gpu` does for XLA:GPU's).
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

# Compiles one call may spend (a minute or two each for a paper-scale step). A search that runs
# out of them before any plan fits raises; one that runs out while bisecting offers the fastest
# plan found to fit, and says how many frontier plans between were not compiled.
DEFAULT_MAX_COMPILES = 8
# The words that open a fit's summary where faster plans were over, and the refusal where none
# compiled fits: what a report of many fits looks for
STEPPED_DOWN = "plans compiled to find one that fits"
NONE_FITS = "no plan compiled fits"


@dataclass(frozen=True, slots=True)
class CompiledTry:
    """One frontier plan compiled on the way: what was predicted and what the step needs."""

    selection: tuple[int, ...]  # the frontier point's option per segment instance
    predicted_time: float  # seconds per step
    predicted_memory: int  # bytes per device
    compiled_memory: int  # bytes per device, XLA's memory analysis of the whole step


@dataclass(frozen=True, slots=True)
class CompiledFit:
    """The fastest plan found whose compiled step fits `budget`, its truth, every plan
    compiled to find it (in the order compiled), and how many frontier plans faster than it
    were not compiled (between it and the leanest faster plan compiled over the budget; 0:
    each faster plan within the budget was compiled, or lies beyond one found over)."""

    plan: Plan
    truth: Evaluation
    budget: int
    tried: tuple[CompiledTry, ...]
    untried_between: int = 0

    def __post_init__(self) -> None:
        if self.truth.memory > self.budget:
            raise ValueError("a CompiledFit's plan fits its budget compiled")
        if not any(t.predicted_time == self.plan.time for t in self.tried):
            raise ValueError("a CompiledFit's plan is one it tried")
        faster = [t for t in self.tried if t.predicted_time < self.plan.time]
        if any(t.compiled_memory <= self.budget for t in faster):
            raise ValueError("a CompiledFit's plan is the fastest tried that fits")
        if self.untried_between < 0:
            raise ValueError("untried_between counts plans: >= 0")

    @property
    def selection(self) -> tuple[int, ...]:
        """The frontier selection of the plan offered (`FrontierPoint.selection`)."""
        return next(t.selection for t in self.tried if t.predicted_time == self.plan.time)

    @property
    def rejected(self) -> tuple[tuple[int, ...], ...]:
        """The selections of the faster plans whose compiled step was over the budget."""
        return tuple(t.selection for t in self.tried if t.compiled_memory > self.budget)

    def summary(self) -> str:
        """One line: how many plans were compiled, and why the faster ones were passed over."""
        if not self.rejected:
            return (
                f"the fastest plan within {_size(self.budget)} fits it compiled "
                f"({_size(self.truth.memory)})"
            )
        over = sorted(
            (t for t in self.tried if t.compiled_memory > self.budget),
            key=lambda t: t.predicted_time,
        )
        shown = "; ".join(
            f"{_ms(t.predicted_time)} predicted in {_size(t.predicted_memory)}, "
            f"compiled {_size(t.compiled_memory)}"
            for t in over
        )
        between = (
            f"; {self.untried_between} frontier plans between it and the leanest of those not "
            "compiled"
            if self.untried_between
            else ""
        )
        return (
            f"{len(self.tried)} {STEPPED_DOWN} {_size(self.budget)} "
            f"({_size(self.truth.memory)} compiled): the faster ones tried need more "
            f"({shown}){between}"
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
    per device (default: the platform's device memory); the search the module docstring
    describes, at most `max_compiles` compiles. `store` keeps the evaluations (as for
    `evaluate`): a plan compiled before is read back.

    Raises `NoPlanFitsError` before compiling anything when no plan is predicted within the
    budget, and when no plan compiled fits, naming what each needed."""
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
    points = frontier.points  # by increasing memory and decreasing time
    memories = [p.memory for p in points]
    tried: dict[int, tuple[Plan, Evaluation]] = {}  # by frontier index, in the order compiled

    def fits(index: int) -> bool:
        plan = analysis.plan_of(points[index].selection, source="cfp")
        tried[index] = (plan, evaluate(plan, step, *args, store=store))
        return tried[index][1].memory <= budget

    def report() -> tuple[CompiledTry, ...]:
        return tuple(
            CompiledTry(points[i].selection, plan.time, plan.memory, truth.memory)
            for i, (plan, truth) in tried.items()
        )

    over, fitting = None, bisect.bisect_right(memories, budget) - 1
    while not fits(fitting):  # jump down by the shortfall seen, until a plan fits
        over = fitting
        if over == 0 or len(tried) == max_compiles:  # `over` leaner plans not compiled
            raise NoPlanFitsError(_none_fits(budget, report(), leaner=over))
        shortfall = tried[over][1].memory - points[over].memory  # > 0: over, predicted within
        below = bisect.bisect_right(memories, budget - shortfall) - 1
        fitting = max(0, min(over - 1, below))  # the leanest at least, if the jump passes it
    while over is not None and over - fitting > 1 and len(tried) < max_compiles:
        middle = (fitting + over) // 2  # points[fitting] fits, points[over] does not
        if fits(middle):
            fitting = middle
        else:
            over = middle
    plan, truth = tried[fitting]
    between = 0 if over is None else over - fitting - 1
    return CompiledFit(plan, truth, budget, report(), between)


def _none_fits(budget: int, tried: tuple[CompiledTry, ...], *, leaner: int) -> str:
    over = "; ".join(
        f"{_ms(t.predicted_time)} predicted in {_size(t.predicted_memory)}, "
        f"compiled {_size(t.compiled_memory)}"
        for t in tried
    )
    left = "no leaner plan is left" if leaner <= 0 else f"{leaner} leaner plans not compiled"
    return (
        f"{NONE_FITS} {_size(budget)} per device: {len(tried)} compiled ({over}); "
        f"{left}. Lower the budget given to the solver by the predictions' shortfall, raise "
        "max_compiles, or add devices."
    )


def _size(amount: float) -> str:
    """Bytes to four digits: at the budget's edge the third decides (40.0 against 40.2 GiB)."""
    return format_bytes(amount, digits=4)


def _ms(seconds: float) -> str:
    """Milliseconds per step, whole from one second up (13177 ms, not 1.318e+04)."""
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if ms >= 1000 else f"{ms:.4g} ms"
