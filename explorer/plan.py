"""Plans: what the solver chose, as versioned JSON that applies back to the step.

A plan carries the mesh, the platform and backend it was priced on, the model's fingerprint,
one configuration per segment instance, one strategy per block with the `PartitionSpec` of
every value the block owns, a `PartitionSpec` per parameter, and the predicted time and memory.
A per-op plan (the Alpa-style ILP) also carries a `PartitionSpec` for every value (`values`,
by value id) and for what each contraction reads (`operands`, by "op:position"); when
`values` is present it, not the block strategies, is what applies.
`apply_plan` re-traces the user's step, checks it is the model the plan was made for, and
returns a jitted sharded step with the same signature. `evaluate` compiles the whole step under
the plan and prices it on the plan's platform: the ground truth predictions are judged on.

This module applies plans; the `Plan` type lives in `explorer.plan_types`, building plans in
`explorer.plan_build`, their JSON form (saving, loading, checking) in `explorer.plan_document`
and evaluation in `explorer.evaluation`, all re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from explorer.evaluation import (
    Evaluation,
    LoweredStep,
    evaluate,
    evaluate_each,
    evaluate_on,
    lower_step,
)
from explorer.ir import (
    Config,
    DimAxes,
    Graph,
    ParallelBlock,
    ShardingAssignment,
    TensorType,
    ValueKind,
)
from explorer.layouts import place
from explorer.mesh import MeshSpec, make_mesh
from explorer.plan_build import make_layout_plan, make_plan, model_fingerprint
from explorer.plan_document import (
    MAX_PLAN_BYTES,
    MAX_PLAN_DEPTH,
    SCHEMA_PATH,
    SCHEMA_VERSION,
    PlanError,
    _check_plan_and_step,
    load_plan,
    writable_path,
)
from explorer.plan_space import space_of
from explorer.plan_types import Plan
from explorer.realize import realize
from explorer.trace import trace

__all__ = [
    "MAX_PLAN_BYTES",
    "MAX_PLAN_DEPTH",
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "Evaluation",
    "LoweredStep",
    "Plan",
    "PlanError",
    "apply_plan",
    "evaluate",
    "evaluate_each",
    "evaluate_on",
    "load_plan",
    "lower_step",
    "make_layout_plan",
    "make_plan",
    "model_fingerprint",
    "writable_path",
]

# -- applying a plan ----------------------------------------------------------------------------


def _configure(
    plan: Plan, step: Callable[..., Any], args: Sequence[Any], *, keep_loops: bool = False
) -> tuple[Graph, Any]:
    """Trace `step`, check it is the plan's model and mesh, and build its sharding assignment.

    With `keep_loops` (the step will run its scans as scans) every iteration of a scan must
    take the same strategies (`_check_loops_uniform`)."""
    mesh = plan.mesh
    if jax.device_count() < mesh.size:
        raise PlanError(
            f"field 'mesh': the plan needs {mesh.size} devices ({mesh}), JAX sees "
            f"{jax.device_count()}. On CPU set XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{mesh.size} before importing JAX, or join more processes."
        )
    graph = trace(step, *args)
    found = model_fingerprint(graph)
    if found != plan.model_fingerprint:
        raise PlanError(
            f"field 'model_fingerprint': the plan was made for model "
            f"{plan.model_fingerprint}, this step traces to {found} (another "
            "architecture, size or batch). Plan this step again."
        )
    if plan.per_op:  # a per-op plan: its layouts stand as they are
        return graph, _layout_assignment(plan, graph)
    wanted = plan.strategies
    analysis, segmentation = space_of(plan, graph)
    if len(wanted) != len(analysis.blocks):
        raise PlanError(
            f"field 'blocks': the plan has {len(wanted)} blocks, the step has "
            f"{len(analysis.blocks)}"
        )
    choices = []
    for block, name in zip(analysis.blocks, wanted, strict=True):
        names = [s.name for s in block.strategies]
        if name not in names:
            raise PlanError(
                f"field 'blocks.{block.index}.strategy': {name!r} is not a strategy of block "
                f"{block.index} ({block.scope}) on mesh {mesh}; expected one of {names}"
            )
        choices.append(names.index(name))
    if keep_loops:
        _check_loops_uniform(graph, analysis.blocks, wanted)
    # the plan's parameter layouts stand (they differ from the blocks' for FSDP)
    parameters = plan.parameter_layouts
    config = Config(tuple(choices))
    placement = place(
        graph, analysis.blocks, config, mesh, segmentation, parameter_layouts=parameters
    )
    return graph, placement.assignment


def _check_loops_uniform(
    graph: Graph, blocks: Sequence[ParallelBlock], strategies: Sequence[str]
) -> None:
    """Each block of a scan's later iterations takes the strategy of the same block of its
    first iteration: the scan that runs has one body, laid out as the first iteration."""
    by_head = {block.head: block for block in blocks}
    for loop in graph.loops:
        first = loop.iterations[0]
        for position, iteration in enumerate(loop.iterations[1:], start=1):
            for block in blocks:
                if not iteration.start <= block.head < iteration.stop:
                    continue
                same = by_head.get(first.start + block.head - iteration.start)
                if same is None or strategies[same.index] != strategies[block.index]:
                    found = "no block" if same is None else repr(strategies[same.index])
                    raise PlanError(
                        f"field 'blocks.{block.index}.strategy': the plan gives block "
                        f"{block.index} ({block.scope}), in iteration {position} of the scan at "
                        f"{loop.source_line}, strategy {strategies[block.index]!r}; the same "
                        f"block of iteration 0 has {found}. apply_plan keeps the scan, whose "
                        "iterations share one configuration: plan with "
                        "Analysis.plan(uniform=True) (the default for a step with a scan)."
                    )


def _layout_assignment(plan: Plan, graph: Graph) -> ShardingAssignment:
    """The assignment of a per-op plan, each layout checked against the traced step."""
    from explorer.layouts import layout_assignment

    mesh = plan.mesh
    values: dict[int, DimAxes] = {}
    for key, spec in plan.values or ():
        where = f"values.{key}"
        if key >= len(graph.values):
            raise PlanError(
                f"field '{where}': expected the id of a value of this step (0 to "
                f"{len(graph.values) - 1}), found {key}"
            )
        value = graph.values[key]
        if value.kind is ValueKind.CONSTANT:
            raise PlanError(
                f"field '{where}': value {key} is a constant of the step; only step inputs and "
                "op results take a layout"
            )
        values[value.id] = _checked_spec(spec, value.type, mesh, where, f"value {key}")
    operands: dict[tuple[int, int], DimAxes] = {}
    for (op_id, position), spec in plan.operands or ():
        where = f"operands.{op_id}:{position}"
        if op_id >= len(graph.ops):
            raise PlanError(
                f"field '{where}': expected 'op:position' naming an op of this step (op 0 to "
                f"{len(graph.ops) - 1}), found '{op_id}:{position}'"
            )
        op = graph.ops[op_id]
        if position >= len(op.inputs):
            raise PlanError(
                f"field '{where}': op {op.id} ({op.primitive}) has {len(op.inputs)} operands, "
                f"found position {position}"
            )
        operands[(op.id, position)] = _checked_spec(
            spec, op.input_types[position], mesh, where, f"operand {position} of op {op.id}"
        )
    return layout_assignment(graph, mesh, values, operands)


def _checked_spec(spec: DimAxes, tt: TensorType, mesh: MeshSpec, where: str, what: str) -> DimAxes:
    if len(spec) != tt.rank:
        raise PlanError(
            f"field '{where}': expected {tt.rank} entries, one per dim of {what} {tt}, found "
            f"{len(spec)}"
        )
    seen: set[str] = set()
    dims = []
    for dim, axes in enumerate(spec):
        names = tuple(axes)
        for name in names:
            if name not in mesh.names:
                raise PlanError(
                    f"field '{where}': dim {dim} of {what} names mesh axis {name!r}; mesh "
                    f"{mesh} has axes {list(mesh.names)}"
                )
            if name in seen:
                raise PlanError(f"field '{where}': mesh axis {name!r} splits {what} twice")
            seen.add(name)
        parts = mesh.axes_size(names)
        if tt.shape[dim] % parts:
            raise PlanError(
                f"field '{where}': dim {dim} of {what} {tt} has size {tt.shape[dim]}, which does "
                f"not split evenly into {parts} parts over mesh axes {'+'.join(names)}"
            )
        dims.append(names)
    return tuple(dims)


def apply_plan(plan: Plan, step: Callable[..., Any], *, donate: bool = True) -> Callable[..., Any]:
    """A jitted sharded version of `step`, with the same signature and results.

    With `donate` (the default, as training loops run: `state = step(state, batch)`), the
    parameters and optimizer state passed in are donated to the updated ones returned: arrays
    already laid out as the plan wants are consumed by the call. `donate=False` keeps them.

    A `scan` of the step stays a scan (a while loop in the compiled program, not unrolled):
    its body runs under the layouts the plan gives the scan's first iteration, so a block
    plan must give every iteration the same strategies (PlanError otherwise); a per-op plan
    applies its first iteration's layouts to all.
    """
    _check_plan_and_step(plan, step, "apply_plan")
    realised: dict[Any, Any] = {}

    def sharded_step(*args: Any) -> Any:
        key = (
            jax.tree_util.tree_structure(args),
            tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(args)),
        )
        if key not in realised:
            graph, assignment = _configure(plan, step, args, keep_loops=True)
            realised[key] = realize(
                graph, assignment, make_mesh(plan.mesh), donate=donate, keep_loops=True
            )
        return realised[key](*args)

    def lower(*args: Any) -> Any:
        """Lower the sharded step for `args` (as `jax.jit(...).lower` does)."""
        graph, assignment = _configure(plan, step, args, keep_loops=True)
        mesh = make_mesh(plan.mesh)
        return realize(graph, assignment, mesh, donate=donate, keep_loops=True).lower(*args)

    sharded_step.__name__ = f"sharded_{getattr(step, '__name__', 'step')}"
    sharded_step.lower = lower  # type: ignore[attr-defined]
    return sharded_step
