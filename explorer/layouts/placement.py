"""Placement: one layout for every value of the step under a Config.

`space.shardings` places what the blocks own (and the parameters, their optimizer state and
their updates). This pass places everything else, so that nothing is left to the compiler's
sharding propagation that the cost model has not seen (DESIGN, method step 3):

- **Segment boundaries.** A tensor crossing from instance n to n+1 is constrained at its
  producer to the layout instance n's last block leaves it in, and at every reader in n+1 to
  the layout that instance's first block wants (cotangents the other way round). The move in
  between is exactly what the resharding programs price (T_R).
- **The follow rule.** An op outside every block takes the layout of one operand (the
  *leader*: one that is split, then split over the most devices, then the deepest, then the
  largest) mapped through the op's affine map (`affine.split_target`); a split the op cannot
  carry is gathered first; a split of a reduced dim leaves partial sums that are all-reduced.
  Its other operands are read in the layout its result implies (`affine.split_source`).
- **Pulled splits.** An op outside blocks whose operands are all replicated, and whose
  readers all read its result split one way, computes only that split (`pull_replicated`):
  slicing a replicated tensor moves nothing (a loss's one-hot of replicated labels).
- **Readers.** Every op reads each operand in an explicit layout: where that differs from the
  layout the operand was produced in, the reader carries a constraint, so the resharding
  happens where the priced program put it. The readers of a boundary tensor made split
  that read it in one other layout share one move (`ShardingAssignment.crossing_reads`):
  the resharding program prices one move per tensor, and the next segment's program
  receives it once, as one input. A move per reader leaves the partitioner one resharded
  copy per reader, and a contraction reading each copy gathers it again (the forward and
  the weight-gradient contractions of a layer's first block: one all-gather more per layer
  than was priced). A tensor made whole is sliced where it is read: nothing moves.

The same placement drives the segment programs, `evaluate` and `apply_plan`, so the program
that runs is, collective for collective, the program whose pieces were priced. `sources`
records which blocks decided each value's layout: a segment reading a value decided by a block
of another segment costs what that block's strategy makes it cost (tied embeddings), which the
profiler keys on. Ops whose dependencies the affine analysis does not know are `unplaced`:
their results stay replicated, and they are listed, never hidden.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from explorer import affine
from explorer.ir import (
    Config,
    DimAxes,
    Graph,
    OpNode,
    ParallelBlock,
    Segmentation,
    ShardingAssignment,
    ValueKind,
    match_suffix,
    path_suffix,
)
from explorer.mesh import MeshSpec
from explorer.space import boundary_moves, shardings

# Reductions whose split input dims leave partial results (all-reduced by the partitioner).
PARTIAL_REDUCTIONS = frozenset(
    {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "argmax"}
)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where every value lives under one Config, and which blocks decided it."""

    assignment: ShardingAssignment
    sources: tuple[frozenset[int], ...]  # per value id: blocks whose strategy decided it
    unplaced: tuple[int, ...]  # op ids the follow rule could not map (results replicated)


def place(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    config: Config,
    mesh: MeshSpec,
    segmentation: Segmentation | None = None,
    *,
    parameter_layouts: Mapping[str, DimAxes] | None = None,
) -> Placement:
    """A layout for every value of `graph` under `config` (see the module doc).

    Without `segmentation` no boundary is constrained (a step not cut into segments).
    """
    core = shardings(graph, blocks, config, mesh, parameter_layouts)
    walk = _Walk(graph, blocks, mesh, core)
    if segmentation is not None:
        walk.constrain_boundaries(segmentation, config)
    walk.run()
    walk.pull_replicated()
    return walk.result(core)


# The mark of a plan whose whole step shares a boundary tensor's move among its readers
# (`shared_moves`): before the rule its step moved the tensor once per reader, so a whole step
# kept under its document from then is not this one. A plan with no such tensor compiles as
# before and keeps its document.
MOVED_ONCE = "moved-once-24"


