"""ParallelBlocks: the paper's Algorithm 1, backward grouping and parameter input branches.

One pass over the traced Graph:

1. Forward contraction ops (`dot_general`, `conv_general_dilated`), sorted by depth, each start
   a block unless already grouped. The head's partitionable dims get roles (E, M, N, K: see
   `DimRole` and `head_geometry`; a role with several candidate dims takes the first that
   splits evenly, and `ParallelBlock.role_notes` says so; given the mesh's `outer` axis size,
   a first candidate of E or M passed over that splits over the outer axis alone is kept
   as E' or M' for that axis; with `contract_last`, K takes the last contracted dim that
   splits evenly instead of the first). From the head's result the
   split of each spatial role (E, M, N) is propagated to users in program order; a user joins
   the block when every role's split maps to an even block split of its result (Eq. 2 via
   `affine.AffineMap.split_target`). The first user that breaks it ends the block there;
   a primed role that breaks is dropped from the block instead, so the blocks, and every
   unprimed layout in them, are the same with or without `outer`.
2. Ops on parameter input branches (casts, broadcasts, transposes of a weight) join the block
   that consumes them, with the layout that block requires, propagated backwards. A parameter
   wanted by two blocks keeps the first block's layout and the conflict is recorded.
3. Backward ops join the block of the forward op they were derived from (the tracer's link, or
   failing that, the one block whose forward ops share their source line and scope), and their
   results take the layout of the forward value of the same shape, unless the block's own
   operands of the op put the split on another dim (a square weight's transposed gradient).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from explorer import affine
from explorer.ir import (
    CONTRACTION_PRIMITIVES,
    BlockAnalysis,
    Conflict,
    DimRole,
    Graph,
    OperandLayout,
    OpNode,
    ParallelBlock,
    Role,
    ValueKind,
    ValueLayout,
)

SPATIAL_ROLES = (DimRole.E, DimRole.M, DimRole.N)
_MAX_END_REASONS = 8

Layout = dict[DimRole, int]


def build_blocks(
    graph: Graph, parallelism: int, outer: int | None = None, *, contract_last: bool = False
) -> BlockAnalysis:
    """Group the graph's ops into ParallelBlocks for a split into `parallelism` parts;
    `outer` (a proper divisor of it: the outer axis size of a 2-D mesh) also places E' and
    M' for that axis (`DimRole`); `contract_last` gives K of a head contracting several dims
    the last of them that splits evenly (`head_geometry`)."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be >= 1, found {parallelism}")
    if outer is not None and (outer < 2 or outer >= parallelism or parallelism % outer):
        raise ValueError(
            f"outer must be a proper divisor of the parallelism {parallelism} (the outer "
            f"axis of a 2-D mesh), found {outer}"
        )
    state = _State(graph, parallelism, outer, contract_last)
    heads = sorted(
        (op for op in graph.contractions() if op.role is Role.FORWARD),
        key=lambda op: (op.depth, op.id),
    )
    drafts = [state.grow(head) for head in heads if state.block_of[head.id] is None]
    for draft in drafts:
        state.attach_branches(draft)
    state.attach_backward(drafts)
    blocks = tuple(draft.freeze(graph) for draft in drafts)
    return BlockAnalysis(
        blocks=blocks,
        block_of_op=tuple(state.block_of),
        conflicts=tuple(state.conflicts),
        unknown_primitives=tuple(sorted(state.unknown)),
        parallelism=parallelism,
        outer_parts=outer,
        contracted_last=any(draft.geometry.contracted_last for draft in drafts),
    )


