"""The segmentation of a step: the cut by scopes or by structure that needs fewer programs,
with backward and optimizer ops placed, boundaries found and instances typed by fingerprint."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from explorer.ir import BlockAnalysis, Graph, Role, Segmentation, SegmentInstance, SegmentType
from explorer.segments.assign import (
    _assign_backward,
    _assign_optimizer,
    _collect_stacking,
    _join_gradient_tails,
    _keep_guesses_in_iterations,
)
from explorer.segments.boundaries import _boundaries
from explorer.segments.count import DEFAULT_CONFIG_CAP, program_count
from explorer.segments.fingerprints import _fingerprint
from explorer.segments.group import _Group
from explorer.segments.scopes import _scope_groups, _split_scope_groups
from explorer.segments.structure import _structural_groups


def build_segments(
    graph: Graph,
    analysis: BlockAnalysis,
    cap: int = DEFAULT_CONFIG_CAP,
    *,
    floats_only: bool = True,
) -> Segmentation:
    """Cut the step into segment instances and unique types (see the module doc).

    Two cuts are tried: by the user's top-level scopes, and by structure (repeats of block
    fingerprints, ops assigned by their dependencies). Any type whose sub-space exceeds `cap`
    configurations is split at a block boundary no tensor skips over if there is one, else
    where the fewest bytes cross (`cover._cap_cuts`, which says what `floats_only` is). The
    cut that needs fewer programs (Eq. 7) wins; scopes on a tie, so named layers keep their
    names.
    """
    forward = [op for op in graph.ops if op.role is Role.FORWARD]
    candidates: list[Segmentation] = []
    groups, _ = _scope_groups(graph, analysis, forward)
    if sum(1 for g in groups if g.blocks) >= 2:
        split = _split_scope_groups(graph, analysis, groups, cap, floats_only=floats_only)
        candidates.append(_segmentation(graph, analysis, split, "scopes"))
    structural = _structural_groups(graph, analysis, forward, cap, floats_only=floats_only)
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
            + " and their repeats are cut at a block boundary no tensor skips over, else where"
            + " the fewest bytes cross"
        )
    return Segmentation(
        instances=instances,
        unique=unique,
        boundaries=boundaries,
        segment_of_op=tuple(resolved),
        method=method,
        notes=tuple(notes),
    )


def _generic_label(label: str) -> str:
    base, _, part = label.partition(" part ")
    generic = re.sub(r"_?\d+$", "", base) or "segment"
    return f"{generic} part {part}" if part else generic
