"""Frozen artefacts handed from one stage to the next.

Nothing here imports another module of ours: these types are the vocabulary every stage
shares. Invariants are checked in `__post_init__` so a malformed artefact fails where it is
made, not three stages later.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    import networkx as nx


class Role(StrEnum):
    """Which part of the training step an op belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class ValueKind(StrEnum):
    """What a value of the graph is: a classified step input, a constant, or an op result."""

    PARAMETER = "parameter"
    OPTIMIZER_STATE = "optimizer_state"
    DATA = "data"
    RNG = "rng"
    CONSTANT = "constant"
    INTERMEDIATE = "intermediate"


# Per dim of a value: the mesh axes splitting it, outermost first (empty tuple: not split).
DimAxes = tuple[tuple[str, ...], ...]

T = TypeVar("T")

INPUT_KINDS = (ValueKind.PARAMETER, ValueKind.OPTIMIZER_STATE, ValueKind.DATA, ValueKind.RNG)

# Tensor contractions: the ops that head ParallelBlocks (a convolution contracts its input
# features and kernel window like a dot contracts its K).
CONTRACTION_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated"})


@dataclass(frozen=True, slots=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        try:
            itemsize = np.dtype(self.dtype).itemsize
        except TypeError:  # PRNG key and other extended dtypes: two uint32 words
            itemsize = 8
        return self.size * itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True, slots=True)
class Value:
    """A tensor of the graph: a step input, a constant or the result of one op."""

    id: int
    type: TensorType
    kind: ValueKind
    producer: int | None = None  # op id, None for inputs and constants
    path: str = ""  # pytree path for step inputs and outputs, e.g. "params['w']"

    def __post_init__(self) -> None:
        if (self.producer is None) == (self.kind is ValueKind.INTERMEDIATE):
            raise ValueError(
                f"value {self.id}: kind {self.kind} and producer {self.producer} disagree "
                "(intermediates have a producer, inputs and constants do not)"
            )


@dataclass(frozen=True, slots=True)
class OpNode:
    """One primitive op of the inlined training step."""

    id: int
    primitive: str
    params: tuple[tuple[str, Any], ...]  # semantic params as plain data, sorted by name
    inputs: tuple[int, ...]  # value ids
    outputs: tuple[int, ...]  # value ids
    input_types: tuple[TensorType, ...]
    output_types: tuple[TensorType, ...]
    role: Role
    scope: str  # user scope with autodiff wrappers removed, e.g. "layer_0/attn"
    name_stack: str  # JAX's name stack, e.g. "transpose(jvp(layer_0/attn))"
    source: str  # "file:line (function)" of the user frame
    depth: int  # longest path from any step input, in ops
    forward_op: int | None = None  # for a backward op: the forward op it was derived from

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.input_types) or len(self.outputs) != len(self.output_types):
            raise ValueError(f"op {self.id} ({self.primitive}): value ids and types disagree")
        if self.forward_op is not None and self.role is not Role.BACKWARD:
            raise ValueError(f"op {self.id}: only backward ops link to a forward op")

    def param(self, name: str, default: Any = None) -> Any:
        for key, value in self.params:
            if key == name:
                return value
        return default

    @property
    def params_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def __str__(self) -> str:
        ins = ", ".join(map(str, self.input_types))
        outs = ", ".join(map(str, self.output_types))
        return f"#{self.id} {self.primitive}({ins}) -> {outs} [{self.role}] {self.scope}"