@dataclass
class _Draft:
    index: int
    head: OpNode
    geometry: HeadGeometry
    forward: list[int] = field(default_factory=list)
    backward: list[int] = field(default_factory=list)
    branch: list[int] = field(default_factory=list)
    layouts: dict[int, Layout] = field(default_factory=dict)
    operands: list[tuple[int, int, int, Layout]] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)
    dropped: dict[DimRole, str] = field(default_factory=dict)  # primed roles, and why

    def drop(self, role: DimRole, why: str) -> None:
        """Take primed `role` out of the block: some op cannot carry its split."""
        if role in self.dropped:
            return
        self.dropped[role] = why
        for dims in self.layouts.values():
            dims.pop(role, None)
        for _, _, _, dims in self.operands:
            dims.pop(role, None)

    def freeze(self, graph: Graph) -> ParallelBlock:
        def layout(value: int, dims: Layout) -> ValueLayout:
            return ValueLayout(value, tuple((r, dims[r]) for r in DimRole if r in dims))

        return ParallelBlock(
            index=self.index,
            head=self.head.id,
            forward_ops=tuple(sorted(self.forward)),
            backward_ops=tuple(sorted(self.backward)),
            branch_ops=tuple(sorted(self.branch)),
            role_sizes=tuple(
                (role, size) for role, size in self.geometry.role_sizes if role not in self.dropped
            ),
            layouts=tuple(layout(v, d) for v, d in sorted(self.layouts.items())),
            operand_layouts=tuple(
                OperandLayout(op, pos, layout(v, d)) for op, pos, v, d in self.operands
            ),
            scope=self.head.scope,
            ends=tuple(self.ends[:_MAX_END_REASONS]),
            role_notes=self.geometry.notes
            + tuple(f"{role.value} dropped: {why}" for role, why in self.dropped.items()),
            partial_sums=self._partial_sums(graph),
        )

    def _partial_sums(self, graph: Graph) -> tuple[tuple[DimRole, tuple[int, ...]], ...]:
        """Per role whose split leaves partial sums, the block's contractions reading that
        role's dim (as the block reads or owns their operands, every one of them: the
        scattered contraction is computed on their shards) into a result holding M but not
        it: where a scattering twin reduce-scatters onto M instead of all-reducing."""
        wanted = {(op, position): dims for op, position, _, dims in self.operands}
        found: dict[DimRole, list[int]] = {}
        for op_id in sorted(self.forward + self.backward):
            op = graph.ops[op_id]
            result = self.layouts.get(op.outputs[0]) if op.outputs else None
            if op.primitive not in CONTRACTION_PRIMITIVES or not result or DimRole.M not in result:
                continue
            read = [wanted.get((op_id, p), self.layouts.get(v)) for p, v in enumerate(op.inputs)]
            if any(dims is None for dims in read):
                continue  # (an LM head's tied embedding: its embedding block lays it out)
            for role in (DimRole.K, DimRole.N):
                if role not in result and any(role in dims for dims in read if dims):
                    found.setdefault(role, []).append(op_id)
        return tuple((role, tuple(ops)) for role, ops in found.items())


