"""What a segment program holds for the whole step, and which of its results nothing waits on.

Composition needs two facts about a segment instance that its compiled program alone does not
give: which memory the step keeps beyond the instance (the step inputs it owns, each input
owned by exactly one instance; the activations saved for a backward pass; the gradients kept
for the optimizer), and which of its results reach only the step's results (so a collective
making them can be combined with other segments' by the compiler). Both are read from the
traced graph and the placement, per device.
"""

from __future__ import annotations

import math
from typing import Any

from explorer.ir import Graph, Role, Segmentation
from explorer.mesh import MeshSpec
from explorer.profile.backends import MemoryAccounting
from explorer.realize import StandaloneProgram


def settled_values(graph: Graph) -> frozenset[int]:
    """Values that reach only the step's results, through optimizer ops and gradient sums.

    Nothing else in the step waits on them (no forward op, no contraction reads them on the
    way), so a collective that makes one is independent of every other segment's: the
    compiler may combine it with theirs (`hlo.parse_collectives`).
    """
    outputs = set(graph.outputs)
    settled = [False] * len(graph.values)
    for op in reversed(graph.ops):
        for vid in op.outputs:
            users = graph.users(vid)
            settled[vid] = (vid in outputs or bool(users)) and all(
                graph.ops[u].role is not Role.FORWARD
                and graph.ops[u].primitive not in ("dot_general", "conv_general_dilated")
                and all(settled[w] for w in graph.ops[u].outputs)
                for u in users
            )
    return frozenset(v for v, ok in enumerate(settled) if ok)


def input_owners(graph: Graph, segmentation: Segmentation) -> dict[int, int]:
    """The one segment instance that holds each step input: the one of its first reader.

    Counting each input once is what makes a tied parameter (read by the embedding and the
    head) and its optimizer state count once in the composed memory.
    """
    owners = {}
    for vid in graph.inputs:
        readers = graph.users(vid)
        if readers:
            owners[vid] = segmentation.segment_of_op[readers[0]]
    return owners


def memory_accounting(
    graph: Graph,
    index: int,
    *,
    ops: tuple[int, ...],
    program: StandaloneProgram,
    assignment: Any,
    mesh: MeshSpec,
    owners: dict[int, int],
) -> MemoryAccounting:
    """What instance `index` holds for the whole step (see `MemoryAccounting`): the step
    inputs it owns, and the activations it makes that a backward op reads, per device."""
    layouts = dict(assignment.values)
    position = {vid: i for i, vid in enumerate(graph.inputs)}

    def local_bytes(vid: int, dims: Any) -> int:
        parts = math.prod(mesh.axes_size(axes) for axes in dims if axes) if dims else 1
        return graph.values[vid].type.nbytes // max(parts, 1)

    persistent = sum(
        local_bytes(vid, assignment.inputs[i])
        for vid, i in position.items()
        if owners.get(vid) == index
    )
    internal = 0
    results = set(program.output_values)
    for op_id in ops:
        for vid in graph.ops[op_id].outputs:
            if _held(graph, vid):
                size = local_bytes(vid, layouts.get(vid))
                persistent += size
                if vid not in results:
                    internal += size
    return MemoryAccounting(persistent, internal)


def _held(graph: Graph, vid: int) -> bool:
    """Whether the step holds `vid` beyond the instance that makes it: an activation saved
    for the backward pass, or a gradient kept until the optimizer update (which the compiler
    schedules after the backward pass, once gradient all-reduces combined across segments
    are done)."""
    producer = graph.producer(vid)
    if producer is None or producer.role is Role.OPTIMIZER:
        return False
    wanted = Role.BACKWARD if producer.role is Role.FORWARD else Role.OPTIMIZER
    return any(graph.ops[u].role is wanted for u in graph.users(vid))