@dataclass(frozen=True, slots=True)
class Graph:
    """A training step as a flat graph of primitive ops, in topological order.

    `ops[i].id == i` and `values[j].id == j`. `program` is the opaque inlined program used to
    re-execute the step with sharding constraints (see realize.py); it takes no part in
    equality.
    """

    ops: tuple[OpNode, ...]
    values: tuple[Value, ...]
    inputs: tuple[int, ...]  # value ids of the flattened step arguments, in order
    outputs: tuple[int, ...]  # value ids of the flattened step results, in order
    output_paths: tuple[str, ...] = ()  # pytree path of each flattened result, e.g. "[1]['w']"
    program: Any = field(default=None, compare=False, repr=False)
    in_tree: Any = field(default=None, compare=False, repr=False)
    out_tree: Any = field(default=None, compare=False, repr=False)
    input_notes: tuple[str, ...] = ()  # how the inputs' roles were decided (role_summary)
    _users: tuple[tuple[int, ...], ...] = field(default=(), init=False, compare=False, repr=False)
    _nx: Any = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        for index, op in enumerate(self.ops):
            if op.id != index:
                raise ValueError(f"op at position {index} has id {op.id}")
        for index, value in enumerate(self.values):
            if value.id != index:
                raise ValueError(f"value at position {index} has id {value.id}")
        users: list[list[int]] = [[] for _ in self.values]
        for op in self.ops:
            for vid in op.inputs:
                if not users[vid] or users[vid][-1] != op.id:
                    users[vid].append(op.id)
        object.__setattr__(self, "_users", tuple(tuple(u) for u in users))

    # -- navigation -------------------------------------------------------------------------

    def users(self, value_id: int) -> tuple[int, ...]:
        """Ids of the ops that read `value_id`, in program order."""
        return self._users[value_id]

    def producer(self, value_id: int) -> OpNode | None:
        producer = self.values[value_id].producer
        return None if producer is None else self.ops[producer]

    @property
    def loops(self) -> tuple[Any, ...]:
        """The scans the tracer unrolled (`_jax_compat.LoopRegion`: operands, results, and
        per iteration the op range and value ids of its body), outermost after the scans
        their bodies hold; empty for a step without scan."""
        return tuple(getattr(self.program, "loops", ()))

    def loop_twin(self, op_id: int) -> int:
        """The same op of the first iteration (in execution order) of every scan whose body
        holds `op_id`, outermost scan first; `op_id` itself outside every scan's body. The
        applied step runs each scan's body under its first iteration's layouts."""
        for loop in sorted(self.loops, key=lambda loop: loop.depth):
            first = loop.iterations[0]
            for iteration in loop.iterations[1:]:
                if iteration.start <= op_id < iteration.stop:
                    op_id = first.start + op_id - iteration.start
                    break
        return op_id

    def ops_with_role(self, role: Role) -> tuple[OpNode, ...]:
        return tuple(op for op in self.ops if op.role is role)

    def inputs_of_kind(self, kind: ValueKind) -> tuple[Value, ...]:
        return tuple(self.values[v] for v in self.inputs if self.values[v].kind is kind)

    def contractions(self) -> Iterator[OpNode]:
        """The tensor contractions (`CONTRACTION_PRIMITIVES`), in program order."""
        return (op for op in self.ops if op.primitive in CONTRACTION_PRIMITIVES)

    @property
    def nx(self) -> nx.MultiDiGraph:
        """networkx view: one node per op (attribute `op`), one edge per value read."""
        if self._nx is None:
            import networkx

            view = networkx.MultiDiGraph()
            for op in self.ops:
                view.add_node(op.id, op=op, primitive=op.primitive, role=str(op.role))
            for op in self.ops:
                for vid in op.inputs:
                    producer = self.values[vid].producer
                    if producer is not None:
                        view.add_edge(producer, op.id, key=vid, value=vid)
            object.__setattr__(self, "_nx", view)
        return self._nx

    def role_counts(self) -> Mapping[Role, int]:
        counts = {role: 0 for role in Role}
        for op in self.ops:
            counts[op.role] += 1
        return counts

    def role_summary(self, examples: int = 3) -> str:
        """How many step inputs have each role, with a few example paths, and how the roles
        were decided (declared or inferred, and anything ambiguous)."""
        lines = ["Step inputs by role:"]
        for kind in INPUT_KINDS:
            found = self.inputs_of_kind(kind)
            shown = ", ".join(v.path for v in found[:examples])
            more = f", ... (+{len(found) - examples})" if len(found) > examples else ""
            lines.append(f"  {kind.value:<16} {len(found):5d}  {shown}{more}")
        lines.extend(f"  note: {note}" for note in self.input_notes)
        return "\n".join(lines)

    def summary(self) -> str:
        counts = self.role_counts()
        kinds = {kind: len(self.inputs_of_kind(kind)) for kind in INPUT_KINDS}
        primitives = [op.primitive for op in self.contractions()]
        convs = primitives.count("conv_general_dilated")
        return (
            f"Graph: {len(self.ops)} ops ({', '.join(f'{n} {r}' for r, n in counts.items())}), "
            f"{primitives.count('dot_general')} dot_general"
            + (f", {convs} conv_general_dilated" if convs else "")
            + "; inputs: "
            + ", ".join(f"{n} {k}" for k, n in kinds.items())
        )


# -- ParallelBlocks and the configuration space -------------------------------------------------


class DimRole(StrEnum):
    """The partitionable dims of a block's head contraction (paper Sec. 4.2).

    E: the dot's batch dim (the expert dim of a batched expert matmul); M: the first free dim
    of the left operand (batch / rows); N: the first free dim of the right operand (columns);
    K: the contracted dim (leaves partial sums, so the head's result is all-reduced).

    Where a role has several candidate dims (a dot with two batch dims, a fused q/k/v weight
    `[d, 3, heads, hd]`), it takes the first whose size divides the parallelism, and
    `ParallelBlock.role_notes` says which were passed over. A convolution's roles: M is its
    batch, N its output features, K its input features; a grouped convolution splits whole
    feature groups as E instead of N and K.
    """

    E = "E"
    M = "M"
    N = "N"
    K = "K"


