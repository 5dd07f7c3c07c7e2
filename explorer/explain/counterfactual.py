"""What changing one block of a plan would cost: the composed cost model, no new compiles.

The solver chooses, per segment instance, one profiled configuration (`cost.Option`): a
strategy for each of the instance's blocks, priced under the strategies of the blocks of
other instances it depends on (`Option.context`). A counterfactual changes one block to
another strategy and keeps every other block: the instance takes the option with the new
choices, and every instance that depends on the block takes the option priced under the new
strategy. In a step with a scan the block changes with its twins (`CostModel.twin`: the
iterations run one body). The altered plan is priced by the same cost model as the plan
(`CostModel.time`, `CostModel.memory`), so `time_delta` and `memory_delta` are exactly the
difference between the two predictions. An alternative the profiles do not hold (infeasible,
or left out by `analyze(..., only=...)`) is listed with `time` None and the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from explorer.cost import CostModel
from explorer.errors import AnalysisError

if TYPE_CHECKING:
    from explorer.pipeline import Analysis
    from explorer.plan import Plan


@dataclass(frozen=True, slots=True)
class Counterfactual:
    """The plan with one block (and its twins) on another strategy."""

    block: int
    block_name: str
    segment: int
    segment_label: str
    current: str  # the plan's strategy of the block
    strategy: str  # the alternative
    blocks: tuple[int, ...]  # every block changed (the block and its twins)
    selection: tuple[int, ...] | None  # option per instance of the altered plan
    time: float | None  # predicted seconds per step of the altered plan
    memory: int | None  # predicted bytes per device of the altered plan
    time_delta: float | None  # altered - plan (positive: slower)
    memory_delta: int | None  # altered - plan (negative: saves memory)
    note: str = ""  # why it cannot be priced, when it cannot

    def __post_init__(self) -> None:
        priced = self.selection is not None
        if priced != (self.time is not None) or priced == bool(self.note):
            raise ValueError(
                f"block {self.block} -> {self.strategy}: a counterfactual is priced (a "
                "selection and a time) or explained (a note), not both or neither"
            )


@dataclass(frozen=True, slots=True)
class Counterfactuals:
    """Every single-block change of a plan, priced by the cost model."""

    source: str
    selection: tuple[int, ...]  # the plan's option per instance
    time: float  # the plan's predicted seconds, by the cost model
    memory: int
    rows: tuple[Counterfactual, ...]

    def for_block(self, block: int) -> tuple[Counterfactual, ...]:
        return tuple(r for r in self.rows if r.block == block)

    def frame(self) -> pd.DataFrame:
        """One row per (block, alternative strategy), in block order."""
        return pd.DataFrame(
            [
                {
                    "block": r.block,
                    "name": r.block_name,
                    "segment": r.segment_label,
                    "current": r.current,
                    "strategy": r.strategy,
                    "time": r.time,
                    "memory": r.memory,
                    "time_delta": r.time_delta,
                    "memory_delta": r.memory_delta,
                    "note": r.note,
                }
                for r in self.rows
            ]
        )


def plan_selection(analysis: Analysis, plan: Plan) -> tuple[int, ...]:
    """The profiled option of every instance that makes up `plan` (its block strategies)."""
    model = analysis.cost_model
    per_block = _choices(analysis, plan)
    selection = select(model, per_block)
    if isinstance(selection, str):
        reason = selection
    elif not math.isclose(model.time(selection), plan.time, rel_tol=1e-9):
        # same block strategies, other parameter layouts (FSDP), priced on the whole step
        reason = (
            f"its predicted time {plan.time:.6g} s is not the composed {model.time(selection):.6g}"
            " s of its block strategies (it was priced by compiling the whole step)"
        )
    else:
        return selection
    raise AnalysisError(
        f"the {plan.source!r} plan is not a combination of the profiled configurations: "
        f"{reason}. Only plans composed from the profiles (Analysis.plan, plan_of, the dp and "
        "megatron baselines) have counterfactuals."
    )


def select(model: CostModel, per_block: Sequence[int]) -> tuple[int, ...] | str:
    """The option of each instance with the blocks' strategies `per_block`, priced under the
    strategies of the blocks it depends on; the reason (a string) when one is not profiled."""
    selection = []
    for n, options in enumerate(model.options):
        wanted = tuple(per_block[b] for b in model.instance_blocks[n])
        context = tuple(per_block[b] for b in model.dependencies[n])
        found = [i for i, o in enumerate(options) if o.choices == wanted and o.context == context]
        if not found:
            return (
                f"instance {model.labels[n]!r} has no profiled configuration with block "
                f"strategies {list(wanted)} under {list(context)} (infeasible, or left out by "
                "only=)"
            )
        selection.append(found[0])
    return tuple(selection)


def counterfactuals(analysis: Analysis, plan: Plan) -> Counterfactuals:
    """Per block, the plan with that block on each other strategy (see the module doc)."""
    from explorer.explain.attribution import block_name

    model = analysis.cost_model
    per_block = _choices(analysis, plan)
    current = plan_selection(analysis, plan)
    base_time, base_memory = model.time(current), model.memory(current)
    scan = bool(analysis.graph.loops)
    segments = analysis.segments
    rows = []
    for block in analysis.blocks:
        changed = tuple(
            b.index
            for b in analysis.blocks
            if b.index == block.index or (scan and model.twin(b.index) == model.twin(block.index))
        )
        segment = segments.segment_of_op[block.head]
        for index, strategy in enumerate(block.strategies):
            if index == per_block[block.index]:
                continue
            altered = list(per_block)
            for b in changed:
                altered[b] = index
            found = select(model, altered)
            time = model.time(found) if not isinstance(found, str) else None
            memory = model.memory(found) if not isinstance(found, str) else None
            rows.append(
                Counterfactual(
                    block=block.index,
                    block_name=block_name(analysis, block.index),
                    segment=segment,
                    segment_label=segments.instances[segment].label,
                    current=block.strategies[per_block[block.index]].name,
                    strategy=strategy.name,
                    blocks=changed,
                    selection=None if isinstance(found, str) else found,
                    time=time,
                    memory=memory,
                    time_delta=None if time is None else time - base_time,
                    memory_delta=None if memory is None else memory - base_memory,
                    note=found if isinstance(found, str) else "",
                )
            )
    return Counterfactuals(plan.source, current, base_time, base_memory, tuple(rows))


def _choices(analysis: Analysis, plan: Plan) -> tuple[int, ...]:
    """The plan's strategy index of every block, checked against the analysis."""
    if plan.mesh != analysis.mesh:
        raise AnalysisError(
            f"the plan is for mesh {plan.mesh}, the analysis for mesh {analysis.mesh}"
        )
    strategies = plan.strategies
    if len(strategies) != len(analysis.blocks):
        raise AnalysisError(
            f"the plan has {len(strategies)} blocks, the analysis {len(analysis.blocks)}: "
            "they are not of the same step"
        )
    choices = []
    for block, name in zip(analysis.blocks, strategies, strict=True):
        names = [s.name for s in block.strategies]
        if name not in names:
            raise AnalysisError(
                f"the plan gives block {block.index} ({block.scope}) strategy {name!r}, which "
                f"is not one of its strategies {names} (a per-op plan has no block choices)"
            )
        choices.append(names.index(name))
    return tuple(choices)
