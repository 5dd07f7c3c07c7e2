"""explorer: profile-based intra-operator parallelism plans for JAX training steps (CFP).

Public verbs only; the stages live in their own modules and `pipeline` chains them.
"""

from explorer import explain, models
from explorer.across_spaces import fastest_plan
from explorer.compiled_fit import fastest_plan_that_fits
from explorer.errors import ExplorerError
from explorer.ir import Graph
from explorer.pipeline import Analysis, SegmentedStep, analyze
from explorer.plan import Plan, apply_plan, evaluate, load_plan
from explorer.trace import trace

__all__ = [
    "Analysis",
    "ExplorerError",
    "Graph",
    "Plan",
    "SegmentedStep",
    "analyze",
    "apply_plan",
    "evaluate",
    "explain",
    "fastest_plan",
    "fastest_plan_that_fits",
    "load_plan",
    "models",
    "trace",
]
__version__ = "0.1.0"
