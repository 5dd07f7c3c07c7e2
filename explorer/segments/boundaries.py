"""What crosses between consecutive instances: activations forward, cotangents backward."""

from __future__ import annotations

from collections import defaultdict

from explorer.ir import Boundary, Graph, Role, ValueKind


def _boundaries(graph: Graph, segment_of_op: list[int], count: int) -> tuple[Boundary, ...]:
    forward: dict[int, set[int]] = defaultdict(set)
    backward: dict[int, set[int]] = defaultdict(set)
    recomputed = _recomputations(graph)
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


def _recomputations(graph: Graph) -> set[int]:
    """Values backward ops make that repeat a forward value: under remat, the forward pass
    redone for the backward pass. They are activations, not cotangents.

    A backward op repeats a forward op when both apply the same primitive with the same
    params to the same operands: the same value or a repeat of it. What is computed from
    constants alone (a causal mask, an attention scale) is named by how it is computed, so
    each layer's copy matches. Matching operand by operand keeps the loss's cotangent seed
    (a constant divided by a constant, on the source line of the loss's mean) out.
    """
    name: dict[int, object] = {}

    def operand(vid: int) -> object:
        if vid in name:
            return name[vid]
        value = graph.values[vid]
        return ("constant", value.type) if value.kind is ValueKind.CONSTANT else vid

    forward: dict[object, tuple[int, ...]] = {}
    repeats: set[int] = set()
    for op in graph.ops:
        operands = tuple(map(operand, op.inputs))
        key = (op.primitive, repr(op.params), operands, op.output_types)
        if not any(isinstance(o, int) for o in operands):
            name.update((v, (key, i)) for i, v in enumerate(op.outputs))
        if op.role is Role.FORWARD:
            forward.setdefault(key, op.outputs)
        elif op.role is Role.BACKWARD and key in forward:
            repeats.update(op.outputs)
            for vid, twin in zip(op.outputs, forward[key], strict=True):
                name.setdefault(vid, operand(twin))
    return repeats
