"""Rematerialisation seen in the graph: the backward ops that redo a forward op.

Under `jax.checkpoint` (`nn.remat`) the backward pass runs a layer's forward ops again instead
of reading what the forward pass saved. Those ops are traced as backward ops with no
`forward_op` of their own (they are not derived from one by differentiation), in the scope of
the ops they redo.
"""

from __future__ import annotations

from explorer import _jax_compat as jc
from explorer.ir import Graph, Role, ValueKind


def recomputed_values(graph: Graph) -> frozenset[int]:
    """The values recomputed ops make: activations, not cotangents. Those of a
    `jax.checkpoint` body are marked so by their name stack, whether or not each matches a
    forward op (a chain of matches breaks at the first op that does not, such as a router's
    top-2 gating); the others are found by matching (`_repeats`). Found once per graph: every
    segmentation of the step asks (seconds at a 7B model's depth)."""
    return graph.derived("recomputed_values", _recomputed_values)


def _recomputed_values(graph: Graph) -> frozenset[int]:
    marked = {vid for op in graph.ops if jc.is_rematerialised(op.name_stack) for vid in op.outputs}
    return frozenset(marked | _repeats(graph))


def _repeats(graph: Graph) -> set[int]:
    """The values backward ops make that repeat a forward op's.

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
