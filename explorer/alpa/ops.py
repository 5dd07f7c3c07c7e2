"""Alpa-style strategies: the sharding strategies of each op, and the op model that prices them.

**Strategies** (step 1 of the method in `explorer.alpa`). A contraction (`dot_general`) may
split its batch (E), left free (M), right free (N) or contracted (K) dims over each mesh axis;
every axis of size > 1 is used, since Alpa prices recomputing a heavy op on a replicated axis as
infinite. A K split leaves partial sums, reduced by an all-reduce, or by a reduce-scatter onto
one output dim. A step input (parameter, optimizer state, data) may take any even layout,
replicated included. Every other op *follows* its deepest operand (longest path from the inputs,
as Alpa does), so it shares that operand's choice variable: the ILP stays the size of the
contractions and inputs. A split the op cannot carry (a reshape merging a split minor dim, a
sort along it) is gathered first; a reduction over a split dim all-reduces its result. Ops the
affine analysis does not know stay replicated.

`OpModel` prices each strategy's own collectives and each resharding with the formulas of
`comm`; it serves the ILP and the fixed-layout pricing of CFP configurations (`symbolic`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from explorer import affine
from explorer.alpa.comm import CommModel
from explorer.ir import DimAxes, Graph, OpNode, TensorType, ValueKind
from explorer.layouts import replicated
from explorer.mesh import MeshSpec

# Reductions whose split operand leaves partial results an all-reduce completes.
PARTIAL_REDUCTIONS = frozenset(
    {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or"}
)


# -- layouts -------------------------------------------------------------------------------------


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
