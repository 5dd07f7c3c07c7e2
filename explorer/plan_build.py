"""Building plans: the solver's choice (or a per-op baseline's layouts) as a `Plan`."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import jax

from explorer.errors import PlanError
from explorer.ir import BlockAnalysis, Config, DimAxes, Graph, Segmentation, ValueKind
from explorer.layouts import MOVED_ONCE, boundary_shared_moves
from explorer.mesh import MeshSpec
from explorer.plan_space import recorded_space
from explorer.plan_types import (
    PAPER_SPACE,
    BlockChoice,
    IlpReport,
    InstanceChoice,
    Plan,
    Prediction,
    SpaceOptions,
    Versions,
)
from explorer.space import scattering_marks, shardings

if TYPE_CHECKING:
    from explorer.platforms import PlatformLike


def model_fingerprint(graph: Graph) -> str:
    """Identity of a traced step: every op, its params and its shapes, in order (hashed once
    per graph: every plan made of it names it)."""
    return graph.derived("model_fingerprint", _fingerprint)


def _fingerprint(graph: Graph) -> str:
    hasher = hashlib.sha256()
    for op in graph.ops:
        hasher.update(repr((op.primitive, op.params, [str(t) for t in op.input_types])).encode())
    return hasher.hexdigest()[:16]


def unpriced_segments(
    segmentation: Segmentation, strategies: Sequence[str]
) -> tuple[InstanceChoice, ...]:
    """Each instance's configuration named by its blocks' `strategies` (per block), with no
    cost of its own: a plan priced as a whole step, not composed from segment profiles."""
    return tuple(
        InstanceChoice(
            label=instance.label,
            type=instance.unique_id,
            configuration=",".join(strategies[b] for b in instance.blocks) or "none",
            time=0.0,
            persistent_memory=0,
            transient_memory=0,
            saved_memory=0,
            gradient_memory=0,
        )
        for instance in segmentation.instances
    )


def make_plan(
    *,
    source: str,
    graph: Graph,
    blocks: BlockAnalysis,
    segments: Sequence[InstanceChoice],
    config: Config,
    mesh: MeshSpec,
    platform: PlatformLike,
    backend: str,
    time: float,
    memory: int,
    memory_eq9: int,
    budget: float | None,
    parameter_layouts: dict[str, DimAxes] | None = None,
    boundary_rules: tuple[str, ...] = (),
    space: SpaceOptions = PAPER_SPACE,
    segmentation: Segmentation | None = None,
) -> Plan:
    """The block plan of `config` in `blocks` (the space `space` made), as the solver or a
    baseline priced it. With the `segmentation` its whole step is placed on, the plan is
    marked `MOVED_ONCE` where readers share a boundary tensor's move (`shared_moves`)."""
    assignment = shardings(graph, blocks.blocks, config, mesh, parameter_layouts)
    values = dict(assignment.values)
    inputs = dict(zip(graph.inputs, assignment.inputs, strict=True))
    choices = []
    chosen = [b.strategies[c] for b, c in zip(blocks.blocks, config.choices, strict=True)]
    for block, strategy in zip(blocks.blocks, chosen, strict=True):
        head = graph.ops[block.head]
        owned = sorted(
            # membership, not truth: a rank-0 value's layout is `()`, falsy but present
            (layout.value, values[layout.value] if layout.value in values else inputs[layout.value])
            for layout in block.layouts
            if layout.value in values or layout.value in inputs
        )
        choices.append(
            BlockChoice(
                index=block.index,
                scope=block.scope,
                head=f"{head.input_types[0]} x {head.input_types[1]}",
                strategy=strategy.name,
                values=tuple(dict(owned).items()),
            )
        )
    parameters = {
        graph.values[vid].path: dims
        for vid, dims in inputs.items()
        if graph.values[vid].kind is ValueKind.PARAMETER
    }
    return _finish(
        source=source,
        graph=graph,
        mesh=mesh,
        platform=platform,
        backend=backend,
        segments=tuple(segments),
        blocks=tuple(choices),
        parameters=parameters,
        predicted=Prediction(time, int(memory), int(memory_eq9), budget),
        boundary_rules=boundary_rules
        + scattering_marks(chosen)
        + _moved_once(graph, blocks, config, mesh=mesh, segmentation=segmentation),
        space=recorded_space(graph, blocks, mesh, space, [c.strategy for c in choices]),
    )


