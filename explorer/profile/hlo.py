"""Collectives read from the optimised HLO text of a compiled program.

The partitioner and later passes decide what communication really happens (combined
all-reduces, all-reduce rewritten as reduce-scatter + all-gather, RNG broadcasts), so this is
the ground the `compiled` backend prices. Replica groups come in three spellings: explicit
`{{0,1},{2,3}}`, iota `[4,2]<=[2,4]T(1,0)`, and named `mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`;
all are expanded to device groups and mapped back to the mesh axes they span.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from explorer.mesh import MeshSpec
from explorer.profile.hlo_reader import _computation_blocks


class CollectiveKind(StrEnum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    COLLECTIVE_PERMUTE = "collective-permute"


@dataclass(frozen=True, slots=True)
class Collective:
    kind: CollectiveKind
    name: str  # HLO instruction name
    shapes: tuple[tuple[str, tuple[int, ...]], ...]  # (dtype, dims) of each result element
    nbytes: int  # size of the full buffer the collective moves (see module doc)
    group_size: int
    axes: tuple[str, ...]  # mesh axes the replica groups span
    op_names: tuple[str, ...]  # JAX op names (name stacks) of the results, per element
    # per result element: it reaches only the step's results (see `terminal_outputs`), so the
    # compiler may combine it with collectives of other segments into one
    combinable: tuple[bool, ...] = ()
    # bytes of the all-reduce's elements that every reader reads as its own device's slice:
    # a GPU pipeline issues those as a reduce-scatter (see `parts`)
    scattered_bytes: int = 0
    scattered: tuple[bool, ...] = ()  # per result element, where the HLO was read

    @property
    def fully_combinable(self) -> bool:
        """Every element the collective still all-reduces reaches only the step's results."""
        if not self.combinable:
            return False
        scattered = self.scattered or (False,) * len(self.combinable)
        kept = [c for c, s in zip(self.combinable, scattered, strict=True) if not s]
        return bool(kept) and all(kept)

    def parts(self) -> tuple[tuple[CollectiveKind, int], ...]:
        """(kind, bytes) of what an accelerator's pipeline issues for this collective.

        XLA's GPU pipeline runs `ReduceScatterCreator` after partitioning: an all-reduce read
        only through each device's own slice (a sharded parameter's gradient, as FSDP makes)
        becomes a reduce-scatter, moving half the bytes of a ring all-reduce. The CPU pipeline
        this backend compiles with has no such pass, so those elements are priced here as the
        reduce-scatter they would be. (The CPU's buffers still hold them whole: memory is not
        corrected.)
        """
        if not self.scattered_bytes:
            return ((self.kind, self.nbytes),)
        kept = self.nbytes - self.scattered_bytes
        reduced = ((CollectiveKind.ALL_REDUCE, kept),) if kept else ()
        return (*reduced, (CollectiveKind.REDUCE_SCATTER, self.scattered_bytes))

    @property
    def is_backward(self) -> bool:
        return any("transpose(" in n for n in self.op_names)

    @property
    def is_scalar(self) -> bool:
        return all(not dims for _, dims in self.shapes)


_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
    "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1,
}  # fmt: skip


def element_bytes(dtype: str, dims: tuple[int, ...]) -> int:
    """Bytes of one array of an HLO shape (unknown dtypes counted as 4 bytes an element)."""
    return _DTYPE_BYTES.get(dtype, 4) * math.prod(dims)


