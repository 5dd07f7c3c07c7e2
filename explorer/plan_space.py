"""The space a block plan was made in: recorded by the plan where its names do not tell it,
rebuilt where the plan is applied.

Applying a block plan constrains its segment boundaries (`layouts.place`), and where they
fall depends on the space: a wider one (`whole_mesh`, `free_axes`, ZeRO or scattering
twins) or another configuration cap cuts the step into other segments than the paper's. The
plan was priced with its own space's cut, so the plan that runs must be cut the same way.
Most plans name a strategy no space looked up before theirs offers, and the names tell the
space. A plan whose every name an earlier space offers too (a whole-mesh plan that keeps
the paper's strategies, say) records its space, and so does one whose cap cuts the step
otherwise than `UNRECORDED_CAP` does (the cap of every plan written before caps were
recorded): its document, and with it the key its whole step is kept under
(`evaluation_store.layout_digest`), then differs from the other space's plan of the same
names. A cap that cuts the step alike is not recorded (`cut_cap`), so the plan and its key
do not change with `analyze`'s default cap where the program does not.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from explorer.blocks import build_blocks
from explorer.ir import BlockAnalysis, Graph, Segmentation
from explorer.mesh import MeshSpec
from explorer.plan_types import PAPER_SPACE, UNRECORDED_CAP, Plan, SpaceOptions
from explorer.segments import SKIPPING_FLOATS, build_segments
from explorer.space import build_space, changed_boundary_rules, parameter_ids, step_space


def space_options(
    mesh: MeshSpec,
    *,
    free_axes: bool = False,
    whole_mesh: bool = False,
    shard_parameters: bool = False,
    config_cap: int = UNRECORDED_CAP,
    batch_outer: bool = False,
    sequence_parallel: bool = False,
    batch_inner: bool = False,
    contract_last: bool = False,
) -> SpaceOptions:
    """`analyze`'s options as the space they make: on a 1-D mesh the 2-D widenings change
    nothing, so they are dropped. `config_cap` is the cap naming the cut (`cut_cap`)."""
    two_d = len(mesh.axes) > 1
    return SpaceOptions(
        free_axes=free_axes and two_d,
        whole_mesh=whole_mesh and two_d,
        shard_parameters=shard_parameters,
        config_cap=config_cap,
        batch_outer=batch_outer and two_d,
        sequence_parallel=sequence_parallel,
        batch_inner=batch_inner and two_d,
        contract_last=contract_last,
    )


def cut_cap(graph: Graph, blocks: BlockAnalysis, segments: Segmentation, cap: int) -> int:
    """The cap naming `segments`, `graph` cut under `cap` in space `blocks`: `cap`, or
    `UNRECORDED_CAP` where that cap cuts the step alike (as `space_of` rebuilds it), so a plan
    records a cap only where it changes the program that runs."""
    if cap == UNRECORDED_CAP:
        return cap
    unrecorded = build_segments(graph, blocks, cap=UNRECORDED_CAP)
    return UNRECORDED_CAP if _cut(unrecorded) == _cut(segments) else cap


def cut_rules(
    graph: Graph, blocks: BlockAnalysis, segments: Segmentation, cap: int
) -> tuple[str, ...]:
    """The marks of the cut rules under which `graph`, cut under `cap` (the cap naming the
    cut: `cut_cap`) in space `blocks`, falls into other segments than it did before them
    (`segments.SKIPPING_FLOATS`). Recorded with the boundary rules in the plans made there:
    a plan document from before the rule names the same strategies and cap, but its whole
    step was cut otherwise, so the two must not share the key it is kept under."""
    before = build_segments(graph, blocks, cap=cap, floats_only=False)
    return () if _cut(before) == _cut(segments) else (SKIPPING_FLOATS,)


def plan_rules(
    graph: Graph, blocks: BlockAnalysis, segments: Segmentation, mesh: MeshSpec, cap: int
) -> tuple[str, ...]:
    """What a plan of this segmentation records of the rules that changed its program: the
    boundary rules (`space.changed_boundary_rules`), then the cut rules (`cut_rules`)."""
    boundaries = changed_boundary_rules(graph, blocks.blocks, segments, mesh)
    return boundaries + cut_rules(graph, blocks, segments, cap)


def cuts_alike(first: Segmentation, second: Segmentation) -> bool:
    """Whether two cuts of one step apply alike (`_cut`): the same segments, ops and
    boundaries, so a plan priced in one runs as it would in the other."""
    return _cut(first) == _cut(second)


def _cut(segments: Segmentation) -> tuple[object, ...]:
    """What applying a plan reads of its segments (`layouts.place`): each instance's blocks
    and ops, which segment each op is in, and the tensors crossing each boundary."""
    return (
        tuple((i.blocks, i.ops) for i in segments.instances),
        segments.segment_of_op,
        segments.boundaries,
    )


def candidate_spaces(
    graph: Graph, blocks: BlockAnalysis, mesh: MeshSpec
) -> Iterator[tuple[SpaceOptions, BlockAnalysis]]:
    """Every space a plan's names may come from (cut as a plan recording no cap is), the
    paper's first: on a 2-D mesh its widenings after it, then each again with ZeRO twins."""
    widenings = ((False, False), (False, True), (True, False))[: 3 if len(mesh.axes) > 1 else 1]
    parameters = parameter_ids(graph)
    for shard_parameters in (False, True):
        stored = parameters if shard_parameters else frozenset[int]()
        for free_axes, whole_mesh in widenings:
            options = SpaceOptions(free_axes, whole_mesh, shard_parameters)
            space = build_space(
                blocks, mesh, free_axes=free_axes, whole_mesh=whole_mesh, stored_parameters=stored
            )
            yield options, space


