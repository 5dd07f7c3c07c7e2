"""The cut by the user's top-level scopes (`embed`, `layer_0`, ..., `head`), each scope
group over the configuration cap split at its blocks."""

from __future__ import annotations

from explorer.ir import BlockAnalysis, Graph, OpNode
from explorer.segments.cover import _pieces
from explorer.segments.fingerprints import _block_signature
from explorer.segments.group import _Group
from explorer.segments.structure import _owners


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


def _split_scope_groups(
    graph: Graph, analysis: BlockAnalysis, groups: list[_Group], cap: int, *, floats_only: bool
) -> list[_Group]:
    """Scope groups whose sub-space exceeds `cap`, split like structural spans."""
    symbols = [_block_signature(graph, b) for b in analysis.blocks]
    cuts: dict[tuple[str, ...], tuple[int, ...]] = {}
    result: list[_Group] = []
    for group in groups:
        pieces = _pieces(
            graph,
            analysis,
            group.blocks,
            symbols=symbols,
            cuts=cuts,
            cap=cap,
            floats_only=floats_only,
        )
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
