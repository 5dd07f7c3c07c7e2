"""Which block makes the compiler emit each collective of a plan's whole step, and its time.

`attribute(analysis, plan)` compiles the whole training step under the plan, as `evaluate`
does (`plan._configure`, `realize`, the `compiled` backend's compile and pricing), parses every
collective of the optimised HLO and prices each on the plan's platform. Each collective is
then traced back to the ops of the graph it came from (`origins`) and from them to a target:

- `BLOCK`: the ops are members of one ParallelBlock, or ops outside every block whose layout
  that one block decided (the follow rule: a layer norm follows the block it feeds);
- `BOUNDARY`: a resharding collective (a sharding constraint) between a value made under one
  block's layout and read under another's: producer block -> consumer block. A move across a
  segment boundary goes between the boundary's two blocks (the last block of the earlier
  instance, the first of the later one), where `layouts.place` constrains it and where the
  resharding programs price it; a move inside a segment goes to the block of the reader the
  plan constrains to read its operand in another layout;
- `OP`: ops outside every block whose layout no block decided (a replicated loss, the
  optimizer): attributed to the op, its segment and source line, not to a block;
- `UNKNOWN`: what could not be traced to one target; counted, listed, never dropped.

A combined collective (XLA's all-reduce combiner merges the gradients of many blocks into
one tuple all-reduce) is split into one row per element, each taking the share of the
collective's time its bytes are of the collective's bytes. So the rows' times add up to the
whole step's communication time exactly as `evaluate` prices it.

Source lines come from the matched graph op (`OpNode.source`, the user frame recorded at
trace): the HLO's own stack frames point into the explorer's re-execution of the step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from explorer.explain.attributed import AttributedCollective, Attribution, BlockShare, Target
from explorer.explain.origins import Origin, Origins, op_key
from explorer.ir import Config, DimAxes, Graph, ValueKind, path_suffix
from explorer.layouts import Placement, place
from explorer.profile.hlo import Collective, element_bytes

if TYPE_CHECKING:
    from explorer.pipeline import Analysis
    from explorer.plan import Plan

__all__ = ["AttributedCollective", "Attribution", "BlockShare", "Target", "attribute"]


def block_name(analysis: Analysis, block: int) -> str:
    """`#index scope` of a block (the scope of its head op)."""
    return f"#{block} {analysis.blocks[block].scope or '<root>'}"


def attribute(analysis: Analysis, plan: Plan) -> Attribution:
    """Compile `plan`'s whole step, price every collective and attribute each (module doc)."""
    from explorer.profile.backends import price_compiled

    platform = plan.platform  # as the plan records it: a scaled platform too, never a name
    graph, assignment, hlo = _compile_step(plan, analysis)
    priced = price_compiled(hlo, platform, plan.mesh)
    layouts: dict[int, DimAxes] = dict(assignment.values)
    layouts.update(zip(graph.inputs, assignment.inputs, strict=True))
    placement = _placement(analysis, plan)
    reads = {(op, position): dims for op, position, dims in assignment.operands}
    origins = Origins(graph, hlo.hlo, layouts, plan.mesh, reads)
    tracer = _Attributor(analysis, graph, placement, origins)
    rows = []
    for collective in priced.collectives:
        rows.extend(tracer.rows(collective, platform.price(collective, plan.mesh)))
    return Attribution(
        source=plan.source,
        mesh=str(plan.mesh),
        platform=platform.name,
        t_comm=priced.t_comm,
        collectives=tuple(rows),
        blocks=_block_shares(analysis, plan, rows),
    )


def _compile_step(plan: Plan, analysis: Analysis) -> tuple[Graph, Any, Any]:
    """The step compiled under the plan exactly as `plan.evaluate_on` compiles it."""
    from explorer.plan import lower_step
    from explorer.profile.backends import Backend, compile_to_text, compile_workers

    step = lower_step(plan, analysis.step, analysis.args)
    text = compile_to_text(step.lowered, compile_workers(Backend.COMPILED, 1))
    return step.graph, step.assignment, text


def _placement(analysis: Analysis, plan: Plan) -> Placement | None:
    """The block plan's placement (which blocks decided each value); None for a per-op plan."""
    if plan.per_op:
        return None
    names = [[s.name for s in b.strategies] for b in analysis.blocks]
    choices = tuple(n.index(s) for n, s in zip(names, plan.strategies, strict=True))
    parameters = plan.parameter_layouts
    return place(
        analysis.graph,
        analysis.blocks,
        Config(choices),
        analysis.mesh,
        analysis.segments,
        parameter_layouts=parameters,
    )


