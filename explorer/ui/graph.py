"""Graph view: ParallelBlocks first, one segment expanded to its ops on demand.

Where nodes sit comes from `layout` (once per model); a re-solve only changes the
plan-dependent properties (outline colour, symbol, text, hover) of the traces already in the
figure, and only those that changed are sent to the page. The ops view can collapse scopes
into one node each and highlight the ops a search finds; the "Why this plan" panel adds one
marker per block for the collectives it makes the compiler emit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from explorer.ui import style
from explorer.ui.layout import LayoutCache
from explorer.ui.nodes import (
    NodeStyle,
    OpNodes,
    block_styles,
    merged,
    op_nodes,
    op_styles,
    strategy_palette,
)

if TYPE_CHECKING:
    from explorer.pipeline import SegmentedStep
    from explorer.plan import Plan
    from explorer.ui.explain_tables import BlockMarker
    from explorer.ui.state import Choice

ROLE_FILTERS = ("all", "forward", "backward", "optimizer")
# Nodes from which a view draws with WebGL: below, SVG. Chromium without a GPU draws WebGL in
# software, slower than SVG for the tens of nodes of the blocks view or a layer's ops.
WEBGL_FROM = 2000

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
        self.search = ""
        self.collapsed: frozenset[str] = frozenset()
        self.slices: tuple[TraceSlice, ...] = ()
        self.band_trace: int | None = None
        self.marker_trace: int | None = None
        self.nodes: OpNodes | None = None  # the ops view's nodes
        self._analysis: SegmentedStep | None = None
        self._palette: tuple[SegmentedStep | None, dict[str, str]] = (None, {})
        self._sent: dict[int, dict[str, tuple[Any, ...]]] = {}  # per trace: what the page has

    def names(self, analysis: SegmentedStep) -> tuple[str, ...]:
        """Each block's role name, unique within its segment (`explain.roles`)."""
        return self.cache.block_names(analysis)

    def palette(self, analysis: SegmentedStep) -> dict[str, str]:
        if self._palette[0] is not analysis:
            self._palette = (analysis, strategy_palette(analysis))
        return self._palette[1]

    # what is shown ---------------------------------------------------------------------------

    def show_blocks(
        self, analysis: SegmentedStep, choice: Choice | None, pins: Mapping[int, str] | None = None
    ) -> None:
        self._analysis = analysis
        self.level, self.instance, self.nodes = "blocks", None, None
        layout = self.cache.block_layout(analysis)
        looks = block_styles(analysis, layout, choice, pins, self.palette(analysis))
        traces: list[Any] = [
            go.Scatter(
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
                    size=22, cue=cls.cue, gl=False,
                )
            )  # fmt: skip
        band_x = [(b.x0 + b.x1) / 2 for b in layout.bands]
        traces.append(
            go.Scatter(
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
        self._remember(looks)

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
        self,
        analysis: SegmentedStep,
        instance: int,
        choice: Choice | None,
        plan: Plan | None,
        pins: Mapping[int, str] | None = None,
    ) -> None:
        self._analysis = analysis
        self.level, self.instance = "ops", instance
        layout = self.cache.op_layout(analysis, instance)
        nodes = op_nodes(analysis, layout, self.role_filter, self.collapsed, self.search)
        self.nodes = nodes
        looks = merged(
            op_styles(analysis, layout, choice, plan, pins=pins, palette=self.palette(analysis)),
            nodes,
            layout,
        )
        ex: list[float | None] = []
        ey: list[float | None] = []
        for a, b in nodes.edges:
            ex += [nodes.x[a], nodes.x[b], None]
            ey += [nodes.y[a], nodes.y[b], None]
        gl = len(nodes.members) >= WEBGL_FROM
        traces: list[Any] = [
            (go.Scattergl if gl else go.Scatter)(
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
        for n, members in enumerate(nodes.members):
            blocks = {owner[layout.ops[k]] for k in members}
            block = blocks.pop() if len(blocks) == 1 else None
            key = -1
            if block is not None and block in position_of:
                key = class_of.get((instance_doc.unique_id, position_of[block]), -1)
            if nodes.labels[n]:
                key = -2  # collapsed scopes: a trace of their own
            groups.setdefault(key, []).append(n)
        slices = []
        for key in sorted(groups):
            group = tuple(groups[key])
            if key == -2:
                name, colour, cue = "collapsed scopes", "#FFFFFF", ""
            elif key == -1:
                name, colour, cue = "outside blocks", style.OUTSIDE, ""
            else:
                cls = block_layout.classes[key]
                name, colour, cue = cls.label, cls.colour, cls.cue
            slices.append(TraceSlice(len(traces), group, cue))
            trace = self._node_trace(
                name, colour, x=nodes.x, y=nodes.y, nodes=group, looks=looks,
                size=14 if key == -2 else 8, cue=cue, gl=gl,
            )  # fmt: skip
            if key == -2:
                trace.mode = "markers+text"
            if self.search:
                trace.marker.opacity = [1.0 if nodes.found[n] else 0.15 for n in group]
            traces.append(trace)
        label = instance_doc.label
        found = sum(nodes.found) if self.search else 0
        title = f"{label}: {sum(len(m) for m in nodes.members)} ops ({self.role_filter})"
        if self.collapsed:
            title += f", {len(self.collapsed)} scope(s) collapsed"
        if self.search:
            title += f"; {found} match “{self.search}”"
        self._replace(traces, [], title + "; coloured by block")
        self.slices = tuple(slices)
        self.band_trace = None
        self._remember(looks)

    def restyle(
        self, choice: Choice | None, plan: Plan | None = None, pins: Mapping[int, str] | None = None
    ) -> None:
        """Only the plan-dependent properties change, and only those that did are sent."""
        analysis = self._analysis
        if analysis is None:
            return
        palette = self.palette(analysis)
        if self.level == "blocks":
            looks = block_styles(analysis, self.cache.block_layout(analysis), choice, pins, palette)
        else:
            assert self.instance is not None and self.nodes is not None
            layout = self.cache.op_layout(analysis, self.instance)
            looks = merged(
                op_styles(analysis, layout, choice, plan, pins=pins, palette=palette),
                self.nodes,
                layout,
            )
        changed = {}
        for s in self.slices:
            new = self._properties(looks, s)
            if new != self._sent.get(s.trace):
                changed[s.trace] = {
                    "marker.line.color": new["outline"],
                    "marker.symbol": new["symbol"],
                    "text": new["text"],
                    "hovertext": new["hover"],
                }
                self._sent[s.trace] = new
        style.send(self.figure, changed)

    def show_markers(self, markers: Sequence[BlockMarker]) -> None:
        """One marker per block node for the collectives the block makes XLA emit, sized by
        their time (the explanation of the plan shown); none to remove them."""
        analysis = self._analysis
        xs: list[float] = []
        ys: list[float] = []
        sizes: list[float] = []
        hover: list[str] = []
        if analysis is not None and markers:
            by_block = {m.block: m for m in markers}
            largest = max(m.time_us for m in markers) or 1.0
            for x, y, found in self._marker_places(analysis, by_block):
                total = sum(m.time_us for m in found)
                xs.append(x)
                ys.append(y)
                sizes.append(8 + 22 * (total / largest) ** 0.5)
                text = found[0].hover
                if len(found) > 1:
                    text += f"<br>({len(found)} blocks here: {total:.1f} us in all)"
                hover.append(text)
        with self.figure.batch_update():
            if self.marker_trace is None:
                if not xs:
                    return
                self.figure.add_trace(
                    go.Scatter(
                        name="collectives (size: time)",
                        mode="markers",
                        marker={
                            "symbol": "diamond", "color": "#B00020", "line": {"width": 0},
                        },
                        hoverinfo="text",
                    )
                )  # fmt: skip
                self.marker_trace = len(self.figure.data) - 1
            trace = self.figure.data[self.marker_trace]
            trace.x, trace.y, trace.hovertext = xs, ys, hover
            trace.marker.size = sizes

    # helpers ---------------------------------------------------------------------------------

    def _marker_places(
        self, analysis: SegmentedStep, by_block: Mapping[int, BlockMarker]
    ) -> list[tuple[float, float, list[BlockMarker]]]:
        """Where each block's marker goes: above its node (blocks view: every repeat of the
        band's position on one node), on its head op's node (ops view)."""
        places = []
        if self.level == "blocks":
            layout = self.cache.block_layout(analysis)
            for n, (band, position) in enumerate(
                zip(layout.node_band, layout.node_position, strict=True)
            ):
                members = [
                    analysis.segments.instances[i].blocks[position]
                    for i in layout.bands[band].instances
                ]
                found = [by_block[b] for b in members if b in by_block]
                if found:
                    places.append((layout.x[n], layout.y[n] + 0.4, found))
        elif self.nodes is not None and self.instance is not None:
            ops = self.cache.op_layout(analysis, self.instance).ops
            node_of = {k: n for n, members in enumerate(self.nodes.members) for k in members}
            index_of = {op: k for k, op in enumerate(ops)}
            for block in analysis.segments.instances[self.instance].blocks:
                k = index_of.get(analysis.blocks[block].head)
                if block in by_block and k in node_of:
                    n = node_of[k]
                    places.append((self.nodes.x[n], self.nodes.y[n] + 0.4, [by_block[block]]))
        return places

    @staticmethod
    def _properties(looks: NodeStyle, s: TraceSlice) -> dict[str, tuple[Any, ...]]:
        return {
            "outline": tuple(looks.outline[n] for n in s.nodes),
            "symbol": tuple(looks.symbol[n] + s.cue for n in s.nodes),
            "text": tuple(looks.text[n] for n in s.nodes),
            "hover": tuple(looks.hover[n] for n in s.nodes),
        }

    def _remember(self, looks: NodeStyle) -> None:
        self._sent = {s.trace: self._properties(looks, s) for s in self.slices}

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
        gl: bool = False,
    ) -> Any:
        return (go.Scattergl if gl else go.Scatter)(
            x=[x[n] for n in nodes],
            y=[y[n] for n in nodes],
            mode="markers+text" if size > 16 else "markers",
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
        self.marker_trace = None

    def clear(self, title: str) -> None:
        """Nothing to show (a run that did not finish, with nothing before it)."""
        self._analysis = None
        self.slices, self.band_trace, self.nodes = (), None, None
        self._replace([], [], title)
        self._sent = {}
