"""Solving the Alpa-style ILP: `solve_alpa`, and its answer as an `AlpaSolution`.

HiGHS's one-hot choices are decoded into a strategy per group, hence a layout for every value
and what every contraction reads. When HiGHS stops at its time limit the best solution found
is kept (with an `AlpaTimeLimitWarning`), or the greedy start when it found none; when no plan
fits the memory budget, the least peak memory any plan needs is found for the error.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from explorer.alpa.ilp import _formulate, _Ilp, _run_highs, build_problem
from explorer.alpa.problem import AlpaProblem, _Builder, _leanest_peak
from explorer.errors import AlpaBudgetError, AlpaError, AlpaTimeLimitWarning
from explorer.ir import DimAxes, Graph, ShardingAssignment
from explorer.layouts import layout_assignment


@dataclass(frozen=True, slots=True)
class AlpaSolution:
    """The ILP's plan: a layout for every value, and what it cost to find."""

    objective: float  # the ILP's communication cost, in `units`
    units: str  # "seconds" (platform) or "alpa" (Alpa's default alpha/beta)
    status: str  # "optimal", "time limit", "time limit (greedy start)"
    solve_seconds: float
    variables: int
    integer_variables: int
    constraints: int
    layouts: tuple[tuple[int, DimAxes], ...]  # every numeric value of rank >= 1, inputs too
    operands: tuple[tuple[int, int, DimAxes], ...]  # what each contraction reads
    strategies: tuple[tuple[int, str], ...]  # contraction op id -> strategy name
    memory: int  # peak per-device bytes of live values under the plan (ILP memory model)
    memory_budget: float | None
    problem: AlpaProblem

    def __post_init__(self) -> None:
        if self.memory_budget is not None and self.memory > self.memory_budget * (1 + 1e-6):
            raise ValueError(f"plan memory {self.memory} exceeds its budget {self.memory_budget}")

    def layout_map(self) -> dict[int, DimAxes]:
        return dict(self.layouts)

    def strategy_of(self, op: int) -> str | None:
        return dict(self.strategies).get(op)

    def assignment(self, graph: Graph) -> ShardingAssignment:
        operands = {(o, p): d for o, p, d in self.operands}
        return layout_assignment(graph, self.problem.mesh, self.layout_map(), operands)

    def summary(self) -> str:
        p = self.problem
        return (
            f"Alpa ILP on mesh {p.mesh}: {p.variables} variables ({p.integer_variables} "
            f"binary), {p.constraints} constraints, {p.nonzeros} nonzeros; {self.status} in "
            f"{self.solve_seconds:.2f} s (built in {p.build_seconds:.2f} s); objective "
            f"{self.objective:.6g} {self.units}; peak {self.memory / 2**20:.2f} MiB/device"
        )


