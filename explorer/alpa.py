"""Alpa-style ILP baseline: per-op sharding strategies priced by communication volume.

This rebuilds the intra-operator pass of Alpa (Zheng et al., OSDI'22, Sec. 4) over the traced
Graph, without ParallelBlocks:

1. **Strategies.** A contraction (`dot_general`) may split its batch (E), left free (M), right
   free (N) or contracted (K) dims over each mesh axis; every axis of size > 1 is used, since
   Alpa prices recomputing a heavy op on a replicated axis as infinite. A K split leaves
   partial sums, reduced by an all-reduce, or by a reduce-scatter onto one output dim. A step
   input (parameter, optimizer state, data) may take any even layout, replicated included.
   Every other op *follows* its deepest operand (longest path from the inputs, as Alpa does),
   so it shares that operand's choice variable: the ILP stays the size of the contractions and
   inputs. A split the op cannot carry (a reshape merging a split minor dim, a sort along it)
   is gathered first; a reduction over a split dim all-reduces its result. Ops the affine
   analysis does not know stay replicated.
2. **Costs.** Communication only (compute is ignored, as in Alpa), per mesh axis, from
   alpha-beta formulas (`all_reduce_cost` ...). Node costs are the collectives an op's own
   strategy implies; edge costs are the resharding from the layout a producer leaves a value
   in to the layout its consumer wants (all-gather an axis the consumer does not split,
   all-to-all an axis it splits on another dim, free slicing otherwise). Alpha and beta come
   from the platform file (latency and 1 / bus bandwidth of the level an axis spans), or
   Alpa's defaults `mesh_alpha=(1, 1)`, `mesh_beta=(1, 0.1)` (abstract units).
3. **ILP.** One-hot choice variables per group of ops sharing a choice, and per edge between
   two groups one variable per pair of (producer layout class, consumer layout class) whose
   margins equal the two groups' choices: the quadratic edge term linearised exactly. With a
   memory budget, Alpa's liveness constraint: at every program point where the live set is
   maximal, the per-device bytes of the values alive there stay within it (written as a
   running sum, so each value enters two rows). Solved by HiGHS (`scipy.optimize.milp`).
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from explorer import affine
from explorer.errors import ExplorerError
from explorer.ir import (
    DimAxes,
    Graph,
    OpNode,
    ShardingAssignment,
    TensorType,
    ValueKind,
    path_suffix,
)
from explorer.layouts import configuration_name, instance_dependencies, loop_twins, twin_config
from explorer.mesh import MeshSpec, mesh_spec
from explorer.space import segment_input_layouts, shardings

if TYPE_CHECKING:
    import pandas as pd

    from explorer.platforms import Platform

Kind = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all"]
KINDS: tuple[Kind, ...] = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")

# Alpa's defaults for a logical mesh (inter-host axis, intra-host axis): see
# alpa/device_mesh.py `get_logical_mesh(mesh_alpha=[1, 1], mesh_beta=[1, 0.1])`.
ALPA_MESH_ALPHA = (1.0, 1.0)
ALPA_MESH_BETA = (1.0, 0.1)

# Reductions whose split operand leaves partial results an all-reduce completes.
PARTIAL_REDUCTIONS = frozenset(
    {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or"}
)


class AlpaError(ExplorerError):
    """The Alpa-style ILP found no plan within its limits."""


class AlpaBudgetError(AlpaError):
    """No assignment of strategies fits the per-device memory budget."""


class AlpaTimeLimitWarning(UserWarning):
    """HiGHS stopped at its time limit: the plan is the best found, not proven optimal."""


# -- alpha-beta formulas -------------------------------------------------------------------------


def all_reduce_cost(alpha: float, beta: float, n: int, nbytes: float) -> float:
    """`alpha + 2 beta (n-1)/n bytes` (ring all-reduce of a `nbytes` buffer over n devices)."""
    return 0.0 if n <= 1 else alpha + 2 * beta * (n - 1) / n * nbytes


def all_gather_cost(alpha: float, beta: float, n: int, nbytes: float) -> float:
    """`alpha + beta (n-1)/n bytes`, `nbytes` the gathered result."""
    return 0.0 if n <= 1 else alpha + beta * (n - 1) / n * nbytes


def reduce_scatter_cost(alpha: float, beta: float, n: int, nbytes: float) -> float:
    """`alpha + beta (n-1)/n bytes`, `nbytes` the buffer before scattering."""
    return 0.0 if n <= 1 else alpha + beta * (n - 1) / n * nbytes


def all_to_all_cost(alpha: float, beta: float, n: int, nbytes: float) -> float:
    """`alpha + beta (n-1)/n^2 bytes (n/2)`: Alpa's all-to-all with its penalty factor n/2."""
    return 0.0 if n <= 1 else alpha + beta * (n - 1) / n**2 * nbytes * (n / 2)


