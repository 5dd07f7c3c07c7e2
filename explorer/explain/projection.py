"""A per-op plan (the Alpa-style ILP) seen through the block space.

For each ParallelBlock, the strategy that lays out every value of the block as the per-op
plan does, or, where no strategy does, the one that agrees on the most values. A block no
offered strategy matches is one of two things:

- **a strategy the space leaves out**: one split of the head's roles lays out every value as
  the per-op plan does (on a 2-D mesh, N over both axes where the space pins the batch to
  the outer one); `unoffered` names it;
- **a reshard inside the block**: no split of the roles does, so the per-op plan changes
  layout between the block's ops, which no ParallelBlock (communication-free by
  construction) can express. Where the plan splits a dim no role of the block lands on
  (`roleless`: MoE's combine einsum contracts both the experts and the capacity, and its K
  role takes only one of them), no strategy of the block could lay it out so either.

`closest_selection` gives the blocks' strategies to the cost model, so that the per-op
plan's nearest block plan can be priced from the profiles beside the plan CFP chose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from explorer.errors import PlanError
from explorer.ir import DimAxes, DimRole, Graph, ParallelBlock, Strategy
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
    # where no offered strategy is exact: the split of the head's roles that lays out every
    # value as the per-op plan does, if one does (None: the plan reshards inside the block)
    unoffered: str | None = None
    # where none is exact: the per-op plan's splits of dims no role of the block lands on, as
    # "dim 0 of bfloat16[32,8,128,1280] over x" (each once)
    roleless: tuple[str, ...] = ()

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
        exact = agreeing[best] == len(block.layouts)
        implied = None if exact else _implied_strategy(graph, block, layout)
        projections.append(
            BlockProjection(
                block=block.index,
                scope=block.scope,
                strategy=best,
                strategy_name=block.strategies[best].name,
                agreeing=agreeing[best],
                values=len(block.layouts),
                unoffered=None if implied is None else implied.name,
                roleless=() if exact else _roleless_splits(graph, block, layout),
            )
        )
    return tuple(projections)


def _implied_strategy(
    graph: Graph, block: ParallelBlock, layout: Callable[[int], DimAxes]
) -> Strategy | None:
    """The split of the block's roles that lays out every value of the block as `layout`
    does, or None where none does. A dim only one role lands on tells that role's axes."""
    role_axes: dict[DimRole, tuple[str, ...]] = {}
    for value in block.layouts:
        laid_out = layout(value.value)
        for role, dim in value.dims:
            if sum(d == dim for _, d in value.dims) != 1:
                continue  # two roles merged on one dim: their axes cannot be told apart here
            if role_axes.setdefault(role, laid_out[dim]) != laid_out[dim]:
                return None
    strategy = Strategy(
        tuple((role, role_axes[role]) for role in block.roles if role_axes.get(role))
    )
    used = [axis for _, axes in strategy.assignment for axis in axes]
    if len(used) != len(set(used)):
        return None  # two roles on one mesh axis: not a partition of the devices
    if all(dim_axes(graph, value, strategy) == layout(value.value) for value in block.layouts):
        return strategy
    return None


def _roleless_splits(
    graph: Graph, block: ParallelBlock, layout: Callable[[int], DimAxes]
) -> tuple[str, ...]:
    """Where `layout` splits a dim of one of the block's values that none of the block's roles
    lands on: a split no strategy of the block can give, whatever the space's rule."""
    found: list[str] = []
    for value in block.layouts:
        roled = {dim for _, dim in value.dims}
        for dim, axes in enumerate(layout(value.value)):
            if not axes or dim in roled:
                continue
            said = f"dim {dim} of {graph.values[value.value].type} over {'+'.join(axes)}"
            if said not in found:
                found.append(said)
    return tuple(found)


def closest_selection(projections: Sequence[BlockProjection]) -> tuple[int, ...]:
    """Per block, the projected strategy's index (what `explain.select` reads)."""
    return tuple(p.strategy for p in projections)