def solve_alpa(
    graph: Graph,
    mesh: Any,
    platform: Any,
    *,
    memory_budget: float | None = None,
    time_limit: float = 60.0,
    defaults: bool = False,
) -> AlpaSolution:
    """Solve the Alpa-style ILP for `graph` on `mesh`: a layout for every value.

    `platform` (a Platform or preset name) gives alpha and beta per mesh axis, so the
    objective is in seconds; `defaults=True` uses Alpa's `mesh_alpha=(1, 1)`,
    `mesh_beta=(1, 0.1)` instead (abstract units; `platform` may then be None).
    `memory_budget` (bytes per device) adds the liveness memory constraints. When HiGHS hits
    `time_limit` seconds, the best solution found is returned with an `AlpaTimeLimitWarning`.
    """
    problem = build_problem(graph, mesh, platform, memory_budget=memory_budget, defaults=defaults)
    builder, ilp = problem.data
    start = time.perf_counter()
    result = _run_highs(ilp, time_limit)
    seconds = time.perf_counter() - start
    if result.x is None and result.status != 1:
        if memory_budget is not None and result.status == 2:
            least = _least_memory(builder, time_limit)
            raise AlpaBudgetError(
                f"expected a plan within the memory budget of {memory_budget:.0f} bytes "
                f"({memory_budget / 2**20:.2f} MiB) per device on mesh {problem.mesh}; found "
                f"none: the least peak memory found is {least} bytes ({least / 2**20:.2f} MiB) "
                "per device. Raise memory_budget to at least that, or use a larger mesh."
            )
        raise AlpaError(
            f"HiGHS found no solution of the Alpa ILP on mesh {problem.mesh}: {result.message}"
        )
    if result.x is not None:
        choice = _decode(builder, ilp, result.x)
        status = "optimal" if result.status == 0 else "time limit"
    else:  # time limit before HiGHS had any solution: start from the greedy one
        greedy = _greedy(builder, memory_budget)
        status = "time limit (greedy start)"
        if greedy is None:
            raise AlpaError(
                f"HiGHS found no feasible solution within time_limit={time_limit} s and the "
                f"greedy start exceeds the memory budget of {memory_budget} bytes; raise "
                "time_limit"
            )
        choice = greedy
    if result.status == 1:
        gap = getattr(result, "mip_gap", None)
        warnings.warn(
            f"Alpa ILP: HiGHS hit its time limit of {time_limit} s before proving optimality; "
            + (
                f"returning the best feasible solution found (relative gap {gap:.3g}). "
                if result.x is not None and gap is not None
                else "it had found no solution, returning the greedy start (each group at its "
                "cheapest own strategy). "
            )
            + "Raise time_limit for an optimal plan.",
            AlpaTimeLimitWarning,
            stacklevel=2,
        )
    return _solution(
        builder, problem, choice=choice, status=status, seconds=seconds, budget=memory_budget
    )


def _decode(builder: _Builder, ilp: _Ilp, x: Any) -> list[int]:
    choice = [0] * len(builder.sizes)
    for g, start in ilp.var_of_group.items():
        choice[g] = int(np.argmax(x[start : start + builder.sizes[g]]))
    return choice


def _greedy(builder: _Builder, budget: float | None) -> list[int] | None:
    choice = [int(np.argmin(c)) for c in builder.node_cost]
    if budget is None or builder.peak(choice) <= budget:
        return choice
    return None


def _least_memory(builder: _Builder, time_limit: float) -> int:
    ilp = _formulate(builder, None, minimise_memory=True)
    result = _run_highs(ilp, time_limit)
    if result.x is not None:
        return builder.peak(_decode(builder, ilp, result.x))
    return _leanest_peak(builder)  # out of time: an upper bound of the least


def _solution(
    builder: _Builder,
    problem: AlpaProblem,
    *,
    choice: list[int],
    status: str,
    seconds: float,
    budget: float | None,
) -> AlpaSolution:
    graph = builder.graph
    layouts: dict[int, DimAxes] = {}
    operands: list[tuple[int, int, DimAxes]] = []
    names: list[tuple[int, str]] = []
    for node in builder.nodes:
        strategy = node.strategies[choice[node.group]]
        for vid, layout in zip(node.outputs, strategy.outputs, strict=True):
            if builder.model.tracked[vid] and graph.values[vid].type.rank:
                layouts[vid] = layout
        if node.op is not None and builder.model.kind(graph.ops[node.op])[0] == "dot":
            names.append((node.op, strategy.name))
            for position, wanted in enumerate(strategy.operands):
                if wanted is not None:
                    operands.append((node.op, position, wanted))
    return AlpaSolution(
        objective=builder.objective(choice),
        units=problem.units,
        status=status,
        solve_seconds=seconds,
        variables=problem.variables,
        integer_variables=problem.integer_variables,
        constraints=problem.constraints,
        layouts=tuple(sorted(layouts.items())),
        operands=tuple(operands),
        strategies=tuple(names),
        memory=builder.peak(choice),
        memory_budget=budget,
        problem=problem,
    )
