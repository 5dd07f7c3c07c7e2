"""Graph view: ParallelBlocks first, one segment expanded to its ops on demand.

The layout (where every node sits, which band it belongs to, the edges) depends only on the
traced model and its blocks, so it is computed once per model and kept in a `LayoutCache`;
a re-solve only changes the plan-dependent properties (outline colour, symbol, text, hover)
of the traces already in the figure.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape as esc
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from explorer.ir import Role
from explorer.ui import style

if TYPE_CHECKING:
    from explorer.pipeline import Analysis
    from explorer.plan import Plan
    from explorer.ui.state import Choice

ROLE_FILTERS = ("all", "forward", "backward", "optimizer")


# -- layout (computed once per model) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockClass:
    """Blocks at one position of one segment type share a colour (and a legend entry)."""

    key: tuple[int, int]  # (segment type id, position in the instance)
    label: str  # unique within the model: type (and its id where labels repeat), position
    colour: str
    cue: str = ""  # marker symbol suffix ("-dot") once the palette repeats: a second cue


@dataclass(frozen=True, slots=True)
class Band:
    """A run of consecutive instances of one segment type, drawn as one labelled band."""

    unique_id: int
    instances: tuple[int, ...]
    label: str  # "layer x 48", "embed"
    x0: float
    x1: float


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """Block-level view: the blocks of each band's first instance stand for the whole run."""

    bands: tuple[Band, ...]
    node_band: tuple[int, ...]  # per node: its band
    node_position: tuple[int, ...]  # per node: block position within the instance
    node_class: tuple[int, ...]  # per node: index into classes
    x: tuple[float, ...]
    y: tuple[float, ...]
    classes: tuple[BlockClass, ...]
    edges_x: tuple[float | None, ...]
    edges_y: tuple[float | None, ...]


@dataclass(frozen=True, slots=True)
class OpLayout:
    """Op-level view of one segment instance: every op, by depth and rank within its depth."""

    instance: int
    ops: tuple[int, ...]
    x: tuple[float, ...]
    y: tuple[float, ...]
    edges: tuple[tuple[int, int], ...]  # (producer position, user position) in `ops`


@dataclass
class LayoutCache:
    """Layouts by model identity; `builds` counts the layouts actually computed.

    A new analysis of the same model (another mesh of the same size, another platform, a
    re-run) finds its layouts here; only a model of other ops, blocks or segments lays out.
    """

    blocks: dict[str, BlockLayout] = field(default_factory=dict)
    ops: dict[tuple[str, int], OpLayout] = field(default_factory=dict)
    builds: int = 0
    _keys: dict[int, tuple[Analysis, str]] = field(default_factory=dict)

    def key(self, analysis: Analysis) -> str:
        known = self._keys.get(id(analysis))
        if known is None or known[0] is not analysis:
            known = (analysis, model_key(analysis))
            self._keys = {id(analysis): known}  # the current analysis only
        return known[1]

    def block_layout(self, analysis: Analysis) -> BlockLayout:
        key = self.key(analysis)
        if key not in self.blocks:
            self.blocks[key] = build_block_layout(analysis)
            self.builds += 1
        return self.blocks[key]

    def op_layout(self, analysis: Analysis, instance: int) -> OpLayout:
        key = (self.key(analysis), instance)
        if key not in self.ops:
            self.ops[key] = build_op_layout(analysis, instance)
            self.builds += 1
        return self.ops[key]


def model_key(analysis: Analysis) -> str:
    """Identity of what the layout depends on: the ops, the blocks and the segments."""
    hasher = hashlib.sha256()
    for op in analysis.graph.ops:
        hasher.update(f"{op.primitive}{op.inputs}{op.outputs}".encode())
    hasher.update(repr([b.ops for b in analysis.blocks]).encode())
    hasher.update(repr([(i.unique_id, i.blocks) for i in analysis.segments.instances]).encode())
    return hasher.hexdigest()[:16]


