"""The configuration space: strategies per block on a mesh, and a Config's shardings.

1-D mesh: one strategy per partitionable role of the block's head (E, M, N, K) whose dim
divides by the mesh size. 2-D mesh: by default the batch role M is pinned to the outer axis
(the paper's rule) and the inner axis takes any role (M again meaning M over both axes), so
a dense block's space has the size of the 1-D one. The expert role E may also span both axes
(expert parallelism over the whole mesh, GShard's layout): like M it splits with no partial
sums, and without it a 2-D mesh could not hold the experts' 1-D plan. `whole_mesh=True`
also offers every other role split over the whole mesh: the 1-D strategies of the flattened
mesh, so a 2-D plan can be what the same devices' 1-D plan would be (tensor parallelism over
all of them, where the batch is too small to split that far) and mix it with the pinned
strategies block by block. `free_axes=True` enumerates every axis-to-role assignment (the
whole-mesh ones among them). `batch_outer=True` builds the blocks with primed roles where
the batch splits over the outer axis but not over the whole mesh (`DimRole`: M' on the
batch of 4 where M, placed for 8 parts, takes the sequence), and pins M' (else E') to the
outer axis beside the paper's strategies, each with every unprimed role on the inner axis.
`batch_inner=True` is the paper's rule with the axes swapped: the batch pinned to the inner
axis (M over both, or M on the inner axis with any role on the outer one), its blocks primed
for the inner axis's size and M' (else E') pinned there, so a step whose batch does not
split over every device can still split it inside each node and its weights across the
nodes (Megatron across, data parallel within: the layout the ILP's winning plans share).
`contract_last=True` (`step_space`) builds the blocks with K on a head's last contracted dim
that splits evenly, not its first: a combine einsum's experts instead of its capacity, so
an expert-parallel plan can sum the experts' outputs where they lie. With
`stored_parameters` a block owning parameters also gets ZeRO-3 twins: each batch-splitting
strategy once more, its parameters kept sharded over the batch axes between steps
(`Strategy.stored`). With
`sequence_parallel` each strategy splitting K, or N and not K, gets a scattering twin:
partial sums reduce-scattered onto M instead of all-reduced (`Strategy.scattered`,
Megatron's sequence parallelism block by block). A strategy that cannot
apply is kept in `ParallelBlock.excluded` with the reason; a block left with none keeps only
the replicated strategy.

`shardings()` turns a Config into a layout for every value the blocks own (by propagation,
computed in blocks.py), the step's parameters and their optimizer state (from the consuming
block), and the step's results (matched to the inputs they update). `layouts.place` builds
on it to place every other value of the step, so nothing is left to the compiler's sharding
propagation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

from explorer import affine
from explorer.blocks import build_blocks
from explorer.errors import AnalysisError
from explorer.ir import (
    CONTRACTION_PRIMITIVES,
    BlockAnalysis,
    Config,
    DimAxes,
    DimRole,
    ExcludedStrategy,
    Graph,
    OpNode,
    ParallelBlock,
    Role,
    Scatter,
    Segmentation,
    ShardingAssignment,
    Strategy,
    ValueKind,
    ValueLayout,
    match_suffix,
    path_suffix,
)
from explorer.mesh import MeshSpec

REPLICATED = Strategy(())


def build_space(
    analysis: BlockAnalysis,
    mesh: MeshSpec,
    *,
    free_axes: bool = False,
    whole_mesh: bool = False,
    stored_parameters: frozenset[int] = frozenset(),
    sequence_parallel: bool = False,
    batch_inner: bool = False,
) -> BlockAnalysis:
    """The same blocks, each with its strategies (and excluded strategies) on `mesh`
    (`free_axes`, `whole_mesh`, `batch_inner`: the 2-D spaces the module docstring
    describes; `batch_inner` wants blocks primed for the inner axis, `step_blocks`).

    `sequence_parallel` adds, after every plain strategy, each one splitting K (or N) again
    with its partial sums (its input gradient's) reduce-scattered onto M
    (`Strategy.scattered`, `scattered_twins`).

    `stored_parameters` (value ids of the step's parameters; `parameter_ids`) adds the
    ZeRO-3 twins: a block owning one of them gets, beside each strategy that splits its
    batch, the same strategy keeping those parameters sharded over the batch axes
    (`Strategy.stored`), listed after every plain strategy."""
    blocks = []
    batch_axis = _batch_axis(mesh, batch_inner)
    for block in analysis.blocks:
        kept, excluded = block_strategies(
            block, mesh, free_axes=free_axes, whole_mesh=whole_mesh, batch_axis=batch_axis
        )
        if sequence_parallel:
            kept = kept + scattered_twins(block, kept, mesh)
        if any(layout.value in stored_parameters for layout in block.layouts):
            kept = kept + stored_twins(kept)
        blocks.append(replace(block, strategies=kept, excluded=excluded))
    return replace(analysis, blocks=tuple(blocks))


def step_space(
    graph: Graph,
    mesh: MeshSpec,
    *,
    free_axes: bool = False,
    whole_mesh: bool = False,
    shard_parameters: bool = False,
    batch_outer: bool = False,
    sequence_parallel: bool = False,
    batch_inner: bool = False,
    contract_last: bool = False,
) -> BlockAnalysis:
    """The step's ParallelBlocks with their strategies on `mesh`: the space `analyze` and
    the cluster's profiler search (`shard_parameters`: with ZeRO twins;
    `sequence_parallel`: with scattering twins; `contract_last`: K on a head's last
    contracted dim that splits evenly, `build_blocks`)."""
    stored = parameter_ids(graph) if shard_parameters else frozenset[int]()
    blocks = step_blocks(
        graph, mesh, batch_outer=batch_outer, batch_inner=batch_inner, contract_last=contract_last
    )
    return build_space(
        blocks,
        mesh,
        free_axes=free_axes,
        whole_mesh=whole_mesh,
        stored_parameters=stored,
        sequence_parallel=sequence_parallel,
        batch_inner=batch_inner,
    )


def step_blocks(
    graph: Graph,
    mesh: MeshSpec,
    *,
    batch_outer: bool = False,
    batch_inner: bool = False,
    contract_last: bool = False,
) -> BlockAnalysis:
    """The step's ParallelBlocks on `mesh`, with primed roles for the axis the batch is
    pinned to if `batch_outer` (the outer axis) or `batch_inner` (the inner one), where the
    mesh has one: a 1-D mesh's blocks are the paper's; `contract_last` as `build_blocks`."""
    if batch_outer and batch_inner:
        raise AnalysisError(
            "expected the batch pinned to one mesh axis, batch_outer or batch_inner, found "
            "both asked for"
        )
    size = mesh.shape[_batch_axis(mesh, batch_inner)]
    primed = size if (batch_outer or batch_inner) and 1 < size < mesh.size else None
    # once per graph and split: every space and mesh of that many devices shares the blocks
    # (primed for 4 parts, the blocks of 4x4's outer and inner axes are the same)
    return graph.derived(
        f"blocks for {mesh.size} parts, primed for {primed}, contract last {contract_last}",
        lambda graph: build_blocks(graph, mesh.size, primed, contract_last=contract_last),
    )


def _batch_axis(mesh: MeshSpec, batch_inner: bool) -> int:
    """The index of the mesh axis the batch is pinned to (and a primed role lives on):
    the inner one in the batch-inner space, else the outer one (the paper's rule)."""
    return len(mesh.axes) - 1 if batch_inner else 0


def parameter_ids(graph: Graph) -> frozenset[int]:
    """The value ids of the step's parameters (what `build_space` may store sharded)."""
    return frozenset(v.id for v in graph.inputs_of_kind(ValueKind.PARAMETER))


def stored_twins(strategies: tuple[Strategy, ...]) -> tuple[Strategy, ...]:
    """Per strategy splitting the batch (M or M'), its twin storing the parameters over
    those axes.

    The batch axes are exactly where such a block holds its weights whole (M never splits a
    weight), so that is where keeping them sharded saves memory without changing the
    block's computation."""
    return tuple(
        replace(strategy, stored=_batch_axes(strategy))
        for strategy in strategies
        if _batch_axes(strategy) and not strategy.stored
    )


def scattered_twins(
    block: ParallelBlock, strategies: tuple[Strategy, ...], mesh: MeshSpec
) -> tuple[Strategy, ...]:
    """Per strategy splitting K, or N and not K, whose M dim also splits over those axes,
    its twin reduce-scattering partial sums onto M (`Strategy.scattered`): Megatron's
    sequence parallelism where M is the sequence, chosen block by block.

    Splitting K (row parallel), the head's partial sums: the plain strategy all-reduces
    them and every op after the head computes on whole activations, the same on every
    device; the twin reduce-scatters them (half an all-reduce's bytes), and those ops (a
    residual add, a norm, dropout) compute and keep their activations on M-shards instead.
    Splitting N (column parallel), the input gradient's: the backward contraction over N
    that makes it leaves partial sums the plain strategy all-reduces; the twin
    reduce-scatters them, so the gradient reaches the ops before the block (the norm a row
    parallel twin left on M-shards) as those ops hold it. Whoever wants either whole
    gathers it (the other half), which the boundary between the blocks prices."""
    sizes = dict(block.role_sizes)
    if DimRole.M not in sizes:
        return ()
    twins = []
    for strategy in strategies:
        role = strategy.partial_sum_role
        over = strategy.axes_of(role)
        if not over or strategy.stored or strategy.scattered:
            continue
        if not block.partial_sums_over(role):
            continue  # nothing to scatter: the twin would be the plain strategy again
        if sizes[DimRole.M] % mesh.axes_size(strategy.axes_of(DimRole.M) + over) == 0:
            twins.append(replace(strategy, scattered=over))
    return tuple(twins)


def _batch_axes(strategy: Strategy) -> tuple[str, ...]:
    return strategy.axes_of(DimRole.M_OUTER) + strategy.axes_of(DimRole.M)


def block_strategies(
    block: ParallelBlock,
    mesh: MeshSpec,
    *,
    free_axes: bool = False,
    whole_mesh: bool = False,
    batch_axis: int = 0,
) -> tuple[tuple[Strategy, ...], tuple[ExcludedStrategy, ...]]:
    """`block`'s strategies on `mesh` and those excluded, with why; `batch_axis` is the
    index of the mesh axis the batch is pinned to (and a primed role lives on): the outer
    one by the paper's rule, the inner one in the batch-inner space."""
    sizes = dict(block.role_sizes)
    candidates = _candidates(
        block.roles, mesh, free_axes=free_axes, whole_mesh=whole_mesh, batch_axis=batch_axis
    )
    if len(mesh.axes) > 1 and not free_axes and DimRole.M not in sizes:
        candidates = _candidates(
            block.roles, mesh, free_axes=True, whole_mesh=False, batch_axis=batch_axis
        )
    kept: list[Strategy] = []
    excluded: list[ExcludedStrategy] = []
    for strategy in candidates:
        reason = _why_not(strategy, sizes, mesh)
        if reason is None:
            kept.append(strategy)
        else:
            excluded.append(ExcludedStrategy(strategy, reason))
    if not kept:
        kept.append(REPLICATED)
        excluded.append(
            ExcludedStrategy(
                REPLICATED,
                f"no dim of the head ({', '.join(f'{r.value}={n}' for r, n in block.role_sizes)})"
                f" divides evenly over mesh {mesh}: the block stays replicated",
            )
        )
    return tuple(kept), tuple(excluded)


def _candidates(
    roles: tuple[DimRole, ...],
    mesh: MeshSpec,
    *,
    free_axes: bool,
    whole_mesh: bool,
    batch_axis: int = 0,
) -> list[Strategy]:
    """The strategies to try, in order, with the batch pinned to axis `batch_axis` of a
    2-D mesh (where a primed role lives too: its blocks were primed for that axis's size)."""
    names = mesh.names
    plain = [role for role in roles if not role.outer_only]  # a primed one: the batch axis's
    if len(names) == 1:
        return [Strategy(((role, names),)) for role in plain]
    pinned = names[batch_axis]
    others = tuple(name for name in names if name != pinned)
    if not free_axes:
        out = []
        for role in plain:
            if role is DimRole.M:
                out.append(Strategy(((DimRole.M, names),)))
            else:
                out.append(_by_axis({DimRole.M: (pinned,), role: others}, names))
            if role is DimRole.E:  # experts over the whole mesh, as the batch can be
                out.append(Strategy(((DimRole.E, names),)))
        # after the paper's strategies (their indices stay the same): the batch's own dim
        # on the pinned axis, where M or E took another one to split over the whole mesh
        batch = next((r for r in (DimRole.M_OUTER, DimRole.E_OUTER) if r in roles), None)
        if batch is not None:
            out += [_by_axis({batch: (pinned,), role: others}, names) for role in plain]
        if whole_mesh:
            whole = (Strategy(((role, names),)) for role in plain)
            out += [strategy for strategy in whole if strategy not in out]
        return out
    out = []
    # a primed role on the batch's axis alone
    per_axis = [roles if name == pinned else plain for name in names]
    for choice in itertools.product(*per_axis):
        grouped: dict[DimRole, tuple[str, ...]] = {}
        for axis, role in zip(names, choice, strict=True):
            grouped[role] = (*grouped.get(role, ()), axis)
        out.append(_by_axis(grouped, names))
    return out


def _by_axis(grouped: Mapping[DimRole, tuple[str, ...]], names: tuple[str, ...]) -> Strategy:
    """The strategy assigning each role its axes, its roles in the order of their first
    axis on the mesh (how a strategy is named and compared)."""
    return Strategy(tuple(sorted(grouped.items(), key=lambda kv: names.index(kv[1][0]))))


def _why_not(strategy: Strategy, sizes: dict[DimRole, int], mesh: MeshSpec) -> str | None:
    for role, axes in strategy.assignment:
        parts = mesh.axes_size(axes)
        if sizes[role] % parts:
            return (
                f"{role.value} has size {sizes[role]}, which does not divide into {parts} "
                f"parts over mesh axes {'+'.join(axes)}"
            )
    return None


def config_count(blocks: tuple[ParallelBlock, ...]) -> int:
    return math.prod(len(b.strategies) for b in blocks)


# -- Config -> shardings ---------------------------------------------------------------------


def shardings(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    config: Config,
    mesh: MeshSpec,
    parameter_layouts: Mapping[str, DimAxes] | None = None,
) -> ShardingAssignment:
    """The layout of every constrained value under `config`.

    `parameter_layouts` (by parameter path) overrides where parameters live, e.g. sharded
    over the data axis as FSDP/ZeRO-3 keeps them; their optimizer state follows.
    """
    if len(config.choices) != len(blocks):
        raise AnalysisError(
            f"expected a configuration with one strategy per block ({len(blocks)} blocks), "
            f"found {len(config.choices)} choices"
        )
    values: dict[int, DimAxes] = {}
    storing: dict[int, tuple[str, ...]] = {}  # parameter id -> axes its block stores it over
    operands: list[tuple[int, int, DimAxes]] = []
    scatters: list[Scatter] = []
    for block, choice in zip(blocks, config.choices, strict=True):
        if not 0 <= choice < len(block.strategies):
            raise AnalysisError(
                f"block {block.index} ({block.scope}): strategy index {choice} out of range; "
                f"it has {len(block.strategies)} strategies"
            )
        strategy = block.strategies[choice]
        for layout in block.layouts:
            values[layout.value] = dim_axes(graph, layout, strategy)
            storing[layout.value] = strategy.stored
        for operand in block.operand_layouts:
            # the head reads its operands whole on M: a column-parallel twin gathers its input
            wanted = dim_axes(graph, operand.layout, strategy, scattering=False)
            operands.append((operand.op, operand.position, wanted))
        scatters.extend(_scatters(graph, block, strategy))
        operands.extend(_gathered_reads(graph, block, strategy))
    stored = _stored_parameters(graph, values, storing, mesh)
    inputs = _input_shardings(graph, values, {**stored, **(parameter_layouts or {})})
    outputs = _output_shardings(graph, inputs)
    _pin_optimizer_updates(graph, outputs, values)
    input_ids = set(graph.inputs)
    internal = tuple(sorted((v, d) for v, d in values.items() if v not in input_ids))
    return ShardingAssignment(
        mesh.axes, inputs, outputs, internal, tuple(operands), tuple(scatters)
    )


def _scatters(graph: Graph, block: ParallelBlock, strategy: Strategy) -> list[Scatter]:
    """The contractions of `block` whose partial sums `strategy` reduce-scatters
    (`ParallelBlock.partial_sums`): splitting K, the head; splitting N, the backward
    contraction making the head's input gradient."""
    role = strategy.scattering_role
    if role is None:
        return []
    return [_scatter(graph, block, strategy, graph.ops[op]) for op in block.partial_sums_over(role)]


def _gathered_reads(
    graph: Graph, block: ParallelBlock, strategy: Strategy
) -> list[tuple[int, int, DimAxes]]:
    """Under a scattering strategy, how the block's other contractions read what it keeps on
    M-shards: whole on M, as the plain strategy has them (the head's operands as the head
    reads them), gathered once where the twin scattered them: Megatron's backward pass.

    Left to the partitioner, a contraction reading one operand on M-shards and another split
    on K or N follows the M-shards (`layouts.place`'s leader): a row parallel twin's weight
    gradient then sums over M-shards into a whole weight, for which XLA:CPU gathered the
    head's four times wider input, and every device computed all of it."""
    role = strategy.scattering_role
    if role is None:
        return []
    scattered = set(block.partial_sums_over(role))
    asked = {(o.op, o.position) for o in block.operand_layouts}  # read whole already
    head_reads = {o.layout.value: o.layout for o in block.operand_layouts if o.op == block.head}
    layouts = {layout.value: layout for layout in block.layouts}
    reads = []
    for op_id in block.forward_ops + block.backward_ops:
        op = graph.ops[op_id]
        if op.primitive not in CONTRACTION_PRIMITIVES or op_id in scattered:
            continue
        for position, vid in enumerate(op.inputs):
            if (op_id, position) in asked:
                continue
            owned = layouts.get(vid)
            if owned is not None:
                whole = dim_axes(graph, owned, strategy, scattering=False)
                if whole != dim_axes(graph, owned, strategy):
                    reads.append((op_id, position, whole))
            elif vid in head_reads:
                whole = dim_axes(graph, head_reads[vid], strategy, scattering=False)
                reads.append((op_id, position, whole))
    return reads


def _read_layouts(block: ParallelBlock, op: OpNode) -> list[ValueLayout | None]:
    """Per operand of `op`, the layout the block reads it in: as the block wants it read
    there, else as the block owns it (None: neither)."""
    wanted = {o.position: o.layout for o in block.operand_layouts if o.op == op.id}
    return [wanted.get(p) or block.layout_of(vid) for p, vid in enumerate(op.inputs)]


def _scatter(graph: Graph, block: ParallelBlock, strategy: Strategy, op: OpNode) -> Scatter:
    """How a scattered contraction computes: on its operands' layouts under the strategy (as
    the block wants them read, else as it owns them), its partial sums reduce-scattered over
    the scattering axes onto its result's M dim."""
    read = _read_layouts(block, op)
    if any(layout is None for layout in read):  # `ParallelBlock.partial_sums` knows them all
        raise AnalysisError(
            f"block {block.index} ({block.scope}): strategy {strategy.name} scatters the "
            f"partial sums of op {op.id} ({op.primitive}), but the block does not lay out "
            "all of its operands"
        )
    operands = tuple(dim_axes(graph, layout, strategy) for layout in read if layout is not None)
    result = block.layout_of(op.outputs[0])
    m_dim = result.dim_of(DimRole.M) if result is not None else None
    if result is None or m_dim is None:
        raise AnalysisError(
            f"block {block.index} ({block.scope}): strategy {strategy.name} scatters the "
            f"partial sums of op {op.id} ({op.primitive}) onto M, but its result has no M dim"
        )
    return Scatter(op.id, operands, dim_axes(graph, result, strategy), m_dim, strategy.scattered)


def _stored_parameters(
    graph: Graph,
    values: Mapping[int, DimAxes],
    storing: Mapping[int, tuple[str, ...]],
    mesh: MeshSpec,
) -> dict[str, DimAxes]:
    """By path, the layout each parameter a strategy stores sharded is kept in (only those
    whose layout that changes)."""
    stored: dict[str, DimAxes] = {}
    for vid, axes in storing.items():
        value = graph.values[vid]
        if not axes or value.kind is not ValueKind.PARAMETER:
            continue
        layout = stored_layout(value.type.shape, values[vid], axes, mesh)
        if layout != values[vid]:
            stored[value.path] = layout
    return stored


def stored_layout(
    shape: tuple[int, ...], used: DimAxes, axes: tuple[str, ...], mesh: MeshSpec
) -> DimAxes:
    """Where a parameter the block uses as `used` is kept when stored over `axes`: `axes`
    added to its largest whole dim they divide, else to its largest split dim they divide
    further; as `used` when no dim divides (or the parameter already spans those axes)."""
    if any(axis in split for split in used for axis in axes):
        return used
    parts = mesh.axes_size(axes)
    # the largest dims first: a weight's hidden dims, not a scan's stacked layer dim
    by_size = sorted(range(len(shape)), key=lambda d: -shape[d])
    candidates = [d for d in by_size if not used[d]] + [d for d in by_size if used[d]]
    for dim in candidates:
        if shape[dim] % (mesh.axes_size(used[dim]) * parts) == 0:
            return tuple((*split, *axes) if d == dim else split for d, split in enumerate(used))
    return used


def dim_axes(
    graph: Graph, layout: ValueLayout, strategy: Strategy, *, scattering: bool = True
) -> DimAxes:
    """Per dim of `layout`'s value, the mesh axes that split it under `strategy`.

    A scattering strategy (`Strategy.scattered`) also splits M over its scattering axes in
    every value that holds no dim of its scattering role (unless not `scattering`: how the
    head reads its operands). Splitting K: the head's result and what follows it, forward
    and backward, but not the head's operands (nor their gradients), which K splits there.
    Splitting N: the head's input gradient, which its backward contraction scatters."""
    dims: list[tuple[str, ...]] = [()] * graph.values[layout.value].type.rank
    role = strategy.scattering_role
    whole = not scattering or role is None or layout.dim_of(role) is not None
    scattered = () if whole else strategy.scattered
    for role, dim in layout.dims:
        axes = strategy.axes_of(role) + (scattered if role is DimRole.M else ())
        if axes:
            dims[dim] = dims[dim] + axes
    return tuple(dims)


def _input_shardings(
    graph: Graph, values: dict[int, DimAxes], overrides: Mapping[str, DimAxes]
) -> tuple[DimAxes, ...]:
    """Parameters from their block (or `overrides`); optimizer state like its parameter; the
    rest replicated."""

    def parameter(vid: int) -> DimAxes:
        value = graph.values[vid]
        if value.path in overrides:
            return tuple(tuple(axes) for axes in overrides[value.path])
        return values.get(vid, ((),) * value.type.rank)

    by_suffix: dict[tuple[str, tuple[int, ...]], DimAxes] = {}
    for vid in graph.inputs:
        value = graph.values[vid]
        if value.kind is ValueKind.PARAMETER:
            by_suffix[(path_suffix(value.path), value.type.shape)] = parameter(vid)
    out = []
    for vid in graph.inputs:
        value = graph.values[vid]
        rank = value.type.rank
        if value.kind is ValueKind.PARAMETER:
            out.append(parameter(vid))
        elif value.kind is ValueKind.OPTIMIZER_STATE:
            out.append(match_suffix(value.path, value.type.shape, by_suffix) or ((),) * rank)
        else:
            out.append(((),) * rank)
    return tuple(out)


def _output_shardings(graph: Graph, inputs: tuple[DimAxes, ...]) -> tuple[DimAxes, ...]:
    """A result that updates an input (new params, new optimizer state) keeps its layout."""
    by_suffix = {
        (path_suffix(graph.values[vid].path), graph.values[vid].type.shape): dims
        for vid, dims in zip(graph.inputs, inputs, strict=True)
    }
    out = []
    for vid, path in zip(
        graph.outputs, graph.output_paths or ("",) * len(graph.outputs), strict=True
    ):
        shape = graph.values[vid].type.shape
        out.append(by_suffix.get((path_suffix(path), shape), ((),) * len(shape)))
    return tuple(out)


def _pin_optimizer_updates(
    graph: Graph, outputs: tuple[DimAxes, ...], values: dict[int, DimAxes]
) -> None:
    """Keep each parameter's update in the parameter's layout.

    Left alone, the partitioner may shard the elementwise AdamW update of a replicated
    parameter and all-gather the result: communication no configuration asked for. Walking
    back from each updated parameter through optimizer ops of the same shape pins them.
    (A parameter a ZeRO twin stores sharded has its update pinned sharded: its gradient,
    all-reduced where the block made it, is read as a slice, a reduce-scatter on a GPU.)
    """

    pending = [
        (vid, dims) for vid, dims in zip(graph.outputs, outputs, strict=True) if vid not in values
    ]
    while pending:
        vid, dims = pending.pop()
        if vid in values:
            continue
        producer = graph.producer(vid)
        if producer is None or producer.role is not Role.OPTIMIZER:
            continue
        values[vid] = dims
        shape = graph.values[vid].type.shape
        for operand in producer.inputs:
            if graph.values[operand].type.shape == shape and operand not in values:
                pending.append((operand, dims))


# -- layouts at segment boundaries -----------------------------------------------------------


def wanted_layout(
    graph: Graph,
    block: ParallelBlock,
    strategy: Strategy,
    value: int,
    mesh: MeshSpec | None,
    *,
    owned_first: bool = True,
    ancestors: bool = True,
) -> DimAxes:
    """The layout `block` under `strategy` wants a tensor of `value`'s shape to arrive in.

    A value the block owns keeps its own layout: a cotangent its backward pass makes and
    hands back across the boundary (the residual stream's, passed through an output
    projection) is where the block made it. Then the head's operand layouts (the activation
    entering a layer), then the block's other values (`produced_layout`, which says what
    `mesh` is for). `owned_first=False` is the rule before owned values came first: the
    head's operand layout by shape alone, which laid such a cotangent out as the projection's
    input (split on the hidden dim) where the block holds it whole, so it was sliced where
    made, gathered again where read, and gathered by the block's own backward dots besides.
    `mesh=None` keeps the rule before tracing (`produced_layout`), which had no owned step
    either (`alpa.symbolic`'s per-configuration prices use it). Last, where none of those
    lays the value out, the tensors an operand was sliced or reshaped from
    (`_operand_ancestor_layout`): the fused QKV projection's cotangent, handed back to the
    projection past the scores block, arrives as the scores read the `q` and `k` sliced
    from it. `ancestors=False` is the rule before (`ancestors_changes`): it crossed
    replicated, gathered where the later segment made it.
    """
    if owned_first and mesh is not None:
        own = block.layout_of(value)
        if own is not None:
            return dim_axes(graph, own, strategy)
    shape = graph.values[value].type.shape
    for operand in block.operand_layouts:
        if graph.values[operand.layout.value].type.shape == shape:
            return dim_axes(graph, ValueLayout(value, operand.layout.dims), strategy)
    found = _produced_or_none(graph, block, strategy, value, mesh)
    if found is None and ancestors and mesh is not None:
        found = _operand_ancestor_layout(graph, block, strategy, value, mesh)
    return found if found is not None else ((),) * len(shape)


def _operand_ancestor_layout(
    graph: Graph, block: ParallelBlock, strategy: Strategy, value: int, mesh: MeshSpec
) -> DimAxes | None:
    """The layout of a tensor of `value`'s shape that one of the block's operands was made
    from, within `TRACE_DEPTH` single-operand ops that carry the operand's split back
    exactly (`AffineMap.split_source`): `q` sliced from the fused QKV projection's result
    says how that result, and so its cotangent, is split. None where no such tensor is."""
    shape = graph.values[value].type.shape
    for operand in block.operand_layouts:
        current = operand.layout.value
        layout = dim_axes(graph, operand.layout, strategy)
        for _ in range(TRACE_DEPTH):
            producer = graph.producer(current)
            position = _single_operand(graph, producer) if producer is not None else None
            if producer is None or position is None:
                break
            maps = affine.traced_op_maps(producer)
            op_map = maps[position] if maps is not None else None
            if op_map is None:
                break  # an op the affine analysis does not know
            parent = producer.inputs[position]
            moved = _carried(layout, op_map, graph.values[parent].type.rank, mesh, forward=False)
            if moved is None:
                break  # some split does not carry back exactly
            if graph.values[parent].type.shape == shape:
                return moved
            current, layout = parent, moved
    return None


def produced_layout(
    graph: Graph,
    block: ParallelBlock,
    strategy: Strategy,
    value: int,
    mesh: MeshSpec | None,
) -> DimAxes:
    """The layout `block` under `strategy` leaves a value in: its own layout, else that of
    the block's value of the same shape (its last results first). A value of no such shape
    is traced to the block's values through the ops between them that carry its split
    exactly (a reshape merging the heads, a transpose, a type conversion: `_traced_layout`,
    which needs `mesh`'s axis sizes), as the placement lays those ops out; else it is
    replicated. `mesh=None` keeps the rule before tracing (`tracing_changes` compares the
    two; `alpa.symbolic` still prices with it: no boundary of the paper's space differs)."""
    found = _produced_or_none(graph, block, strategy, value, mesh)
    return found if found is not None else ((),) * graph.values[value].type.rank


def _produced_or_none(
    graph: Graph,
    block: ParallelBlock,
    strategy: Strategy,
    value: int,
    mesh: MeshSpec | None,
) -> DimAxes | None:
    """`produced_layout`, None where it would replicate for want of a layout."""
    own = block.layout_of(value)
    if own is not None:
        return dim_axes(graph, own, strategy)
    shape = graph.values[value].type.shape
    for layout in reversed(block.layouts):  # the block's last results first: its outputs
        if graph.values[layout.value].type.shape == shape:
            return dim_axes(graph, ValueLayout(value, layout.dims), strategy)
    if mesh is not None:
        return _traced_layout(graph, block, strategy, value, mesh, seen=frozenset({value}), depth=0)
    return None


# How many ops apart a boundary value and the block's own value may be for `_traced_layout`.
TRACE_DEPTH = 3


def _traced_layout(
    graph: Graph,
    block: ParallelBlock,
    strategy: Strategy,
    value: int,
    mesh: MeshSpec,
    *,
    seen: frozenset[int],
    depth: int,
) -> DimAxes | None:
    """`value`'s layout where a chain of single-operand ops links it to a value `block` owns
    and each carries the split exactly (`AffineMap.split_target` forward, `split_source`
    backward): through the op that made it (a reshape after the block) or the op that reads
    it (the reshape of a cotangent before the block). None where no such chain is found."""
    own = block.layout_of(value)
    if own is not None:
        return dim_axes(graph, own, strategy)
    if depth == TRACE_DEPTH:
        return None
    rank = graph.values[value].type.rank
    producer = graph.producer(value)
    links: list[tuple[OpNode, int, int, bool]] = []  # (op, position, other value, forward)
    if producer is not None and (position := _single_operand(graph, producer)) is not None:
        links.append((producer, position, producer.inputs[position], True))
    for op_id in graph.users(value):
        op = graph.ops[op_id]
        position = _single_operand(graph, op)
        if position is not None and op.inputs[position] == value:
            links.append((op, position, op.outputs[0], False))
    for op, position, other, forward in links:
        maps = affine.traced_op_maps(op) if other not in seen else None
        op_map = maps[position] if maps is not None else None
        if op_map is None:
            continue  # seen already, or an op the affine analysis does not know
        found = _traced_layout(
            graph, block, strategy, other, mesh, seen=seen | {other}, depth=depth + 1
        )
        if found is None:
            continue
        moved = _carried(found, op_map, rank, mesh, forward=forward)
        if moved is not None:
            return moved
    return None


def _single_operand(graph: Graph, op: OpNode) -> int | None:
    """The position of `op`'s one array operand, where every other operand is a scalar."""
    arrays = [i for i, vid in enumerate(op.inputs) if graph.values[vid].type.rank > 0]
    return arrays[0] if len(arrays) == 1 and len(op.outputs) == 1 else None


def _carried(
    layout: DimAxes, op_map: affine.AffineMap, rank: int, mesh: MeshSpec, *, forward: bool
) -> DimAxes | None:
    """`layout` moved through one op: from its operand to its result (`forward`) or back;
    None where some split does not carry exactly."""
    dims: list[tuple[str, ...]] = [()] * rank
    for dim, axes in enumerate(layout):
        if not axes:
            continue
        parts = mesh.axes_size(axes)
        target = op_map.split_target(dim, parts) if forward else op_map.split_source(dim, parts)
        if target is None:
            return None
        dims[target] = dims[target] + axes
    return tuple(dims)


def segment_input_layouts(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    segmentation: Segmentation,
    index: int,
    choices: tuple[int, ...],
    *,
    mesh: MeshSpec | None = None,
) -> dict[int, DimAxes]:
    """Boundary layouts of instance `index` under `choices` (one per block of the instance).

    Each tensor crossing into the instance arrives where `boundary_moves` takes it: the
    forward activation as its first block wants it, the cotangent of its output as its last
    block produced the output (replicated at an instance without blocks). Moving between
    those and the neighbours' layouts is the resharding programs' job, priced separately (T_R).
    """
    instance = segmentation.instances[index]
    if len(choices) != len(instance.blocks):
        raise AnalysisError(
            f"segment {instance.label!r}: expected {len(instance.blocks)} strategy choices "
            f"(one per block), found {len(choices)}"
        )
    first = choices[0] if choices else 0
    last = choices[-1] if choices else 0
    layouts: dict[int, DimAxes] = {}
    if index > 0:
        crossing = set(segmentation.boundaries[index - 1].forward)
        moves = boundary_moves(
            graph, blocks, segmentation, index - 1, mesh, last_choice=0, first_choice=first
        )
        layouts.update((v, wanted) for v, _, wanted in moves if v in crossing)
    if index < len(segmentation.boundaries):
        crossing = set(segmentation.boundaries[index].backward)
        moves = boundary_moves(
            graph, blocks, segmentation, index, mesh, last_choice=last, first_choice=0
        )
        layouts.update((v, wanted) for v, _, wanted in moves if v in crossing)
    return layouts


def boundary_moves(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    segmentation: Segmentation,
    boundary: int,
    mesh: MeshSpec | None,
    *,
    last_choice: int,
    first_choice: int,
    owned_first: bool = True,
    ancestors: bool = True,
) -> tuple[tuple[int, DimAxes, DimAxes], ...]:
    """What crosses boundary `boundary`, as (value, from layout, to layout), both directions.

    Forward: the previous instance's last block produced the activation; the next instance's
    first block wants it. Backward: the cotangent goes the opposite way. (`mesh`: see
    `produced_layout`; `owned_first`, `ancestors`: see `wanted_layout`.)
    """
    crossing = segmentation.boundaries[boundary]
    before = segmentation.instances[boundary]
    after = segmentation.instances[boundary + 1]

    def replicated_for(vid: int) -> DimAxes:
        return ((),) * graph.values[vid].type.rank

    def produced(vid: int) -> DimAxes:
        if not before.blocks:
            return replicated_for(vid)
        block = blocks[before.blocks[-1]]
        strategy = block.strategies[last_choice]
        return produced_layout(graph, block, strategy, vid, mesh)

    def wanted(vid: int) -> DimAxes:
        if not after.blocks:
            return replicated_for(vid)
        block = blocks[after.blocks[0]]
        strategy = block.strategies[first_choice]
        return wanted_layout(
            graph, block, strategy, vid, mesh, owned_first=owned_first, ancestors=ancestors
        )

    forward = tuple((v, produced(v), wanted(v)) for v in crossing.forward)
    backward = tuple((v, wanted(v), produced(v)) for v in crossing.backward)
    return forward + backward


def tracing_changes(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    segmentation: Segmentation,
    boundary: int,
    mesh: MeshSpec,
) -> bool:
    """Whether, for some pair of strategies, tracing (`produced_layout`) lays out a value
    crossing `boundary` otherwise than the rule before it did (both without owned values
    first, which `owned_first_changes` marks apart, and without operands' ancestors)."""
    return _rule_changes(
        graph,
        blocks,
        segmentation,
        boundary,
        now=(mesh, False, False),
        before=(None, False, False),
    )


def owned_first_changes(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    segmentation: Segmentation,
    boundary: int,
    mesh: MeshSpec,
) -> bool:
    """Whether, for some pair of strategies, a value crossing `boundary` is laid out
    otherwise now that a block's own values come first (`wanted_layout`) than before."""
    return _rule_changes(
        graph,
        blocks,
        segmentation,
        boundary,
        now=(mesh, True, False),
        before=(mesh, False, False),
    )


def ancestors_changes(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    segmentation: Segmentation,
    boundary: int,
    mesh: MeshSpec,
) -> bool:
    """Whether, for some pair of strategies, a value crossing `boundary` is laid out
    otherwise now that a block lays out what it has no layout for as the tensors its
    operands were sliced from (`wanted_layout`) than before."""
    return _rule_changes(
        graph,
        blocks,
        segmentation,
        boundary,
        now=(mesh, True, True),
        before=(mesh, True, False),
    )


# Marks what a boundary rule changed, where it changed a boundary of a segmentation: the keys
# of the programs of such a segment type (profile/jobs.py) and the plans cut by such a
# segmentation (their whole step: evaluation.py), so that nothing made under the rule before
# is read back as if it were the same program.
# `tracing_changes`: a value crossing a boundary that neither block owns, nor has the shape of
# one of theirs, was replicated there (gathered, then split again) and now follows its block
# through a reshape or the like.
TRACED_BOUNDARIES = "traced-20"
# `owned_first_changes`: the residual stream's cotangent an output projection hands back is
# where the projection made it, not split like its input.
OWNED_BOUNDARIES = "owned-21"
# `ancestors_changes`: the fused QKV projection's cotangent, handed back past the scores
# block, was replicated there and now arrives split as the scores read `q` and `k`.
ANCESTOR_BOUNDARIES = "ancestors-22"
# `_gathered_reads`: a scattering twin's other contractions read what it scattered whole on
# M. Its name is the same as before the rule, so its programs (`profile.jobs`) and the plans
# choosing it (`plan_build.make_plan`) carry this mark beside their keys.
GATHERED_READS = "gathered-23"


def scattering_marks(strategies: Iterable[Strategy]) -> tuple[str, ...]:
    """The rule marks a program or plan choosing `strategies` carries (`GATHERED_READS`
    where one of them scatters): none for the others, whose keys stay as they were."""
    return (GATHERED_READS,) if any(s.scattered for s in strategies) else ()


def changed_boundary_rules(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    segmentation: Segmentation,
    mesh: MeshSpec,
) -> tuple[str, ...]:
    """The marks of the boundary rules that lay out some value crossing some boundary of
    `segmentation` otherwise than before them, for some pair of strategies: a plan cut by it
    may compile to another whole step than it did before the rule. Read at each pair of
    types' first boundary (`pair_boundaries`): the others move the same tensors."""
    boundaries = sorted(set(pair_boundaries(segmentation).values()))
    checks = (
        (TRACED_BOUNDARIES, tracing_changes),
        (OWNED_BOUNDARIES, owned_first_changes),
        (ANCESTOR_BOUNDARIES, ancestors_changes),
    )
    return tuple(
        mark
        for mark, changes in checks
        if any(changes(graph, blocks, segmentation, b, mesh) for b in boundaries)
    )


def _rule_changes(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    segmentation: Segmentation,
    boundary: int,
    *,
    now: tuple[MeshSpec | None, bool, bool],
    before: tuple[MeshSpec | None, bool, bool],
) -> bool:
    """Whether two boundary rules, each `(mesh, owned_first, ancestors)` as `boundary_moves`
    takes them, move some value crossing `boundary` differently for some pair of strategies."""

    def moves(
        last: int, first: int, rule: tuple[MeshSpec | None, bool, bool]
    ) -> tuple[object, ...]:
        mesh, owned_first, ancestors = rule
        return boundary_moves(
            graph,
            blocks,
            segmentation,
            boundary,
            mesh,
            last_choice=last,
            first_choice=first,
            owned_first=owned_first,
            ancestors=ancestors,
        )

    return any(
        moves(last, first, now) != moves(last, first, before)
        for last, first in boundary_choices(blocks, segmentation, boundary)
    )


def boundary_choices(
    blocks: tuple[ParallelBlock, ...], segmentation: Segmentation, boundary: int
) -> Iterator[tuple[int, int]]:
    """Every pair of strategy indices meeting at `boundary`: the last block of the instance
    before it, the first block of the one after (0 on a side without blocks)."""
    before = segmentation.instances[boundary]
    after = segmentation.instances[boundary + 1]
    lasts = range(len(blocks[before.blocks[-1]].strategies)) if before.blocks else [0]
    firsts = range(len(blocks[after.blocks[0]].strategies)) if after.blocks else [0]
    return itertools.product(lasts, firsts)


# What a resharding program moves, whichever boundary it serves: (dtype, shape, from, to) of
# each value whose layout changes, sorted. Empty when nothing moves.
ReshardSignature = tuple[tuple[str, tuple[int, ...], DimAxes, DimAxes], ...]


def changed_moves(
    graph: Graph, moves: tuple[tuple[int, DimAxes, DimAxes], ...]
) -> tuple[tuple[int, DimAxes, DimAxes], ...]:
    """The moves that cost something at the boundary, in the whole step as in a profile: a
    value already where the next block wants it stays, and a scalar broadcast (a cotangent
    of zeros, say) is made where it is wanted, on every device, as the whole step makes it
    (a resharding program given it as an input would all-gather it)."""
    return tuple(
        move for move in moves if move[1] != move[2] and not _scalar_broadcast(graph, move[0])
    )


def _scalar_broadcast(graph: Graph, vid: int) -> bool:
    op = graph.producer(vid)
    return (
        op is not None
        and op.primitive == "broadcast_in_dim"
        and all(graph.values[i].type.rank == 0 for i in op.inputs)
    )


def reshard_signature(
    graph: Graph, moves: tuple[tuple[int, DimAxes, DimAxes], ...]
) -> ReshardSignature:
    """Two boundaries with the same signature compile to the same resharding program."""
    return tuple(
        sorted(
            (graph.values[v].type.dtype, graph.values[v].type.shape, source, target)
            for v, source, target in changed_moves(graph, moves)
        )
    )


def pair_boundaries(segmentation: Segmentation) -> dict[tuple[int, int], int]:
    """Per pair of consecutive types (before, after), the first boundary between them: every
    boundary of a pair moves the same tensors, so that one stands for all."""
    first: dict[tuple[int, int], int] = {}
    for boundary, (before, after) in enumerate(itertools.pairwise(segmentation.instances)):
        first.setdefault((before.unique_id, after.unique_id), boundary)
    return first


def reshard_signatures(
    graph: Graph, blocks: tuple[ParallelBlock, ...], segmentation: Segmentation, mesh: MeshSpec
) -> dict[tuple[int, int], dict[tuple[int, int], ReshardSignature]]:
    """Per pair of consecutive types (before, after), per strategy pair (last block of the
    one, first block of the other), what resharding between them moves, read at the pair's
    first boundary (`pair_boundaries`)."""
    found: dict[tuple[int, int], dict[tuple[int, int], ReshardSignature]] = {}
    for pair, boundary in pair_boundaries(segmentation).items():
        found[pair] = {
            (last, first): reshard_signature(
                graph,
                boundary_moves(
                    graph,
                    blocks,
                    segmentation,
                    boundary,
                    mesh,
                    last_choice=last,
                    first_choice=first,
                ),
            )
            for last, first in boundary_choices(blocks, segmentation, boundary)
        }
    return found