class _State:
    def __init__(
        self, graph: Graph, parallelism: int, outer: int | None, contract_last: bool
    ) -> None:
        self.graph = graph
        self.parts = parallelism
        self.outer = outer
        self.contract_last = contract_last
        self.block_of: list[int | None] = [None] * len(graph.ops)
        self.value_owner: dict[int, int] = {}
        self.conflicts: list[Conflict] = []
        self.unknown: set[str] = set()
        self._maps: dict[tuple[int, int], tuple[affine.AffineMap | None, ...] | None] = {}
        self.param_derived = self._parameter_derived()
        self.next_index = 0

    def parts_of(self, role: DimRole) -> int:
        """How many parts `role` splits into: the outer axis's for a primed role."""
        return self.outer if role.outer_only and self.outer else self.parts

    # -- affine maps ----------------------------------------------------------------------

    def maps(self, op: OpNode, result: int = 0) -> tuple[affine.AffineMap | None, ...] | None:
        key = (op.id, result)
        if key not in self._maps:
            found = affine.traced_op_maps(op, result)
            if found is None:
                self.unknown.add(op.primitive)
            self._maps[key] = found
        return self._maps[key]

    # -- Algorithm 1 ------------------------------------------------------------------------

    def grow(self, head: OpNode) -> _Draft:
        geometry = head_geometry(head, self.parts, self.outer, contract_last=self.contract_last)
        draft = _Draft(self.next_index, head, geometry)
        self.next_index += 1
        self._add(draft, head, draft.forward)
        out_layout = draft.geometry.result_dims(self.parts_of)
        for vid in head.outputs:
            self._own(draft, vid, out_layout)
        # Program order is topological: when a user is popped, every operand it reads that
        # depends on the head has been decided. Values that depend on the head through an op
        # that broke the split are "tainted": an op reading one is not parallelism-preserving
        # even when its other operands are (the LayerNorm `x - mean(x)` after a residual).
        frontier: list[int] = []
        queued: set[int] = set()
        live: set[int] = set()  # queued ops that read an owned value
        tainted: set[int] = set()

        def enqueue_users(vid: int, owned: bool) -> None:
            for user in self.graph.users(vid):
                # backward readers of saved activations lie far ahead and never join
                if self.graph.ops[user].role is not Role.FORWARD:
                    continue
                if owned:
                    live.add(user)
                if user not in queued:
                    queued.add(user)
                    heapq.heappush(frontier, user)

        for vid in head.outputs:
            enqueue_users(vid, owned=True)
        while live:
            op = self.graph.ops[heapq.heappop(frontier)]
            reads_owned = op.id in live
            live.discard(op.id)
            results = None
            if self.block_of[op.id] is None and not any(v in tainted for v in op.inputs):
                results = self._propagate(draft, op) if reads_owned else None
            elif reads_owned and self.block_of[op.id] is None:
                draft.ends.append(
                    f"#{op.id} {op.primitive} ({op.scope}): also reads the block's result "
                    "through an op that broke the split"
                )
            if results is None:
                tainted.update(op.outputs)
                for vid in op.outputs:
                    enqueue_users(vid, owned=False)
                continue
            self._add(draft, op, draft.forward)
            for vid, layout in zip(op.outputs, results, strict=True):
                self._own(draft, vid, layout)
                enqueue_users(vid, owned=True)
        return draft

    def _propagate(self, draft: _Draft, op: OpNode) -> list[Layout] | None:
        """Result layouts of `op` if every tracked split survives it, else None (recorded);
        a primed role's split that does not survive is dropped from the block."""
        results: list[Layout] = []
        breaks: dict[DimRole, str] = {}  # primed roles `op` cannot carry
        for result in range(len(op.outputs)):
            maps = self.maps(op, result)
            if maps is None:
                draft.ends.append(f"#{op.id} {op.primitive}: unknown to the affine analysis")
                return None
            layout: Layout = {}
            for position, vid in enumerate(op.inputs):
                source = draft.layouts.get(vid)
                if source is None or self.value_owner.get(vid) != draft.index:
                    continue
                op_map = maps[position] if position < len(maps) else None
                for role, dim in source.items():
                    target = op_map.split_target(dim, self.parts_of(role)) if op_map else None
                    if target is None or layout.get(role, target) != target:
                        why = (
                            f"#{op.id} {op.primitive} ({op.scope}): the {role.value} split of "
                            f"operand {position} dim {dim} is not an even block split of its "
                            "result"
                        )
                        if role.outer_only:
                            breaks.setdefault(role, why)
                            continue
                        draft.ends.append(why)
                        return None
                    layout[role] = target
            results.append(layout)
        for role, why in breaks.items():  # only once `op` joins: it is the block's op then
            draft.drop(role, why)
            for layout in results:
                layout.pop(role, None)
        return results

    # -- parameter input branches ---------------------------------------------------------

    def attach_branches(self, draft: _Draft) -> None:
        for op_id in list(draft.forward):
            op = self.graph.ops[op_id]
            for position, vid in enumerate(op.inputs):
                owned = self.value_owner.get(vid) == draft.index and vid in draft.layouts
                if owned and not (op_id == draft.head.id and self.param_derived[vid]):
                    continue
                wanted = self._operand_layout(draft, op, position)
                if wanted is None:
                    continue
                if self.param_derived[vid]:
                    self._claim_branch(draft, vid, wanted)
                elif op_id == draft.head.id:
                    draft.operands.append((op_id, position, vid, wanted))

    def _operand_layout(self, draft: _Draft, op: OpNode, position: int) -> Layout | None:
        if op.id == draft.head.id:
            return {
                role: dim
                for role, dim in draft.geometry.operand_dims(position, self.parts_of).items()
                if role not in draft.dropped
            }
        maps = self.maps(op)
        op_map = maps[position] if maps and position < len(maps) else None
        if op_map is None:
            return None
        result_layout = draft.layouts.get(op.outputs[0], {})
        wanted: Layout = {}
        for role, dim in result_layout.items():
            source = op_map.split_source(dim, self.parts_of(role))
            if source is not None:
                wanted[role] = source
        return wanted

    def _claim_branch(self, draft: _Draft, vid: int, wanted: Layout) -> None:
        owner = self.value_owner.get(vid)
        if owner is not None and owner != draft.index:
            if not any(c.value == vid and draft.index in c.blocks for c in self.conflicts):
                self.conflicts.append(
                    Conflict(
                        value=vid,
                        blocks=(owner, draft.index),
                        chosen=owner,
                        reason=f"{self._value_name(vid)} feeds blocks {owner} and "
                        f"{draft.index}; it keeps the layout of block {owner}, the earlier "
                        "one along the dependency path, and block "
                        f"{draft.index} reshards it",
                    )
                )
            return
        self._own(draft, vid, wanted)
        producer = self.graph.producer(vid)
        if producer is None or self.block_of[producer.id] is not None:
            return
        self._add(draft, producer, draft.branch)
        maps = self.maps(producer)
        for position, operand in enumerate(producer.inputs):
            if not self.param_derived[operand]:
                continue
            op_map = maps[position] if maps and position < len(maps) else None
            upstream: Layout = {}
            for role, dim in wanted.items():
                source = op_map.split_source(dim, self.parts_of(role)) if op_map else None
                if source is not None:
                    upstream[role] = source
            self._claim_branch(draft, operand, upstream)

    def _parameter_derived(self) -> list[bool]:
        """Values computed from parameters alone (constants aside), outside the backward pass."""
        derived = [v.kind is ValueKind.PARAMETER for v in self.graph.values]
        for op in self.graph.ops:
            if op.role is Role.BACKWARD or op.primitive in CONTRACTION_PRIMITIVES:
                continue
            sources = [v for v in op.inputs if self.graph.values[v].kind is not ValueKind.CONSTANT]
            if sources and all(derived[v] for v in sources):
                for vid in op.outputs:
                    derived[vid] = True
        return derived

    # -- backward grouping ----------------------------------------------------------------

    def attach_backward(self, drafts: list[_Draft]) -> None:
        by_key: dict[tuple[str, str], set[int]] = defaultdict(set)
        for draft in drafts:
            for op_id in draft.forward:
                op = self.graph.ops[op_id]
                by_key[(op.source, op.scope)].add(draft.index)
        for op in self.graph.ops:
            if op.role is not Role.BACKWARD or self.block_of[op.id] is not None:
                continue
            block = self.block_of[op.forward_op] if op.forward_op is not None else None
            if block is None:
                owners = by_key.get((op.source, op.scope), set())
                block = next(iter(owners)) if len(owners) == 1 else None
            if block is None:
                continue
            draft = drafts[block]
            self._add(draft, op, draft.backward)
            self._backward_layouts(draft, op)

    def _backward_layouts(self, draft: _Draft, op: OpNode) -> None:
        """A cotangent takes the layout of the forward value of its shape in the same block."""
        if op.forward_op is not None:
            forward = [self.graph.ops[op.forward_op]]
        else:
            forward = [
                self.graph.ops[f]
                for f in draft.forward
                if self.graph.ops[f].source == op.source and self.graph.ops[f].scope == op.scope
            ]
        candidates: dict[tuple[int, ...], list[Layout]] = defaultdict(list)
        requirements = {(o, p): d for o, p, _, d in draft.operands}
        for fwd in forward:
            for position, vid in enumerate(fwd.inputs):
                layout = draft.layouts.get(vid) or requirements.get((fwd.id, position))
                if layout is not None:
                    candidates[self.graph.values[vid].type.shape].append(layout)
            for vid in fwd.outputs:
                if vid in draft.layouts:
                    candidates[self.graph.values[vid].type.shape].append(draft.layouts[vid])
        for result, vid in enumerate(op.outputs):
            found = candidates.get(self.graph.values[vid].type.shape, [])
            unprimed = [{r: d for r, d in f.items() if not r.outer_only} for f in found]
            if not found or any(f != unprimed[0] for f in unprimed):
                continue
            # A shape can match the wrong value: the gradient of a square weight comes out
            # of its dot transposed ([out, in] before the `transpose`), the weight's shape,
            # split on the other dim. Where the op's operands put the split elsewhere, the
            # value is left to placement's follow rule, which maps it through the op.
            breaks = {
                role: f"#{op.id} {op.primitive} ({op.scope}): the forward values of its "
                f"result's shape disagree on the {role.value} split"
                for role in DimRole
                if role.outer_only and any(f.get(role) != found[0].get(role) for f in found)
            }
            layout = dict(found[0])
            if self._agrees_with_operands(draft, op, result, layout, breaks):
                for role, why in breaks.items():
                    draft.drop(role, why)
                self._own(draft, vid, {r: d for r, d in layout.items() if r not in breaks})

    def _agrees_with_operands(
        self, draft: _Draft, op: OpNode, result: int, layout: Layout, breaks: dict[DimRole, str]
    ) -> bool:
        """Whether every split of an operand the block knows lands where `layout` puts it (a
        split the op cannot carry, e.g. a contracted one, must be absent from `layout`); a
        primed role's split that does not is added to `breaks` instead."""
        maps = self.maps(op, result)
        if maps is None:
            return True  # nothing to check against: the shape is all we know
        for position, vid in enumerate(op.inputs):
            source = self._known_layout(draft, vid)
            op_map = maps[position] if position < len(maps) else None
            if source is None or op_map is None:
                continue
            for role, dim in source.items():
                if layout.get(role) != op_map.split_target(dim, self.parts_of(role)):
                    if not role.outer_only:
                        return False
                    breaks.setdefault(
                        role,
                        f"#{op.id} {op.primitive} ({op.scope}): the {role.value} split of "
                        f"operand {position} dim {dim} does not land where the forward value "
                        "of its result's shape has it",
                    )
        return True

    def _known_layout(self, draft: _Draft, vid: int) -> Layout | None:
        """What the block knows of a value: the layout it owns it in, else the one its head
        wants of it (the saved activation a weight's gradient reads)."""
        if self.value_owner.get(vid) == draft.index and vid in draft.layouts:
            return draft.layouts[vid]
        wanted = None
        for _, _, operand, layout in draft.operands:
            if operand == vid:
                wanted = layout  # the last, as a dict built from the list would keep
        return wanted

    # -- bookkeeping ----------------------------------------------------------------------

    def _add(self, draft: _Draft, op: OpNode, bucket: list[int]) -> None:
        self.block_of[op.id] = draft.index
        bucket.append(op.id)

    def _own(self, draft: _Draft, vid: int, layout: Layout) -> None:
        self.value_owner[vid] = draft.index
        draft.layouts[vid] = layout

    def _value_name(self, vid: int) -> str:
        value = self.graph.values[vid]
        return value.path or f"value {vid} {value.type}"


