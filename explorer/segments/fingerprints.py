"""Fingerprints: equal ones share a segment type, profiled once. Profile cache keys depend on
these strings, so any change to what goes in them re-profiles every model."""

from __future__ import annotations

import hashlib
from collections import Counter

from explorer import affine
from explorer.ir import CONTRACTION_PRIMITIVES, BlockAnalysis, Graph, ParallelBlock
from explorer.segments.group import _Group

TRIVIAL = affine.ELEMENTWISE | {
    "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "copy", "copy_p",
    "convert_element_type", "select_n",
}  # fmt: skip


def _block_signature(graph: Graph, block: ParallelBlock) -> str:
    dots = [
        graph.ops[o] for o in block.forward_ops if graph.ops[o].primitive in CONTRACTION_PRIMITIVES
    ]
    members = set(block.forward_ops)
    index = {op.id: k for k, op in enumerate(dots)}
    parts: list[object] = [block.role_sizes]
    for k, op in enumerate(dots):
        layout = block.layout_of(op.outputs[0])
        parts.append(
            (
                k,
                tuple(t.shape for t in op.input_types),
                # a convolution's strides, padding and groups matter as much as its shapes
                op.params if op.primitive != "dot_general" else op.param("dimension_numbers"),
                layout.dims if layout else (),
            )
        )
        for position, vid in enumerate(op.inputs):
            feeders = _feeding_dots(graph, vid, members, index)
            parts.append(("edge", k, position, feeders))
    kinds = Counter(
        graph.ops[o].primitive
        for o in block.forward_ops
        if graph.ops[o].primitive not in TRIVIAL
        and graph.ops[o].primitive not in CONTRACTION_PRIMITIVES
    )
    parts.append(sorted(kinds.items()))
    return _digest(parts)


def _feeding_dots(
    graph: Graph, vid: int, members: set[int], index: dict[int, int]
) -> tuple[int, ...]:
    """Indices of the block's dots that `vid` depends on through non-dot block ops."""
    found: set[int] = set()
    stack, seen = [vid], set()
    while stack:
        value = stack.pop()
        producer = graph.values[value].producer
        if producer is None or producer in seen or producer not in members:
            continue
        seen.add(producer)
        if producer in index:
            found.add(index[producer])
            continue
        stack.extend(graph.ops[producer].inputs)
    return tuple(sorted(found))


def _fingerprint(graph: Graph, analysis: BlockAnalysis, group: _Group, sends_back: bool) -> str:
    blocks = [analysis.blocks[b] for b in group.blocks]
    parts: list[object] = [_block_signature(graph, b) for b in blocks]
    parts.append(("sends back", sends_back))
    first = {b.index: k for k, b in enumerate(blocks)}
    for k, block in enumerate(blocks):
        head = graph.ops[block.head]
        for position, vid in enumerate(head.inputs):
            parts.append(("feeds", k, position, _feeding_block(graph, analysis, vid, first)))
    kinds = Counter(
        (graph.ops[o].primitive, graph.ops[o].output_types[0].rank)
        for o in group.forward_ops
        if analysis.block_of_op[o] is None and graph.ops[o].primitive not in TRIVIAL
    )
    parts.append(sorted(kinds.items()))
    if group.collects:  # no forward op of its own: what it updates tells it apart
        parts.append(sorted(graph.values[v].type.shape for v in group.collects))
        # and which block decides it: two update segments never share a type, which would
        # tie their deciders to one strategy in a uniform plan
        parts.append(("decided by", group.decider))
    parts.append(
        sorted(
            (graph.ops[o].primitive, tuple(t.shape for t in graph.ops[o].input_types))
            for o in group.forward_ops
            if analysis.block_of_op[o] is None
            and graph.ops[o].primitive in ("gather", "scatter-add", *CONTRACTION_PRIMITIVES)
        )
    )
    return _digest(parts)


def _feeding_block(
    graph: Graph, analysis: BlockAnalysis, vid: int, local: dict[int, int]
) -> object:
    """Which block of this segment a head operand comes from (through unblocked ops)."""
    stack, seen = [vid], set()
    while stack:
        value = stack.pop()
        producer = graph.values[value].producer
        if producer is None or producer in seen:
            continue
        seen.add(producer)
        block = analysis.block_of_op[producer]
        if block is not None:
            return local.get(block, "outside")
        if len(seen) > 64:
            break
        stack.extend(graph.ops[producer].inputs)
    return "outside"  # an earlier segment or a step input: the same to this segment


def _digest(parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
