"""Where the block sequence is cut: the tandem repeats covering it, and the cuts bringing a
span under the configuration cap."""

from __future__ import annotations

import itertools
import math

from explorer.ir import BlockAnalysis, Graph, Role

# Marks a plan whose cut changed when `_cap_cuts` stopped counting tensors other than floats
# as skipping a cut (`plan_space.cut_rules`).
SKIPPING_FLOATS = "skipping-floats-22"


def _cap_cuts(
    graph: Graph, analysis: BlockAnalysis, members: list[int], cap: int, *, floats_only: bool
) -> tuple[int, ...]:
    """Offsets (in blocks) where a span over `cap` configurations is cut, recursively: at a
    block boundary no earlier tensor skips over if there is one (a residual stream crossing
    a cut makes the far side depend on the near side's strategy), then where the fewest
    bytes cross, then where Eq. 7 counts the fewest programs.

    Only floats count as skipping: activations are what strategies split. A dropout key (8
    bytes of integers) is replicated under every strategy, so a cut it skips moves nothing
    for it. Counted (`floats_only=False`, the rule before `SKIPPING_FLOATS`), it was all
    that told apart the two cuts of BERT's attention on whole-mesh strategies (projection |
    scores, scores | product), and it chose the second, which more bytes cross: the values
    `v` the projection made, which the scores block, last before that cut, has no layout
    for, so the boundary replicated them (gathered forward, and their cotangent backward)."""
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
                    and (_floating(graph.values[vid].type.dtype) or not floats_only)
                ):
                    skipping += graph.values[vid].type.nbytes
        # the programs this cut costs by Eq. 7: both sides, and the pairs across it
        programs = math.prod(sizes[:k]) + math.prod(sizes[k:]) + sizes[k - 1] * sizes[k]
        key = (skipping, crossing, programs)
        if best is None or key < best[0]:
            best = (key, k)
    assert best is not None
    k = best[1]
    left = _cap_cuts(graph, analysis, members[:k], cap, floats_only=floats_only)
    right = _cap_cuts(graph, analysis, members[k:], cap, floats_only=floats_only)
    return (*left, k, *(k + c for c in right))


def _floating(dtype: str) -> bool:
    """Whether `dtype` (as `TensorType` names it: "float32", "bfloat16", ...) is a float."""
    return "float" in dtype


def _pieces(
    graph: Graph,
    analysis: BlockAnalysis,
    members: list[int],
    *,
    symbols: list[str],
    cuts: dict[tuple[str, ...], tuple[int, ...]],
    cap: int,
    floats_only: bool,
) -> list[list[int]]:
    """`members` cut under `cap`; every repeat of a unit (its blocks' fingerprints) is cut
    where its first one was (`cuts` remembers)."""
    unit = tuple(symbols[b] for b in members)
    if unit not in cuts:
        cuts[unit] = _cap_cuts(graph, analysis, members, cap, floats_only=floats_only)
    edges = (0, *cuts[unit], len(members))
    return [members[a:b] for a, b in itertools.pairwise(edges)]


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
