"""Where the graph view puts things: computed once per model, never on a re-solve.

The layout depends only on the traced model, its blocks and segments, so it is kept in a
`LayoutCache` keyed by the model's identity: a new analysis of the same model (another mesh of
the same size, another platform, a re-run) finds its layouts here.

- Block level: one node per block of each band's first instance (a band is a run of
  instances of one segment type, "layer x 48"), named by its role (`explain.roles`).
- Op level: the ops of one segment instance in layers by depth, ordered within a layer by
  the barycentre of their producers.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from explorer.ui import style

if TYPE_CHECKING:
    from explorer.pipeline import SegmentedStep


@dataclass(frozen=True, slots=True)
class BlockClass:
    """Blocks at one position of one segment type share a colour (and a legend entry)."""

    key: tuple[int, int]  # (segment type id, position in the instance)
    label: str  # unique within the model: the segment type (its id where labels repeat) and
    # the block's role name (unique within a segment: explain.roles.block_names)
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
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    builds: int = 0
    _keys: dict[int, tuple[SegmentedStep, str]] = field(default_factory=dict)

    def key(self, analysis: SegmentedStep) -> str:
        known = self._keys.get(id(analysis))
        if known is None or known[0] is not analysis:
            known = (analysis, model_key(analysis))
            self._keys = {id(analysis): known}  # the current analysis only
        return known[1]

    def block_names(self, analysis: SegmentedStep) -> tuple[str, ...]:
        """Each block's role name (`explain.roles`), unique within its segment."""
        key = self.key(analysis)
        if key not in self.names:
            from explorer.explain.roles import block_names

            self.names[key] = block_names(analysis)
        return self.names[key]

    def block_layout(self, analysis: SegmentedStep) -> BlockLayout:
        key = self.key(analysis)
        if key not in self.blocks:
            self.blocks[key] = build_block_layout(analysis, self.block_names(analysis))
            self.builds += 1
        return self.blocks[key]

    def op_layout(self, analysis: SegmentedStep, instance: int) -> OpLayout:
        key = (self.key(analysis), instance)
        if key not in self.ops:
            self.ops[key] = build_op_layout(analysis, instance)
            self.builds += 1
        return self.ops[key]


def model_key(analysis: SegmentedStep) -> str:
    """Identity of what the layout depends on: the ops, the blocks and the segments."""
    hasher = hashlib.sha256()
    for op in analysis.graph.ops:
        hasher.update(f"{op.primitive}{op.inputs}{op.outputs}".encode())
    hasher.update(repr([b.ops for b in analysis.blocks]).encode())
    hasher.update(repr([(i.unique_id, i.blocks) for i in analysis.segments.instances]).encode())
    return hasher.hexdigest()[:16]


def runs(analysis: SegmentedStep) -> list[list[int]]:
    """Maximal runs of consecutive instances of one segment type."""
    out: list[list[int]] = []
    for instance in analysis.segments.instances:
        if out and analysis.segments.instances[out[-1][-1]].unique_id == instance.unique_id:
            out[-1].append(instance.index)
        else:
            out.append([instance.index])
    return out


def build_block_layout(analysis: SegmentedStep, names: tuple[str, ...]) -> BlockLayout:
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
                name = (
                    unique.label if repeated[unique.label] == 1 else f"{unique.label}[{unique.id}]"
                )
                class_list.append(
                    BlockClass(
                        key,
                        f"{name} · {names[block]}",
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


def build_op_layout(analysis: SegmentedStep, index: int) -> OpLayout:
    """Ops in layers by depth (x); within a layer, ordered by the mean rank of the producers
    already placed (the barycentre heuristic of layered drawing), so that most edges run
    straight instead of crossing the layer."""
    graph = analysis.graph
    ops = analysis.segments.instances[index].ops
    base = min((graph.ops[o].depth for o in ops), default=0)
    position = {op: k for k, op in enumerate(ops)}
    producers: dict[int, list[int]] = {}
    edges = []
    for k, op in enumerate(ops):
        for vid in graph.ops[op].inputs:
            producer = graph.values[vid].producer
            if producer is not None and producer in position:
                edges.append((position[producer], k))
                producers.setdefault(op, []).append(producer)
    columns: dict[int, list[int]] = {}
    for op in ops:
        columns.setdefault(graph.ops[op].depth - base, []).append(op)
    where: dict[int, tuple[float, float]] = {}
    for depth in sorted(columns):
        members = columns[depth]

        def barycentre(op: int, members: list[int] = members) -> tuple[float, int]:
            placed = [where[p][1] for p in producers.get(op, ()) if p in where]
            mean = sum(placed) / len(placed) if placed else (members.index(op) - len(members) / 2)
            return (mean, op)

        def rows(order: list[int]) -> dict[int, float]:
            return {op: rank - (len(order) - 1) / 2 for rank, op in enumerate(order)}

        def reach(row: dict[int, float]) -> float:
            """Rows the layer's edges from the layers placed so far cross."""
            return sum(
                abs(row[op] - where[p][1])
                for op in row
                for p in producers.get(op, ())
                if p in where
            )

        # a heuristic: keep the program's order where it is the better of the two
        ordered, program = rows(sorted(members, key=barycentre)), rows(members)
        for op, y in (ordered if reach(ordered) < reach(program) else program).items():
            where[op] = (float(depth), y)
    return OpLayout(
        instance=index,
        ops=tuple(ops),
        x=tuple(where[o][0] for o in ops),
        y=tuple(where[o][1] for o in ops),
        edges=tuple(edges),
    )
