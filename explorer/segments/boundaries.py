"""What crosses between consecutive instances: activations forward, cotangents backward."""

from __future__ import annotations

from collections import defaultdict

from explorer.ir import Boundary, Graph, Role
from explorer.segments.recompute import recomputed_values


def _boundaries(graph: Graph, segment_of_op: list[int], count: int) -> tuple[Boundary, ...]:
    forward: dict[int, set[int]] = defaultdict(set)
    backward: dict[int, set[int]] = defaultdict(set)
    recomputed = recomputed_values(graph)
    for op in graph.ops:
        reader = segment_of_op[op.id]
        for vid in op.inputs:
            producer = graph.values[vid].producer
            if producer is None:
                continue
            source = segment_of_op[producer]
            kind = graph.ops[producer].role
            # an activation the next instance reads, in its forward pass or saved for its
            # backward pass, or recomputed for it under remat; a cotangent the previous
            # instance reads
            activation = kind is Role.FORWARD or vid in recomputed
            if source == reader - 1 and activation and op.role is not Role.OPTIMIZER:
                forward[source].add(vid)
            if source == reader + 1 and kind is Role.BACKWARD and op.role is Role.BACKWARD:
                backward[reader].add(vid)
    return tuple(
        Boundary(i, tuple(sorted(forward[i])), tuple(sorted(backward[i]))) for i in range(count - 1)
    )