# -- the head's roles -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RoleDim:
    """Where one role of a head contraction splits: the dim's size and its index in the lhs,
    the rhs and the result (None where the role has no dim there, e.g. K in the result)."""

    size: int
    lhs: int | None = None
    rhs: int | None = None
    result: int | None = None

    def describe(self) -> str:
        sides = (("lhs", self.lhs), ("rhs", self.rhs))
        where = [f"{name} dim {d}" for name, d in sides if d is not None]
        return f"{' / '.join(where) or 'result dim ' + str(self.result)} (size {self.size})"


@dataclass(frozen=True, slots=True)
class HeadGeometry:
    """Where each partitionable role of a head contraction lives.

    `places` holds, in `DimRole` order, the one dim each role splits; `notes` say why a role
    took a later dim than the first candidate, or why a role is not offered at all.
    """

    places: tuple[tuple[DimRole, RoleDim], ...]
    notes: tuple[str, ...] = ()
    contracted_last: bool = False  # K took a later contracted dim for `contract_last`

    @property
    def role_sizes(self) -> list[tuple[DimRole, int]]:
        return [(role, place.size) for role, place in self.places]

    def result_dims(self, parts_of: Callable[[DimRole], int]) -> Layout:
        """The result dim of each role that splits into its `parts_of(role)` even blocks."""
        return {
            role: place.result
            for role, place in self.places
            if place.result is not None and place.size % parts_of(role) == 0
        }

    def operand_dims(self, position: int, parts_of: Callable[[DimRole], int]) -> Layout:
        """The dim of operand `position` (0: lhs, 1: rhs) each splittable role lands on."""
        dims: Layout = {}
        for role, place in self.places:
            dim = place.lhs if position == 0 else place.rhs if position == 1 else None
            if dim is not None and place.size % parts_of(role) == 0:
                dims[role] = dim
        return dims