@dataclass(frozen=True, slots=True)
class ValueLayout:
    """Which dim of a value each role's split lands on (after propagation through the block)."""

    value: int
    dims: tuple[tuple[DimRole, int], ...]

    def dim_of(self, role: DimRole) -> int | None:
        for r, d in self.dims:
            if r is role:
                return d
        return None


@dataclass(frozen=True, slots=True)
class OperandLayout:
    """A layout the block requires of one operand of one of its ops (consumer side)."""

    op: int
    position: int
    layout: ValueLayout


@dataclass(frozen=True, slots=True)
class Strategy:
    """One partition choice of a block: which mesh axes split which head dim roles."""

    assignment: tuple[tuple[DimRole, tuple[str, ...]], ...]

    @property
    def name(self) -> str:
        if not self.assignment:
            return "replicated"
        return ",".join(f"{role.value}@{'+'.join(axes)}" for role, axes in self.assignment)

    def axes_of(self, role: DimRole) -> tuple[str, ...]:
        for r, axes in self.assignment:
            if r is role:
                return axes
        return ()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class ExcludedStrategy:
    strategy: Strategy
    reason: str


@dataclass(frozen=True, slots=True)
class ParallelBlock:
    """Ops whose partition follows from the head contraction's without communication."""

    index: int
    head: int  # op id of the first contraction op
    forward_ops: tuple[int, ...]  # the head and the forward ops the split propagates through
    backward_ops: tuple[int, ...]  # backward ops derived from the forward members
    branch_ops: tuple[int, ...]  # ops on parameter input branches feeding the block
    role_sizes: tuple[tuple[DimRole, int], ...]  # size of the head dim of each role
    layouts: tuple[ValueLayout, ...]  # values the block produces or owns (sorted by id)
    operand_layouts: tuple[OperandLayout, ...]  # layouts the head wants of its operands
    scope: str
    ends: tuple[str, ...] = ()  # why the propagation stopped where it did
    strategies: tuple[Strategy, ...] = ()
    excluded: tuple[ExcludedStrategy, ...] = ()
    role_notes: tuple[str, ...] = ()  # why a role took the dim it did, or is not offered

    def __post_init__(self) -> None:
        members = self.forward_ops + self.backward_ops + self.branch_ops
        if len(set(members)) != len(members):
            raise ValueError(f"block {self.index}: an op is listed twice")
        if self.head not in self.forward_ops:
            raise ValueError(f"block {self.index}: head {self.head} is not a member")

    @property
    def ops(self) -> tuple[int, ...]:
        return tuple(sorted(self.forward_ops + self.backward_ops + self.branch_ops))

    @property
    def roles(self) -> tuple[DimRole, ...]:
        return tuple(role for role, _ in self.role_sizes)

    def layout_of(self, value: int) -> ValueLayout | None:
        for layout in self.layouts:
            if layout.value == value:
                return layout
        return None


@dataclass(frozen=True, slots=True)
class Conflict:
    """An op or parameter wanted by several blocks; `chosen` is the block whose layout it takes."""

    value: int
    blocks: tuple[int, ...]
    chosen: int
    reason: str