def runs(analysis: Analysis) -> list[list[int]]:
    """Maximal runs of consecutive instances of one segment type."""
    out: list[list[int]] = []
    for instance in analysis.segments.instances:
        if out and analysis.segments.instances[out[-1][-1]].unique_id == instance.unique_id:
            out[-1].append(instance.index)
        else:
            out.append([instance.index])
    return out


def build_block_layout(analysis: Analysis) -> BlockLayout:
    segments = analysis.segments
    classes: dict[tuple[int, int], int] = {}
    class_list: list[BlockClass] = []
    bands: list[Band] = []
    repeated = Counter(u.label for u in segments.unique)
    node_band: list[int] = []
    node_position: list[int] = []
    node_class: list[int] = []
    xs: list[float] = []
    cursor = 0.0
    for run in runs(analysis):
        first = segments.instances[run[0]]
        unique = segments.unique[first.unique_id]
        width = max(len(first.blocks), 1)
        label = unique.label if len(run) == 1 else f"{unique.label} x {len(run)}"
        bands.append(Band(first.unique_id, tuple(run), label, cursor - 0.45, cursor + width - 0.55))
        for position, block in enumerate(first.blocks):
            key = (first.unique_id, position)
            if key not in classes:
                classes[key] = len(class_list)
                scope = analysis.blocks[block].scope
                tail = scope.split("/", 1)[1] if "/" in scope else scope
                name = (
                    unique.label if repeated[unique.label] == 1 else f"{unique.label}[{unique.id}]"
                )
                class_list.append(
                    BlockClass(
                        key,
                        f"{name} #{position} {tail}",
                        style.block_colour(len(class_list)),
                        style.block_cue(len(class_list)),
                    )
                )
            node_band.append(len(bands) - 1)
            node_position.append(position)
            node_class.append(classes[key])
            xs.append(cursor + position)
        cursor += width + 1.0
    edges_x: list[float | None] = []
    edges_y: list[float | None] = []
    for a in range(len(xs) - 1):
        edges_x += [xs[a], xs[a + 1], None]
        edges_y += [0.0, 0.0, None]
    return BlockLayout(
        bands=tuple(bands),
        node_band=tuple(node_band),
        node_position=tuple(node_position),
        node_class=tuple(node_class),
        x=tuple(xs),
        y=tuple(0.0 for _ in xs),
        classes=tuple(class_list),
        edges_x=tuple(edges_x),
        edges_y=tuple(edges_y),
    )


def build_op_layout(analysis: Analysis, index: int) -> OpLayout:
    graph = analysis.graph
    ops = analysis.segments.instances[index].ops
    base = min((graph.ops[o].depth for o in ops), default=0)
    columns: dict[int, list[int]] = {}
    for op in ops:
        columns.setdefault(graph.ops[op].depth - base, []).append(op)
    where: dict[int, tuple[float, float]] = {}
    for depth, members in columns.items():
        for rank, op in enumerate(members):
            where[op] = (float(depth), rank - (len(members) - 1) / 2)
    position = {op: k for k, op in enumerate(ops)}
    edges = []
    for k, op in enumerate(ops):
        for vid in graph.ops[op].inputs:
            producer = graph.values[vid].producer
            if producer is not None and producer in position:
                edges.append((position[producer], k))
    return OpLayout(
        instance=index,
        ops=tuple(ops),
        x=tuple(where[o][0] for o in ops),
        y=tuple(where[o][1] for o in ops),
        edges=tuple(edges),
    )


# -- plan-dependent properties (recomputed on every re-solve) ---------------------------------


@dataclass(frozen=True, slots=True)
class NodeStyle:
    """What a plan changes about a set of nodes: per node, outline, symbol, text, hover."""

    outline: tuple[str, ...]
    symbol: tuple[str, ...]
    text: tuple[str, ...]
    hover: tuple[str, ...]