_KINDS = "|".join(k.value for k in CollectiveKind)
_INSTRUCTION = re.compile(
    rf"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
    rf"(?P<kind>{_KINDS})(?P<suffix>-start|-done)?\((?P<args>[^)]*)\)(?P<attrs>.*)$"
)
# a word of every collective's opcode: lines holding none are passed over unparsed
_COLLECTIVE_WORDS = ("all-", "reduce-scatter", "collective-permute")
assert all(any(w in k.value for w in _COLLECTIVE_WORDS) for k in CollectiveKind)
# searched from its opcode (a literal start is what lets the search skip ahead), then
# checked to be the opcode: what comes before it on its line is "= shape "
_GTE = re.compile(
    r"get-tuple-element\(%(?P<source>[\w.\-]+)\),\s*index=(?P<index>\d+)"
    r'.*?op_name="(?P<op>[^"]*)"'
)
_GTE_HEAD = re.compile(r"=\s*\S+\s+\Z")
_SHAPE = re.compile(r"(?P<dtype>[a-z]+[0-9]*[a-z0-9]*)\[(?P<dims>[0-9,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def parse_collectives(
    hlo: str, mesh: MeshSpec, terminal_outputs: frozenset[int] | None = None
) -> tuple[Collective, ...]:
    """Every collective of an optimised HLO module, async pairs counted once.

    `terminal_outputs`: positions of the entry's result tuple that are results of the whole
    training step (updated parameters, the loss). An all-reduce element whose value reaches
    only those, through no other collective, depends on nothing later and nothing later
    depends on it: in the whole step the compiler's all-reduce combiner merges it with the
    like elements of other segments. Such elements are marked `combinable`.
    """
    flow = _Dataflow(hlo)
    # a whole step (no `terminal_outputs`): every result is the step's
    results = (
        terminal_outputs
        if terminal_outputs is not None
        else frozenset(range(len(flow.root_operands)))
    )
    gte_names: dict[str, dict[int, str]] = {}
    for gte in _GTE.finditer(hlo):
        line_start = hlo.rfind("\n", 0, gte.start()) + 1
        if _GTE_HEAD.search(hlo, line_start, gte.start()) is None:
            continue
        gte_names.setdefault(gte["source"], {})[int(gte["index"])] = gte["op"]
    starts: dict[str, str] = {}
    found = []
    for line in hlo.splitlines():
        # a plain substring test first: most lines hold no collective
        if not any(word in line for word in _COLLECTIVE_WORDS):
            continue
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        suffix = match["suffix"]
        if suffix == "-start":
            starts[match["name"]] = match["attrs"]
            continue
        attrs = match["attrs"]
        if suffix == "-done":
            attrs = starts.get(match["args"].strip().lstrip("%"), attrs) + attrs
        collective = _collective(match, attrs, gte_names, mesh)
        if collective.kind is CollectiveKind.ALL_REDUCE:
            collective = _with_scattered(collective, flow, results)
            if terminal_outputs is not None:
                combinable = tuple(
                    flow.terminal(match["name"], element, len(collective.shapes), terminal_outputs)
                    for element in range(len(collective.shapes))
                )
                collective = replace(collective, combinable=combinable)
        found.append(collective)
    return tuple(found)


def emitted(collectives: Iterable[Collective]) -> tuple[tuple[str, int, tuple[str, ...], int], ...]:
    """(kind, bytes, axes, group size) of every part of `collectives` (`Collective.parts`):
    what the step is priced as emitting."""
    return tuple(
        (kind.value, nbytes, c.axes, c.group_size)
        for c in collectives
        for kind, nbytes in c.parts()
    )


def _with_scattered(collective: Collective, flow: _Dataflow, results: frozenset[int]) -> Collective:
    """Mark the elements of an all-reduce that every reader reads as its own device's slice,
    on their way to the step's results only: a sharded parameter's gradient, reduced for its
    update. (An activation reduced and then sliced by the next segment's layout would be one
    too, in the whole step; its segment program cannot see the slice, so the two would be
    priced apart: such all-reduces stay all-reduces on both sides.)"""
    elements = len(collective.shapes)
    scattered = tuple(
        flow.read_as_own_slice(
            collective.name, element, elements, math.prod(dims), collective.group_size
        )
        and flow.terminal(collective.name, element, elements, results)
        for element, (_dtype, dims) in enumerate(collective.shapes)
    )
    if not any(scattered):
        return collective
    nbytes = sum(
        element_bytes(dtype, dims)
        for (dtype, dims), s in zip(collective.shapes, scattered, strict=True)
        if s
    )
    return replace(collective, scattered=scattered, scattered_bytes=nbytes)