@dataclass(frozen=True, slots=True)
class BlockAnalysis:
    blocks: tuple[ParallelBlock, ...]
    block_of_op: tuple[int | None, ...]  # per op id
    conflicts: tuple[Conflict, ...]
    unknown_primitives: tuple[str, ...]  # primitives the affine analysis does not know
    parallelism: int

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for block in self.blocks:
            ops = set(block.ops)
            if ops & seen:
                raise ValueError(f"blocks overlap on ops {sorted(ops & seen)[:5]}")
            seen |= ops

    def summary(self, graph: Graph) -> str:
        lines = [f"{len(self.blocks)} ParallelBlocks (P={self.parallelism})"]
        for block in self.blocks:
            head = graph.ops[block.head]
            inner = sum(
                1 for o in block.forward_ops if graph.ops[o].primitive in CONTRACTION_PRIMITIVES
            )
            lines.append(
                f"  block {block.index:3d} head #{block.head} {head.scope or '<root>'} "
                f"{head.input_types[0]} x {head.input_types[1]}: "
                f"{len(block.forward_ops)} fwd ({inner} contraction), "
                f"{len(block.backward_ops)} bwd, "
                f"{len(block.branch_ops)} branch; roles "
                + " ".join(f"{r.value}={n}" for r, n in block.role_sizes)
                + (
                    f"; strategies {', '.join(s.name for s in block.strategies)}"
                    if block.strategies
                    else ""
                )
            )
        if self.unknown_primitives:
            lines.append(f"  unknown primitives (end blocks): {', '.join(self.unknown_primitives)}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Config:
    """One strategy per block: `choices[i]` indexes `blocks[i].strategies`."""

    choices: tuple[int, ...]

    def names(self, blocks: tuple[ParallelBlock, ...]) -> tuple[str, ...]:
        return tuple(b.strategies[c].name for b, c in zip(blocks, self.choices, strict=True))


@dataclass(frozen=True, slots=True)
class ShardingAssignment:
    """Where every constrained value of the step lives on the mesh under one Config."""

    mesh_axes: tuple[tuple[str, int], ...]
    inputs: tuple[DimAxes, ...]  # per flattened step argument
    outputs: tuple[DimAxes, ...]  # per flattened step result
    values: tuple[tuple[int, DimAxes], ...]  # producer side: value id -> layout
    operands: tuple[tuple[int, int, DimAxes], ...]  # consumer side: (op id, position) -> layout

    def value_map(self) -> dict[int, DimAxes]:
        return dict(self.values)


# -- segments ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentType:
    """A unique segment: every instance with this fingerprint is profiled once."""

    id: int
    fingerprint: str
    label: str  # e.g. "layer", "embed", "head"
    block_count: int
    instance_count: int


@dataclass(frozen=True, slots=True)
class SegmentInstance:
    index: int
    unique_id: int
    label: str  # the scope label of the instance, e.g. "layer_3"
    blocks: tuple[int, ...]  # block indices, in order
    ops: tuple[int, ...]  # every op of the instance: forward, backward, optimizer


@dataclass(frozen=True, slots=True)
class Boundary:
    """Tensors crossing from instance `before` to instance `before + 1`."""

    before: int
    forward: tuple[int, ...]  # values made by `before`'s forward ops, read by the next's
    backward: tuple[int, ...]  # cotangents made by the next's backward, read by `before`'s


@dataclass(frozen=True, slots=True)
class Segmentation:
    instances: tuple[SegmentInstance, ...]
    unique: tuple[SegmentType, ...]
    boundaries: tuple[Boundary, ...]
    segment_of_op: tuple[int, ...]
    method: str  # "scopes" or "repeats"
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for i, instance in enumerate(self.instances):
            if instance.index != i:
                raise ValueError(f"segment instance at {i} has index {instance.index}")
        if len(self.boundaries) != max(0, len(self.instances) - 1):
            raise ValueError("one boundary between each pair of consecutive instances")

    @property
    def reuse_found(self) -> bool:
        return len(self.unique) < len(self.instances)

    def summary(self) -> str:
        lines = [
            f"{len(self.instances)} segment instances of {len(self.unique)} unique types "
            f"(by {self.method})"
        ]
        for unique in self.unique:
            lines.append(
                f"  type {unique.id} {unique.label!r}: {unique.block_count} blocks "
                f"x{unique.instance_count}"
            )
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


# -- pytree paths ----------------------------------------------------------------------------


def path_suffix(path: str) -> str:
    """The path below the top-level argument: `params['w']` -> `['w']`, `[1]['w']` -> `['w']`."""
    for index, char in enumerate(path):
        if char in "[." and index > 0:
            if path[0] == "[":
                end = path.index("]") + 1
                return path[end:]
            return path[index:]
    if path.startswith("["):
        return path[path.index("]") + 1 :]
    return ""


def match_suffix(
    path: str, shape: tuple[int, ...], by_suffix: Mapping[tuple[str, tuple[int, ...]], T]
) -> T | None:
    """The entry whose path ends `path` with the same shape, longest suffix first (e.g. the
    parameter an optimizer-state leaf belongs to)."""
    for index in range(len(path)):
        if path[index] in "[.":
            found = by_suffix.get((path[index:], shape))
            if found is not None:
                return found
    return _match_tail(path, shape, by_suffix)


_COMPONENT = re.compile(r"\[[^\]]*\]|\.[A-Za-z_]\w*")


def _match_tail(
    path: str, shape: tuple[int, ...], by_suffix: Mapping[tuple[str, tuple[int, ...]], T]
) -> T | None:
    """The entry sharing the longest tail of path components with `path`, when unique.

    A Flax `TrainState` keeps `state.params['params']['Dense_0']['kernel']` and its Adam
    moment at `state.opt_state[0].mu['params']['Dense_0']['kernel']`: neither path ends the
    other, but they share `['params']['Dense_0']['kernel']`. A tail of one component (a bare
    `['kernel']`) is not enough to tell parameters apart.
    """
    mine = _COMPONENT.findall(path)
    best: list[T] = []
    longest = 1
    for (suffix, key_shape), entry in by_suffix.items():
        if key_shape != shape:
            continue
        theirs = _COMPONENT.findall(suffix)
        common = 0
        while common < min(len(mine), len(theirs)) and mine[-1 - common] == theirs[-1 - common]:
            common += 1
        if common > longest:
            best, longest = [entry], common
        elif common == longest and common > 1:
            best.append(entry)
    return best[0] if len(best) == 1 else None
