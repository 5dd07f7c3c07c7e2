"""Scans the tracer unrolled: which parts are a scan's iterations, the ops kept inside each
iteration, and the parameters a scan reads (whose updates form segments of their own)."""

from __future__ import annotations

import bisect
import functools
import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from explorer.ir import BlockAnalysis, Graph, Role, ValueKind
from explorer.segments.group import _PREFIX, _TAIL


@dataclass(frozen=True)
class _AlignedLoop:
    """A scan whose iterations (in execution order) are consecutive runs of `width` parts,
    the first iteration's from part `first`."""

    loop: Any  # _jax_compat.LoopRegion
    first: int
    width: int

    @functools.cached_property
    def stops(self) -> tuple[int, ...]:
        """Where each iteration's body ends, in execution order."""
        return tuple(iteration.stop for iteration in self.loop.iterations)

    @property
    def stop(self) -> int:
        return self.first + self.width * self.loop.length

    def position(self, op_id: int) -> int | None:
        """The iteration (in execution order) whose body holds `op_id`, or whose slicing
        precedes it; None outside the loop and for the stacking after its last iteration."""
        if not self.loop.start <= op_id < self.stops[-1]:
            return None
        return bisect.bisect_right(self.stops, op_id)


def _aligned_loops(
    graph: Graph, analysis: BlockAnalysis, parts: list[list[int]]
) -> tuple[_AlignedLoop, ...]:
    """The scans whose iterations are the parts: every part holding a block of the scan's
    body lies in one iteration, and iteration k holds parts first + k*width onwards."""
    found = []
    for loop in sorted(graph.loops, key=lambda loop: loop.depth):
        where: dict[int, set[int | None]] = defaultdict(set)
        for index, members in enumerate(parts):
            for b in members:
                at = loop.iteration_of(analysis.blocks[b].head)
                where[index].add(at[0] if at else None)
        inside = [i for i in range(len(parts)) if where[i] != {None}]
        if not inside or any(None in where[i] or len(where[i]) != 1 for i in inside):
            continue
        first, length = inside[0], loop.length
        if len(inside) % length or inside != list(range(first, first + len(inside))):
            continue
        width = len(inside) // length
        if all(where[k] == {(k - first) // width} for k in inside):
            found.append(_AlignedLoop(loop, first, width))
    return tuple(found)


def _keep_in_iterations(
    ops: list[int], owner: dict[int, int], loops: Sequence[_AlignedLoop], n: int
) -> None:
    """An op of iteration k of an aligned scan goes with iteration k's parts (a pre-norm
    layer's norm reads the previous layer's residual, yet runs in this iteration's body); an
    op outside the scan never joins an iteration: one before it goes with the part before the
    scan, one after it with the part after (the final norm after the last layer), so that
    every iteration, first and last too, holds the same ops.

    Except after an iteration cut in several parts (over the configuration cap): its residual
    stream skips the later parts, so the final norm's cotangent would reach the last
    iteration's first part from the head, a block its type was not profiled under. There the
    final norm stays with the last part, which becomes a type of its own."""
    for aligned in loops:
        for op_id in ops:
            part = owner[op_id]
            position = aligned.position(op_id)
            if position is not None:
                lo = aligned.first + position * aligned.width
                owner[op_id] = min(max(part, lo), lo + aligned.width - 1)
            elif aligned.first <= part < aligned.stop:
                if op_id < aligned.loop.start:
                    owner[op_id] = aligned.first - 1 if aligned.first > 0 else _PREFIX
                elif aligned.width == 1:
                    owner[op_id] = aligned.stop if aligned.stop < n else _TAIL


def _read_in_loop(
    graph: Graph, analysis: BlockAnalysis, loop: Any
) -> list[tuple[int | None, frozenset[int]]]:
    """The parameters first read (forward) inside `loop` (stacked ones sliced per iteration,
    shared ones every iteration reads), grouped by the block that first reads what is made
    of them, which decides their layout: an Adam update is elementwise, so each group's
    program depends on that block's strategy alone, not on the product of all of them."""
    by_block: dict[int | None, set[int]] = defaultdict(set)
    for value in graph.inputs_of_kind(ValueKind.PARAMETER):
        readers = [u for u in graph.users(value.id) if graph.ops[u].role is Role.FORWARD]
        if readers and loop.start <= min(readers) < loop.stop:
            by_block[_first_block_reading(graph, analysis, value.id)].add(value.id)
    order = sorted(by_block, key=lambda b: (b is None, b or 0))
    return [(block, frozenset(by_block[block])) for block in order]


def _first_block_reading(graph: Graph, analysis: BlockAnalysis, vid: int) -> int | None:
    """The block of the earliest forward op (in program order) that reads `vid` or what is
    computed from it; None when no block does."""
    frontier = [u for u in graph.users(vid) if graph.ops[u].role is Role.FORWARD]
    heapq.heapify(frontier)
    seen = set(frontier)
    while frontier:
        op_id = heapq.heappop(frontier)
        block = analysis.block_of_op[op_id]
        if block is not None:
            return block
        for out in graph.ops[op_id].outputs:
            for user in graph.users(out):
                if user not in seen and graph.ops[user].role is Role.FORWARD:
                    seen.add(user)
                    heapq.heappush(frontier, user)
    return None
