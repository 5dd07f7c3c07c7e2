"""A per-op plan seen through the block space (`explain.project_onto_blocks`)."""

from __future__ import annotations

import pytest
from helpers import traced

import explorer as ex
from explorer.errors import PlanError
from explorer.explain import closest_selection, project_onto_blocks
from explorer.ir import Config, DimRole, Strategy
from explorer.layouts import place
from explorer.plan_build import make_layout_plan
from explorer.space import dim_axes


def _per_op_plan_of(
    analysis: ex.SegmentedStep, per_block: tuple[int, ...], edit: dict | None = None
):
    """The per-op plan that lays out every value as the block strategies `per_block` do,
    with the layouts in `edit` changed."""
    placement = place(
        analysis.graph, analysis.blocks, Config(per_block), analysis.mesh, analysis.segments
    )
    values = dict(placement.assignment.values)
    values.update(zip(analysis.graph.inputs, placement.assignment.inputs, strict=True))
    values.update(edit or {})
    return make_layout_plan(
        source="per-op",
        graph=analysis.graph,
        blocks=analysis.block_analysis,
        segmentation=analysis.segments,
        mesh=analysis.mesh,
        platform=analysis.platform,
        backend=analysis.backend,
        time=0.0,
        memory=0,
        budget=None,
        values=values,
        operands={},
        op_strategies={},
    )


@pytest.fixture(scope="module")
def gpt() -> ex.SegmentedStep:
    step, args, _ = traced("gpt")
    return ex.analyze(step, *args, mesh=(4,), profile=False)


def _mixed(analysis: ex.SegmentedStep) -> tuple[int, ...]:
    """A different strategy on every other block: no single template."""
    return tuple((index % len(block.strategies)) for index, block in enumerate(analysis.blocks))


def test_a_per_op_plan_made_of_block_strategies_projects_back_onto_them(
    gpt: ex.SegmentedStep,
) -> None:
    chosen = _mixed(gpt)
    projections = project_onto_blocks(gpt.graph, gpt.blocks, _per_op_plan_of(gpt, chosen))
    assert all(p.exact for p in projections)
    for block, projection, index in zip(gpt.blocks, projections, chosen, strict=True):
        # two strategies can lay a block out alike; then either is the same plan
        found, wanted = block.strategies[projection.strategy], block.strategies[index]
        assert [dim_axes(gpt.graph, v, found) for v in block.layouts] == [
            dim_axes(gpt.graph, v, wanted) for v in block.layouts
        ]
    assert closest_selection(projections) == tuple(p.strategy for p in projections)


def test_a_layout_no_strategy_gives_makes_its_block_inexact_by_one_value(
    gpt: ex.SegmentedStep,
) -> None:
    chosen = _mixed(gpt)
    block = next(b for b in gpt.blocks if any(v.dims for v in b.layouts) and len(b.layouts) > 1)
    value = next(v for v in block.layouts if v.dims)
    strategy = block.strategies[chosen[block.index]]
    rank = gpt.graph.values[value.value].type.rank
    other = (("x",),) + ((),) * (rank - 1)
    if dim_axes(gpt.graph, value, strategy) == other:
        other = ((),) * (rank - 1) + (("x",),)
    plan = _per_op_plan_of(gpt, chosen, {value.value: other})
    projections = project_onto_blocks(gpt.graph, gpt.blocks, plan)
    inexact = [p for p in projections if not p.exact]
    assert [p.block for p in inexact] == [block.index]
    assert inexact[0].agreeing == inexact[0].values - 1
    assert inexact[0].unoffered is None, "one value moved alone: a reshard inside the block"


def test_a_block_laid_out_by_a_split_the_space_leaves_out_names_that_split() -> None:
    # on 2x2 the space pins the batch to the outer axis: N over both axes is not offered
    step, args, _ = traced("gpt")
    analysis = ex.analyze(step, *args, mesh=(2, 2), profile=False)
    chosen = (0,) * len(analysis.blocks)
    block = next(b for b in analysis.blocks if DimRole.N in b.roles)
    both = Strategy(((DimRole.N, ("x", "y")),))
    assert both.name not in [s.name for s in block.strategies]
    edit = {v.value: dim_axes(analysis.graph, v, both) for v in block.layouts}
    plan = _per_op_plan_of(analysis, chosen, edit)
    projections = project_onto_blocks(analysis.graph, analysis.blocks, plan)
    inexact = [p for p in projections if not p.exact]
    assert [(p.block, p.unoffered) for p in inexact] == [(block.index, "N@x+y")]


def test_a_plan_of_block_strategies_only_is_refused(gpt: ex.SegmentedStep) -> None:
    plan = gpt.baseline("dp")
    with pytest.raises(PlanError, match="expected a per-op plan"):
        project_onto_blocks(gpt.graph, gpt.blocks, plan)


def test_a_split_of_a_dim_no_role_takes_is_named(gpt: ex.SegmentedStep) -> None:
    chosen = _mixed(gpt)
    # a value with a dim none of its block's roles lands on, that splits four ways
    block, value, dim = next(
        (b, v, d)
        for b in gpt.blocks
        for v in b.layouts
        for d, size in enumerate(gpt.graph.values[v.value].type.shape)
        if size % 4 == 0 and d not in {dim for _, dim in v.dims}
    )
    rank = gpt.graph.values[value.value].type.rank
    split = tuple(("x",) if d == dim else () for d in range(rank))
    plan = _per_op_plan_of(gpt, chosen, {value.value: split})
    projections = project_onto_blocks(gpt.graph, gpt.blocks, plan)
    inexact = [p for p in projections if not p.exact]
    assert [p.block for p in inexact] == [block.index]
    said = f"dim {dim} of {gpt.graph.values[value.value].type} over x"
    assert inexact[0].roleless == (said,)
    assert inexact[0].unoffered is None
    assert all(p.roleless == () for p in projections if p.exact)
