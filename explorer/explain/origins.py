"""Which ops of the traced step an instruction of the compiled whole step came from.

The optimised HLO keeps, in each instruction's metadata, the JAX op name it was lowered
from: `jit(<step>)/<name stack>/<primitive>`, the name stack and primitive the tracer records
on every `OpNode`. A name alone is often shared (every `reduce_sum` of a layer's backward
pass), so each candidate op is checked against two more facts of the instruction:

- **shape**: the instruction's array against the op's result, whole or as one device holds
  it under the plan's layouts;
- **outputs reached**: the step results (updated parameters, optimizer state, the loss) the
  instruction's value flows into in the HLO, against those the op's results flow into in
  the graph. A gradient flows into its own parameter's update only;
- **partial sums** (an all-reduce): the reductions whose operand, as the plan has them read
  it, is split over the all-reduce's mesh axes on a reduced dim (layouts.PARTIAL_REDUCTIONS:
  only those leave partial sums to all-reduce);
- **device shape**: the instruction's array against the op's result as one device holds it
  under the plan (an all-gather named after an op makes that op's result whole).

A filter that would leave no candidate is skipped (the compiler fused, transposed or
simplified what the graph has), so the ops kept are those consistent with every fact that
could be used, and `evidence` names the facts used.

Collectives the partitioner inserts for a sharding constraint carry the constraint's name,
not an op's: for those, `producers` and `consumers` follow the HLO data flow to the nearest
instructions that do name an op (or to the step inputs and results themselves).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from explorer.ir import DimAxes, Graph
from explorer.layouts import PARTIAL_REDUCTIONS
from explorer.mesh import MeshSpec
from explorer.profile.hlo import HloInstruction, entry_instructions

# op names of instructions that move a value without computing it (sharding constraints)
MOVEMENT_PRIMITIVES = frozenset({"sharding_constraint"})
_ARGUMENT = re.compile(r"\[(\d+)\]$")
# how far the data-flow walks look for an instruction that names an op
_WALK_LIMIT = 64


@dataclass(frozen=True, slots=True)
class Origin:
    """The graph ops one HLO value (an instruction, or one element of its tuple) came from.

    `ops`: the candidates left by every filter that could be used (`evidence`); empty when
    the instruction names no op of the graph. `step_input`/`step_output`: the position of
    the step argument it receives or the result it is, when it is one.
    """

    ops: tuple[int, ...]
    evidence: tuple[str, ...]
    op_name: str
    step_input: int | None = None
    step_output: int | None = None

    @property
    def found(self) -> bool:
        return bool(self.ops) or self.step_input is not None or self.step_output is not None


def op_key(op_name: str) -> tuple[str, str]:
    """(name stack, primitive) of an HLO op name, without the outer `jit(...)` of the step."""
    parts = op_name.split("/")
    if parts and parts[0].startswith("jit("):
        parts = parts[1:]
    if not parts:
        return "", ""
    return "/".join(parts[:-1]), parts[-1]


class Origins:
    """Graph ops behind the instructions of one compiled whole step (see the module doc).

    `layouts`: the plan's layout of every value (step inputs included) it places; `reads`:
    the layout an op reads an operand in, where the plan constrains it: (op, position) ->
    layout (`ShardingAssignment.operands`).
    """

    def __init__(
        self,
        graph: Graph,
        hlo: str,
        layouts: Mapping[int, DimAxes],
        mesh: MeshSpec,
        reads: Mapping[tuple[int, int], DimAxes] | None = None,
    ) -> None:
        self.graph = graph
        self.layouts = layouts
        self.reads = reads or {}
        self.instructions = {i.name: i for i in entry_instructions(hlo)}
        self.users: dict[str, list[str]] = {}
        for instruction in self.instructions.values():
            for operand in instruction.operands:
                self.users.setdefault(operand, []).append(instruction.name)
        root = next((i for i in self.instructions.values() if i.root), None)
        results = (
            (list(root.operands) if root is not None and root.opcode == "tuple" else [root.name])
            if root is not None
            else []
        )
        # the entry's results are the step's flat results, in order, when the counts agree
        self.result_of = (
            {name: k for k, name in enumerate(results)}
            if len(results) == len(graph.outputs)
            else {}
        )
        self.by_key: dict[tuple[str, str], list[int]] = {}
        for op in graph.ops:
            self.by_key.setdefault((op.name_stack, op.primitive), []).append(op.id)
        self.shapes = _op_shapes(graph, layouts, mesh)
        self.local_shapes = _op_shapes(graph, layouts, mesh, whole=False)
        self.graph_reach, self.graph_depends = _graph_flow(graph)
        self._up: dict[str, int] = {}
        self._down: dict[str, int] = {}
        self._flow_bits()

    # -- one value --------------------------------------------------------------------------

    def origin(
        self,
        name: str,
        element: int | None = None,
        op_name: str | None = None,
        partial_over: tuple[str, ...] = (),
    ) -> Origin:
        """The ops instruction `name` (element `element` of its tuple result) came from;
        `op_name` overrides the instruction's own (a combined collective names each element
        on the get-tuple-element that reads it); `partial_over`: the mesh axes an all-reduce
        spans (its candidates are narrowed to reductions leaving partial sums over them)."""
        instruction = self.instructions[name]
        given = instruction.op_name if op_name is None else op_name
        output = self.result_of.get(name) if element is None else None
        if instruction.parameter is not None:
            return Origin((), ("step input",), given, step_input=self._argument(instruction))
        key = op_key(given)
        candidates = [] if key[1] in MOVEMENT_PRIMITIVES else self.by_key.get(key, [])
        if not candidates:
            return Origin((), (), given, step_output=output)
        evidence = ["op name"]
        if len(candidates) > 1:
            flow = self._closest_flow(candidates, name, element)
            if len(flow) < len(candidates):
                candidates, evidence = flow, [*evidence, "data flow"]
        if len(candidates) > 1 and instruction.opcode == "all-reduce" and partial_over:
            partial = [o for o in candidates if self._partial_axes(o) & set(partial_over)]
            if partial and len(partial) < len(candidates):
                candidates, evidence = partial, [*evidence, "partial sums"]
        dims = self._dims(instruction, element)
        if len(candidates) > 1 and dims is not None:
            local = [o for o in candidates if dims in self.local_shapes[o]]
            if local and len(local) < len(candidates):
                candidates, evidence = local, [*evidence, "device shape"]
        if len(candidates) > 1 and dims is not None:
            exact = [o for o in candidates if dims in self.shapes[o]]
            size = math.prod(dims)
            sized = [o for o in candidates if size in {math.prod(d) for d in self.shapes[o]}]
            if exact and len(exact) < len(candidates):
                candidates, evidence = exact, [*evidence, "shape"]
            elif sized and len(sized) < len(candidates):
                candidates, evidence = sized, [*evidence, "size"]
        return Origin(tuple(candidates), tuple(evidence), given, step_output=output)

    def _partial_axes(self, op: int) -> set[str]:
        """The mesh axes a reduction leaves partial sums over: those splitting a reduced dim
        of its operand as the plan has it read (empty for any other op)."""
        node = self.graph.ops[op]
        if node.primitive not in PARTIAL_REDUCTIONS or not node.inputs:
            return set()
        layout = self.reads.get((op, 0), self.layouts.get(node.inputs[0]))
        reduced = node.param("axes", ())
        if layout is None or not isinstance(reduced, tuple):
            return set()
        return {a for d in reduced if isinstance(d, int) and d < len(layout) for a in layout[d]}

    def _argument(self, instruction: HloInstruction) -> int | None:
        """The step input a parameter receives: JAX names it after the flat argument
        (`flat[3]`); jit drops unused arguments, so the parameter number may differ."""
        named = _ARGUMENT.search(instruction.op_name)
        if named is not None and int(named[1]) < len(self.graph.inputs):
            return int(named[1])
        return None

    def _dims(self, instruction: HloInstruction, element: int | None) -> tuple[int, ...] | None:
        shapes = instruction.shapes
        if element is not None and element < len(shapes):
            return shapes[element][1]
        return shapes[0][1] if len(shapes) == 1 else None

    # -- data flow ----------------------------------------------------------------------------

    def producers(self, name: str, element: int | None = None) -> tuple[Origin, ...]:
        """The nearest values upstream of operand `element` (all operands when None) of
        instruction `name` that name an op of the graph or are step inputs."""
        operands = self.instructions[name].operands
        start = (
            [operands[element]]
            if element is not None and element < len(operands)
            else list(operands)
        )
        return self._walk(start, upstream=True)

    def consumers(self, name: str, element: int | None = None) -> tuple[Origin, ...]:
        """The nearest values downstream of instruction `name` (of element `element` of its
        tuple result) that name an op of the graph or are step results."""
        return self._walk(self._readers(name, element), upstream=False, source=(name, element))

    def _readers(self, name: str, element: int | None) -> list[str]:
        readers = self.users.get(name, [])
        if element is None:
            return list(readers)
        return [u for u in readers if self.instructions[u].index in (None, element)]

    def _walk(
        self, start: list[str], *, upstream: bool, source: tuple[str, int | None] | None = None
    ) -> tuple[Origin, ...]:
        found: list[Origin] = []
        if source is not None and not upstream and source[1] is None:
            output = self.result_of.get(source[0])
            if output is not None:
                found.append(Origin((), ("step result",), "", step_output=output))
        # level by level: the nearest values that name something, not everything beyond them
        seen: set[str] = set()
        level = list(start)
        while level and not found and len(seen) < _WALK_LIMIT:
            following: list[str] = []
            for name in level:
                if name in seen or name not in self.instructions:
                    continue
                seen.add(name)
                origin = self.origin(name)
                if origin.ops or origin.step_input is not None:
                    found.append(origin)
                    continue
                if origin.step_output is not None:
                    found.append(origin)
                instruction = self.instructions[name]
                following.extend(instruction.operands if upstream else self.users.get(name, []))
            level = following
        return tuple(found)

    # -- data flow between step inputs and results --------------------------------------------

    def _closest_flow(self, candidates: list[int], name: str, element: int | None) -> list[int]:
        """The candidates whose results depend on the step inputs the value depends on, and
        flow into the step results it flows into, most nearly (fewest differences)."""
        down = self.reach(name, element) if self.result_of else None
        up = self.depends(name, element)
        score = {
            o: (self.graph_depends[o] ^ up).bit_count()
            + ((self.graph_reach[o] ^ down).bit_count() if down is not None else 0)
            for o in candidates
        }
        best = min(score.values())
        return [o for o in candidates if score[o] == best]

    def reach(self, name: str, element: int | None = None) -> int:
        """Bit k set when the value flows into step result k (for a tuple: element `element`)."""
        if element is None:
            return self._down.get(name, 0)
        bits = 0
        for user in self.users.get(name, []):
            index = self.instructions[user].index
            if index is None or index == element:
                bits |= self._down.get(user, 0)
        return bits

    def depends(self, name: str, element: int | None = None) -> int:
        """Bit k set when the value depends on step input k (for a tuple: element `element`
        where the instruction makes one element of each operand)."""
        instruction = self.instructions[name]
        if element is not None and _per_operand(instruction):
            return self._up.get(instruction.operands[element], 0)
        return self._up.get(name, 0)

    def _flow_bits(self) -> None:
        order = list(self.instructions.values())
        up: dict[str, int] = {}
        for instruction in order:
            argument = self._argument(instruction)
            bits = 1 << argument if argument is not None else 0
            source = (
                self.instructions.get(instruction.operands[0]) if instruction.operands else None
            )
            if (
                instruction.index is not None
                and source is not None
                and _per_operand(source)
                and instruction.index < len(source.operands)
            ):
                bits |= up.get(source.operands[instruction.index], 0)
            else:
                for operand in instruction.operands:
                    bits |= up.get(operand, 0)
            up[instruction.name] = bits
        down: dict[str, int] = {}
        for instruction in reversed(order):
            bits = 0
            if instruction.name in self.result_of:
                bits |= 1 << self.result_of[instruction.name]
            for user in self.users.get(instruction.name, []):
                bits |= down.get(user, 0)
            down[instruction.name] = bits
        self._up, self._down = up, down


def _per_operand(instruction: HloInstruction) -> bool:
    """A tuple whose element k is made from operand k (a tuple, a combined collective)."""
    return len(instruction.shapes) > 1 and len(instruction.operands) == len(instruction.shapes)


def _op_shapes(
    graph: Graph, layouts: Mapping[int, DimAxes], mesh: MeshSpec, whole: bool = True
) -> list[set[tuple[int, ...]]]:
    """Per op: the dims of its results, whole (unless `whole` is False, where the plan
    places the result) and as one device holds them."""
    shapes: list[set[tuple[int, ...]]] = []
    for op in graph.ops:
        found: set[tuple[int, ...]] = set()
        for vid, tt in zip(op.outputs, op.output_types, strict=True):
            layout = layouts.get(vid)
            placed = layout is not None and len(layout) == tt.rank
            if whole or not placed:
                found.add(tt.shape)
            if layout is not None and placed:
                found.add(
                    tuple(
                        d // mesh.axes_size(axes) for d, axes in zip(tt.shape, layout, strict=True)
                    )
                )
        shapes.append(found)
    return shapes


def _graph_flow(graph: Graph) -> tuple[list[int], list[int]]:
    """Per op: bit k set when its results flow into step result k, and when it depends on
    step input k."""
    result_bits: dict[int, int] = {}
    for k, vid in enumerate(graph.outputs):
        result_bits[vid] = result_bits.get(vid, 0) | (1 << k)
    reach = [0] * len(graph.ops)
    for op in reversed(graph.ops):
        bits = 0
        for vid in op.outputs:
            bits |= result_bits.get(vid, 0)
            for user in graph.users(vid):
                bits |= reach[user]
        reach[op.id] = bits
    input_bits = {vid: 1 << k for k, vid in enumerate(graph.inputs)}
    depends = [0] * len(graph.ops)
    for op in graph.ops:
        bits = 0
        for vid in op.inputs:
            producer = graph.values[vid].producer
            bits |= input_bits.get(vid, 0) | (depends[producer] if producer is not None else 0)
        depends[op.id] = bits
    return reach, depends
