"""Realisation: Graph + Config + mesh -> a jittable sharded program.

The inlined step is re-executed primitive by primitive (`_jax_compat.evaluate`) with
`with_sharding_constraint` on every value a block owns and on the operands a block head wants
in its own layout, and with input and output shardings from the ShardingAssignment. XLA's SPMD
partitioner then inserts exactly the communication the configuration implies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from explorer import _jax_compat as jc
from explorer.errors import ArgumentMismatchError
from explorer.ir import Graph, ShardingAssignment
from explorer.mesh import named_sharding


@dataclass(frozen=True, slots=True)
class RealizedStep:
    """A sharded step with the original step's signature, and its shardings."""

    fn: Any  # the jitted function (jax.stages.Wrapped)
    in_shardings: tuple[Any, ...]  # pytree of NamedSharding per argument
    out_shardings: Any
    mesh: Mesh

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def lower(self, *args: Any) -> Any:
        return self.fn.lower(*args)


def realize(graph: Graph, assignment: ShardingAssignment, mesh: Mesh) -> RealizedStep:
    if graph.program is None:
        raise ArgumentMismatchError("this Graph carries no program to realise (was it traced?)")
    # graph op ids are the whole program's equation indices
    constrain_value, constrain_operand = _hooks(
        assignment, mesh, {op.id: op.id for op in graph.ops}
    )
    program = graph.program

    def sharded_step(*args: Any) -> Any:
        flat, tree = jax.tree_util.tree_flatten(args)
        if tree != graph.in_tree:
            raise ArgumentMismatchError(
                f"expected arguments with the traced structure\n{graph.in_tree}\nfound\n{tree}"
            )
        results = jc.evaluate(program, flat, constrain_value, constrain_operand)
        return jax.tree_util.tree_unflatten(graph.out_tree, results)

    in_shardings = jax.tree_util.tree_unflatten(
        graph.in_tree, [named_sharding(mesh, d) for d in assignment.inputs]
    )
    out_shardings = jax.tree_util.tree_unflatten(
        graph.out_tree, [named_sharding(mesh, d) for d in assignment.outputs]
    )
    fn = jax.jit(sharded_step, in_shardings=tuple(in_shardings), out_shardings=out_shardings)
    return RealizedStep(fn, tuple(in_shardings), out_shardings, mesh)


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
        return self.fn.lower(*self.inputs)


def segment_program(
    graph: Graph,
    ops: tuple[int, ...],
    assignment: ShardingAssignment,
    mesh: Mesh,
    input_layouts: dict[int, Any] | None = None,
) -> StandaloneProgram:
    """The ops of one segment instance as a program of their own.

    Its inputs are every value the ops read but do not make: step inputs keep the layout the
    assignment gives them, values listed in `input_layouts` (the boundary tensors) arrive in
    that layout, and anything else arrives replicated. Block values inside keep their
    sharding constraints, so the partitioner inserts the same communication as in the step.
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
    constrain_value, constrain_operand = _hooks(assignment, mesh, eqn_position)

    def run(*flat: Any) -> Any:
        return tuple(jc.evaluate(program, flat, constrain_value, constrain_operand))

    fn = jax.jit(run, in_shardings=tuple(shardings))
    inputs = tuple(program.abstract(v, s) for v, s in zip(program.invars, shardings, strict=True))
    return StandaloneProgram(fn, inputs, program.invars, program.outvars)


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