def strategy_palette(analysis: Analysis) -> dict[str, str]:
    names: dict[str, None] = {}
    for block in analysis.blocks:
        for strategy in block.strategies:
            names[strategy.name] = None
    return {name: style.strategy_colour(i) for i, name in enumerate(names)}


def block_styles(analysis: Analysis, layout: BlockLayout, choice: Choice | None) -> NodeStyle:
    palette = strategy_palette(analysis)
    strategies = choice.strategies if choice is not None else None
    outline, symbol, text, hover = [], [], [], []
    for band_index, position in zip(layout.node_band, layout.node_position, strict=True):
        band = layout.bands[band_index]
        members = [analysis.segments.instances[i].blocks[position] for i in band.instances]
        head = analysis.blocks[members[0]]
        op = analysis.graph.ops[head.head]
        lines = [
            f"<b>block {head.index}</b> {esc(head.scope)}"
            + (f" (+{len(members) - 1} repeats)" if len(members) > 1 else ""),
            f"head #{op.id} {op.primitive}: {esc(str(op.input_types[0]))} x "
            f"{esc(str(op.input_types[1]))}",
            f"{len(head.forward_ops)} forward, {len(head.backward_ops)} backward, "
            f"{len(head.branch_ops)} branch ops",
            "strategies: " + ", ".join(s.name for s in head.strategies),
        ]
        if strategies is None:
            outline.append(style.NO_PLAN)
            symbol.append("circle-open")
            text.append("")
            lines.append("no plan")
        else:
            chosen = Counter(strategies[b] for b in members)
            common = chosen.most_common(1)[0][0]
            outline.append(palette.get(common, style.NO_PLAN))
            symbol.append(style.strategy_symbol(common))
            text.append(
                common if len(chosen) == 1 else " / ".join(f"{n} x{c}" for n, c in chosen.items())
            )
            lines.append(
                "plan: "
                + ", ".join(
                    f"{name} on {count} of {len(members)}" for name, count in chosen.items()
                )
            )
        hover.append("<br>".join(lines))
    return NodeStyle(tuple(outline), tuple(symbol), tuple(text), tuple(hover))


def op_styles(
    analysis: Analysis, layout: OpLayout, choice: Choice | None, plan: Plan | None
) -> NodeStyle:
    """`plan` (the document of `choice`) gives the PartitionSpecs; without it, strategies only."""
    graph = analysis.graph
    owner = analysis.block_analysis.block_of_op
    palette = strategy_palette(analysis)
    documents = plan.document["blocks"] if plan is not None else None
    parameters = plan.document["parameters"] if plan is not None else {}
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
            lines.append(f"block {block}: strategy {strategy}")
            if documents is not None:
                values = documents[block]["values"]
                specs = [
                    style.partition_spec_text(values[str(v)])
                    for v in op.outputs
                    if str(v) in values
                ]
                lines.append(
                    "PartitionSpec: "
                    + (", ".join(specs) if specs else "not constrained: propagated from the block")
                )
            outline.append(palette.get(strategy, style.NO_PLAN))
            symbol.append(style.strategy_symbol(strategy))
        text.append("")
        hover.append("<br>".join(lines))
    return NodeStyle(tuple(outline), tuple(symbol), tuple(text), tuple(hover))


# -- the figure -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceSlice:
    """Which nodes of the current view a figure trace draws."""

    trace: int
    nodes: tuple[int, ...]
    cue: str = ""  # the block class's symbol suffix


