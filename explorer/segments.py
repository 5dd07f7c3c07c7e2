"""Segments: fingerprints, unique segment types, and the instance sequence (paper Sec. 4.3).

A segment instance is a contiguous stretch of the forward program together with the backward
and optimizer ops derived from it. Instances follow the user's top-level scopes when the step
has them (`embed`, `layer_0`, `layer_1`, ..., `head`); otherwise the block sequence is covered
greedily by the longest tandem repeats of block fingerprints. Instances with equal fingerprints
share a unique type, which is profiled once whatever the depth.

A fingerprint is built from the fine-grained dependency graph of the instance's contraction
ops (shapes, dimension numbers, how each role's split lands on their results, which contraction
feeds which through which operand) plus the multiset of non-trivial primitives (reductions,
gathers, RNG) that change communication under a fixed configuration. Elementwise and layout ops
are left out, so an extra residual add does not make a new type.

A `scan` the tracer unrolled keeps its iterations apart: each iteration's ops (its norm too,
though it reads the previous iteration's residual) stay in its own segment, ops outside the
scan never join one, and the updates of the parameters the scan reads (stacked, one slice per
iteration) form segments of their own, one per block deciding their layout. Every iteration
then holds the same ops, so the program count does not grow with the scan's length.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import heapq
import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from explorer import affine
from explorer.errors import ProfilingBudgetError
from explorer.ir import (
    CONTRACTION_PRIMITIVES,
    BlockAnalysis,
    Boundary,
    Graph,
    OpNode,
    ParallelBlock,
    Role,
    Segmentation,
    SegmentInstance,
    SegmentType,
    ValueKind,
    match_suffix,
    path_suffix,
)

# Configurations a unique segment may have before it is split (adaptive granularity), and
# the default bound of a profiling run per segment type.
DEFAULT_PROFILING_BUDGET = 256

TRIVIAL = affine.ELEMENTWISE | {
    "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "copy", "copy_p",
    "convert_element_type", "select_n",
}  # fmt: skip


def build_segments(
    graph: Graph, analysis: BlockAnalysis, cap: int = DEFAULT_PROFILING_BUDGET
) -> Segmentation:
    """Cut the step into segment instances and unique types (see the module doc).

    Two cuts are tried: by the user's top-level scopes, and by structure (repeats of block
    fingerprints, ops assigned by their dependencies). Any type whose sub-space exceeds `cap`
    configurations is split at the block boundary the fewest bytes cross. The cut that needs
    fewer programs (Eq. 7) wins; scopes on a tie, so named layers keep their names.
    """
    forward = [op for op in graph.ops if op.role is Role.FORWARD]
    candidates: list[Segmentation] = []
    groups, _ = _scope_groups(graph, analysis, forward)
    if sum(1 for g in groups if g.blocks) >= 2:
        split = _split_scope_groups(graph, analysis, groups, cap)
        candidates.append(_segmentation(graph, analysis, split, "scopes"))
    structural = _structural_groups(graph, analysis, forward, cap)
    candidates.append(_segmentation(graph, analysis, structural, "repeats"))
    return min(candidates, key=lambda s: program_count(s, analysis).total)


def _segmentation(
    graph: Graph, analysis: BlockAnalysis, groups: list[_Group], method: str
) -> Segmentation:
    segment_of_op: list[int | None] = [None] * len(graph.ops)
    for index, group in enumerate(groups):
        for op_id in group.forward_ops:
            segment_of_op[op_id] = index
    guessed = _assign_backward(graph, groups, segment_of_op)
    _keep_guesses_in_iterations(graph, guessed, segment_of_op)
    collector = {vid: index for index, group in enumerate(groups) for vid in group.collects}
    _assign_optimizer(graph, segment_of_op, collector)
    _join_gradient_tails(graph, guessed, segment_of_op)
    _collect_stacking(graph, segment_of_op, set(collector.values()))
    resolved = [0 if s is None else s for s in segment_of_op]

    boundaries = _boundaries(graph, resolved, len(groups))
    # whether an instance's backward sends a cotangent to the instance before: a first
    # layer reading the step's data makes none, so its program lacks the input-gradient
    # matmul (and its all-reduce) every later layer runs, and is not theirs to price
    sends_back = [False] + [bool(b.backward) for b in boundaries]
    prints = [_fingerprint(graph, analysis, group, sends_back[i]) for i, group in enumerate(groups)]
    type_of: dict[str, int] = {}
    for fingerprint in prints:
        type_of.setdefault(fingerprint, len(type_of))
    ops_of: dict[int, list[int]] = defaultdict(list)
    for op_id, seg in enumerate(resolved):
        ops_of[seg].append(op_id)
    instances = tuple(
        SegmentInstance(i, type_of[prints[i]], g.label, tuple(g.blocks), tuple(ops_of[i]))
        for i, g in enumerate(groups)
    )
    counts = Counter(inst.unique_id for inst in instances)
    unique = tuple(
        SegmentType(
            id=type_id,
            fingerprint=fingerprint,
            label=_generic_label(next(i.label for i in instances if i.unique_id == type_id)),
            block_count=len(next(i.blocks for i in instances if i.unique_id == type_id)),
            instance_count=counts[type_id],
        )
        for fingerprint, type_id in type_of.items()
    )
    notes = []
    if len(unique) == len(instances):
        notes.append(
            "no reuse found: every segment is unique, so profiling covers each one separately"
        )
    if any(g.part for g in groups):
        notes.append(
            "split over the configuration cap: "
            + ", ".join(sorted({g.label for g in groups if g.part == 1}))
            + " and their repeats are cut at the block boundary the fewest bytes cross"
        )
    return Segmentation(
        instances=instances,
        unique=unique,
        boundaries=boundaries,
        segment_of_op=tuple(resolved),
        method=method,
        notes=tuple(notes),
    )


@dataclass
class _Group:
    label: str
    forward_ops: list[int]
    blocks: list[int]
    part: int = 0  # 1, 2, ... for the parts of a group split over the configuration cap
    # a scan's update segment: the parameters the scan reads, whose updates (and gradient
    # assembly) no single iteration owns
    collects: frozenset[int] = field(default_factory=frozenset)
    decider: int | None = None  # the block that decides the layout of what it collects


# -- grouping -------------------------------------------------------------------------------


def _top_scope(op: OpNode) -> str:
    return op.scope.split("/")[0] if op.scope else ""


def _scope_groups(
    graph: Graph, analysis: BlockAnalysis, forward: list[OpNode]
) -> tuple[list[_Group], str]:
    """Runs of forward ops by top-level scope; root-scope ops join the run that follows."""
    runs: list[_Group] = []
    pending: list[int] = []
    for op in forward:
        label = _top_scope(op)
        if not label:
            pending.append(op.id)
            continue
        if runs and runs[-1].label == label:
            runs[-1].forward_ops.extend(pending)
        else:
            runs.append(_Group(label, list(pending), []))
        pending = []
        runs[-1].forward_ops.append(op.id)
    if pending:
        if runs:
            runs[-1].forward_ops.extend(pending)
        else:
            runs.append(_Group("", pending, []))
    head_run = {}
    for index, run in enumerate(runs):
        for op_id in run.forward_ops:
            head_run[op_id] = index
    for block in analysis.blocks:
        runs[head_run[block.head]].blocks.append(block.index)
    # Consecutive block-free runs form one segment of their own (the embedding before the
    # layers, a loss after them): a segment needs no block, it then has one configuration.
    merged: list[_Group] = []
    for run in runs:
        if merged and not run.blocks and not merged[-1].blocks:
            merged[-1].forward_ops.extend(run.forward_ops)
        else:
            merged.append(run)
    for group in merged:
        group.forward_ops.sort()
    return merged, "scopes"


def _structural_groups(
    graph: Graph, analysis: BlockAnalysis, forward: list[OpNode], cap: int
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
            graph, analysis, list(range(start, end)), symbols=symbols, cuts=cuts, cap=cap
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


_PREFIX, _TAIL = -1, -2


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


def _cap_cuts(
    graph: Graph, analysis: BlockAnalysis, members: list[int], cap: int
) -> tuple[int, ...]:
    """Offsets (in blocks) where a span over `cap` configurations is cut, recursively: at a
    block boundary no earlier tensor skips over if there is one (a residual stream crossing
    a cut makes the far side depend on the near side's strategy), then where Eq. 7 counts the
    fewest programs, then where the fewest bytes cross."""
    blocks = analysis.blocks
    sizes = [max(1, len(blocks[b].strategies)) for b in members]
    if math.prod(sizes) <= cap or len(members) < 2:
        return ()
    starts = [min(blocks[b].forward_ops) for b in members]
    lo, hi = starts[0], max(o for b in members for o in blocks[b].forward_ops)
    best: tuple[tuple[int, int, int], int] | None = None
    for k in range(1, len(members)):
        cut = starts[k]
        skipping = crossing = 0
        for op_id in range(lo, cut):
            op = graph.ops[op_id]
            if op.role is not Role.FORWARD:
                continue
            for vid in op.outputs:
                if any(
                    cut <= u <= hi and graph.ops[u].role is Role.FORWARD for u in graph.users(vid)
                ):
                    crossing += graph.values[vid].type.nbytes
        for op_id in range(cut, hi + 1):  # tensors from before the span read past the cut
            op = graph.ops[op_id]
            if op.role is not Role.FORWARD:
                continue
            for vid in op.inputs:
                producer = graph.values[vid].producer
                if (
                    producer is not None
                    and producer < lo
                    and graph.ops[producer].role is Role.FORWARD
                ):
                    skipping += graph.values[vid].type.nbytes
        # the programs this cut costs by Eq. 7: both sides, and the pairs across it
        programs = math.prod(sizes[:k]) + math.prod(sizes[k:]) + sizes[k - 1] * sizes[k]
        key = (skipping, crossing, programs)
        if best is None or key < best[0]:
            best = (key, k)
    assert best is not None
    k = best[1]
    left = _cap_cuts(graph, analysis, members[:k], cap)
    right = _cap_cuts(graph, analysis, members[k:], cap)
    return (*left, k, *(k + c for c in right))


def _pieces(
    graph: Graph,
    analysis: BlockAnalysis,
    members: list[int],
    *,
    symbols: list[str],
    cuts: dict[tuple[str, ...], tuple[int, ...]],
    cap: int,
) -> list[list[int]]:
    """`members` cut under `cap`; every repeat of a unit (its blocks' fingerprints) is cut
    where its first one was (`cuts` remembers)."""
    unit = tuple(symbols[b] for b in members)
    if unit not in cuts:
        cuts[unit] = _cap_cuts(graph, analysis, members, cap)
    edges = (0, *cuts[unit], len(members))
    return [members[a:b] for a, b in itertools.pairwise(edges)]


def _split_scope_groups(
    graph: Graph, analysis: BlockAnalysis, groups: list[_Group], cap: int
) -> list[_Group]:
    """Scope groups whose sub-space exceeds `cap`, split like structural spans."""
    symbols = [_block_signature(graph, b) for b in analysis.blocks]
    cuts: dict[tuple[str, ...], tuple[int, ...]] = {}
    result: list[_Group] = []
    for group in groups:
        pieces = _pieces(graph, analysis, group.blocks, symbols=symbols, cuts=cuts, cap=cap)
        if len(pieces) == 1:
            result.append(group)
            continue
        part_of_block = {b: k for k, members in enumerate(pieces) for b in members}
        owner = _owners(graph, analysis, group.forward_ops, part_of_block, len(pieces), ends=False)
        split = [
            _Group(f"{group.label} part {k + 1}", [], members, k + 1)
            for k, members in enumerate(pieces)
        ]
        for op_id in group.forward_ops:
            split[owner[op_id]].forward_ops.append(op_id)
        result.extend(split)
    return result


def _cover(symbols: list[str], lo: int, hi: int) -> list[tuple[int, int]]:
    """Spans covering [lo, hi): the tandem repeat covering most blocks, then both sides."""
    if lo >= hi:
        return []
    best: tuple[int, int, int, int] | None = None  # (covered, -length, start, repeats)
    for length in range(1, (hi - lo) // 2 + 1):
        for start in range(lo, hi - 2 * length + 1):
            unit = symbols[start : start + length]
            repeats = 1
            while (
                start + (repeats + 1) * length <= hi
                and symbols[start + repeats * length : start + (repeats + 1) * length] == unit
            ):
                repeats += 1
            if repeats >= 2:
                key = (repeats * length, -length, -start, repeats)
                if best is None or key > best:
                    best = key
    if best is None:
        return [(lo, hi)]
    covered, negative_length, negative_start, repeats = best
    length, start = -negative_length, -negative_start
    middle = [(start + k * length, start + (k + 1) * length) for k in range(repeats)]
    return _cover(symbols, lo, start) + middle + _cover(symbols, start + covered, hi)


# -- backward and optimizer ops -------------------------------------------------------------


def _assign_backward(
    graph: Graph, groups: list[_Group], segment_of_op: list[int | None]
) -> set[int]:
    """Place each backward op with its forward op, else with the one segment of its scope,
    else (a guess) with the earliest segment whose backward made one of its operands.
    Returns the guessed ops."""
    guessed = set()
    by_label: dict[str, set[int]] = defaultdict(set)
    for index, group in enumerate(groups):
        for op_id in group.forward_ops:
            by_label[graph.ops[op_id].scope].add(index)
    current = len(groups) - 1
    for op in graph.ops:
        if op.role is not Role.BACKWARD:
            continue
        if op.forward_op is not None and segment_of_op[op.forward_op] is not None:
            segment = segment_of_op[op.forward_op]
        elif len(by_label.get(op.scope, ())) == 1:
            segment = next(iter(by_label[op.scope]))
        else:
            # a cotangent sum (a residual's two branches): with the earliest segment whose
            # backward made one of its operands, so each cotangent moves one segment back
            made = [
                segment_of_op[p]
                for v in op.inputs
                if (p := graph.values[v].producer) is not None
                and graph.ops[p].role is Role.BACKWARD
                and segment_of_op[p] is not None
            ]
            segment = min((m for m in made if m is not None), default=current)
            guessed.add(op.id)
        segment_of_op[op.id] = segment
        current = segment if segment is not None else current
    return guessed


def _keep_guesses_in_iterations(
    graph: Graph, guessed: set[int], segment_of_op: list[int | None]
) -> None:
    """A guessed backward op in the body of an iteration of a scan stays among the segments
    of that iteration's other backward ops (those placed with their forward op). Without
    this a bias gradient (the sum of the cotangent a layer received) goes with the segment
    that sent the cotangent: the next iteration's, or the head's for the last one, and the
    iterations of one scan would differ."""
    for loop in graph.loops:
        for iteration in loop.iterations:
            body = range(iteration.start, iteration.stop)
            placed = [
                segment
                for o in body
                if graph.ops[o].role is Role.BACKWARD
                and o not in guessed
                and (segment := segment_of_op[o]) is not None
            ]
            if not placed:
                continue
            lo, hi = min(placed), max(placed)
            for o in body:
                if o in guessed and (current := segment_of_op[o]) is not None:
                    segment_of_op[o] = min(max(current, lo), hi)


def _join_gradient_tails(graph: Graph, guessed: set[int], segment_of_op: list[int | None]) -> None:
    """A guessed backward op whose results only make a parameter's gradient (read by that
    parameter's update, or by other such ops) joins the segment that updates the parameter.

    The bias gradient of a norm (a sum of the cotangent its forward op received) has no
    forward op to follow; left with the op that made the cotangent, the norm's segment would
    update a parameter whose gradient another segment lays out, and so depend on that
    segment's strategy.
    """
    tails: set[int] = set()
    for op in reversed(graph.ops):
        if op.id not in guessed:
            continue
        readers = {u for v in op.outputs for u in graph.users(v)}
        owners = {segment_of_op[u] for u in readers}
        if not (
            readers
            and len(owners) == 1
            and all(graph.ops[u].role is Role.OPTIMIZER or u in tails for u in readers)
        ):
            continue
        owner = owners.pop()
        made = {segment_of_op[p] for v in op.inputs if (p := graph.values[v].producer) is not None}
        # joining must not make the owner read past its own backward boundary (a stacked
        # parameter's gradient gathers pieces from every iteration of a scan)
        if owner is not None and made <= {owner, owner + 1}:
            segment_of_op[op.id] = owner
            tails.add(op.id)


def _collect_stacking(graph: Graph, segment_of_op: list[int | None], collectors: set[int]) -> None:
    """The stacking the tracer added after a scan's backward iterations (outside every
    iteration's body), read only by the update of a scan's update segment (one of
    `collectors`) or by other such stacking, joins that segment: it assembles the stacked
    gradient from the pieces each iteration made."""
    if not collectors:
        return
    stacking = [(loop.iterations[-1].stop, loop.stop) for loop in graph.loops]
    for op in reversed(graph.ops):
        if op.role is not Role.BACKWARD or not any(a <= op.id < b for a, b in stacking):
            continue
        owners = {segment_of_op[u] for v in op.outputs for u in graph.users(v)}
        if len(owners) == 1 and (owner := owners.pop()) in collectors:
            segment_of_op[op.id] = owner


def _assign_optimizer(
    graph: Graph, segment_of_op: list[int | None], collector: Mapping[int, int]
) -> None:
    """Each parameter's update goes with the segment that first reads the parameter; one a
    scan reads goes with the scan's update segment (`collector`), since every iteration
    reads it."""
    owner_of_suffix: dict[tuple[str, tuple[int, ...]], int] = {}
    for value in graph.inputs_of_kind(ValueKind.PARAMETER):
        readers = [u for u in graph.users(value.id) if graph.ops[u].role is Role.FORWARD]
        owner = collector.get(value.id)
        if owner is None and readers:
            owner = segment_of_op[readers[0]]
        if owner is not None:
            owner_of_suffix[(path_suffix(value.path), value.type.shape)] = owner
    pending: list[tuple[int, int]] = []
    for vid, path in zip(graph.outputs, graph.output_paths, strict=False):
        shape = graph.values[vid].type.shape
        owner = match_suffix(path, shape, owner_of_suffix)
        if owner is not None:
            pending.append((vid, owner))
    while pending:
        vid, owner = pending.pop()
        producer = graph.producer(vid)
        if producer is None or producer.role is not Role.OPTIMIZER:
            continue
        if segment_of_op[producer.id] is not None:
            continue
        segment_of_op[producer.id] = owner
        pending.extend((v, owner) for v in producer.inputs)
    for op in graph.ops:  # step counters, bias corrections: shared scalars
        if op.role is Role.OPTIMIZER and segment_of_op[op.id] is None:
            segment_of_op[op.id] = 0


# -- fingerprints ---------------------------------------------------------------------------


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


def _generic_label(label: str) -> str:
    base, _, part = label.partition(" part ")
    generic = re.sub(r"_?\d+$", "", base) or "segment"
    return f"{generic} part {part}" if part else generic


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


# -- program count --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProgramCount:
    """The paper's Eq. 7: programs to profile, which does not grow with depth."""

    segment_programs: int
    reshard_programs: int
    per_type: tuple[tuple[int, int], ...]  # (unique type id, configurations)
    per_pair: tuple[tuple[int, int, int], ...]  # (type before, type after, strategy pairs)

    @property
    def total(self) -> int:
        return self.segment_programs + self.reshard_programs

    def formula(self) -> str:
        seg = " + ".join(str(n) for _, n in self.per_type)
        pairs = " + ".join(str(n) for *_, n in self.per_pair) or "0"
        return f"({seg}) + ({pairs}) = {self.total}"


def program_count(
    segmentation: Segmentation,
    analysis: BlockAnalysis,
    dependencies: Sequence[tuple[int, ...]] = (),
    reshards: Mapping[tuple[int, int], Mapping[tuple[int, int], Sequence[object]]] | None = None,
) -> ProgramCount:
    """Eq. 7, with the extra programs of a type whose cost depends on another instance's
    block (`dependencies`, per instance: see `layouts.external_blocks`): one per strategy
    of that block.

    With `reshards` (`space.reshard_signatures`: what each pair's resharding moves, per
    strategy pair), a resharding program is counted once however many boundaries share it,
    and not at all where nothing moves; without, every strategy pair of every pair of types
    counts, as in the paper.
    """
    blocks = analysis.blocks
    first_instance: dict[int, SegmentInstance] = {}
    for instance in segmentation.instances:
        first_instance.setdefault(instance.unique_id, instance)

    def configurations(instance: SegmentInstance) -> int:
        depends = dependencies[instance.index] if dependencies else ()
        return math.prod(len(blocks[b].strategies) for b in (*instance.blocks, *depends))

    per_type = tuple((t, configurations(inst)) for t, inst in sorted(first_instance.items()))

    def edge_strategies(instance: SegmentInstance, last: bool) -> int:
        if not instance.blocks:
            return 1
        return len(blocks[instance.blocks[-1 if last else 0]].strategies)

    pairs: dict[tuple[int, int], int] = {}
    seen: set[object] = set()
    for before, after in zip(segmentation.instances, segmentation.instances[1:], strict=False):
        key = (before.unique_id, after.unique_id)
        if key in pairs:
            continue
        if reshards is None:
            pairs[key] = edge_strategies(before, True) * edge_strategies(after, False)
        else:  # the programs this pair adds: what moves, not yet moved by an earlier pair
            new = {tuple(s) for s in reshards[key].values() if s} - seen
            seen |= new
            pairs[key] = len(new)
    per_pair = tuple((a, b, n) for (a, b), n in sorted(pairs.items()))
    return ProgramCount(
        segment_programs=sum(n for _, n in per_type),
        reshard_programs=sum(n for *_, n in per_pair),
        per_type=per_type,
        per_pair=per_pair,
    )


# -- profiling budget -----------------------------------------------------------------------


def check_profiling_budget(
    segmentation: Segmentation, analysis: BlockAnalysis, budget: int = DEFAULT_PROFILING_BUDGET
) -> None:
    """Refuse to plan thousands of programs silently: name the segment and its count."""
    count = program_count(segmentation, analysis)
    for type_id, configurations in count.per_type:
        if configurations > budget:
            unique = segmentation.unique[type_id]
            instance = next(i for i in segmentation.instances if i.unique_id == type_id)
            sizes = " x ".join(str(len(analysis.blocks[b].strategies)) for b in instance.blocks)
            if len(instance.blocks) == 1:
                block = analysis.blocks[instance.blocks[0]]
                raise ProfilingBudgetError(
                    f"block {block.index} ({block.scope or 'unscoped'}, head op #{block.head}) "
                    f"alone has {len(block.strategies)} strategies, over the profiling budget "
                    f"of {budget}: a segment is cut only between blocks, so no cut can bring "
                    f"it under. Raise the budget to at least {len(block.strategies)}."
                )
            raise ProfilingBudgetError(
                f"segment type {type_id} ({unique.label!r}, {unique.block_count} blocks, first "
                f"instance {instance.label!r}) has {configurations} configurations ({sizes}), "
                f"over the profiling budget of {budget}: these segments were cut for a larger "
                f"cap. Build them with this budget as their cap (build_segments(..., "
                f"cap={budget}), as analyze does) so the type is split at its blocks, or raise "
                "the budget."
            )
