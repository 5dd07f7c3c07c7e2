"""What a segment instance's program depends on beyond its own blocks: the twins of blocks
inside a scan, the blocks of other instances whose strategy changes its program, and the name
of a segment configuration with the strategies it depends on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from explorer.ir import BlockAnalysis, Config, Graph, ParallelBlock, Segmentation
from explorer.layouts.placement import Placement, boundary_reads, place
from explorer.mesh import MeshSpec


def loop_twins(graph: Graph, blocks: Sequence[ParallelBlock]) -> tuple[int, ...]:
    """Per block, its twin: the same block of the first iteration of every scan it lies in
    (`Graph.loop_twin` of its head); a block outside every scan is its own twin.

    Why: within a scan every iteration runs one body, so plans of a step with a scan give a
    block and its twins one strategy (uniform plans; `apply_plan` keeps the scan), and a
    dependency on the same block of another iteration is a dependency on one's own strategy.
    The iterations share the stacked parameters (one value, sliced per iteration), whose
    layout all of them decide; without twins each iteration would depend on every other.
    A block whose twin position holds no block with the same strategies stays its own twin.
    """
    by_head = {block.head: block for block in blocks}
    twins = []
    for block in blocks:
        twin = by_head.get(graph.loop_twin(block.head))
        same = twin is not None and twin.strategies == block.strategies
        twins.append(twin.index if twin is not None and same else block.index)
    return tuple(twins)


def twin_config(twins: Sequence[int], blocks: Sequence[int], choices: Sequence[int]) -> Config:
    """The whole-step Config that gives each of `blocks` its choice and every twin of one of
    them the same strategy (a uniform plan's placement of what the scan's iterations share:
    the stacked parameters); every other block takes strategy 0. A block's own choice stands
    over a twin's (the first given wins between twins of one another)."""
    if len(blocks) != len(choices):
        raise ValueError(
            f"expected one strategy per block: {len(blocks)} blocks, {len(choices)} choices"
        )
    own = dict(zip(blocks, choices, strict=True))
    by_twin: dict[int, int] = {}
    for block, choice in own.items():
        by_twin.setdefault(twins[block], choice)
    return Config(tuple(own.get(b, by_twin.get(twin, 0)) for b, twin in enumerate(twins)))


def external_blocks(
    placement: Placement,
    graph: Graph,
    segmentation: Segmentation,
    index: int,
    twins: Sequence[int],
) -> tuple[int, ...]:
    """Blocks of other segment instances whose strategy changes instance `index`'s program,
    each named by its twin (`loop_twins`).

    Its boundary tensors arrive in layouts its own first and last blocks decide; anything else
    it reads or makes whose layout another instance's block decided (a parameter tied to a
    block elsewhere, a value made far away) makes its cost depend on that block's strategy.
    A block whose twin is the twin of one of the instance's own blocks is left out: it takes
    the instance's own strategy (the same block of another iteration of a scan).
    """
    instance = segmentation.instances[index]
    own = set(instance.ops)
    boundary = {v for v, reader in boundary_reads(segmentation, graph) if reader == index}
    found: set[int] = set()
    for op_id in instance.ops:
        op = graph.ops[op_id]
        for vid in op.inputs:
            producer = graph.values[vid].producer
            if (producer is None or producer not in own) and vid not in boundary:
                found |= placement.sources[vid]
        for vid in op.outputs:
            found |= placement.sources[vid]
    mine = {twins[b] for b in instance.blocks}
    return tuple(sorted({twins[b] for b in found} - mine))


def instance_dependencies(
    graph: Graph, analysis: BlockAnalysis, segmentation: Segmentation, mesh: MeshSpec
) -> tuple[tuple[int, ...], ...]:
    """Per instance, the blocks of other instances whose strategy changes its program (by
    their twins: the first iteration's blocks for blocks inside a scan)."""
    zero = Config((0,) * len(analysis.blocks))
    placement = place(graph, analysis.blocks, zero, mesh, segmentation)
    twins = loop_twins(graph, analysis.blocks)
    return tuple(
        external_blocks(placement, graph, segmentation, n, twins)
        for n in range(len(segmentation.instances))
    )