class GraphView:
    """The plotly figure and what it currently shows; rebuilt for a new model or level,
    restyled for a new plan."""

    def __init__(self, cache: LayoutCache, on_segment: Callable[[int], None]) -> None:
        self.cache = cache
        self.on_segment = on_segment
        self.figure = go.FigureWidget(
            layout=go.Layout(
                **{
                    **style.figure_layout(height=380, margin={"l": 10, "r": 40, "t": 40, "b": 10}),
                    "legend": {"orientation": "h", "y": -0.05},
                },
                xaxis={"visible": False},
                yaxis={"visible": False},
                dragmode="pan",
            )
        )
        self.level = "blocks"
        self.instance: int | None = None
        self.role_filter = "all"
        self.slices: tuple[TraceSlice, ...] = ()
        self.band_trace: int | None = None
        self._analysis: Analysis | None = None

    # what is shown ---------------------------------------------------------------------------

    def show_blocks(self, analysis: Analysis, choice: Choice | None) -> None:
        self._analysis = analysis
        self.level, self.instance = "blocks", None
        layout = self.cache.block_layout(analysis)
        looks = block_styles(analysis, layout, choice)
        traces: list[Any] = [
            go.Scattergl(
                x=list(layout.edges_x),
                y=list(layout.edges_y),
                mode="lines",
                line={"color": "#999999", "width": 1},
                hoverinfo="skip",
                showlegend=False,
                name="edges",
            )
        ]
        slices = []
        for index, cls in enumerate(layout.classes):
            nodes = tuple(n for n, c in enumerate(layout.node_class) if c == index)
            slices.append(TraceSlice(len(traces), nodes, cls.cue))
            traces.append(
                self._node_trace(
                    cls.label, cls.colour, x=layout.x, y=layout.y, nodes=nodes, looks=looks,
                    size=22, cue=cls.cue,
                )
            )  # fmt: skip
        band_x = [(b.x0 + b.x1) / 2 for b in layout.bands]
        traces.append(
            go.Scattergl(
                x=band_x,
                y=[0.8] * len(band_x),
                mode="markers+text",
                text=[b.label for b in layout.bands],
                textposition="top center",
                marker={"symbol": "triangle-down", "size": 12, "color": "#555555"},
                hovertext=[
                    f"{b.label}: instances "
                    + ", ".join(analysis.segments.instances[i].label for i in b.instances)
                    + "<br>click to expand to ops"
                    for b in layout.bands
                ],
                hoverinfo="text",
                name="segments",
                showlegend=False,
            )
        )
        self.band_trace = len(traces) - 1
        shapes = [
            {
                "type": "rect",
                "x0": b.x0,
                "x1": b.x1,
                "y0": -0.6,
                "y1": 0.7,
                "fillcolor": "#F2F2F2" if k % 2 == 0 else "#E6E6E6",
                "line": {"width": 0},
                "layer": "below",
            }
            for k, b in enumerate(layout.bands)
        ]
        self._replace(traces, shapes, "ParallelBlocks by segment (click a segment to expand it)")
        self.slices = tuple(slices)

        def clicked(trace: Any, points: Any, _state: Any) -> None:
            if not points.point_inds:
                return
            k = points.point_inds[0]
            if trace.name == "segments":
                band = layout.bands[k]
            else:
                slice_ = next(s for s in self.slices if self.figure.data[s.trace] is trace)
                band = layout.bands[layout.node_band[slice_.nodes[k]]]
            self.on_segment(band.instances[0])

        for trace in self.figure.data[1:]:
            trace.on_click(clicked)

    def show_ops(
        self, analysis: Analysis, instance: int, choice: Choice | None, plan: Plan | None
    ) -> None:
        self._analysis = analysis
        self.level, self.instance = "ops", instance
        layout = self.cache.op_layout(analysis, instance)
        looks = op_styles(analysis, layout, choice, plan)
        graph = analysis.graph
        wanted = [
            k
            for k, op in enumerate(layout.ops)
            if self.role_filter == "all" or graph.ops[op].role is Role(self.role_filter)
        ]
        shown = set(wanted)
        ex: list[float | None] = []
        ey: list[float | None] = []
        for a, b in layout.edges:
            if a in shown and b in shown:
                ex += [layout.x[a], layout.x[b], None]
                ey += [layout.y[a], layout.y[b], None]
        traces: list[Any] = [
            go.Scattergl(
                x=ex, y=ey, mode="lines", line={"color": "#CCCCCC", "width": 0.5},
                hoverinfo="skip", showlegend=False, name="edges",
            )
        ]  # fmt: skip
        block_layout = self.cache.block_layout(analysis)
        owner = analysis.block_analysis.block_of_op
        instance_doc = analysis.segments.instances[instance]
        position_of = {b: p for p, b in enumerate(instance_doc.blocks)}
        class_of = {cls.key: i for i, cls in enumerate(block_layout.classes)}
        groups: dict[int, list[int]] = {}
        for k in wanted:
            block = owner[layout.ops[k]]
            key = -1
            if block is not None and block in position_of:
                key = class_of.get((instance_doc.unique_id, position_of[block]), -1)
            groups.setdefault(key, []).append(k)
        slices = []
        for key in sorted(groups):
            nodes = tuple(groups[key])
            if key < 0:
                name, colour, cue = "outside blocks", style.OUTSIDE, ""
            else:
                cls = block_layout.classes[key]
                name, colour, cue = cls.label, cls.colour, cls.cue
            slices.append(TraceSlice(len(traces), nodes, cue))
            traces.append(
                self._node_trace(
                    name, colour, x=layout.x, y=layout.y, nodes=nodes, looks=looks, size=8,
                    cue=cue,
                )
            )  # fmt: skip
        label = analysis.segments.instances[instance].label
        self._replace(
            traces, [], f"{label}: {len(wanted)} ops ({self.role_filter}); coloured by block"
        )
        self.slices = tuple(slices)
        self.band_trace = None

    def restyle(self, choice: Choice | None, plan: Plan | None = None) -> None:
        """Only the plan-dependent properties change: positions and traces stay."""
        analysis = self._analysis
        if analysis is None:
            return
        if self.level == "blocks":
            looks = block_styles(analysis, self.cache.block_layout(analysis), choice)
        else:
            assert self.instance is not None
            layout = self.cache.op_layout(analysis, self.instance)
            looks = op_styles(analysis, layout, choice, plan)
        with self.figure.batch_update():
            for s in self.slices:
                trace = self.figure.data[s.trace]
                trace.marker.line.color = [looks.outline[n] for n in s.nodes]
                trace.marker.symbol = [looks.symbol[n] + s.cue for n in s.nodes]
                trace.text = [looks.text[n] for n in s.nodes]
                trace.hovertext = [looks.hover[n] for n in s.nodes]

    # helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _node_trace(
        name: str,
        colour: str,
        *,
        x: Sequence[float],
        y: Sequence[float],
        nodes: Sequence[int],
        looks: NodeStyle,
        size: int,
        cue: str = "",
    ) -> Any:
        return go.Scattergl(
            x=[x[n] for n in nodes],
            y=[y[n] for n in nodes],
            mode="markers+text" if size > 10 else "markers",
            name=name,
            text=[looks.text[n] for n in nodes],
            textposition="bottom center",
            hovertext=[looks.hover[n] for n in nodes],
            hoverinfo="text",
            marker={
                "color": colour,
                "size": size,
                "symbol": [looks.symbol[n] + cue for n in nodes],
                "line": {
                    "color": [looks.outline[n] for n in nodes],
                    "width": 3 if size > 10 else 1.5,
                },
            },
        )

    def _replace(self, traces: list[Any], shapes: list[dict[str, Any]], title: str) -> None:
        with self.figure.batch_update():
            self.figure.data = ()
            self.figure.add_traces(traces)
            self.figure.layout.shapes = shapes
            self.figure.layout.title = style.title(title, size=13)

    def clear(self, title: str) -> None:
        """Nothing to show (a run that did not finish, with nothing before it)."""
        self._analysis = None
        self.slices, self.band_trace = (), None
        self._replace([], [], title)
