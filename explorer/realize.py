"""Realisation: Graph + Config + mesh -> a jittable sharded program.

The inlined step is re-executed primitive by primitive (`_jax_compat.evaluate`) with
`with_sharding_constraint` on every value the ShardingAssignment places (`layouts.place`
places them all) and on the operands it wants read in another layout (block heads, readers
across a segment boundary), and with input and output shardings from the assignment. XLA's
SPMD partitioner then inserts exactly the communication the configuration implies, except
where a contraction's partial sums are reduce-scattered (`Scatter`): that one is written
out, as XLA:GPU's partitioner would make it and XLA:CPU's does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from explorer import _jax_compat as jc
from explorer.errors import ArgumentMismatchError
from explorer.ir import DimAxes, Graph, Scatter, ShardingAssignment, ValueKind, path_suffix
from explorer.mesh import named_sharding, partition_spec


@dataclass(frozen=True, slots=True)
class RealizedStep:
    """A sharded step with the original step's signature, and its shardings.

    `flat_fn` is the jitted program over the flattened arguments (what is compiled); with
    donation, the parameters and optimizer state it reads are donated to the updated ones it
    returns, as a training loop does (`state = step(state, batch)`), so a step holds them
    once, not twice.
    """

    flat_fn: Any  # the jitted function over flat leaves (jax.stages.Wrapped)
    in_shardings: tuple[Any, ...]  # pytree of NamedSharding per argument
    out_shardings: Any
    mesh: Mesh
    in_tree: Any
    donated: tuple[int, ...]  # positions of the donated flat arguments

    def __call__(self, *args: Any) -> Any:
        return self.flat_fn(*self._leaves(args))

    def lower(self, *args: Any) -> Any:
        with jc.random_bits_as_accelerators_lower():
            return self.flat_fn.lower(*self._leaves(args))

    def _leaves(self, args: tuple[Any, ...]) -> list[Any]:
        leaves, tree = jax.tree_util.tree_flatten(args)
        if tree != self.in_tree:
            raise ArgumentMismatchError(
                f"expected arguments with the traced structure\n{self.in_tree}\nfound\n{tree}"
            )
        return leaves


def donatable_inputs(graph: Graph) -> tuple[int, ...]:
    """Positions of the step arguments a training loop hands over: parameters and optimizer
    state that the step returns updated (a result of the same path suffix and shape)."""
    results = {
        (path_suffix(path), graph.values[vid].type.shape, graph.values[vid].type.dtype)
        for vid, path in zip(graph.outputs, graph.output_paths, strict=False)
    }
    donated = []
    for position, vid in enumerate(graph.inputs):
        value = graph.values[vid]
        if value.kind not in (ValueKind.PARAMETER, ValueKind.OPTIMIZER_STATE):
            continue
        if (path_suffix(value.path), value.type.shape, value.type.dtype) in results:
            donated.append(position)
    return tuple(donated)


def realize(
    graph: Graph,
    assignment: ShardingAssignment,
    mesh: Mesh,
    *,
    donate: bool = False,
    keep_loops: bool = False,
) -> RealizedStep:
    """The step under `assignment`, jitted; `donate=True` donates its parameters and
    optimizer state (`donatable_inputs`).

    `keep_loops=True` runs each scan the tracer unrolled (`Graph.loops`) as a scan again,
    every iteration under its first iteration's layouts: the step the user runs. The
    default runs the unrolled program, the one whole-step pricing compiles (XLA's cost
    analysis counts a while loop's body once, not once per trip)."""
    if graph.program is None:
        raise ArgumentMismatchError("this Graph carries no program to realise (was it traced?)")
    # graph op ids are the whole program's equation indices
    eqn_of_op = {op.id: op.id for op in graph.ops}
    constrain_value, constrain_operand = _hooks(assignment, mesh, eqn_of_op)
    rebind = _scattering(assignment, mesh, eqn_of_op)
    program = graph.program
    layouts = {(op, position): dims for op, position, dims in assignment.operands}
    crossing = {read: layouts[read] for read in assignment.crossing_reads}

    def sharded_step(*flat: Any) -> Any:
        results = jc.evaluate(
            program,
            flat,
            constrain_value,
            _moving_once(constrain_operand, crossing),  # fresh per trace: its tracers
            keep_loops=keep_loops,
            rebind=rebind,
        )
        return jax.tree_util.tree_unflatten(graph.out_tree, results)

    flat_in = tuple(named_sharding(mesh, d) for d in assignment.inputs)
    in_shardings = jax.tree_util.tree_unflatten(graph.in_tree, list(flat_in))
    out_shardings = jax.tree_util.tree_unflatten(
        graph.out_tree, [named_sharding(mesh, d) for d in assignment.outputs]
    )
    donated = donatable_inputs(graph) if donate else ()
    fn = jax.jit(
        sharded_step, in_shardings=flat_in, out_shardings=out_shardings, donate_argnums=donated
    )
    return RealizedStep(fn, tuple(in_shardings), out_shardings, mesh, graph.in_tree, donated)


def _hooks(
    assignment: ShardingAssignment, mesh: Mesh, eqn_of_op: dict[int, int]
) -> tuple[Callable[[int, Any], Any], Callable[[int, int, Any], Any]]:
    """`evaluate` hooks applying the assignment's constraints to results and head operands.

    Replicated layouts are constraints too: they are where a K split's partial sums are
    reduced, and where a head gathers its input.
    """
    values = {v: named_sharding(mesh, d) for v, d in assignment.values}
    operands = {
        (eqn_of_op[o], p): named_sharding(mesh, d)
        for o, p, d in assignment.operands
        if o in eqn_of_op
    }

    def constrain_value(vid: int, x: Any) -> Any:
        sharding = values.get(vid)
        return _constrain(x, sharding) if sharding is not None else x

    def constrain_operand(eqn: int, position: int, x: Any) -> Any:
        sharding = operands.get((eqn, position))
        return _constrain(x, sharding) if sharding is not None else x

    return constrain_value, constrain_operand


def _moving_once(
    constrain_operand: Callable[[int, int, Any], Any],
    crossing: Mapping[tuple[int, int], DimAxes],
) -> Callable[[int, int, Any], Any]:
    """`constrain_operand` where the readers of one boundary tensor in one layout (`crossing`:
    (equation, position) -> layout) read one constrained copy of it, as the resharding
    program priced one move; a copy per reader would be resharded once per reader."""
    copies: dict[tuple[int, DimAxes], tuple[Any, Any]] = {}

    def read(eqn: int, position: int, x: Any) -> Any:
        dims = crossing.get((eqn, position))
        if dims is None:
            return constrain_operand(eqn, position, x)
        key = (id(x), dims)  # the same array (not one rematerialised apart), the same layout
        if key not in copies:  # x is kept with its copy, so its id is not reused
            copies[key] = (x, constrain_operand(eqn, position, x))
        return copies[key][1]

    return read


def _scattering(
    assignment: ShardingAssignment, mesh: Mesh, eqn_of_op: dict[int, int]
) -> dict[int, Callable[[Any, list[Any]], Any]]:
    """`evaluate`'s `rebind`: each contraction whose partial sums are reduce-scattered
    (`assignment.scatters`), computed per device on its operands' shards and reduce-scattered
    over the K axes onto its result's M dim.

    Left to the partitioner, a K-split dot whose result is wanted split on M compiles, on
    XLA:CPU, to an all-reduce of the whole result and a slice of it (XLA:GPU rewrites that
    pair into a reduce-scatter, XLA:CPU has no such pass): twice the bytes, and the whole
    activation on every device, which the strategy exists to avoid."""

    def rebound(scatter: Scatter) -> Callable[[Any, list[Any]], Any]:
        def run(eqn: Any, operands: list[Any]) -> Any:
            def local(*shards: Any) -> Any:
                partial = eqn.primitive.bind(*shards, **eqn.params)
                axes = scatter.axes[0] if len(scatter.axes) == 1 else scatter.axes
                return jax.lax.psum_scatter(
                    partial, axes, scatter_dimension=scatter.dim, tiled=True
                )

            return jax.shard_map(
                local,
                mesh=mesh,
                in_specs=tuple(partition_spec(d) for d in scatter.operands),
                out_specs=partition_spec(scatter.result),
                check_vma=False,
            )(*operands)

        return run

    return {eqn_of_op[s.op]: rebound(s) for s in assignment.scatters if s.op in eqn_of_op}


def _constrain(x: Any, sharding: NamedSharding) -> Any:
    dtype = getattr(x, "dtype", None)
    if dtype is None or not isinstance(dtype, np.dtype):
        return x  # PRNG keys and other extended dtypes: leave to the compiler
    return jax.lax.with_sharding_constraint(x, sharding)


# -- segment and resharding programs -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StandaloneProgram:
    """A jitted program over flat arrays, with abstract inputs to lower it without data."""

    fn: Any
    inputs: tuple[Any, ...]  # jax.ShapeDtypeStruct per input, carrying its sharding
    input_values: tuple[int, ...]  # graph value ids of the inputs
    output_values: tuple[int, ...]

    def lower(self) -> Any:
        with jc.random_bits_as_accelerators_lower():
            return self.fn.lower(*self.inputs)


def segment_program(
    graph: Graph,
    ops: tuple[int, ...],
    assignment: ShardingAssignment,
    mesh: Mesh,
    input_layouts: dict[int, Any] | None = None,
    *,
    after: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
) -> StandaloneProgram:
    """The ops of one segment instance as a program of their own.

    Its inputs are every value the ops read but do not make: step inputs keep the layout the
    assignment gives them, values listed in `input_layouts` (the boundary tensors) arrive in
    that layout, and anything else arrives where the assignment places it. Every value keeps
    its sharding constraint, so the partitioner inserts the same communication as in the step.

    `after = (late, first)`: inputs in `late` (the cotangents the next instance sends back)
    are read only once the values in `first` (the activations this instance sends it) exist
    (`_tie_late_inputs`). In the whole step that order is forced by the data; standalone,
    the compiler would otherwise be free to combine the backward pass's all-reduces with
    the forward pass's, which the step it stands for cannot.
    """
    program = graph.program.subprogram(ops)
    position = {vid: i for i, vid in enumerate(graph.inputs)}
    values = dict(assignment.values)
    layouts = input_layouts or {}
    shardings = []
    for vid in program.invars:
        if vid in layouts:
            dims = layouts[vid]
        elif vid in position:
            dims = assignment.inputs[position[vid]]
        else:
            dims = values.get(vid, ((),) * graph.values[vid].type.rank)
        shardings.append(named_sharding(mesh, dims))
    eqn_position = {op: i for i, op in enumerate(sorted(set(ops)))}
    # every read of a boundary tensor reads an input arriving in that read's layout, so
    # there is no move to share (`assignment.crossing_reads` is for the whole step)
    constrain_value, constrain_operand = _hooks(assignment, mesh, eqn_position)
    rebind = _scattering(assignment, mesh, eqn_position)
    late = [v for v in after[0] if v in set(program.invars)]
    first = [v for v in after[1] if v in set(program.outvars)]
    tied = _tie_late_inputs(graph, late, first, {**values, **layouts})
    if tied:
        # one replicated zero scalar, an input the compiler cannot fold
        shardings.append(named_sharding(mesh, ()))

    def run(*flat: Any) -> Any:
        if not tied:
            return tuple(
                jc.evaluate(program, flat, constrain_value, constrain_operand, rebind=rebind)
            )
        *inputs, zero = flat
        made: dict[int, Any] = {}

        def on_value(vid: int, x: Any) -> Any:
            x = constrain_value(vid, x)
            made[vid] = x
            return x

        def on_operand(eqn: int, position: int, x: Any) -> Any:
            vid = program.eqns[eqn].invars[position]
            if vid in tied:
                # late + 0 * first: the same numbers, read only once `first` exists
                x = x + zero.astype(x.dtype) * made[tied[vid]]
            return constrain_operand(eqn, position, x)

        return tuple(jc.evaluate(program, inputs, on_value, on_operand, rebind=rebind))

    fn = jax.jit(run, in_shardings=tuple(shardings))
    inputs = tuple(program.abstract(v, s) for v, s in zip(program.invars, shardings, strict=False))
    if tied:
        inputs += (jax.ShapeDtypeStruct((), np.float32, sharding=shardings[-1]),)
    return StandaloneProgram(fn, inputs, program.invars, program.outvars)


def _tie_late_inputs(
    graph: Graph, late: list[int], first: list[int], layouts: dict[int, Any]
) -> dict[int, int]:
    """Pair each late input with a value of `first` of its shape, dtype and layout.

    An optimization barrier does not stop XLA's all-reduce combiner (it becomes a control
    dependency), so the order is made a data dependency: `late + 0 * first`, an elementwise
    op between tensors laid out alike, which moves no data. A late input without such a
    partner is left as it is.
    """
    pairs: dict[int, int] = {}
    for vid in late:
        value = graph.values[vid]
        for other in first:
            partner = graph.values[other]
            if (
                partner.type == value.type
                and layouts.get(other) == layouts.get(vid)
                # jax's test: numpy does not count bfloat16 (ml_dtypes) as floating
                and jax.dtypes.issubdtype(np.dtype(value.type.dtype), np.floating)
            ):
                pairs[vid] = other
                break
    return pairs


def reshard_program(
    graph: Graph, moves: tuple[tuple[int, Any, Any], ...], mesh: Mesh
) -> StandaloneProgram:
    """Move each value `(value id, from layout, to layout)`: the boundary's resharding cost."""
    sources = tuple(named_sharding(mesh, src) for _, src, _ in moves)
    targets = tuple(named_sharding(mesh, dst) for _, _, dst in moves)

    def run(*flat: Any) -> Any:
        return tuple(_constrain(x, t) for x, t in zip(flat, targets, strict=True))

    fn = jax.jit(run, in_shardings=sources, out_shardings=targets)
    program = graph.program
    inputs = tuple(program.abstract(v, s) for (v, _, _), s in zip(moves, sources, strict=True))
    ids = tuple(v for v, _, _ in moves)
    return StandaloneProgram(fn, inputs, ids, ids)
