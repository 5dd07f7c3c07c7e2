"""What a segment program holds for the whole step, and which of its results nothing waits on.

Composition needs two facts about a segment instance that its program's totals do not give:
which memory the step holds for it beyond the instance, and which of its results reach only
the step's results (so a collective making them can be combined with other segments' by
the compiler).

Memory, checked against the whole step's buffer assignment (tiny GPT, LLaMA, BERT, 20 plans
each, `tests/test_accuracy.py`). The step holds, for each instance:

- the step inputs it owns (each input is owned by exactly one instance, so a tied parameter
  and its optimizer state count once) and the gradients it makes for another instance's
  optimizer: read from the traced graph and the placement;
- the temporaries its forward part makes and its backward part reads, and the forward values
  it receives and keeps for its backward part: read from the compiled program's schedule
  (`buffers`), not from the jaxpr. The compiler keeps fewer values than the jaxpr saves (it
  recomputes an elementwise value, SwiGLU's product, RMSNorm's normalised input, inside the
  backward fusions from the values it does keep) and keeps some in another layout (the
  gathered copy a sharded dot reads);
- a copy of each donated step input that the compiler cannot update in place.

The rest of the program's temporaries are transient: alive only while the instance runs.
Each held amount is held for a different stretch of the step (`HeldMemory`), which is what
lets composition follow the step's order: an early layer's working set coexists with the
activations saved before it, not with every layer's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from explorer.ir import Graph, Role, Segmentation, path_suffix
from explorer.mesh import MeshSpec
from explorer.profile.buffers import Schedule
from explorer.realize import StandaloneProgram, donatable_inputs


@dataclass(frozen=True, slots=True)
class HeldMemory:
    """Bytes per device the step holds for one segment instance, by how long it holds them.

    The step runs the instances' forward parts in chain order, then their backward parts in
    reverse; instance n's backward part runs while the activations saved by instances 0..n
    are alive and after the gradients of instances n+1.. were made (`cost.CostModel.memory`);
    the constants of every type whose first instance ran before are alive too.
    """

    persistent: int  # the whole step: the step inputs it owns, copies of donated inputs
    saved: int  # from its forward part to its backward part: the values its backward reads
    gradients: int  # from its backward part to the optimizer: gradients for another instance
    transient: int  # only while it runs: the rest of its working set
    # from the first instance of its type on: values made from constants alone that its
    # backward part reads, one buffer for every instance of the type (`held`)
    constants: int = 0


@dataclass(frozen=True, slots=True)
class MemoryAccounting:
    """What a segment program holds for the whole step, computed from its placement; the
    rest is read from its compiled schedule (`held`).

    `persistent`: the step inputs the instance owns, per device; `gradients`: the gradients
    it makes for another instance's optimizer. The program's arguments (positions) that another
    instance's backward pass makes (`backward_inputs`: cotangents, gradients) tell its
    backward part from its forward part; those another instance's forward pass makes
    (`forward_inputs`) may be kept for the backward part. `donated`: (argument, result)
    pairs of a donated step input and its update, which the step holds in one buffer.
    """

    persistent: int
    backward_inputs: frozenset[int] = frozenset()
    forward_inputs: frozenset[int] = frozenset()
    donated: tuple[tuple[int, int], ...] = ()
    # result positions another instance reads (activations sent on, cotangents sent back)
    passed: frozenset[int] = frozenset()
    gradients: int = 0

    def held(self, hlo: str, combined: frozenset[str] = frozenset()) -> HeldMemory:
        """What the step holds for the compiled program `hlo`, per device.

        `combined`: the all-reduces the compiler combines across segments in the whole step
        (`hlo.Collective.combinable`)."""
        schedule = Schedule.parse(hlo)
        parameters = {
            i.argument: at
            for at, i in enumerate(schedule.instructions)
            if i.opcode == "parameter" and i.argument is not None
        }
        # where the tensors other instances pass in arrive: their parameter instructions
        from_forward = {parameters[a] for a in self.forward_inputs if a in parameters}
        from_backward = {parameters[a] for a in self.backward_inputs if a in parameters}
        # the backward part: what waits for a cotangent (or a gradient) of another instance;
        # backward ops that need only forward values may run in the forward part. The last
        # instance, where the step turns, waits for none: it keeps nothing across.
        backward = schedule.downstream(from_backward)
        temporaries = schedule.temporaries()
        # a value made from constants alone that the backward part reads (a scalar broadcast to
        # the scores' shape, which a library fusion cannot take in; the zeros an embedding's
        # gradient is scattered into) is held from the forward part too, but the step's
        # compiler merges the equal ones of every instance of a type into one buffer (CSE):
        # `constants`, held once per type, not once per layer (GPT-2.6B: 128 MiB a layer)
        made_from_constants = schedule.argument_free()
        across = [
            b
            for b in temporaries
            if schedule.buffers[b].defined not in backward and schedule.readers[b] & backward
        ]
        constants = sum(
            schedule.buffers[b].nbytes
            for b in across
            if made_from_constants[schedule.buffers[b].defined]
        )
        # results are counted where they are received (`kept`): the step has no reader of
        # them in this backward part (only `realize.segment_program`'s ordering ties do)
        saved = sum(schedule.buffers[b].nbytes for b in across) - constants
        arrived = [
            b
            for b, buffer in enumerate(schedule.buffers)
            if buffer.defined in from_forward or buffer.defined in from_backward
        ]
        kept_for_backward = {
            b
            for b in arrived
            if schedule.buffers[b].defined in from_forward and schedule.readers[b] & backward
        }
        kept = sum(schedule.buffers[b].nbytes for b in kept_for_backward)
        copies = _copied(schedule, parameters, self.donated, combined)
        # the working set also holds the tensors passed between instances while this one
        # runs: those it receives (until read, unless kept above) and those it sends (from
        # made on). The program has them as arguments and results, not temporaries; in the
        # step nothing else counts them (a head's logits, read by a separate loss segment).
        received = [b for b in arrived if b not in kept_for_backward]
        sending = {schedule.outputs[k] for k in self.passed if k < len(schedule.outputs)}
        sent = [
            b
            for b, buffer in enumerate(schedule.buffers)
            if buffer.result
            and buffer.defined in sending
            and schedule.instructions[buffer.defined].opcode != "parameter"
        ]
        # the saved temporaries are counted as held: the rest of the peak is the working set
        working = schedule.peak([*temporaries, *received, *sent], arriving=received)
        return HeldMemory(
            persistent=self.persistent + copies,
            saved=saved + kept,
            gradients=self.gradients,
            transient=max(working - saved - constants, 0),
            constants=constants,
        )


def _copied(
    schedule: Schedule,
    parameters: dict[int, int],
    donated: tuple[tuple[int, int], ...],
    combined: frozenset[str],
) -> int:
    """Bytes of the donated step inputs the whole step holds twice.

    XLA writes an update into its donated input's buffer only when every reader of the old
    value is ordered before the update; otherwise it copies the old value first (a weight
    the backward pass reads for a cotangent, which its own update does not wait for). An
    update that waits for a gradient all-reduce combined across segments comes after the
    whole backward pass, which orders every reader: nothing is copied.
    """
    total = 0
    for argument, result in donated:
        at = parameters.get(argument)
        if at is None or result >= len(schedule.outputs) or schedule.outputs[result] == at:
            continue  # (an input returned as it is stays in its buffer)
        before = schedule.upstream(schedule.outputs[result])
        if any(schedule.instructions[i].name in combined for i in before):
            continue
        for b, buffer in enumerate(schedule.buffers):
            if buffer.defined == at and schedule.readers[b] - before:
                total += buffer.nbytes
    return total


def settled_values(graph: Graph) -> frozenset[int]:
    """Values that reach only the step's results, through optimizer ops and gradient sums.

    Nothing else in the step waits on them (no forward op, no contraction reads them on the
    way), so a collective that makes one is independent of every other segment's: the
    compiler may combine it with theirs (`hlo.parse_collectives`).
    """
    outputs = set(graph.outputs)
    settled = [False] * len(graph.values)
    for op in reversed(graph.ops):
        for vid in op.outputs:
            users = graph.users(vid)
            settled[vid] = (vid in outputs or bool(users)) and all(
                graph.ops[u].role is not Role.FORWARD
                and graph.ops[u].primitive not in ("dot_general", "conv_general_dilated")
                and all(settled[w] for w in graph.ops[u].outputs)
                for u in users
            )
    return frozenset(v for v, ok in enumerate(settled) if ok)


def input_owners(graph: Graph, segmentation: Segmentation) -> dict[int, int]:
    """The one segment instance that holds each step input: the one that updates it (a
    parameter or optimizer state the step returns updated), else the one of its first reader.

    Counting each input once is what makes a tied parameter (read by the embedding and the
    head) and its optimizer state count once in the composed memory. Holding it where it is
    updated keeps a scan's stacked parameters, which every iteration reads, with the scan's
    update segment: the first iteration's type is every iteration's, and holds none of them.
    """
    update_of = _updates(graph)
    owners = {}
    for vid in graph.inputs:
        update = update_of.get(vid)
        producer = graph.producer(update) if update is not None else None
        readers = graph.users(vid)
        if producer is not None and producer.role is Role.OPTIMIZER:
            owners[vid] = segmentation.segment_of_op[producer.id]
        elif readers:
            owners[vid] = segmentation.segment_of_op[readers[0]]
    return owners


def memory_accounting(
    graph: Graph,
    index: int,
    *,
    ops: tuple[int, ...],
    program: StandaloneProgram,
    assignment: Any,
    mesh: MeshSpec,
    owners: dict[int, int],
) -> MemoryAccounting:
    """What instance `index` holds for the whole step (see `MemoryAccounting`)."""
    layouts = dict(assignment.values)
    position = {vid: i for i, vid in enumerate(graph.inputs)}

    def local_bytes(vid: int, dims: Any) -> int:
        parts = math.prod(mesh.axes_size(axes) for axes in dims if axes) if dims else 1
        return graph.values[vid].type.nbytes // max(parts, 1)

    persistent = sum(
        local_bytes(vid, assignment.inputs[i])
        for vid, i in position.items()
        if owners.get(vid) == index
    )
    results = set(program.output_values)
    gradients = sum(
        local_bytes(vid, layouts.get(vid))
        for op_id in ops
        for vid in graph.ops[op_id].outputs
        if vid in results and _for_optimizer(graph, vid)
    )
    made_by = {
        argument: producer.role
        for argument, vid in enumerate(program.input_values)
        if (producer := graph.producer(vid)) is not None
    }
    step_results = set(graph.outputs)
    return MemoryAccounting(
        persistent,
        gradients=gradients,
        backward_inputs=frozenset(a for a, r in made_by.items() if r is Role.BACKWARD),
        forward_inputs=frozenset(a for a, r in made_by.items() if r is Role.FORWARD),
        donated=_donated(graph, program),
        passed=frozenset(
            k
            for k, vid in enumerate(program.output_values)
            if vid not in step_results and not _for_optimizer(graph, vid)
        ),
    )


def _for_optimizer(graph: Graph, vid: int) -> bool:
    """Whether `vid` is a gradient held until an optimizer update (which the compiler
    schedules after the backward pass, once gradient all-reduces combined across segments
    are done)."""
    producer = graph.producer(vid)
    return (
        producer is not None
        and producer.role is Role.BACKWARD
        and any(graph.ops[u].role is Role.OPTIMIZER for u in graph.users(vid))
    )


def _donated(graph: Graph, program: StandaloneProgram) -> tuple[tuple[int, int], ...]:
    """(argument, result) positions of `program`: a donated step input and its update (the
    step result of the same path suffix and type, as `realize.donatable_inputs` pairs them)."""
    update_of = _updates(graph)
    result_of = {vid: k for k, vid in enumerate(program.output_values)}
    donated = {graph.inputs[p] for p in donatable_inputs(graph)}
    pairs = []
    for argument, vid in enumerate(program.input_values):
        if vid in donated and update_of.get(vid) in result_of:
            pairs.append((argument, result_of[update_of[vid]]))
    return tuple(pairs)


def _updates(graph: Graph) -> dict[int, int]:
    """Per step input, the step result that updates it: the one of the same path suffix and
    type (as `realize.donatable_inputs` pairs them)."""
    by_key = {
        (path_suffix(path), graph.values[vid].type): vid
        for vid, path in zip(graph.outputs, graph.output_paths, strict=False)
    }
    found = {}
    for vid in graph.inputs:
        value = graph.values[vid]
        update = by_key.get((path_suffix(value.path), value.type))
        if update is not None:
            found[vid] = update
    return found