def _moved_once(
    graph: Graph,
    blocks: BlockAnalysis,
    config: Config,
    *,
    mesh: MeshSpec,
    segmentation: Segmentation | None,
) -> tuple[str, ...]:
    """`(MOVED_ONCE,)` where the whole step placed on `segmentation` shares a move (found
    from its boundaries alone: the parameters' layouts do not change what crosses them)."""
    if segmentation is None:
        return ()
    shared = boundary_shared_moves(graph, blocks.blocks, config, mesh, segmentation)
    return (MOVED_ONCE,) if shared else ()


def make_layout_plan(
    *,
    source: str,
    graph: Graph,
    blocks: BlockAnalysis,
    segmentation: Segmentation,
    mesh: MeshSpec,
    platform: PlatformLike,
    backend: str,
    time: float,
    memory: int,
    budget: float | None,
    values: Mapping[int, DimAxes],
    operands: Mapping[tuple[int, int], DimAxes],
    op_strategies: Mapping[int, str],
    ilp: IlpReport | None = None,
) -> Plan:
    """A per-op plan: a layout for every value (step inputs included) and for what each
    contraction reads. Blocks and segments are reported for display only: each block under
    the strategy its head contraction took (prefixed with `source`)."""
    replicated = ((),)

    def layout(vid: int) -> DimAxes:
        return values.get(vid, replicated * graph.values[vid].type.rank)

    choices = []
    for block in blocks.blocks:
        head = graph.ops[block.head]
        owned = sorted({v.value: layout(v.value) for v in block.layouts}.items())
        choices.append(
            BlockChoice(
                index=block.index,
                scope=block.scope,
                head=f"{head.input_types[0]} x {head.input_types[1]}",
                strategy=f"{source}:{op_strategies.get(block.head, 'R')}",
                values=tuple(owned),
            )
        )
    segments = unpriced_segments(segmentation, [c.strategy for c in choices])
    parameters = {
        value.path: layout(value.id) for value in graph.inputs_of_kind(ValueKind.PARAMETER)
    }
    return _finish(
        source=source,
        graph=graph,
        mesh=mesh,
        platform=platform,
        backend=backend,
        segments=segments,
        blocks=tuple(choices),
        parameters=parameters,
        predicted=Prediction(time, int(memory), int(memory), budget),
        values=tuple(sorted(values.items())),
        operands=tuple(sorted(operands.items())),
        ilp=ilp,
    )


def _finish(
    *,
    source: str,
    graph: Graph,
    mesh: MeshSpec,
    platform: PlatformLike,
    backend: str,
    segments: tuple[InstanceChoice, ...],
    blocks: tuple[BlockChoice, ...],
    parameters: dict[str, DimAxes],
    predicted: Prediction,
    values: tuple[tuple[int, DimAxes], ...] | None = None,
    operands: tuple[tuple[tuple[int, int], DimAxes], ...] | None = None,
    ilp: IlpReport | None = None,
    boundary_rules: tuple[str, ...] = (),
    space: SpaceOptions | None = None,
) -> Plan:
    from explorer import __version__
    from explorer.platforms import resolve_platform

    # Not validated against the schema here: the solver builds one per slider step, and
    # validating a plan of a 48-layer model takes a second. What leaves the process (save,
    # to_json) and what comes in (load_plan) is validated.
    priced_on = resolve_platform(platform)
    if predicted.budget is not None and predicted.memory > predicted.budget:
        raise PlanError(f"plan memory {predicted.memory} exceeds its budget {predicted.budget}")
    return Plan(
        source=source,
        mesh=mesh,
        platform_name=priced_on.name,
        # in full: a scaled or calibrated platform has no file a name could be resolved to
        priced_on=priced_on,
        backend=backend,
        model_fingerprint=model_fingerprint(graph),
        segments=segments,
        blocks=blocks,
        parameters=tuple(sorted(parameters.items())),
        predicted=predicted,
        versions=Versions(explorer=__version__, jax=jax.__version__),
        values=values,
        operands=operands,
        ilp=ilp,
        boundary_rules=boundary_rules,
        space=space,
    )