_FORMULAS = {
    "all-reduce": all_reduce_cost,
    "all-gather": all_gather_cost,
    "reduce-scatter": reduce_scatter_cost,
    "all-to-all": all_to_all_cost,
}


@dataclass(frozen=True, slots=True)
class AxisComm:
    """Alpha (seconds or units per collective) and beta (per byte) of one mesh axis."""

    name: str
    size: int
    alpha: tuple[float, float, float, float]  # per KINDS
    beta: tuple[float, float, float, float]

    def cost(self, kind: Kind, nbytes: float) -> float:
        index = KINDS.index(kind)
        return _FORMULAS[kind](self.alpha[index], self.beta[index], self.size, nbytes)


@dataclass(frozen=True, slots=True)
class CommModel:
    axes: tuple[AxisComm, ...]
    units: str  # "seconds" (platform) or "alpa" (Alpa's default alpha/beta)

    def axis(self, name: str) -> AxisComm:
        for axis in self.axes:
            if axis.name == name:
                return axis
        raise KeyError(name)

    def cost(self, kind: Kind, axis: str, nbytes: float) -> float:
        return self.axis(axis).cost(kind, nbytes)


def comm_model(mesh: MeshSpec, platform: Platform | None, *, defaults: bool = False) -> CommModel:
    """Per-axis alpha and beta: from `platform`, or Alpa's defaults when `defaults`.

    Alpa's two values are (inter-host, intra-host); a mesh's axes are aligned on the right, so
    a 1-D mesh is Alpa's single-host logical mesh (alpha 1, beta 0.1), and extra outer axes of
    a 3-D or 4-D mesh take the inter-host values. With a platform, an axis whose device group
    stays inside a node uses the intra-node link figures, else the inter-node ones.
    """
    axes = []
    if defaults:
        count = len(mesh.axes)
        for position, (name, size) in enumerate(mesh.axes):
            index = max(0, len(ALPA_MESH_ALPHA) - count + position)
            a, b = ALPA_MESH_ALPHA[index], ALPA_MESH_BETA[index]
            axes.append(AxisComm(name, size, (a, a, a, a), (b, b, b, b)))
        return CommModel(tuple(axes), "alpa")
    if platform is None:
        raise AlpaError(
            "expected a platform to price collectives in seconds, found None; pass a platform "
            "name such as 'a100-pcie-8', or defaults=True for Alpa's mesh_alpha/mesh_beta"
        )
    for name, size in mesh.axes:
        group = platform.group_devices([name], mesh) if size > 1 else [0]
        nodes = {d // platform.devices_per_node for d in group}
        level = platform.inter if len(nodes) > 1 and platform.inter is not None else platform.intra
        alpha = _per_kind([level[kind].latency_s for kind in KINDS])
        beta = _per_kind([1.0 / level[kind].bandwidth_Bps for kind in KINDS])
        axes.append(AxisComm(name, size, alpha, beta))
    return CommModel(tuple(axes), "seconds")


def _per_kind(values: Sequence[float]) -> tuple[float, float, float, float]:
    return (values[0], values[1], values[2], values[3])


# -- layouts -------------------------------------------------------------------------------------


def replicated(rank: int) -> DimAxes:
    return ((),) * rank


def _numeric(tt: TensorType) -> bool:
    try:
        np.dtype(tt.dtype)
    except TypeError:  # PRNG keys: never constrained (see realize._constrain)
        return False
    return True


def layout_name(layout: DimAxes) -> str:
    if not any(layout):
        return "R"
    return "".join("S" + "+".join(axes) if axes else "R" for axes in layout)


@dataclass(frozen=True, slots=True)
class OpStrategy:
    """One sharding strategy of an op (or a step input): what it reads, leaves and costs."""

    name: str
    operands: tuple[DimAxes | None, ...]  # layout wanted of each operand; None: no need
    outputs: tuple[DimAxes, ...]
    cost: float  # the op's own collectives (partial sums), in the model's units


class OpModel:
    """Per-op strategies and costs on one mesh: shared by the ILP and the fixed-layout pricing
    of CFP configurations, so both judge on the same formulas."""

    def __init__(self, graph: Graph, mesh: MeshSpec, comm: CommModel) -> None:
        self.graph = graph
        self.mesh = mesh
        self.comm = comm
        self.sizes = dict(mesh.axes)
        self.order = {name: i for i, name in enumerate(mesh.names)}
        self.axes = tuple(name for name, size in mesh.axes if size > 1)
        self.tracked = [_numeric(v.type) and v.kind is not ValueKind.CONSTANT for v in graph.values]
        self._maps: dict[tuple[int, int], tuple[affine.AffineMap | None, ...] | None] = {}
        self._dots: dict[int, tuple[OpStrategy, ...]] = {}
        self._follow: dict[tuple[int, DimAxes], OpStrategy] = {}
        self._reshard: dict[tuple[TensorType, DimAxes, DimAxes], float] = {}
        self._input_layouts: dict[int, tuple[DimAxes, ...]] = {}
        # kind of each op and the operand it follows, decided once in program order
        self.free = [False] * len(graph.values)  # does the value's producer have a choice?
        for vid in graph.inputs:
            self.free[vid] = self.tracked[vid] and len(self.input_layouts(vid)) > 1
        self.kinds: list[tuple[str, int]] = []
        for op in graph.ops:
            kind = self._decide(op)
            self.kinds.append(kind)
            free = kind[0] == "dot" or (kind[0] == "follow" and self.free[op.inputs[kind[1]]])
            for vid in op.outputs:
                self.free[vid] = free and self.tracked[vid]

    # -- helpers ---------------------------------------------------------------------------

    def parts(self, axes: Iterable[str]) -> int:
        return math.prod(self.sizes[a] for a in axes)

    def local_bytes(self, tt: TensorType, layout: DimAxes | None) -> float:
        if not layout:
            return float(tt.nbytes)
        return tt.nbytes / self.parts(a for axes in layout for a in axes)

    def sort_axes(self, axes: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(axes, key=self.order.__getitem__))

    def maps(self, op: OpNode, result: int = 0) -> tuple[affine.AffineMap | None, ...] | None:
        key = (op.id, result)
        if key not in self._maps:
            self._maps[key] = affine.traced_op_maps(op, result)
        return self._maps[key]

    def reshard(self, tt: TensorType, src: DimAxes | None, dst: DimAxes | None) -> float:
        """Cost of moving a value from layout `src` to `dst`, per mesh axis.

        An axis `src` splits and `dst` does not: all-gather; split on another dim:
        all-to-all; split only by `dst`: a local slice, free. The buffer is the value over the
        axis's device group (the whole value divided by the other axes that split it).
        """
        if src is None or dst is None or src == dst:
            return 0.0
        key = (tt, src, dst)
        found = self._reshard.get(key)
        if found is not None:
            return found
        src_dim = {a: d for d, axes in enumerate(src) for a in axes}
        dst_dim = {a: d for d, axes in enumerate(dst) for a in axes}
        cost = 0.0
        for axis, s in src_dim.items():
            d = dst_dim.get(axis)
            if d == s:
                continue
            others = self.parts(a for a in src_dim if a != axis)
            nbytes = tt.nbytes / others
            cost += self.comm.cost("all-gather" if d is None else "all-to-all", axis, nbytes)
        self._reshard[key] = cost
        return cost

    def layouts(self, shape: tuple[int, ...]) -> tuple[DimAxes, ...]:
        """Every even layout of a `shape` tensor: each axis splits one dim or none."""
        out = []
        for choice in itertools.product(range(-1, len(shape)), repeat=len(self.axes)):
            dims: list[tuple[str, ...]] = [()] * len(shape)
            for axis, dim in zip(self.axes, choice, strict=True):
                if dim >= 0:
                    dims[dim] = (*dims[dim], axis)
            if all(n % self.parts(a) == 0 for n, a in zip(shape, dims, strict=True)):
                out.append(tuple(dims))
        return tuple(out)

    def input_layouts(self, vid: int) -> tuple[DimAxes, ...]:
        found = self._input_layouts.get(vid)
        if found is None:
            shape = self.graph.values[vid].type.shape
            found = self.layouts(shape) if self.tracked[vid] else (replicated(len(shape)),)
            self._input_layouts[vid] = found
        return found

    # -- op kinds ----------------------------------------------------------------------------

    def _decide(self, op: OpNode) -> tuple[str, int]:
        """("dot", -1), ("follow", operand position) or ("replicated", -1)."""
        if op.primitive == "dot_general":
            return ("dot", -1) if self.dot_strategies(op) else ("replicated", -1)
        maps = self.maps(op)
        if maps is None:
            return ("replicated", -1)
        best: tuple[Any, ...] | None = None
        for position, vid in enumerate(op.inputs):
            if (
                not self.tracked[vid]
                or position >= len(maps)
                or maps[position] is None
                or self.graph.values[vid].type.rank == 0
            ):
                continue
            producer = self.graph.values[vid].producer
            depth = -1 if producer is None else self.graph.ops[producer].depth
            # Alpa follows the deepest operand; one with a choice wins over one without (a
            # dropout mask drawn from the replicated RNG stream must not pin the data path)
            key = (self.free[vid], depth, self.graph.values[vid].type.nbytes, -position)
            if best is None or key > best[0]:
                best = (key, position)
        if best is None:
            return ("replicated", -1)
        return ("follow", int(best[1]))

    def kind(self, op: OpNode) -> tuple[str, int]:
        return self.kinds[op.id]

    def replicated_strategy(self, op: OpNode) -> OpStrategy:
        operands = tuple(
            replicated(t.rank) if self.tracked[v] else None
            for v, t in zip(op.inputs, op.input_types, strict=True)
        )
        return OpStrategy("R", operands, tuple(replicated(t.rank) for t in op.output_types), 0.0)

    def dot_strategies(self, op: OpNode) -> tuple[OpStrategy, ...]:
        found = self._dots.get(op.id)
        if found is None:
            found = tuple(self._enumerate_dot(op))
            self._dots[op.id] = found
        return found

    def _enumerate_dot(self, op: OpNode) -> Iterable[OpStrategy]:
        (lc, rc), (lb, rb) = op.param("dimension_numbers")
        lhs, rhs = op.input_types[0].shape, op.input_types[1].shape
        out = op.output_types[0]
        lhs_free = [d for d in range(len(lhs)) if d not in lc and d not in lb]
        rhs_free = [d for d in range(len(rhs)) if d not in rc and d not in rb]

        def tag(role: str, index: int, count: int) -> str:
            return role if count == 1 else f"{role}{index}"

        # (name, lhs dim, rhs dim, output dim or None for a contracted dim, size)
        slots: list[tuple[str, int | None, int | None, int | None, int]] = []
        for i, (left, right) in enumerate(zip(lb, rb, strict=True)):
            slots.append((tag("E", i, len(lb)), left, right, i, lhs[left]))
        for i, left in enumerate(lhs_free):
            slots.append((tag("M", i, len(lhs_free)), left, None, len(lb) + i, lhs[left]))
        offset = len(lb) + len(lhs_free)
        for i, right in enumerate(rhs_free):
            slots.append((tag("N", i, len(rhs_free)), None, right, offset + i, rhs[right]))
        for i, (left, right) in enumerate(zip(lc, rc, strict=True)):
            slots.append((tag("K", i, len(lc)), left, right, None, lhs[left]))
        for choice in itertools.product(range(len(slots)), repeat=len(self.axes)):
            per_slot: dict[int, tuple[str, ...]] = {}
            for axis, slot in zip(self.axes, choice, strict=True):
                per_slot[slot] = (*per_slot.get(slot, ()), axis)
            if any(slots[s][4] % self.parts(a) for s, a in per_slot.items()):
                continue
            lhs_layout: list[tuple[str, ...]] = [()] * len(lhs)
            rhs_layout: list[tuple[str, ...]] = [()] * len(rhs)
            base: list[tuple[str, ...]] = [()] * out.rank
            contracted: list[str] = []
            for slot, axes in per_slot.items():
                _, left, right, dim, _ = slots[slot]
                if left is not None:
                    lhs_layout[left] = axes
                if right is not None:
                    rhs_layout[right] = axes
                if dim is None:
                    contracted.extend(axes)
                else:
                    base[dim] = axes
            name = ",".join(
                f"{slots[s][0]}@{'+'.join(a)}"
                for s, a in sorted(per_slot.items(), key=lambda kv: self.order[kv[1][0]])
            )
            operands = (tuple(lhs_layout), tuple(rhs_layout))
            partial = self.local_bytes(out, tuple(base))
            contracted_axes = self.sort_axes(contracted)
            # each contracted axis: all-reduce, or reduce-scatter onto one output dim
            for targets in itertools.product(range(-1, out.rank), repeat=len(contracted_axes)):
                layout = list(base)
                cost = 0.0
                notes = []
                for axis, target in zip(contracted_axes, targets, strict=True):
                    if target < 0:
                        cost += self.comm.cost("all-reduce", axis, partial)
                    else:
                        layout[target] = self.sort_axes((*layout[target], axis))
                        cost += self.comm.cost("reduce-scatter", axis, partial)
                        notes.append(f"rs{target}@{axis}")
                if any(n % self.parts(a) for n, a in zip(out.shape, layout, strict=True)):
                    continue
                label = name + (f"({','.join(notes)})" if notes else "") if name else "R"
                yield OpStrategy(label, operands, (tuple(layout),), cost)

    def follow(self, op: OpNode, leader: int, layout: DimAxes) -> OpStrategy:
        """The strategy of `op` when its operand `leader` arrives in `layout`."""
        key = (op.id, layout)
        found = self._follow.get(key)
        if found is not None:
            return found
        reduced = set(op.param("axes") or ()) if op.primitive in PARTIAL_REDUCTIONS else set()
        kept = list(layout)
        partial: list[str] = []
        outputs: list[DimAxes] = []
        first_maps = self.maps(op, 0)
        for result, tt in enumerate(op.output_types):
            maps = first_maps if result == 0 else self.maps(op, result)
            op_map = maps[leader] if maps is not None and leader < len(maps) else None
            out: list[tuple[str, ...]] = [()] * tt.rank
            for dim, axes in enumerate(layout):
                if not axes:
                    continue
                if dim in reduced:
                    if result == 0:
                        partial.extend(axes)
                    continue
                target = op_map.split_target(dim, self.parts(axes)) if op_map else None
                if target is None or out[target]:
                    kept[dim] = ()  # the op cannot carry this split: gather it first
                else:
                    out[target] = axes
            outputs.append(tuple(out))
        operands: list[DimAxes | None] = []
        for position, (vid, tt) in enumerate(zip(op.inputs, op.input_types, strict=True)):
            if position == leader:
                operands.append(tuple(kept))
                continue
            if not self.tracked[vid]:
                operands.append(None)
                continue
            op_map = first_maps[position] if first_maps and position < len(first_maps) else None
            wanted: list[tuple[str, ...]] = [()] * tt.rank
            if op_map is not None and outputs:
                for dim, axes in enumerate(outputs[0]):
                    if axes:
                        source = op_map.split_source(dim, self.parts(axes))
                        if source is not None:
                            wanted[source] = axes
            operands.append(tuple(wanted))
        cost = 0.0
        if partial and op.output_types:
            nbytes = self.local_bytes(op.output_types[0], outputs[0])
            cost = sum(self.comm.cost("all-reduce", a, nbytes) for a in self.sort_axes(partial))
        name = layout_name(outputs[0]) if outputs else "R"
        strategy = OpStrategy(name, tuple(operands), tuple(outputs), cost)
        self._follow[key] = strategy
        return strategy

    # -- pricing fixed layouts ---------------------------------------------------------------

    def fixed_cost(
        self,
        ops: Sequence[int],
        arriving: Mapping[int, DimAxes],
        fixed_values: Mapping[int, DimAxes],
        fixed_operands: Mapping[tuple[int, int], DimAxes],
    ) -> float:
        """Alpa-style cost of running `ops` with some layouts imposed.

        `arriving` gives the layout of each value the ops read but do not make; values in
        `fixed_values` are constrained to their layout (resharded there when the op leaves
        them otherwise), and `fixed_operands` to what one op reads. Each contraction takes
        its cheapest strategy given those layouts, every other op follows its leader, as in
        the ILP: the cost a compiler honouring the constraints would pay under this model.
        """
        actual: dict[int, DimAxes] = {}
        total = 0.0
        for op_id in sorted(ops):
            op = self.graph.ops[op_id]
            reads: list[DimAxes | None] = []
            for position, vid in enumerate(op.inputs):
                if not self.tracked[vid]:
                    reads.append(None)
                    continue
                here = actual.get(vid)
                if here is None:
                    here = arriving.get(vid, replicated(self.graph.values[vid].type.rank))
                wanted = fixed_operands.get((op_id, position))
                if wanted is not None:
                    total += self.reshard(self.graph.values[vid].type, here, wanted)
                    here = wanted
                reads.append(here)
            kind, leader = self.kind(op)
            if kind == "dot":
                candidates: Sequence[OpStrategy] = self.dot_strategies(op)
            elif kind == "follow" and reads[leader] is not None:
                candidates = (self.follow(op, leader, reads[leader]),)  # type: ignore[arg-type]
            else:
                candidates = (self.replicated_strategy(op),)
            fixed = [fixed_values.get(v) if self.tracked[v] else None for v in op.outputs]
            best_cost, best = math.inf, candidates[0]
            for strategy in candidates:
                cost = strategy.cost
                for position, wanted in enumerate(strategy.operands):
                    if wanted is not None and reads[position] is not None:
                        tt = op.input_types[position]
                        cost += self.reshard(tt, reads[position], wanted)
                for tt, made, want in zip(op.output_types, strategy.outputs, fixed, strict=True):
                    if want is not None:
                        cost += self.reshard(tt, made, want)
                if cost < best_cost:
                    best_cost, best = cost, strategy
            total += best_cost
            for vid, made, want in zip(op.outputs, best.outputs, fixed, strict=True):
                actual[vid] = want if want is not None else made
        return total


# -- the ILP -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Node:
    op: int | None  # None for a step input
    value: int | None  # the input's value id
    group: int
    strategies: list[OpStrategy]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AlpaProblem:
    """The ILP over one graph and mesh: its size, and what decoding a solution needs."""

    mesh: MeshSpec
    units: str
    nodes: int  # ops and step inputs with a layout
    groups: int  # sets of nodes sharing one choice (an op and the ops following it)
    free_groups: int  # groups with more than one strategy: one-hot variables
    edges: int  # pairs of free groups with a resharding cost matrix
    variables: int
    integer_variables: int
    constraints: int
    memory_constraints: int
    nonzeros: int
    build_seconds: float
    data: Any = field(default=None, compare=False, repr=False)


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


class _Builder:
    """Groups, costs and liveness of the ILP; kept for decoding and re-pricing choices."""

    def __init__(self, graph: Graph, model: OpModel) -> None:
        self.graph = graph
        self.model = model
        self.nodes: list[_Node] = []
        self.sizes: list[int] = []  # strategies per group
        self.producer: dict[int, tuple[int, int]] = {}  # value -> (node, output index)
        for vid in graph.inputs:
            if model.tracked[vid]:
                layouts = model.input_layouts(vid)
                strategies = [OpStrategy(layout_name(d), (), (d,), 0.0) for d in layouts]
                group = self._new_group(len(strategies))
                self._add(
                    None, value=vid, group=group, strategies=strategies, inputs=(), outputs=(vid,)
                )
        for op in graph.ops:
            kind, leader = model.kind(op)
            if kind == "dot":
                strategies = list(model.dot_strategies(op))
                group = self._new_group(len(strategies))
            elif kind == "follow":
                node, index = self.producer[op.inputs[leader]]
                group = self.nodes[node].group
                strategies = [
                    model.follow(op, leader, s.outputs[index]) for s in self.nodes[node].strategies
                ]
            else:
                strategies = [model.replicated_strategy(op)]
                group = self._new_group(1)
            self._add(
                op.id,
                value=None,
                group=group,
                strategies=strategies,
                inputs=op.inputs,
                outputs=op.outputs,
            )
        self._costs()

    def _new_group(self, size: int) -> int:
        self.sizes.append(size)
        return len(self.sizes) - 1

    def _add(
        self,
        op: int | None,
        *,
        value: int | None,
        group: int,
        strategies: list[OpStrategy],
        inputs: tuple[int, ...],
        outputs: tuple[int, ...],
    ) -> None:
        self.nodes.append(_Node(op, value, group, strategies, inputs, outputs))
        for index, vid in enumerate(outputs):
            if self.model.tracked[vid]:
                self.producer[vid] = (len(self.nodes) - 1, index)

    def _matrix(self, vid: int, src: Sequence[DimAxes], dst: Sequence[DimAxes | None]) -> Any:
        """Resharding costs from each producer strategy's layout to each consumer want."""
        tt = self.graph.values[vid].type
        src_keys = {d: i for i, d in enumerate(dict.fromkeys(src))}
        dst_keys = {d: i for i, d in enumerate(dict.fromkeys(dst))}
        small = np.zeros((len(src_keys), len(dst_keys)))
        for s, i in src_keys.items():
            for d, j in dst_keys.items():
                small[i, j] = self.model.reshard(tt, s, d)
        rows = np.array([src_keys[d] for d in src])
        cols = np.array([dst_keys[d] for d in dst])
        return small[np.ix_(rows, cols)]

    def _costs(self) -> None:
        self.constant = 0.0
        self.node_cost = [np.zeros(k) for k in self.sizes]
        self.edges: dict[tuple[int, int], Any] = {}
        for node in self.nodes:
            costs = np.array([s.cost for s in node.strategies])
            self.node_cost[node.group] += costs
            for position, vid in enumerate(node.inputs):
                if vid not in self.producer:
                    continue
                wants = [s.operands[position] for s in node.strategies]
                if all(w is None for w in wants):
                    continue
                source, index = self.producer[vid]
                made = [s.outputs[index] for s in self.nodes[source].strategies]
                self._edge(vid, self.nodes[source].group, made, node.group, wants)
        # a result that updates a step input (new parameters, optimizer state) is stored in
        # that input's layout: the step's output sharding; other results leave replicated
        inputs = {
            (path_suffix(self.graph.values[v].path), self.graph.values[v].type.shape): v
            for v in self.graph.inputs
            if v in self.producer
        }
        paths = self.graph.output_paths or ("",) * len(self.graph.outputs)
        for vid, path in zip(self.graph.outputs, paths, strict=True):
            if vid not in self.producer:
                continue
            source, index = self.producer[vid]
            made = [s.outputs[index] for s in self.nodes[source].strategies]
            alias = inputs.get((path_suffix(path), self.graph.values[vid].type.shape))
            if alias is None:
                rank = self.graph.values[vid].type.rank
                self._edge(vid, self.nodes[source].group, made, None, [replicated(rank)])
            else:
                target = self.nodes[self.producer[alias][0]]
                stored: list[DimAxes | None] = [s.outputs[0] for s in target.strategies]
                self._edge(vid, self.nodes[source].group, made, target.group, stored)

    def _edge(
        self,
        vid: int,
        g: int,
        made: Sequence[DimAxes],
        h: int | None,
        wants: Sequence[DimAxes | None],
    ) -> None:
        matrix = self._matrix(vid, made, wants)
        if not matrix.any():
            return
        if h == g:  # same choice on both sides: only the diagonal is reachable
            self.node_cost[g] += np.diag(matrix)
        elif h is None or self.sizes[h] == 1:
            self.node_cost[g] += matrix[:, 0]
        elif self.sizes[g] == 1:
            self.node_cost[h] += matrix[0, :]
        else:
            key = (g, h)
            if key in self.edges:
                self.edges[key] = self.edges[key] + matrix
            else:
                self.edges[key] = matrix

    # -- memory -------------------------------------------------------------------------------

    def value_bytes(self, vid: int) -> Any:
        """Per-device bytes of `vid` under each strategy of its group."""
        node, index = self.producer[vid]
        tt = self.graph.values[vid].type
        return np.array(
            [
                int(self.model.local_bytes(tt, s.outputs[index]))
                for s in self.nodes[node].strategies
            ],
            dtype=np.int64,
        )

    def live_deltas(self) -> list[dict[int, Any]]:
        """At each program point whose live set is maximal, the per-device bytes by group
        that became live (positive) or died (negative) since the previous such point.

        Step inputs live throughout (a jitted step does not donate them); an op's result lives
        from the op to its last reader, or to the end for a step result. A point where nothing
        dies is dominated by the next one, and a point where nothing was born since the last
        point kept is dominated by that one: both are skipped. Differences rather than live
        sets keep the memory rows linear in the graph: each value enters two of them.
        """
        graph = self.graph
        results = set(graph.outputs)
        inputs = set(graph.inputs)
        last: dict[int, int] = {}  # op results: the last op reading them
        for op in graph.ops:
            for vid in op.inputs:
                if vid in self.producer and vid not in inputs and vid not in results:
                    last[vid] = op.id
        dying: dict[int, list[int]] = {}
        for vid, at in last.items():
            dying.setdefault(at, []).append(vid)
        pending: dict[int, Any] = {}

        def add(vid: int, sign: int) -> None:
            group = self.nodes[self.producer[vid][0]].group
            current = pending.get(group)
            delta = sign * self.value_bytes(vid)
            pending[group] = delta if current is None else current + delta

        for vid in graph.inputs:
            if vid in self.producer:
                add(vid, 1)
        points: list[dict[int, Any]] = []
        born = True
        for op in graph.ops:
            for vid in op.outputs:
                if vid in self.producer and (vid in last or vid in results):
                    add(vid, 1)
                    born = True
            if op.id in dying and born:
                points.append({g: v for g, v in pending.items() if v.any()})
                pending = {}
                born = False
            for vid in dying.get(op.id, ()):
                add(vid, -1)
        if born or not points:
            points.append({g: v for g, v in pending.items() if v.any()})
        return points

    def peak(self, choice: Sequence[int]) -> int:
        """Peak per-device bytes over every program point under `choice` (a strategy per
        group)."""
        best = live = 0
        for delta in self.live_deltas():
            live += int(sum(int(v[choice[g]]) for g, v in delta.items()))
            best = max(best, live)
        return best

    def objective(self, choice: Sequence[int]) -> float:
        total = self.constant + sum(float(c[choice[g]]) for g, c in enumerate(self.node_cost))
        for (g, h), matrix in self.edges.items():
            total += float(matrix[choice[g], choice[h]])
        return total


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


def _platform(platform: Any, defaults: bool) -> Platform | None:
    if defaults or platform is None:
        return None
    from explorer.platforms import Platform, load_platform

    return platform if isinstance(platform, Platform) else load_platform(platform)


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


def _leanest_peak(builder: _Builder) -> int:
    """Peak under the leanest strategy of every group on its own (fewest bytes in all)."""
    total = [np.zeros(k, dtype=np.int64) for k in builder.sizes]
    for vid, (node, _) in builder.producer.items():
        total[builder.nodes[node].group] += builder.value_bytes(vid)
    return builder.peak([int(np.argmin(t)) for t in total])


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


# -- layouts -> a sharding assignment --------------------------------------------------------


def layout_assignment(
    graph: Graph,
    mesh: MeshSpec,
    values: Mapping[int, DimAxes],
    operands: Mapping[tuple[int, int], DimAxes] | None = None,
) -> ShardingAssignment:
    """A ShardingAssignment from per-value layouts (step inputs included).

    A step result that updates an input is stored in that input's layout (so the next step
    reads it as this one did); any other result leaves replicated.
    """
    inputs = tuple(values.get(v, replicated(graph.values[v].type.rank)) for v in graph.inputs)
    by_suffix = {
        (path_suffix(graph.values[v].path), graph.values[v].type.shape): dims
        for v, dims in zip(graph.inputs, inputs, strict=True)
    }
    paths = graph.output_paths or ("",) * len(graph.outputs)
    outputs = tuple(
        by_suffix.get(
            (path_suffix(path), graph.values[v].type.shape),
            replicated(graph.values[v].type.rank),
        )
        for v, path in zip(graph.outputs, paths, strict=True)
    )
    input_ids = set(graph.inputs)
    internal = tuple(sorted((v, d) for v, d in values.items() if v not in input_ids))
    wanted = tuple(sorted((o, p, d) for (o, p), d in (operands or {}).items()))
    return ShardingAssignment(mesh.axes, inputs, outputs, internal, wanted)


# -- Fig. 9: Alpa's prediction of each CFP configuration ----------------------------------------


def symbolic_config_costs(analysis: Any) -> pd.DataFrame:
    """Alpa-style communication cost of every configuration of every unique segment.

    `analysis` is a pipeline Analysis (read for `.graph`, `.block_analysis`, `.segments`,
    `.mesh`, `.platform`). Each configuration is priced as its profiled program runs: the
    first instance of the segment type, its blocks' layouts imposed, its boundary tensors
    arriving as `segment_input_layouts` gives them, every other op following its operands.
    Rows join `analysis.profiles` (kind "segment") on `segment` and `config`.
    """
    import pandas as pd

    graph = analysis.graph
    blocks = analysis.block_analysis.blocks
    segmentation = analysis.segments
    mesh = mesh_spec(analysis.mesh)
    model = OpModel(graph, mesh, comm_model(mesh, _platform(analysis.platform, False)))
    position = {vid: i for i, vid in enumerate(graph.inputs)}
    rows = []
    first: dict[int, Any] = {}
    for instance in segmentation.instances:
        first.setdefault(instance.unique_id, instance)
    dependencies = instance_dependencies(graph, analysis.block_analysis, segmentation, mesh)
    twins = loop_twins(graph, blocks)
    for unique in segmentation.unique:
        instance = first[unique.id]
        inside = set(instance.ops)
        depends = dependencies[instance.index]
        for choices, context in itertools.product(
            itertools.product(*(range(len(blocks[b].strategies)) for b in instance.blocks)),
            itertools.product(*(range(len(blocks[b].strategies)) for b in depends)),
        ):
            config = twin_config(twins, (*instance.blocks, *depends), (*choices, *context))
            assignment = shardings(graph, blocks, config, mesh)
            boundary = segment_input_layouts(
                graph, blocks, segmentation, instance.index, tuple(choices)
            )
            values = dict(assignment.values)
            arriving: dict[int, DimAxes] = {}
            for op_id in instance.ops:
                for vid in graph.ops[op_id].inputs:
                    producer = graph.values[vid].producer
                    if producer is not None and producer in inside:
                        continue
                    if vid in boundary:
                        arriving[vid] = boundary[vid]
                    elif vid in position:
                        arriving[vid] = assignment.inputs[position[vid]]
                    else:
                        arriving[vid] = values.get(vid, replicated(graph.values[vid].type.rank))
            fixed = {v: d for v, d in values.items() if graph.values[v].producer in inside}
            operand_layouts = {(o, p): d for o, p, d in assignment.operands if o in inside}
            cost = model.fixed_cost(instance.ops, arriving, fixed, operand_layouts)
            names = configuration_name(blocks, instance.blocks, tuple(choices), depends, context)
            rows.append(
                {
                    "segment": unique.id,
                    "label": unique.label,
                    "config": names,
                    "choices": tuple(choices),
                    "symbolic_cost": cost,
                }
            )
    return pd.DataFrame(rows, columns=["segment", "label", "config", "choices", "symbolic_cost"])
