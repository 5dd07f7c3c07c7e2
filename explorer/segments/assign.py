"""Backward and optimizer ops placed with the segments of the forward ops they derive from."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from explorer.ir import Graph, Role, ValueKind, match_suffix, path_suffix
from explorer.segments.group import _Group


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
