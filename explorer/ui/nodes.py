"""What each node of the graph view looks like under a plan, as pure functions.

`block_styles` and `op_styles` give per node the plan-dependent properties (outline colour by
strategy, symbol by the role split, text, hover); `op_nodes` decides what the ops view draws
(ops, or collapsed scopes; the role filter; the search). The view (`graph.GraphView`) only
draws what these return.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape as esc
from typing import TYPE_CHECKING

from explorer.ir import Role
from explorer.ui import style
from explorer.ui.layout import BlockLayout, OpLayout

if TYPE_CHECKING:
    from explorer.pipeline import SegmentedStep
    from explorer.plan import Plan
    from explorer.ui.state import Choice

PIN = "pinned"

# -- plan-dependent properties (recomputed on every re-solve) ---------------------------------


@dataclass(frozen=True, slots=True)
class NodeStyle:
    """What a plan changes about a set of nodes: per node, outline, symbol, text, hover."""

    outline: tuple[str, ...]
    symbol: tuple[str, ...]
    text: tuple[str, ...]
    hover: tuple[str, ...]


def strategy_palette(analysis: SegmentedStep) -> dict[str, str]:
    """One colour per strategy name, in the order the blocks offer them."""
    names: dict[str, None] = {}
    for block in analysis.blocks:
        for strategy in block.strategies:
            names[strategy.name] = None
    return {name: style.strategy_colour(i) for i, name in enumerate(names)}


def block_styles(
    analysis: SegmentedStep,
    layout: BlockLayout,
    choice: Choice | None,
    pins: Mapping[int, str] | None = None,
    palette: Mapping[str, str] | None = None,
) -> NodeStyle:
    """Per block node: the plan's strategy (outline, symbol, text) and its hover. A pinned
    block says so in its text and hover: a cue that does not rely on colour."""
    palette = strategy_palette(analysis) if palette is None else palette
    pins = pins or {}
    strategies = choice.strategies if choice is not None else None
    outline, symbol, text, hover = [], [], [], []
    for node, (band_index, position) in enumerate(
        zip(layout.node_band, layout.node_position, strict=True)
    ):
        band = layout.bands[band_index]
        members = [analysis.segments.instances[i].blocks[position] for i in band.instances]
        head = analysis.blocks[members[0]]
        op = analysis.graph.ops[head.head]
        pinned = [b for b in members if b in pins]
        lines = [
            f"<b>{esc(layout.classes[layout.node_class[node]].label)}</b>: block {head.index} "
            f"{esc(head.scope)}" + (f" (+{len(members) - 1} repeats)" if len(members) > 1 else ""),
            f"head #{op.id} {op.primitive}: {esc(str(op.input_types[0]))} x "
            f"{esc(str(op.input_types[1]))}",
            f"{len(head.forward_ops)} forward, {len(head.backward_ops)} backward, "
            f"{len(head.branch_ops)} branch ops",
            "strategies: " + ", ".join(s.name for s in head.strategies),
        ]
        if pinned:
            lines.append(
                f"<b>{PIN}</b>: " + ", ".join(f"block {b} on {pins[b]}" for b in pinned[:6])
            )
        if strategies is None:
            outline.append(style.NO_PLAN)
            symbol.append("circle-open")
            text.append(f"{PIN}" if pinned else "")
            lines.append("no plan")
        else:
            chosen = Counter(strategies[b] for b in members)
            common = chosen.most_common(1)[0][0]
            outline.append(palette.get(common, style.NO_PLAN))
            symbol.append(style.strategy_symbol(common))
            shown = (
                common if len(chosen) == 1 else " / ".join(f"{n} x{c}" for n, c in chosen.items())
            )
            text.append(f"{shown} ({PIN})" if pinned else shown)
            lines.append(
                "plan: "
                + ", ".join(
                    f"{name} on {count} of {len(members)}" for name, count in chosen.items()
                )
            )
        hover.append("<br>".join(lines))
    return NodeStyle(tuple(outline), tuple(symbol), tuple(text), tuple(hover))


def op_styles(
    analysis: SegmentedStep,
    layout: OpLayout,
    choice: Choice | None,
    plan: Plan | None,
    *,
    pins: Mapping[int, str] | None = None,
    palette: Mapping[str, str] | None = None,
) -> NodeStyle:
    """`plan` (the full plan of `choice`) gives the PartitionSpecs; without it, strategies only."""
    graph = analysis.graph
    owner = analysis.block_analysis.block_of_op
    palette = strategy_palette(analysis) if palette is None else palette
    pins = pins or {}
    block_layouts = [dict(b.values) for b in plan.blocks] if plan is not None else None
    parameters = plan.parameter_layouts if plan is not None else {}
    outline, symbol, text, hover = [], [], [], []
    for op_id in layout.ops:
        op = graph.ops[op_id]
        block = owner[op_id]
        lines = [
            f"<b>#{op.id} {op.primitive}</b> [{op.role}] {esc(op.scope or '<root>')}",
            "in: " + esc(", ".join(map(str, op.input_types))),
            "out: " + esc(", ".join(map(str, op.output_types))),
        ]
        for vid in op.inputs:
            value = graph.values[vid]
            if value.path in parameters:
                spec = style.partition_spec_text(parameters[value.path])
                lines.append(f"{esc(value.path)}: {spec}")
        if block is None:
            lines.append("outside every ParallelBlock: XLA propagates its sharding")
            outline.append(style.OUTSIDE)
            symbol.append("circle")
        elif choice is None:
            lines.append(f"block {block}; no plan")
            outline.append(style.NO_PLAN)
            symbol.append("circle-open")
        else:
            strategy = choice.strategies[block]
            lines.append(
                f"block {block}: strategy {strategy}" + (f" ({PIN})" if block in pins else "")
            )
            if block_layouts is not None:
                values = block_layouts[block]
                specs = [style.partition_spec_text(values[v]) for v in op.outputs if v in values]
                lines.append(
                    "PartitionSpec: "
                    + (", ".join(specs) if specs else "not constrained: propagated from the block")
                )
            outline.append(palette.get(strategy, style.NO_PLAN))
            symbol.append(style.strategy_symbol(strategy))
        text.append("")
        hover.append("<br>".join(lines))
    return NodeStyle(tuple(outline), tuple(symbol), tuple(text), tuple(hover))


# -- the ops view's nodes: ops, or collapsed scopes -------------------------------------------


@dataclass(frozen=True, slots=True)
class OpNodes:
    """What the ops view draws: each node one op, or a collapsed scope (several ops)."""

    members: tuple[tuple[int, ...], ...]  # per node: positions in the OpLayout
    x: tuple[float, ...]
    y: tuple[float, ...]
    labels: tuple[str, ...]  # a collapsed scope's name ("" for an op)
    edges: tuple[tuple[int, int], ...]  # between nodes
    found: tuple[bool, ...]  # per node: matches the search (all True without one)


def op_nodes(
    analysis: SegmentedStep,
    layout: OpLayout,
    roles: str,
    collapsed: frozenset[str],
    search: str,
) -> OpNodes:
    """The ops the role filter keeps, a collapsed scope's ops merged into one node at their
    centre, and which nodes the search finds (op id "#12", primitive or scope, any case)."""
    graph = analysis.graph
    wanted = [
        k for k, op in enumerate(layout.ops) if roles == "all" or graph.ops[op].role is Role(roles)
    ]
    node_of: dict[int, int] = {}
    members: list[list[int]] = []
    labels: list[str] = []
    by_scope: dict[str, int] = {}
    for k in wanted:
        scope = graph.ops[layout.ops[k]].scope or "<root>"
        if scope in collapsed:
            if scope not in by_scope:
                by_scope[scope] = len(members)
                members.append([])
                labels.append(scope)
            node_of[k] = by_scope[scope]
            members[by_scope[scope]].append(k)
        else:
            node_of[k] = len(members)
            members.append([k])
            labels.append("")
    xs = tuple(sum(layout.x[k] for k in m) / len(m) for m in members)
    ys = tuple(sum(layout.y[k] for k in m) / len(m) for m in members)
    edges = sorted(
        {
            (node_of[a], node_of[b])
            for a, b in layout.edges
            if a in node_of and b in node_of and node_of[a] != node_of[b]
        }
    )
    needle = search.strip().lower()

    def matches(k: int) -> bool:
        op = graph.ops[layout.ops[k]]
        return needle in f"#{op.id} {op.primitive} {op.scope}".lower()

    found = tuple(not needle or any(matches(k) for k in m) for m in members)
    return OpNodes(tuple(tuple(m) for m in members), xs, ys, tuple(labels), tuple(edges), found)


def merged(looks: NodeStyle, nodes: OpNodes, layout: OpLayout) -> NodeStyle:
    """Op styles per ops-view node: a collapsed scope takes its most common outline."""
    outline, symbol, text, hover = [], [], [], []
    for members, label in zip(nodes.members, nodes.labels, strict=True):
        if not label:
            (k,) = members
            outline.append(looks.outline[k])
            symbol.append(looks.symbol[k])
            text.append(looks.text[k])
            hover.append(looks.hover[k])
            continue
        colours = Counter(looks.outline[k] for k in members)
        outline.append(colours.most_common(1)[0][0])
        symbol.append("hexagon")
        text.append(label)
        shown = ", ".join(f"#{layout.ops[k]}" for k in members[:12])
        more = f" (+{len(members) - 12})" if len(members) > 12 else ""
        hover.append(
            f"<b>{esc(label)}</b>: {len(members)} ops collapsed<br>{shown}{more}"
            "<br>untick the scope in “collapse” to see them"
        )
    return NodeStyle(tuple(outline), tuple(symbol), tuple(text), tuple(hover))