def head_geometry(
    head: OpNode, parts: int, outer: int | None = None, *, contract_last: bool = False
) -> HeadGeometry:
    """The roles of a contraction op heading a block split into `parts` parts (and, given
    the outer axis size `outer`, its primed roles; with `contract_last`, K on the last
    contracted dim that splits evenly)."""
    if head.primitive == "conv_general_dilated":
        return _conv_geometry(head)
    return _dot_geometry(head, parts, outer, contract_last)


def _dot_geometry(
    head: OpNode, parts: int, outer: int | None, contract_last: bool = False
) -> HeadGeometry:
    """E: a batch dim, M: a free lhs dim, N: a free rhs dim, K: a contracted dim.

    A role with several candidate dims takes the first whose size divides into `parts`
    (the first one when none does): a fused q/k/v projection `[d] x [d, 3, heads, hd]`
    splits its heads, not the size-3 q/k/v dim. Where E or M so passed over its first
    candidate and that one divides into `outer` parts, E' or M' takes it (the batch of 4
    of an `[4, 1024, d]` activation on a 2x4 mesh: M splits the sequence over the whole
    mesh, M' the batch over the outer axis).

    `contract_last` looks K's candidates over from the last: a combine einsum
    `gsec,egcm->gsm` contracts its capacity `c` and its experts `e`, listed in that order;
    K on `e` reads the expert outputs split by expert, as the expert einsums' blocks leave
    them, where K on `c` must lay them out by capacity first.
    """
    (lc, rc), (lb, rb) = head.param("dimension_numbers")
    lhs, rhs = head.input_types[0].shape, head.input_types[1].shape
    lhs_free = [d for d in range(len(lhs)) if d not in lc and d not in lb]
    rhs_free = [d for d in range(len(rhs)) if d not in rc and d not in rb]
    offset_n = len(lb) + len(lhs_free)
    candidates = {
        DimRole.E: [RoleDim(lhs[a], a, b, k) for k, (a, b) in enumerate(zip(lb, rb, strict=True))],
        DimRole.M: [RoleDim(lhs[d], lhs=d, result=len(lb) + k) for k, d in enumerate(lhs_free)],
        DimRole.N: [RoleDim(rhs[d], rhs=d, result=offset_n + k) for k, d in enumerate(rhs_free)],
        DimRole.K: [RoleDim(lhs[a], a, b) for a, b in zip(lc, rc, strict=True)],
    }
    places: list[tuple[DimRole, RoleDim]] = []
    notes: list[str] = []
    contracted_last = False
    for role, options in candidates.items():
        if not options:
            continue
        place, note = _first_dividing(role, options, parts)
        if role is DimRole.K and contract_last:
            last, _ = _first_dividing(role, options[::-1], parts)
            if last is not place and last.size % parts == 0:
                contracted_last = True
                note = [
                    f"K: the last contracted dim that divides into {parts} parts: "
                    f"{last.describe()}, not {place.describe()} (contract_last)"
                ]
                place = last
        places.append((role, place))
        notes.extend(note)
    primed = {DimRole.E: DimRole.E_OUTER, DimRole.M: DimRole.M_OUTER}
    for role, place in list(places):
        first = candidates[role][0]
        if role in primed and outer and place is not first and first.size % outer == 0:
            places.append((primed[role], first))
            notes.append(
                f"{primed[role].value}: {first.describe()} splits over the outer axis "
                f"({outer} parts), not over all {parts}"
            )
    return HeadGeometry(tuple(places), tuple(notes), contracted_last)