_DEFINITION = re.compile(r"^\s*(?P<root>ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<rest>.*)$")
_REFERENCE = re.compile(r"%([\w.\-]+)")
_OPCODE = re.compile(r"\s(?P<op>[a-z][a-z0-9\-]*)\(")
_INDEX = re.compile(r"index=(\d+)")


_FUSED_CALLEE = re.compile(r" fusion\([^\n]*?\bcalls=%?(?P<name>[\w.\-]+)")
_ENTRY_NAME = re.compile(r"^ENTRY\s+%?(?P<name>[^\s(]+)", re.MULTILINE)
_COLLECTIVE_CALL = re.compile(rf"\s(?:{_KINDS})(?:-start|-done)?\(")


def _outside_fusions(hlo: str) -> Iterator[tuple[bool, list[str]]]:
    """(whether it is the entry, its body lines) of each computation of the module, less the
    fused computations that hold no collective.

    Names are module-unique and nothing outside a fused computation names what is inside
    it, so no def-use path from a collective enters one; and fusions are most of a step's
    lines (dropout's random bits: nine tenths of a small GPT step's)."""
    fused = frozenset(_FUSED_CALLEE.findall(hlo))
    entry = _ENTRY_NAME.search(hlo)
    for name, body in _computation_blocks(hlo):
        if name in fused and not _COLLECTIVE_CALL.search("\n".join(body)):
            continue
        yield entry is not None and name == entry["name"], body


class _Dataflow:
    """Def-use edges between the instructions of an HLO module (names are module-unique),
    outside the fused computations no collective is in (`_outside_fusions`)."""

    def __init__(self, hlo: str) -> None:
        self.users: dict[str, list[str]] = {}
        self.operands: dict[str, list[str]] = {}
        self.opcode: dict[str, str] = {}
        self.index: dict[str, int] = {}  # get-tuple-element -> element index
        self.size: dict[str, int | None] = {}  # elements of the result (None: a tuple)
        self.root_operands: list[str] = []
        self._device_values: set[str] | None = None
        for in_entry, body in _outside_fusions(hlo):
            for line in body:
                self._read(line, in_entry)

    def _read(self, line: str, in_entry: bool) -> None:
        """The edges of one instruction's line (`in_entry`: of the entry computation)."""
        match = _DEFINITION.match(line)
        if match is None:
            return
        name, rest = match["name"], match["rest"]
        opcode = _OPCODE.search(rest)
        self.opcode[name] = opcode["op"] if opcode else ""
        head = rest.split("), ", 1)[0]  # operands, before the attributes
        operands = _REFERENCE.findall(head)
        self.operands[name] = operands
        for operand in operands:
            self.users.setdefault(operand, []).append(name)
        shape = rest.split(" ", 1)[0]
        dims = _SHAPE.fullmatch(shape.split("{", 1)[0])
        self.size[name] = (
            None if dims is None else math.prod(int(d) for d in dims["dims"].split(",") if d)
        )
        if self.opcode[name] == "get-tuple-element":
            found = _INDEX.search(rest)
            if found:
                self.index[name] = int(found[1])
        if in_entry and match["root"]:
            self.root_operands = operands if self.opcode[name] == "tuple" else [name]

    def _by_device(self) -> set[str]:
        """Small values computed from the device's id (offsets of its own slice)."""
        if self._device_values is None:
            found = {n for n, op in self.opcode.items() if op in ("partition-id", "replica-id")}
            pending = list(found)
            while pending:
                for user in self.users.get(pending.pop(), []):
                    size = self.size.get(user)
                    if user not in found and size is not None and size <= _OFFSET_TABLE:
                        found.add(user)
                        pending.append(user)
            self._device_values = found
        return self._device_values

    def _element_users(self, name: str, element: int, elements: int) -> list[str]:
        """The users of element `element` of `name`: of a tuple, its get-tuple-elements (and
        any user of the whole tuple)."""
        users = self.users.get(name, [])
        if elements > 1:
            return [u for u in users if self.index.get(u, element) == element]
        return users

    def read_as_own_slice(
        self, name: str, element: int, elements: int, size: int, group_size: int
    ) -> bool:
        """Whether element `element` of `name` is only ever used as each device's own slice:
        every path from it runs through ops of its own size (a convert, a sum with another
        gradient) to one taking a 1/`group_size` slice at an offset computed from the
        device's id. A reduce-scatter and the same ops on the slice then compute the same."""
        if group_size < 2 or size % group_size:
            return False
        readers = self._element_users(name, element, elements)
        if elements > 1:  # a tuple result: the readers of this element's get-tuple-elements
            readers = [r for g in readers if g in self.index for r in self.users.get(g, [])]
        device = self._by_device()
        pending, seen = list(readers), set()
        while pending:
            reader = pending.pop()
            if reader in seen:
                continue
            seen.add(reader)
            if self.opcode.get(reader, "").split("-start")[0] in _COLLECTIVE_OPCODES:
                return False
            if self.size.get(reader) == size and reader not in self.root_operands:
                pending.extend(self.users.get(reader, []))  # still whole: follow it
                continue
            if self.size.get(reader) != size // group_size:
                return False
            if not any(operand in device for operand in self.operands.get(reader, [])):
                return False
        return bool(seen)

    def terminal(self, name: str, element: int, elements: int, outputs: frozenset[int]) -> bool:
        """Whether element `element` of instruction `name` reaches only entry results in
        `outputs`, through no other collective."""
        start = self._element_users(name, element, elements)
        roots = {operand: position for position, operand in enumerate(self.root_operands)}
        seen: set[str] = set()
        pending = list(start)
        if name in roots and roots[name] not in outputs:
            return False
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            if self.opcode.get(current, "").split("-start")[0] in _COLLECTIVE_OPCODES:
                return False
            if current in roots and roots[current] not in outputs:
                return False
            pending.extend(self.users.get(current, []))
        return True