def offers(space: BlockAnalysis, names: Sequence[str]) -> bool:
    """Whether `space` has as many blocks as `names` and offers each block its name."""
    return len(space.blocks) == len(names) and all(
        name in {s.name for s in block.strategies}
        for block, name in zip(space.blocks, names, strict=True)
    )


def recorded_space(
    graph: Graph,
    blocks: BlockAnalysis,
    mesh: MeshSpec,
    own: SpaceOptions,
    names: Sequence[str],
) -> SpaceOptions | None:
    """What a plan of strategies `names` made in space `own` records of it: None where the
    first space offering every name (`candidate_spaces`, the order `space_of` looks them up
    in) is `own`, so the names tell it (the paper's own plans always); else `own`, as where
    its cut is named by another cap than `UNRECORDED_CAP` (`cut_cap`)."""
    if own == PAPER_SPACE:  # the first space looked up: it offers all its plans' names
        return None
    if own.config_cap != UNRECORDED_CAP:
        return own
    for options, space in candidate_spaces(graph, blocks, mesh):
        if offers(space, names):
            return None if options == own else own
    return own


def space_of(plan: Plan, graph: Graph) -> tuple[BlockAnalysis, Segmentation]:
    """The space block plan `plan` came from, and its segments: the one it records, else
    the first space offering every name it has that cuts the step into as many segment
    instances as it records (a plan written before spaces were recorded: the names of
    another space's plan may all be the paper's), else the first offering the names, else
    the paper's (whose names the caller's error then lists)."""
    mesh = plan.mesh
    if plan.space is not None:
        options = plan.space
        space = step_space(
            graph,
            mesh,
            free_axes=options.free_axes,
            whole_mesh=options.whole_mesh,
            shard_parameters=options.shard_parameters,
            batch_outer=options.batch_outer,
            sequence_parallel=options.sequence_parallel,
            batch_inner=options.batch_inner,
            contract_last=options.contract_last,
        )
        return space, build_segments(graph, space, cap=options.config_cap)
    blocks = build_blocks(graph, mesh.size)
    offering: tuple[BlockAnalysis, Segmentation] | None = None
    for _, space in candidate_spaces(graph, blocks, mesh):
        if not offers(space, plan.strategies):
            continue
        segmentation = build_segments(graph, space, cap=UNRECORDED_CAP)
        if not plan.segments or len(segmentation.instances) == len(plan.segments):
            return space, segmentation
        offering = offering or (space, segmentation)
    if offering is not None:
        return offering
    space = build_space(blocks, mesh)
    return space, build_segments(graph, space, cap=UNRECORDED_CAP)