def _first_dividing(role: DimRole, options: list[RoleDim], parts: int) -> tuple[RoleDim, list[str]]:
    """The first option whose size divides into `parts` (else the first), and a note when a
    later one was taken."""
    for index, place in enumerate(options):
        if place.size % parts == 0:
            if index == 0:
                return place, []
            skipped = ", ".join(o.describe() for o in options[:index])
            return place, [
                f"{role.value}: {skipped} does not divide into {parts} parts; "
                f"the split takes {place.describe()}"
            ]
    return options[0], []


def _conv_geometry(head: OpNode) -> HeadGeometry:
    """M: the batch, N: the output features, K: the input features (contracted).

    A grouped conv (`feature_group_count` G > 1) is a batched contraction over its groups:
    E splits whole groups (input features, kernel output features and output features
    alike, no communication), and neither N nor K is a block split of a whole dim (each
    would cut every group). Spatial dims are not offered: an output position reads a window
    across the block edge (a halo exchange this model does not price).
    """
    lhs_spec, rhs_spec, out_spec = head.param("dimension_numbers")
    groups = head.param("feature_group_count", 1)
    batch_groups = head.param("batch_group_count", 1)
    lhs, rhs = head.input_types[0].shape, head.input_types[1].shape
    places: list[tuple[DimRole, RoleDim]] = []
    notes = ["spatial dims are not split: each output reads a window across the block edge"]
    if groups > 1:
        places.append((DimRole.E, RoleDim(groups, lhs_spec[1], rhs_spec[0], out_spec[1])))
    if batch_groups == 1:
        places.append((DimRole.M, RoleDim(lhs[lhs_spec[0]], lhs=lhs_spec[0], result=out_spec[0])))
    else:
        notes.append(
            f"M: batch_group_count={batch_groups} folds batch rows into output features; "
            "the batch is not split"
        )
    if groups == 1:
        places.append((DimRole.N, RoleDim(rhs[rhs_spec[0]], rhs=rhs_spec[0], result=out_spec[1])))
        places.append((DimRole.K, RoleDim(lhs[lhs_spec[1]], lhs_spec[1], rhs_spec[1])))
    else:
        notes.append(
            f"N, K: feature_group_count={groups}: splitting output or input features within "
            "the groups is not an even block split of the feature dims; E splits whole groups"
        )
    return HeadGeometry(tuple(places), tuple(notes))