_COLLECTIVE_OPCODES = frozenset(k.value for k in CollectiveKind)
# the most elements a value computed from the device's id may have and still count as an
# offset (the partitioner's per-device offset tables hold one entry per device)
_OFFSET_TABLE = 4096


def _collective(
    match: re.Match[str], attrs: str, gte_names: dict[str, dict[int, str]], mesh: MeshSpec
) -> Collective:
    kind = CollectiveKind(match["kind"])
    shapes = tuple(
        (m["dtype"], tuple(int(d) for d in m["dims"].split(",") if d))
        for m in _SHAPE.finditer(match["shape"])
    )
    groups = _replica_groups(attrs, mesh.size)
    group_size = len(groups[0]) if groups else 1
    if kind is CollectiveKind.COLLECTIVE_PERMUTE:
        axes = _permute_axes(attrs, mesh)
        group_size = 2 if axes else 1
    else:
        axes = _axes_of(groups, mesh)
    result_bytes = sum(element_bytes(dtype, dims) for dtype, dims in shapes)
    nbytes = result_bytes * group_size if kind is CollectiveKind.REDUCE_SCATTER else result_bytes
    element_names = gte_names.get(match["name"], {})
    own = _OP_NAME.search(attrs)
    if element_names:
        op_names = tuple(element_names.get(i, own[1] if own else "") for i in range(len(shapes)))
    else:
        op_names = (own[1],) if own else ()
    return Collective(kind, match["name"], shapes, nbytes, group_size, axes, op_names)


