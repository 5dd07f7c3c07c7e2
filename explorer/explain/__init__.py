"""Why this plan: the engine side of explaining a plan (the UI draws what these return).

- `attribute`: every collective of the plan's compiled whole step, priced and attributed to
  the block (or the boundary between blocks) that makes the compiler emit it;
- `counterfactuals`: per block, what changing it to each other strategy would cost or save,
  from the profiles (no new compiles);
- `plan_diff`: which choices two plans make differently, and the predicted deltas;
- `project_onto_blocks`: a per-op plan (the Alpa-style ILP) as block strategies, and where no
  strategy expresses it (it reshards inside a block).
"""

from explorer.explain.attribution import (
    AttributedCollective,
    Attribution,
    BlockShare,
    Target,
    attribute,
)
from explorer.explain.counterfactual import (
    Counterfactual,
    Counterfactuals,
    counterfactuals,
    plan_selection,
)
from explorer.explain.diff import BlockChange, ParameterChange, PlanDiff, SegmentChange, plan_diff
from explorer.explain.projection import BlockProjection, closest_selection, project_onto_blocks

__all__ = [
    "AttributedCollective",
    "Attribution",
    "BlockChange",
    "BlockProjection",
    "BlockShare",
    "Counterfactual",
    "Counterfactuals",
    "ParameterChange",
    "PlanDiff",
    "SegmentChange",
    "Target",
    "attribute",
    "closest_selection",
    "counterfactuals",
    "plan_diff",
    "plan_selection",
    "project_onto_blocks",
]