def shared_moves(graph: Graph, assignment: ShardingAssignment) -> tuple[tuple[int, int], ...]:
    """The moves of boundary tensors two readers or more share: (value id, readers), one per
    tensor and layout read (`ShardingAssignment.crossing_reads`)."""
    layout = {(op, position): dims for op, position, dims in assignment.operands}
    return _shared(
        (graph.ops[op].inputs[position], layout[(op, position)])
        for op, position in assignment.crossing_reads
    )


def _shared(reads: Iterable[tuple[int, DimAxes]]) -> tuple[tuple[int, int], ...]:
    """(value id, readers) of each tensor read in one layout by two readers or more."""
    readers = Counter(reads)
    return tuple((vid, count) for (vid, _), count in readers.items() if count > 1)


@dataclass(frozen=True, slots=True)
class BoundaryMove:
    """A tensor crossing a segment boundary: made in `produced` (as the block before the
    boundary leaves it), read at `reads` (op, position) in `wanted` (as the block after it
    wants it), and the blocks that decided each."""

    value: int
    produced: DimAxes
    wanted: DimAxes
    producer_blocks: frozenset[int]
    reader_blocks: frozenset[int]
    reads: tuple[tuple[int, int], ...]


def boundary_constraints(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    config: Config,
    mesh: MeshSpec,
    segmentation: Segmentation,
) -> tuple[BoundaryMove, ...]:
    """Every boundary's tensors under `config`, in boundary order (a later one overrides an
    earlier one's layout of the same tensor): what the walk constrains before it places the
    ops, and all that decides which moves the whole step shares (`boundary_shared_moves`)."""
    blocks_of = [i.blocks for i in segmentation.instances]
    found: list[BoundaryMove] = []
    for boundary in segmentation.boundaries:
        before, after = boundary.before, boundary.before + 1
        last = blocks_of[before][-1] if blocks_of[before] else None
        first = blocks_of[after][0] if blocks_of[after] else None
        moves = boundary_moves(
            graph,
            blocks,
            segmentation,
            before,
            mesh,
            last_choice=config.choices[last] if last is not None else 0,
            first_choice=config.choices[first] if first is not None else 0,
        )
        forward = set(boundary.forward)
        for vid, produced, wanted in moves:
            producer_block, reader_block = (last, first) if vid in forward else (first, last)
            reader_segment = after if vid in forward else before
            reads = tuple(
                (user, position)
                for user in graph.users(vid)
                if segmentation.segment_of_op[user] == reader_segment
                for position, operand in enumerate(graph.ops[user].inputs)
                if operand == vid
            )
            found.append(
                BoundaryMove(
                    vid, produced, wanted, _only(producer_block), _only(reader_block), reads
                )
            )
    return tuple(found)


def boundary_shared_moves(
    graph: Graph,
    blocks: tuple[ParallelBlock, ...],
    config: Config,
    mesh: MeshSpec,
    segmentation: Segmentation,
) -> tuple[tuple[int, int], ...]:
    """`shared_moves` of the step placed on `segmentation` under `config`, without placing
    it: a boundary tensor is made in the layout its boundary fixes, and its readers read it
    in the one the boundary wants, so only the boundaries decide which moves are shared
    (a plan's `MOVED_ONCE` mark, for each plan built, at a fraction of a placement's cost)."""
    made: dict[int, DimAxes] = {}
    read: dict[tuple[int, int], DimAxes] = {}
    for move in boundary_constraints(graph, blocks, config, mesh, segmentation):
        made[move.value] = move.produced
        read.update(dict.fromkeys(move.reads, move.wanted))
    moved = ((graph.ops[op].inputs[position], wanted) for (op, position), wanted in read.items())
    # (as `place` leaves it: a tensor made whole is sliced where read; a PRNG key, the
    # compiler places)
    return _shared(
        (vid, wanted)
        for vid, wanted in moved
        if wanted != made[vid] and any(made[vid]) and _numeric(graph.values[vid].type.dtype)
    )


def boundary_reads(segmentation: Segmentation, graph: Graph) -> set[tuple[int, int]]:
    """(value id, reading segment) of every tensor crossing a boundary: where T_R applies."""
    reads: set[tuple[int, int]] = set()
    for boundary in segmentation.boundaries:
        reads.update((v, boundary.before + 1) for v in boundary.forward)
        reads.update((v, boundary.before) for v in boundary.backward)
    return reads