class _Attributor:
    def __init__(
        self, analysis: Analysis, graph: Graph, placement: Placement | None, origins: Origins
    ) -> None:
        self.analysis = analysis
        self.graph = graph
        self.block_of_op = analysis.block_analysis.block_of_op
        self.segment_of_op = analysis.segments.segment_of_op
        self.sources = placement.sources if placement is not None else None
        self.origins = origins
        # the block owning each step input (parameters, their optimizer state)
        owned: dict[int, int] = {}
        for block in analysis.blocks:
            for layout in block.layouts:
                owned.setdefault(layout.value, block.index)
        self.input_owner: dict[int, int] = {}
        for position, vid in enumerate(graph.inputs):
            found = self._value_owner(vid) if self.sources is not None else owned.get(vid)
            if found is not None:
                self.input_owner[position] = found
        self.updates = _updated_inputs(graph)

    # -- owners -----------------------------------------------------------------------------

    def _value_owner(self, vid: int) -> int | None:
        if self.sources is None or len(self.sources[vid]) != 1:
            return None
        (block,) = self.sources[vid]
        return block

    def _op_owner(self, op: int) -> tuple[int | None, str]:
        """The block an op belongs to, or whose layout its results follow."""
        block = self.block_of_op[op]
        if block is not None:
            return block, "a member of"
        if self.sources is not None:
            decided = set().union(*(self.sources[v] for v in self.graph.ops[op].outputs))
            if len(decided) == 1:
                return decided.pop(), "laid out by"
        # an optimizer op: the block owning every parameter (or state) its results update
        reached = self.origins.graph_reach[op]
        results = [k for k in range(len(self.graph.outputs)) if reached >> k & 1]
        owners = {self.input_owner.get(self.updates.get(k, -1)) for k in results}
        if results and len(owners) == 1 and None not in owners:
            return owners.pop(), "updating the parameters of"
        return None, ""

    def _owners(self, origin: Origin) -> set[int | None]:
        if origin.ops:
            return {self._op_owner(o)[0] for o in origin.ops}
        if origin.step_input is not None:
            return {self.input_owner.get(origin.step_input)}
        if origin.step_output is not None:
            vid = self.graph.outputs[origin.step_output]
            producer = self.graph.values[vid].producer
            return {self._op_owner(producer)[0] if producer is not None else None}
        return set()

    # -- rows -------------------------------------------------------------------------------

    def rows(self, collective: Collective, seconds: float) -> list[AttributedCollective]:
        elements = max(len(collective.shapes), 1)
        sizes = [element_bytes(dtype, dims) for dtype, dims in collective.shapes] or [
            collective.nbytes
        ]
        total = sum(sizes)
        out = []
        for element in range(elements):
            share = sizes[element] / total if total else 1 / elements
            names = collective.op_names
            # one name for all elements: the collective's own (its elements are unnamed)
            op_name = names[element] if len(names) == elements else (names[0] if names else "")
            where = self._trace(
                collective.name, element if elements > 1 else None, op_name, collective.axes
            )
            out.append(
                AttributedCollective(
                    name=collective.name,
                    element=element,
                    elements=elements,
                    kind=collective.kind.value,
                    nbytes=collective.nbytes if elements == 1 else round(collective.nbytes * share),
                    axes=collective.axes,
                    group_size=collective.group_size,
                    time=seconds * share,
                    op_name=op_name,
                    **where,
                )
            )
        return out

    def _trace(
        self, name: str, element: int | None, op_name: str, axes: tuple[str, ...]
    ) -> dict[str, Any]:
        origin = self.origins.origin(name, element, op_name=op_name, partial_over=axes)
        if origin.ops:
            return self._from_ops(origin)
        # a sharding constraint, or a name the graph does not have: by where it moves data
        return self._from_flow(name, element, op_name)

    def _from_ops(self, origin: Origin) -> dict[str, Any]:
        ops = origin.ops
        owners = {o: self._op_owner(o) for o in ops}
        blocks = {b for b, _ in owners.values()}
        how = " and ".join(origin.evidence)
        shown = _ops_text(ops)
        owned = {b for b in blocks if b is not None}
        if len(blocks) == 1 and owned:
            (block,) = owned
            op = ops[0]
            relation = owners[op][1]
            return self._block_row(block, op, f"{how} match {shown}, {relation} block {block}")
        if blocks == {None}:
            op = ops[0]
            segment = self.segment_of_op[op]
            return {
                "target": Target.OP,
                "block": None,
                "block_name": "",
                "source_block": None,
                "segment": segment,
                "segment_label": self._label(segment),
                "op": op,
                "source": self.graph.ops[op].source,
                "reason": f"{how} match {shown}, outside every block and laid out by none",
            }
        listed = ", ".join(sorted("none" if b is None else str(b) for b in blocks))
        return self._unknown(f"{how} match {shown}, of different blocks ({listed})")

    def _from_flow(self, name: str, element: int | None, op_name: str) -> dict[str, Any]:
        """A collective that names no op (a sharding constraint): between the values it
        moves and the values made from what it moved."""
        made = self.origins.producers(name, element)
        read = self.origins.consumers(name, element)
        before = {b for o in made for b in self._owners(o) if b is not None}
        after = {b for o in read for b in self._owners(o) if b is not None}
        consumer_op = next((o.ops[0] for o in read if o.ops), None)
        producer_op = next((o.ops[0] for o in made if o.ops), None)
        what = f"{op_key(op_name)[1] or 'an unnamed instruction'}"
        if len(before | after) == 1:
            (block,) = before | after
            return self._block_row(
                block,
                consumer_op if consumer_op is not None else producer_op,
                f"{what} between {_flow_text(made)} and {_flow_text(read)}, all of block {block}",
            )
        if len(before) == 1 and len(after) == 1:
            (source,), (block,) = before, after
            row = self._block_row(
                block,
                consumer_op,
                f"{what} moves {_flow_text(made)} made under block {source}'s layout to "
                f"{_flow_text(read)}, read under block {block}'s",
            )
            row.update(target=Target.BOUNDARY, source_block=source)
            return row
        crossing = self._crossing(made, read)
        if crossing is not None:
            boundary, forward, source, block = crossing
            row = self._block_row(
                block,
                consumer_op,
                f"{what} moves {_flow_text(made)} of instance "
                f"{self._label(boundary if forward else boundary + 1)} across the segment "
                f"boundary to {_flow_text(read)} of instance "
                f"{self._label(boundary + 1 if forward else boundary)} "
                f"({'the activation' if forward else 'the cotangent'}): made as block "
                f"{source} leaves it, read as block {block} wants it (the boundary's "
                f"resharding, priced for this pair of strategies)",
            )
            row.update(target=Target.BOUNDARY, source_block=source)
            return row
        moved = self._moved_reads(read)
        if len(moved) == 1:
            ((block, op),) = moved.items()
            sources = before - {block}
            row = self._block_row(
                block,
                op,
                f"{what} moves {_flow_text(made)} to op #{op} of block {block}, which the "
                f"plan has read an operand in another layout than the one it was made in",
            )
            if len(sources) == 1:
                row.update(target=Target.BOUNDARY, source_block=sources.pop())
            return row
        return self._unknown(
            f"{what} between {_flow_text(made)} (blocks {sorted(before)}) and "
            f"{_flow_text(read)} (blocks {sorted(after)}): no single producer and consumer block"
        )

    def _moved_reads(self, read: tuple[Origin, ...]) -> dict[int, int]:
        """Block -> a reader op, over the readers the plan constrains to read an operand in
        another layout than the one it was made in (a block head gathering its input, an
        expert block reading dispatched tokens): where such a read is, the data moves."""
        found: dict[int, int] = {}
        reads, layouts = self.origins.reads, self.origins.layouts
        for origin in read:
            for op in origin.ops:
                inputs = self.graph.ops[op].inputs
                if not any(
                    (op, p) in reads and reads[(op, p)] != layouts.get(v)
                    for p, v in enumerate(inputs)
                ):
                    continue
                block = self._op_owner(op)[0]
                if block is not None:
                    found.setdefault(block, op)
        return found

    def _crossing(
        self, made: tuple[Origin, ...], read: tuple[Origin, ...]
    ) -> tuple[int, bool, int, int] | None:
        """(boundary, forward, producer block, reader block) when the values moved are made
        in one segment instance and read in the next (or, a cotangent, the previous): at a
        boundary `layouts.place` constrains the value at its producer to the layout the
        producing instance's boundary block leaves it in, and at its readers to the layout
        the reading instance's boundary block wants (the last block of the earlier instance,
        the first of the later one), so the move is between those two blocks."""
        made_in = {self.segment_of_op[o] for origin in made for o in origin.ops}
        read_in = {self.segment_of_op[o] for origin in read for o in origin.ops}
        if not made_in or not read_in:
            return None
        # the two sets lie on either side of one boundary; the compiler may fuse the moved
        # value into ops further on (a residual add into the next layer's ops), so the
        # producer and reader instances are those nearest the boundary
        if max(made_in) + 1 == min(read_in):
            producer, reader = max(made_in), min(read_in)
        elif min(made_in) - 1 == max(read_in):
            producer, reader = min(made_in), max(read_in)
        else:
            return None
        forward = reader == producer + 1
        boundary = min(producer, reader)
        crossing = next(
            (b for b in self.analysis.segments.boundaries if b.before == boundary), None
        )
        if crossing is None or not (crossing.forward if forward else crossing.backward):
            return None
        before = self.analysis.segments.instances[boundary].blocks
        after = self.analysis.segments.instances[boundary + 1].blocks
        if not before or not after:
            return None
        last, first = before[-1], after[0]
        source, block = (last, first) if forward else (first, last)
        return boundary, forward, source, block

    def _block_row(self, block: int, op: int | None, reason: str) -> dict[str, Any]:
        segment = self.segment_of_op[self.analysis.blocks[block].head]
        return {
            "target": Target.BLOCK,
            "block": block,
            "block_name": block_name(self.analysis, block),
            "source_block": None,
            "segment": segment,
            "segment_label": self._label(segment),
            "op": op,
            "source": self.graph.ops[op].source if op is not None else "",
            "reason": reason,
        }

    def _unknown(self, reason: str) -> dict[str, Any]:
        return {
            "target": Target.UNKNOWN,
            "block": None,
            "block_name": "",
            "source_block": None,
            "segment": None,
            "segment_label": "",
            "op": None,
            "source": "",
            "reason": reason,
        }

    def _label(self, segment: int | None) -> str:
        if segment is None:
            return ""
        return self.analysis.segments.instances[segment].label


