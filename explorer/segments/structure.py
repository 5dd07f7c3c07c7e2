"""The cut by structure alone: tandem repeats of block fingerprints, and every forward op
given to the part it depends on, so that repeated parts hold the same ops."""

from __future__ import annotations

import re
from collections.abc import Sequence

from explorer.ir import (
    CONTRACTION_PRIMITIVES,
    BlockAnalysis,
    Graph,
    OpNode,
    ParallelBlock,
    ValueKind,
)
from explorer.segments.cover import _cover, _pieces
from explorer.segments.fingerprints import TRIVIAL, _block_signature
from explorer.segments.group import _PREFIX, _TAIL, _Group
from explorer.segments.loops import (
    _aligned_loops,
    _AlignedLoop,
    _keep_in_iterations,
    _read_in_loop,
)


def _structural_groups(
    graph: Graph, analysis: BlockAnalysis, forward: list[OpNode], cap: int, *, floats_only: bool
) -> list[_Group]:
    """Instances from structure alone: the block sequence covered by tandem repeats of block
    fingerprints, spans over the cap split, then every forward op assigned by dependency."""
    blocks = analysis.blocks
    symbols = [_block_signature(graph, b) for b in blocks]
    spans = _cover(symbols, 0, len(symbols))
    if not spans:
        return [_Group("", [op.id for op in forward], [])]
    parts: list[tuple[list[int], int]] = []  # (blocks, part number)
    cuts: dict[tuple[str, ...], tuple[int, ...]] = {}
    for start, end in spans:
        pieces = _pieces(
            graph,
            analysis,
            list(range(start, end)),
            symbols=symbols,
            cuts=cuts,
            cap=cap,
            floats_only=floats_only,
        )
        for k, members in enumerate(pieces):
            parts.append((members, k + 1 if len(pieces) > 1 else 0))
    part_of_block = {b: n for n, (members, _) in enumerate(parts) for b in members}
    loops = _aligned_loops(graph, analysis, [members for members, _ in parts])
    forward_ids = [op.id for op in forward]
    owner = _owners(graph, analysis, forward_ids, part_of_block, len(parts), loops=loops)
    groups = [
        _Group(_span_label(graph, blocks, members, part), [], members, part)
        for members, part in parts
    ]
    prefix = _Group("input", [], [])
    tail = _Group("loss", [], [])
    for op in forward:
        found = owner[op.id]
        target = prefix if found == _PREFIX else tail if found == _TAIL else groups[found]
        target.forward_ops.append(op.id)
    updates = []
    for aligned in loops:
        label = groups[aligned.first].label.partition(" part ")[0] + " update"
        for block, params in _read_in_loop(graph, analysis, aligned.loop):
            updates.append(_Group(label, [], [], collects=params, decider=block))
    if prefix.forward_ops:
        groups.insert(0, prefix)
    if tail.forward_ops:
        groups.append(tail)
    return groups + updates


def _owners(
    graph: Graph,
    analysis: BlockAnalysis,
    ops: list[int],
    part_of_block: dict[int, int],
    n: int,
    *,
    ends: bool = True,
    loops: Sequence[_AlignedLoop] = (),
) -> dict[int, int]:
    """The part each forward op belongs to, so that repeated parts hold the same ops.

    A block op belongs to its block's part. Any other op goes with the latest part it
    depends on (a layer norm after a residual add ends the layer that made the residual).
    An op depending on no part goes with its earliest reader, except that activations read
    first by the first part (an embedding, the first layer norm) form the `_PREFIX`, and the
    loss after the last part, when that part repeats one before it, forms the `_TAIL`
    (`ends=False`: no prefix or tail, for the parts of one group).
    """
    members = set(ops)
    up: dict[int, int | None] = {}
    from_data: dict[int, bool] = {}
    for op_id in ops:
        op = graph.ops[op_id]
        block = analysis.block_of_op[op_id]
        found: int | None = part_of_block.get(block) if block is not None else None
        data = False
        for vid in op.inputs:
            value = graph.values[vid]
            if value.kind is ValueKind.DATA:
                data = True
            producer = value.producer
            if producer is None or producer not in members:
                continue
            data = data or from_data[producer]
            earlier = up[producer]
            if earlier is not None and (found is None or earlier > found) and block is None:
                found = earlier
        up[op_id], from_data[op_id] = found, data
    owner: dict[int, int] = {}
    for op_id in reversed(ops):
        if up[op_id] is not None:
            owner[op_id] = up[op_id]  # type: ignore[assignment]
            continue
        readers = [
            owner[u]
            for vid in graph.ops[op_id].outputs
            for u in graph.users(vid)
            if u in owner and u in members
        ]
        readers = [r for r in readers if r >= 0] or readers
        first = min(readers, default=0)
        prefix = ends and from_data[op_id] and first in (0, _PREFIX)
        owner[op_id] = _PREFIX if prefix else max(first, 0)
    _keep_in_iterations(ops, owner, loops, n)
    if ends and n >= 2:
        _split_off_the_loss(graph, ops, owner, n)
    return owner


def _split_off_the_loss(graph: Graph, ops: list[int], owner: dict[int, int], n: int) -> None:
    """Ops of the last part that no block reads and that lead to a step result (the loss)
    form the tail, unless the part before it has such ops too (a per-layer auxiliary loss)."""
    outputs = set(graph.outputs)
    to_result: set[int] = set()
    for op_id in reversed(ops):
        op = graph.ops[op_id]
        if any(v in outputs for v in op.outputs) or any(
            u in to_result for v in op.outputs for u in graph.users(v)
        ):
            to_result.add(op_id)
    block_readers: set[int] = set()  # ops some block reads, directly or through other ops
    for op_id in reversed(ops):
        if owner[op_id] >= 0 and any(
            u in block_readers or (u in owner and graph.ops[u].primitive in CONTRACTION_PRIMITIVES)
            for v in graph.ops[op_id].outputs
            for u in graph.users(v)
        ):
            block_readers.add(op_id)

    def loss_like(part: int) -> list[int]:
        return [
            o
            for o in ops
            if owner[o] == part
            and o in to_result
            and o not in block_readers
            and graph.ops[o].primitive not in CONTRACTION_PRIMITIVES
        ]

    last = loss_like(n - 1)
    if not last or loss_like(n - 2):
        return
    if any(graph.ops[o].primitive not in TRIVIAL for o in last):
        for o in last:
            owner[o] = _TAIL


def _span_label(
    graph: Graph, blocks: tuple[ParallelBlock, ...], members: list[int], part: int
) -> str:
    """A readable name from whatever scope the heads carry: their common scope path."""
    scopes = [graph.ops[blocks[b].head].scope.split("/") for b in members]
    common: list[str] = []
    for names in zip(*scopes, strict=False):
        if len(set(names)) != 1 or not re.fullmatch(r"[\w.\-]+", names[0]):
            break
        common.append(names[0])
    numbered = [c for c in common if re.search(r"\d", c)]
    label = numbered[0] if numbered else (common[-1] if common else f"blocks_{members[0]}")
    return f"{label} part {part}" if part else label