def split_by_dependencies(
    segmentation: Segmentation,
    dependencies: Sequence[tuple[int, ...]],
    blocks: Sequence[ParallelBlock],
) -> Segmentation:
    """The segmentation with every type split by what its instances depend on.

    A type is profiled at its first instance, under the strategies of the blocks that
    instance depends on, and every instance of the type takes those programs with its own
    dependencies in their place, position by position. That holds only where the instances
    depend on as many blocks, with the same strategies, in the same order. Where a layer
    sits between the embedding and the head it is not so: with a layer cut in parts, the
    residual stream skips a part, so the first layer's part reads the embedding's output
    (no block), a middle layer's the previous layer's, and the last layer's backward reads
    the head's cotangent. Instances that differ become types of their own ("layer part 3
    (2)"), each profiled at its first instance: more programs, each priced as it runs."""
    signatures: dict[int, list[tuple[tuple[str, ...], ...]]] = {}
    variant_of: list[int] = []
    for instance in segmentation.instances:
        signature = tuple(
            tuple(s.name for s in blocks[b].strategies) for b in dependencies[instance.index]
        )
        seen = signatures.setdefault(instance.unique_id, [])
        if signature not in seen:
            seen.append(signature)
        variant_of.append(seen.index(signature))
    if all(len(seen) == 1 for seen in signatures.values()):
        return segmentation
    # a type's first variant keeps its id; the others are numbered on after the last type
    new_id = {(unique.id, 0): unique.id for unique in segmentation.unique}
    for unique in segmentation.unique:
        for variant in range(1, len(signatures[unique.id])):
            new_id[(unique.id, variant)] = len(new_id)
    instances = tuple(
        replace(instance, unique_id=new_id[(instance.unique_id, variant)])
        for instance, variant in zip(segmentation.instances, variant_of, strict=True)
    )
    counts = Counter(instance.unique_id for instance in instances)
    types = [replace(unique, instance_count=counts[unique.id]) for unique in segmentation.unique]
    notes = []
    for unique in segmentation.unique:  # in id order, so the new types follow in theirs
        variants = len(signatures[unique.id])
        if variants == 1:
            continue
        notes.append(
            f"type {unique.label!r} split in {variants}: its instances depend on other "
            "instances' blocks differently, so no one program stands for them all"
        )
        for variant in range(1, variants):
            index = new_id[(unique.id, variant)]
            types.append(
                replace(
                    unique,
                    id=index,
                    fingerprint=f"{unique.fingerprint}/depends-{variant}",
                    label=f"{unique.label} ({variant + 1})",
                    instance_count=counts[index],
                )
            )
    return replace(
        segmentation,
        instances=instances,
        unique=tuple(types),
        notes=segmentation.notes + tuple(notes),
    )


# between a segment configuration's own strategies and those of the blocks it depends on
CONTEXT_SEPARATOR = " | "


def configuration_name(
    blocks: tuple[ParallelBlock, ...],
    own: tuple[int, ...],
    choices: tuple[int, ...],
    depends: tuple[int, ...] = (),
    context: tuple[int, ...] = (),
) -> str:
    """A segment configuration's name: its blocks' strategies (`"M@x,N@x"`, `"-"` without
    blocks), then those of the blocks it depends on (`" | head:N@x"`)."""
    name = ",".join(blocks[b].strategies[c].name for b, c in zip(own, choices, strict=True))
    name = name or "-"
    if depends:
        name += CONTEXT_SEPARATOR + ",".join(
            f"{blocks[b].scope or b}:{blocks[b].strategies[c].name}"
            for b, c in zip(depends, context, strict=True)
        )
    return name
