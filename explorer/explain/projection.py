"""A per-op plan (the Alpa-style ILP) seen through the block space.

For each ParallelBlock, the strategy that lays out every value of the block as the per-op
plan does, or, where no strategy does, the one that agrees on the most values: the per-op
plan then changes layout inside the block, which the block space cannot express (a
ParallelBlock is communication-free by construction). `closest_selection` gives the blocks'
strategies to the cost model, so that the per-op plan's nearest block plan can be priced
from the profiles beside the plan CFP chose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from explorer.errors import PlanError
from explorer.ir import DimAxes, Graph, ParallelBlock
from explorer.plan_types import Plan
from explorer.space import dim_axes


@dataclass(frozen=True, slots=True)
class BlockProjection:
    """Which strategy of one block the per-op plan's layouts of its values amount to."""

    block: int
    scope: str
    strategy: int  # index into the block's strategies: the exact one, or the closest
    strategy_name: str
    agreeing: int  # values of the block the strategy lays out as the per-op plan does
    values: int  # values of the block

    @property
    def exact(self) -> bool:
        return self.agreeing == self.values


def project_onto_blocks(
    graph: Graph, blocks: Sequence[ParallelBlock], plan: Plan
) -> tuple[BlockProjection, ...]:
    """Per block, the strategy whose layouts agree with `plan`'s on the most of the block's
    values (ties: the earlier strategy). `plan` must be a per-op plan (it has `values`)."""
    if plan.values is None:
        raise PlanError(
            f"expected a per-op plan (one with a layout for every value, as the Alpa-style "
            f"ILP makes), found the {plan.source!r} plan, which has block strategies only"
        )
    laid_out = dict(plan.values)

    def layout(vid: int) -> DimAxes:
        return laid_out.get(vid, ((),) * graph.values[vid].type.rank)

    projections = []
    for block in blocks:
        agreeing = [
            sum(dim_axes(graph, value, strategy) == layout(value.value) for value in block.layouts)
            for strategy in block.strategies
        ]
        best = max(range(len(agreeing)), key=lambda i: (agreeing[i], -i))
        projections.append(
            BlockProjection(
                block=block.index,
                scope=block.scope,
                strategy=best,
                strategy_name=block.strategies[best].name,
                agreeing=agreeing[best],
                values=len(block.layouts),
            )
        )
    return tuple(projections)


def closest_selection(projections: Sequence[BlockProjection]) -> tuple[int, ...]:
    """Per block, the projected strategy's index (what `explain.select` reads)."""
    return tuple(p.strategy for p in projections)
