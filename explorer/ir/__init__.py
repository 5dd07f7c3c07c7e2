"""Frozen artefacts handed from one stage to the next.

Nothing here imports a module of ours outside `ir`: these types are the vocabulary every stage
shares. Invariants are checked in `__post_init__` so a malformed artefact fails where it is
made, not three stages later.

Modules: `graph` (the traced step: values, ops, roles), `parallel_blocks` (ParallelBlocks,
strategies, configurations and the sharding of every value), `segmentation` (segment types,
instances and boundaries), `paths` (matching pytree paths of step inputs and outputs).
"""

from explorer.ir.graph import (
    CONTRACTION_PRIMITIVES,
    INPUT_KINDS,
    Graph,
    OpNode,
    Role,
    TensorType,
    Value,
    ValueKind,
)
from explorer.ir.parallel_blocks import (
    BlockAnalysis,
    Config,
    Conflict,
    DimAxes,
    DimRole,
    ExcludedStrategy,
    OperandLayout,
    ParallelBlock,
    Scatter,
    ShardingAssignment,
    Strategy,
    ValueLayout,
)
from explorer.ir.paths import match_suffix, path_suffix
from explorer.ir.segmentation import Boundary, Segmentation, SegmentInstance, SegmentType

__all__ = [
    "CONTRACTION_PRIMITIVES",
    "INPUT_KINDS",
    "BlockAnalysis",
    "Boundary",
    "Config",
    "Conflict",
    "DimAxes",
    "DimRole",
    "ExcludedStrategy",
    "Graph",
    "OpNode",
    "OperandLayout",
    "ParallelBlock",
    "Role",
    "Scatter",
    "SegmentInstance",
    "SegmentType",
    "Segmentation",
    "ShardingAssignment",
    "Strategy",
    "TensorType",
    "Value",
    "ValueKind",
    "ValueLayout",
    "match_suffix",
    "path_suffix",
]
