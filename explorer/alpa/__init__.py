"""Alpa-style ILP baseline: per-op sharding strategies priced by communication volume.

This rebuilds the intra-operator pass of Alpa (Zheng et al., OSDI'22, Sec. 4) over the traced
Graph, without ParallelBlocks, one idea per module:

1. **Strategies** (`ops`): the sharding strategies of each op and step input, and the op model
   that prices them (also used to price CFP configurations).
2. **Costs** (`comm`): communication only, per mesh axis, from alpha-beta formulas, with alpha
   and beta from the platform file or Alpa's defaults.
3. **ILP** (`problem`, `ilp`, `solve`): ops grouped by the choice they share, with their node
   and edge costs and liveness (`problem`); one-hot choice variables, the linearised edge
   terms and the memory rows, solved by HiGHS (`ilp`); `solve_alpa` decodes the answer into an
   `AlpaSolution`, a layout for every value (`solve`).
4. **Kept answers** (`kept`): `solve_alpa_kept` reads an answer from the store it is given,
   by a digest of the problem, or solves it and keeps it.

`symbolic` gives Alpa's prediction of each CFP configuration (the CFP paper's Fig. 9), and
`errors` what the ILP raises and warns. Turning a solution's layouts into a
`ShardingAssignment` is nothing Alpa-specific: `explorer.layouts.layout_assignment`.
"""

from explorer.alpa.comm import (
    ALPA_MESH_ALPHA,
    ALPA_MESH_BETA,
    KINDS,
    AxisComm,
    CommModel,
    Kind,
    all_gather_cost,
    all_reduce_cost,
    all_to_all_cost,
    comm_model,
    reduce_scatter_cost,
)
from explorer.alpa.ilp import build_problem
from explorer.alpa.kept import IlpAnswer, IlpAnswerStore, solve_alpa_kept
from explorer.alpa.ops import PARTIAL_REDUCTIONS, OpModel, OpStrategy, layout_name
from explorer.alpa.problem import AlpaProblem
from explorer.alpa.solve import AlpaSolution, solve_alpa
from explorer.alpa.symbolic import symbolic_config_costs
from explorer.errors import AlpaBudgetError, AlpaError, AlpaTimeLimitWarning
from explorer.layouts import replicated

__all__ = [
    "ALPA_MESH_ALPHA",
    "ALPA_MESH_BETA",
    "KINDS",
    "PARTIAL_REDUCTIONS",
    "AlpaBudgetError",
    "AlpaError",
    "AlpaProblem",
    "AlpaSolution",
    "AlpaTimeLimitWarning",
    "AxisComm",
    "CommModel",
    "IlpAnswer",
    "IlpAnswerStore",
    "Kind",
    "OpModel",
    "OpStrategy",
    "all_gather_cost",
    "all_reduce_cost",
    "all_to_all_cost",
    "build_problem",
    "comm_model",
    "layout_name",
    "reduce_scatter_cost",
    "replicated",
    "solve_alpa",
    "solve_alpa_kept",
    "symbolic_config_costs",
]