def _block_shares(
    analysis: Analysis, plan: Plan, rows: list[AttributedCollective]
) -> tuple[BlockShare, ...]:
    shares = []
    for block in analysis.blocks:
        own = [r for r in rows if r.block == block.index and r.target is Target.BLOCK]
        into = [r for r in rows if r.block == block.index and r.target is Target.BOUNDARY]
        segment = analysis.segments.segment_of_op[block.head]
        shares.append(
            BlockShare(
                block=block.index,
                name=block_name(analysis, block.index),
                strategy=plan.strategies[block.index],
                segment=segment,
                segment_label=analysis.segments.instances[segment].label,
                collectives=len(own),
                nbytes=sum(r.nbytes for r in own),
                time=math.fsum(r.time for r in own),
                boundary_time=math.fsum(r.time for r in into),
            )
        )
    return tuple(shares)


def _updated_inputs(graph: Graph) -> dict[int, int]:
    """Step result position -> the step input it updates (same path below the top-level
    argument, shape and dtype: a parameter or optimizer state and its new value)."""
    by_key: dict[tuple[str, tuple[int, ...], str], int] = {}
    for position, vid in enumerate(graph.inputs):
        value = graph.values[vid]
        if value.kind in (ValueKind.PARAMETER, ValueKind.OPTIMIZER_STATE):
            by_key.setdefault(
                (path_suffix(value.path), value.type.shape, value.type.dtype), position
            )
    found: dict[int, int] = {}
    for k, (vid, path) in enumerate(zip(graph.outputs, graph.output_paths, strict=False)):
        tt = graph.values[vid].type
        updated = by_key.get((path_suffix(path), tt.shape, tt.dtype))
        if updated is not None:
            found[k] = updated
    return found


def _ops_text(ops: tuple[int, ...]) -> str:
    shown = ", ".join(f"#{o}" for o in ops[:4])
    more = f" (+{len(ops) - 4})" if len(ops) > 4 else ""
    return f"op{'s' if len(ops) > 1 else ''} {shown}{more}"


def _flow_text(origins: tuple[Origin, ...]) -> str:
    parts = []
    for origin in origins[:3]:
        if origin.ops:
            parts.append(_ops_text(origin.ops))
        elif origin.step_input is not None:
            parts.append(f"step input {origin.step_input}")
        elif origin.step_output is not None:
            parts.append(f"step result {origin.step_output}")
    return "; ".join(parts) or "nothing traced"
