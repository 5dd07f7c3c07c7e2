"""The traced training step as a flat graph: tensor types, values, primitive ops and their
roles (forward, backward, optimizer)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    import networkx as nx

_T = TypeVar("_T")


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
    _derived: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

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

    def derived(self, name: str, compute: Callable[[Graph], _T]) -> _T:
        """`compute(self)`, computed once per graph under `name`: a fact derived from the
        graph alone (which never changes), so the analyses of one step in several spaces and
        on several meshes share it."""
        if name not in self._derived:
            self._derived[name] = compute(self)
        found: _T = self._derived[name]
        return found

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