def _replica_groups(attrs: str, device_count: int) -> list[list[int]]:
    named = re.search(r"replica_groups=mesh\[(?P<mesh>[^\]]*)\]\s*\{(?P<axes>[^}]*)\}", attrs)
    if named:
        sizes = [
            (n.strip("' "), int(s)) for n, s in (p.split("=") for p in named["mesh"].split(","))
        ]
        over = {a.strip("' ") for a in named["axes"].split(",") if a.strip()}
        ids = np.arange(math.prod(s for _, s in sizes)).reshape([s for _, s in sizes])
        keep = [i for i, (n, _) in enumerate(sizes) if n not in over]
        move = [i for i, (n, _) in enumerate(sizes) if n in over]
        grouped = ids.transpose(keep + move).reshape(-1, math.prod(sizes[i][1] for i in move))
        return grouped.tolist()
    iota = re.search(
        r"replica_groups=\[(?P<shape>[0-9,]+)\]<=\[(?P<dims>[0-9,]+)\](?:T\((?P<perm>[0-9,]+)\))?",
        attrs,
    )
    if iota:
        shape = [int(x) for x in iota["shape"].split(",")]
        dims = [int(x) for x in iota["dims"].split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota["perm"]:
            ids = ids.transpose([int(x) for x in iota["perm"].split(",")])
        return ids.reshape(shape[0], -1).tolist()
    explicit = re.search(r"replica_groups=\{(?P<body>(?:\{[0-9,]*\},?)*)\}", attrs)
    if explicit and explicit["body"]:
        return [
            [int(x) for x in group.split(",") if x]
            for group in re.findall(r"\{([0-9,]*)\}", explicit["body"])
        ]
    return [list(range(device_count))]  # empty groups: every device in one group


def _coordinates(device: int, mesh: MeshSpec) -> tuple[int, ...]:
    return tuple(int(c) for c in np.unravel_index(device % mesh.size, mesh.shape))


def _axes_of(groups: list[list[int]], mesh: MeshSpec) -> tuple[str, ...]:
    if not groups or len(groups[0]) < 2:
        return ()
    coords = [_coordinates(d, mesh) for d in groups[0]]
    return tuple(name for i, name in enumerate(mesh.names) if len({c[i] for c in coords}) > 1)


def _permute_axes(attrs: str, mesh: MeshSpec) -> tuple[str, ...]:
    pairs = re.findall(r"\{(\d+),(\d+)\}", attrs.rsplit("source_target_pairs=", maxsplit=1)[-1])
    varying: set[int] = set()
    for source, target in pairs:
        a, b = _coordinates(int(source), mesh), _coordinates(int(target), mesh)
        varying |= {i for i in range(len(a)) if a[i] != b[i]}
    return tuple(mesh.names[i] for i in sorted(varying))


@dataclass(frozen=True, slots=True)
class HloInstruction:
    """One instruction of a module's entry computation, as its text prints it."""

    name: str
    opcode: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]  # (dtype, dims) of each array it makes
    operands: tuple[str, ...]  # names of the instructions it reads, in order
    op_name: str  # the JAX op name (name stack / primitive) of its metadata; "" without
    index: int | None = None  # a get-tuple-element: the element of its operand it reads
    parameter: int | None = None  # a parameter: the number of the argument it receives
    root: bool = False


_PARAMETER = re.compile(r"\sparameter\((\d+)\)")


def entry_instructions(hlo: str) -> tuple[HloInstruction, ...]:
    """The instructions of the entry computation of an HLO module, in textual order (for
    a scheduled module: execution order). Names are unique within the module."""
    found = []
    in_entry = False
    for line in hlo.splitlines():
        if line.startswith("ENTRY"):
            in_entry = True
            continue
        if line.startswith("}"):
            in_entry = False
        if not in_entry:
            continue
        match = _DEFINITION.match(line)
        if match is None:
            continue
        rest = match["rest"]
        opcode = _OPCODE.search(rest)
        if opcode is None:
            continue
        shapes = tuple(
            (m["dtype"], tuple(int(d) for d in m["dims"].split(",") if d))
            for m in _SHAPE.finditer(rest[: opcode.start()])
        )
        kind = opcode["op"]
        head = rest[opcode.end() :].split("), ", 1)[0]  # operands, before the attributes
        op_name = _OP_NAME.search(rest)
        index = _INDEX.search(rest) if kind == "get-tuple-element" else None
        parameter = _PARAMETER.search(rest) if kind == "parameter" else None
        found.append(
            HloInstruction(
                name=match["name"],
                opcode=kind,
                shapes=shapes,
                operands=tuple(_REFERENCE.findall(head)),
                op_name=op_name[1] if op_name else "",
                index=int(index[1]) if index else None,
                parameter=int(parameter[1]) if parameter else None,
                root=bool(match["root"]),
            )
        )
    return tuple(found)