def _numeric(dtype: str) -> bool:
    try:
        np.dtype(dtype)
    except TypeError:
        return False  # PRNG keys and other extended dtypes: the compiler places them
    return True


class _Walk:
    def __init__(
        self,
        graph: Graph,
        blocks: tuple[ParallelBlock, ...],
        mesh: MeshSpec,
        core: ShardingAssignment,
    ) -> None:
        self.graph = graph
        self.blocks = blocks
        self.mesh = mesh
        self.layout: dict[int, DimAxes] = {}
        self.source: dict[int, frozenset[int]] = {}
        self.fixed: dict[int, tuple[DimAxes, frozenset[int]]] = {}  # decided before the walk
        self.reads: dict[tuple[int, int], DimAxes] = {}  # (op, position) -> layout it reads
        self.fixed_reads: dict[tuple[int, int], DimAxes] = {}
        self.read_sources: dict[tuple[int, int], frozenset[int]] = {}
        self.crossing: set[tuple[int, int]] = set()  # reads of boundary tensors
        self.unplaced: list[int] = []
        owner: dict[int, int] = {}
        for block in blocks:
            for value_layout in block.layouts:
                owner.setdefault(value_layout.value, block.index)
        self.owner = owner
        for op, position, dims in core.operands:
            self.fixed_reads[(op, position)] = dims
        for vid, dims in core.values:
            found = owner.get(vid)
            self.fixed[vid] = (dims, frozenset() if found is None else frozenset({found}))
        self._place_inputs(core)

    def _place_inputs(self, core: ShardingAssignment) -> None:
        graph = self.graph
        by_suffix: dict[tuple[str, tuple[int, ...]], frozenset[int]] = {}
        for vid, dims in zip(graph.inputs, core.inputs, strict=True):
            value = graph.values[vid]
            found = self.owner.get(vid)
            self.layout[vid] = dims
            self.source[vid] = frozenset() if found is None else frozenset({found})
            if value.kind is ValueKind.PARAMETER:
                by_suffix[(path_suffix(value.path), value.type.shape)] = self.source[vid]
        for vid in graph.inputs:  # optimizer state lives like its parameter
            value = graph.values[vid]
            if value.kind is ValueKind.OPTIMIZER_STATE:
                matched = match_suffix(value.path, value.type.shape, by_suffix)
                self.source[vid] = matched or frozenset()

    def constrain_boundaries(self, segmentation: Segmentation, config: Config) -> None:
        graph = self.graph
        # A block whose split survives past its instance's end (an RMSNorm of the next
        # layer keeps the batch split of this layer's last block) does not reach into the
        # next instance: there the tensor arrives as that instance's first block wants it,
        # and the ops follow from there.
        home = {b.index: segmentation.segment_of_op[b.head] for b in self.blocks}
        for vid in list(self.fixed):
            owner = self.owner.get(vid)
            producer = graph.values[vid].producer
            if (
                owner is not None
                and producer is not None
                and segmentation.segment_of_op[producer] != home[owner]
            ):
                del self.fixed[vid]
        for move in boundary_constraints(graph, self.blocks, config, self.mesh, segmentation):
            self.fixed[move.value] = (move.produced, move.producer_blocks)
            for read in move.reads:
                self.fixed_reads[read] = move.wanted
                self.read_sources[read] = move.reader_blocks
                self.crossing.add(read)

    def run(self) -> None:
        for op in self.graph.ops:
            self._place(op)

    # -- one op ----------------------------------------------------------------------------

    def _maps(self, op: OpNode) -> tuple[affine.AffineMap | None, ...] | None:
        """`affine.traced_op_maps` of the op's first result."""
        return affine.traced_op_maps(op, 0)

    def _place(self, op: OpNode) -> None:
        graph = self.graph
        outputs = [vid for vid in op.outputs if _numeric(graph.values[vid].type.dtype)]
        decided = [vid in self.fixed for vid in outputs]
        if outputs and all(decided):
            for vid in outputs:
                self.layout[vid], self.source[vid] = self.fixed[vid]
            self._read_as_result_implies(op, leader=None)
            return
        leader = self._leader(op)
        maps = self._maps(op)
        if leader is None:
            if maps is None and any(self._split(op, p) for p in range(len(op.inputs))):
                self.unplaced.append(op.id)
            for vid in op.outputs:
                if vid in self.fixed:
                    self.layout[vid], self.source[vid] = self.fixed[vid]
                elif _numeric(graph.values[vid].type.dtype):
                    self.layout[vid] = ((),) * graph.values[vid].type.rank
                    self.source[vid] = frozenset()
            self._read_as_result_implies(op, leader=None)
            return
        carried = self._follow(op, leader)
        origin = self._read_source(op, leader)
        for result, vid in enumerate(op.outputs):
            if vid in self.fixed:
                self.layout[vid], self.source[vid] = self.fixed[vid]
            elif _numeric(graph.values[vid].type.dtype):
                self.layout[vid] = carried[result]
                self.source[vid] = origin
        self._read_as_result_implies(op, leader=leader)

    def _leader(self, op: OpNode) -> int | None:
        """The operand whose layout the op follows: a split one first, then the one split
        over the most devices (on a 2-D mesh, a weight-gradient dot follows the saved
        activation split on both axes rather than a cotangent split on one, which would
        gather the activation), then the deepest, then the largest."""
        maps = self._maps(op)
        if maps is None:
            return None
        best: tuple[tuple[int, int, int, int, int], int] | None = None
        for position, vid in enumerate(op.inputs):
            tt = self.graph.values[vid].type
            if tt.rank == 0 or position >= len(maps) or maps[position] is None:
                continue
            if not _numeric(tt.dtype):
                continue
            producer = self.graph.values[vid].producer
            depth = -1 if producer is None else self.graph.ops[producer].depth
            split = int(self._split(op, position))
            key = (split, self._shards(op, position), depth, tt.nbytes, -position)
            if best is None or key > best[0]:
                best = (key, position)
        return None if best is None else best[1]

    def _shards(self, op: OpNode, position: int) -> int:
        """How many pieces operand `position` is read in (1: replicated)."""
        dims = self._reading(op, position) or ()
        return self.mesh.axes_size(tuple(axis for axes in dims for axis in axes))

    def _split(self, op: OpNode, position: int) -> bool:
        dims = self._reading(op, position)
        return dims is not None and any(dims)

    def _reading(self, op: OpNode, position: int) -> DimAxes | None:
        """The layout `op` receives operand `position` in, before any reader constraint of
        its own: a boundary or head requirement, else the producer's layout."""
        fixed = self.fixed_reads.get((op.id, position))
        if fixed is not None:
            return fixed
        return self.layout.get(op.inputs[position])

    def _read_source(self, op: OpNode, position: int) -> frozenset[int]:
        fixed = self.read_sources.get((op.id, position))
        if fixed is not None:
            return fixed
        return self.source.get(op.inputs[position], frozenset())

    def _follow(self, op: OpNode, leader: int) -> list[DimAxes]:
        """Result layouts when the op follows operand `leader`."""
        layout = self._reading(op, leader)
        assert layout is not None
        reduced = set(op.param("axes") or ()) if op.primitive in PARTIAL_REDUCTIONS else set()
        results: list[DimAxes] = []
        for result, tt in enumerate(op.output_types):
            maps = affine.traced_op_maps(op, result)
            op_map = maps[leader] if maps is not None and leader < len(maps) else None
            out: list[tuple[str, ...]] = [()] * tt.rank
            for dim, axes in enumerate(layout):
                if not axes or dim in reduced:
                    continue  # a reduced split leaves partial sums: all-reduced, replicated
                target = op_map.split_target(dim, self.mesh.axes_size(axes)) if op_map else None
                if target is not None and not out[target]:
                    out[target] = axes  # else the op cannot carry the split: gathered
            results.append(tuple(out))
        return results

    def _read_as_result_implies(self, op: OpNode, leader: int | None) -> None:
        """Readers keep only the constraints decided before the walk (boundaries, heads).

        Every value is constrained where it is made, so each op's operand and result
        layouts are fixed and the partitioner's choice for it is local: the same in a
        segment program as in the whole step. Only a boundary read differs (the segment
        program receives the tensor already moved), so only there does the reader carry
        its own constraint.
        """
        for position in range(len(op.inputs)):
            key = (op.id, position)
            if key in self.fixed_reads:
                self.reads[key] = self.fixed_reads[key]

    # -- replicated ops split where they are read --------------------------------------------

    def pull_replicated(self) -> None:
        """An op outside every block whose operands are all replicated computes the same on
        every device. Where all its readers want its result split one way, it computes only
        that split instead: nothing moves, and it holds and computes a fraction (a loss's
        one-hot of replicated labels under a batch-split head: 2.1 GB per device at LLaMA-7B
        shapes, batch 8, where the split one holds 0.26 GB). In reverse order, so a chain of
        such ops (iota, compare, convert) takes the split from its last reader back."""
        graph = self.graph
        for op in reversed(graph.ops):
            if len(op.outputs) != 1:
                continue
            vid = op.outputs[0]
            value = graph.values[vid]
            if vid in self.fixed or value.type.rank == 0 or not _numeric(value.type.dtype):
                continue
            if any(self.layout.get(vid, ())):
                continue
            if not all(_numeric(graph.values[v].type.dtype) for v in op.inputs):
                continue  # (a PRNG key: leave random bits where the compiler puts them)
            if any(self._split(op, p) for p in range(len(op.inputs))) or self._maps(op) is None:
                continue
            wanted = self._wanted_by_readers(vid)
            if wanted is not None:
                self.layout[vid], self.source[vid] = wanted

    def _wanted_by_readers(self, vid: int) -> tuple[DimAxes, frozenset[int]] | None:
        """The one split layout every reader of `vid` reads it in (from its own result's
        layout, through its affine map), with the blocks that decided it; None when a reader
        wants it whole or the readers disagree."""
        graph = self.graph
        found: set[DimAxes] = set()
        sources: set[int] = set()
        for user in graph.users(vid):
            reader = graph.ops[user]
            if reader.id in self.unplaced or len(reader.outputs) != 1:
                return None
            maps = self._maps(reader)
            result = self.layout.get(reader.outputs[0])
            if maps is None or result is None:
                return None
            for position, operand in enumerate(reader.inputs):
                if operand != vid:
                    continue
                if (user, position) in self.fixed_reads or position >= len(maps):
                    return None
                op_map = maps[position]
                if op_map is None:
                    return None
                # (a reduction reads only its kept dims split: no partial sums)
                dims: list[tuple[str, ...]] = [()] * graph.values[vid].type.rank
                for result_dim, axes in enumerate(result):
                    if not axes:
                        continue
                    source = op_map.split_source(result_dim, self.mesh.axes_size(axes))
                    if source is not None:
                        dims[source] = axes
                found.add(tuple(dims))
                sources |= self.source.get(reader.outputs[0], frozenset())
        if len(found) != 1:
            return None
        (layout,) = found
        if not any(layout):
            return None
        return layout, frozenset(sources)

    # -- result ----------------------------------------------------------------------------

    def result(self, core: ShardingAssignment) -> Placement:
        graph = self.graph
        inputs = set(graph.inputs)
        values = tuple(
            sorted(
                (vid, dims)
                for vid, dims in self.layout.items()
                if vid not in inputs and graph.values[vid].type.rank > 0
            )
        )
        operands = tuple(
            sorted(
                (op, position, dims)
                for (op, position), dims in self.reads.items()
                if dims != self.layout.get(graph.ops[op].inputs[position])
            )
        )
        sources = tuple(self.source.get(v.id, frozenset()) for v in graph.values)
        # a boundary tensor made whole is sliced where it is read, which moves nothing: its
        # reads stay their own (only tensors made split are moved, once)
        crossing = tuple(
            (op, position)
            for op, position, _ in operands
            if (op, position) in self.crossing
            and any(self.layout.get(graph.ops[op].inputs[position], ()))
        )
        assignment = ShardingAssignment(
            core.mesh_axes, core.inputs, core.outputs, values, operands, core.scatters, crossing
        )
        return Placement(assignment, sources, tuple(self.unplaced))


def _only(block: int | None) -> frozenset[int]:
    return frozenset() if block is None else frozenset({block})
