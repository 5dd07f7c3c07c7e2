"""The Alpa-style ILP: formulated over the problem's groups and solved by HiGHS.

**ILP** (step 3 of the method in `explorer.alpa`). One-hot choice variables per group of ops
sharing a choice, and per edge between two groups one variable per pair of (producer layout
class, consumer layout class) whose margins equal the two groups' choices: the quadratic edge
term linearised exactly. With a memory budget, Alpa's liveness constraint: at every program
point where the live set is maximal, the per-device bytes of the values alive there stay
within it (written as a running sum, so each value enters two rows). Solved by HiGHS
(`scipy.optimize.milp`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from explorer.alpa.comm import _platform, comm_model
from explorer.alpa.ops import OpModel
from explorer.alpa.problem import AlpaProblem, _Builder, _leanest_peak
from explorer.ir import Graph
from explorer.mesh import mesh_spec

if TYPE_CHECKING:
    from explorer.platforms import Platform


def _classes(matrix: Any) -> tuple[Any, Any, Any]:
    """Strategies grouped by equal costs: (class of each row, class of each column, the
    matrix between classes). Two strategies that leave (or want) the same layout share a
    class, so an edge needs one variable per pair of distinct layouts, not of strategies."""
    rows, row_of = np.unique(matrix, axis=0, return_inverse=True)
    small, col_of = np.unique(rows, axis=1, return_inverse=True)
    return row_of.ravel(), col_of.ravel(), small


@dataclass
class _Ilp:
    c: Any
    integrality: Any
    rows: list[int]
    cols: list[int]
    vals: list[float]
    lower: list[float]
    upper: list[float]
    var_of_group: dict[int, int]  # first variable of each free group
    memory_rows: int = 0
    var_upper: Any = None  # upper bound of each variable (binary and edge ones: 1)

    def add_row(self, entries: Iterable[tuple[int, float]], low: float, high: float) -> int:
        row = len(self.lower)
        for col, val in entries:
            self.rows.append(row)
            self.cols.append(col)
            self.vals.append(val)
        self.lower.append(low)
        self.upper.append(high)
        return row


def _formulate(builder: _Builder, budget: float | None, minimise_memory: bool = False) -> _Ilp:
    sizes = builder.sizes
    free = [g for g, k in enumerate(sizes) if k > 1]
    var_of_group: dict[int, int] = {}
    costs: list[float] = []
    for g in free:
        var_of_group[g] = len(costs)
        costs.extend(builder.node_cost[g].tolist())
    integer = len(costs)
    ilp = _Ilp(np.array([]), np.array([]), [], [], [], [], [], var_of_group)
    for g in free:  # one-hot choice per group
        start = var_of_group[g]
        ilp.add_row(((start + k, 1.0) for k in range(sizes[g])), 1.0, 1.0)
    for (g, h), matrix in builder.edges.items():
        row_of, col_of, small = _classes(matrix)
        if small.shape[1] == 1:  # the cost depends on g's choice alone
            costs_g = small[row_of, 0]
            for k, value in enumerate(costs_g):
                costs[var_of_group[g] + k] += float(value)
            continue
        if small.shape[0] == 1:
            for k, value in enumerate(small[0, col_of]):
                costs[var_of_group[h] + k] += float(value)
            continue
        # e[i, j] = (g's choice in row class i) * (h's choice in column class j), exactly:
        # its margins are the two one-hot sums of the classes
        first = len(costs)
        n_rows, n_cols = small.shape
        costs.extend(small.ravel().tolist())
        for i in range(n_rows):
            members = [var_of_group[g] + k for k in np.flatnonzero(row_of == i)]
            margin = [(first + i * n_cols + j, 1.0) for j in range(n_cols)]
            ilp.add_row(margin + [(m, -1.0) for m in members], 0.0, 0.0)
        for j in range(n_cols - 1):  # the last column's margin follows from the others
            members = [var_of_group[h] + k for k in np.flatnonzero(col_of == j)]
            margin = [(first + i * n_cols + j, 1.0) for i in range(n_rows)]
            ilp.add_row(margin + [(m, -1.0) for m in members], 0.0, 0.0)
    upper = [1.0] * len(costs)
    if budget is not None or minimise_memory:
        # live bytes at point t: P[t] = P[t-1] + what became live - what died in between
        deltas = builder.live_deltas()
        # bytes run to 1e9 and more: rows are in units of the budget (or of the leanest
        # choice's peak, an upper bound of the least) so HiGHS's tolerances stay relative
        scale = float(budget) if budget is not None else float(_leanest_peak(builder))
        scale = max(scale, 1.0)
        first_point = len(costs)
        costs += [0.0] * len(deltas)
        upper += [budget / scale if budget is not None else np.inf] * len(deltas)
        for t, delta in enumerate(deltas):
            fixed = 0.0
            entries: list[tuple[int, float]] = [(first_point + t, 1.0)]
            if t:
                entries.append((first_point + t - 1, -1.0))
            for g, values in delta.items():
                if sizes[g] == 1:
                    fixed += float(values[0]) / scale
                else:
                    start = var_of_group[g]
                    entries += [(start + k, -float(v) / scale) for k, v in enumerate(values) if v]
            ilp.add_row(entries, fixed, fixed)
            ilp.memory_rows += 1
        if minimise_memory:  # minimise the largest P[t]
            peak = len(costs)
            costs = [0.0] * len(costs) + [1.0]
            upper.append(np.inf)
            for t in range(len(deltas)):
                ilp.add_row([(first_point + t, 1.0), (peak, -1.0)], -np.inf, 0.0)
    integrality = np.zeros(len(costs))
    integrality[:integer] = 1
    ilp.c = np.array(costs)
    ilp.integrality = integrality
    ilp.var_upper = np.array(upper)
    return ilp


def _run_highs(ilp: _Ilp, time_limit: float) -> Any:
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_array

    n = len(ilp.c)
    matrix = csr_array((ilp.vals, (ilp.rows, ilp.cols)), shape=(len(ilp.lower), n))
    upper = ilp.var_upper if ilp.var_upper is not None else np.ones(n)
    scale = float(np.abs(ilp.c).max()) if n else 0.0
    # HiGHS's tolerances are absolute: costs of microseconds would all look like zero
    c = ilp.c * (1e3 / scale) if scale > 0 else ilp.c
    constraints = [LinearConstraint(matrix, ilp.lower, ilp.upper)] if ilp.lower else []
    return milp(
        c,
        integrality=ilp.integrality,
        bounds=Bounds(np.zeros(n), upper),
        constraints=constraints,
        # a tight gap: strategies often differ by one collective's latency in thousands
        options={"time_limit": max(time_limit, 1e-3), "disp": False, "mip_rel_gap": 1e-6},
    )


def build_problem(
    graph: Graph,
    mesh: Any,
    platform: Platform | None = None,
    *,
    memory_budget: float | None = None,
    defaults: bool = False,
) -> AlpaProblem:
    """The ILP for `graph` on `mesh`, priced on `platform` (or Alpa's defaults), not solved."""
    spec = mesh_spec(mesh)
    start = time.perf_counter()
    model = OpModel(graph, spec, comm_model(spec, _platform(platform, defaults), defaults=defaults))
    builder = _Builder(graph, model)
    ilp = _formulate(builder, memory_budget)
    return AlpaProblem(
        mesh=spec,
        units=model.comm.units,
        nodes=len(builder.nodes),
        groups=len(builder.sizes),
        free_groups=len(ilp.var_of_group),
        edges=len(builder.edges),
        variables=len(ilp.c),
        integer_variables=int(ilp.integrality.sum()),
        constraints=len(ilp.lower),
        memory_constraints=ilp.memory_rows,
        nonzeros=len(ilp.vals),
        build_seconds=time.perf_counter() - start,
        data=(builder, ilp),
    )
