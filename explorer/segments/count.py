"""The paper's Eq. 7 program count, and the profiling cap it is checked against: the most
configurations one unique segment may have (a count, never bytes: `memory_budget` is bytes)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from explorer.errors import ConfigCapError
from explorer.ir import BlockAnalysis, Segmentation, SegmentInstance

# Configurations a unique segment may have before it is split (adaptive granularity), and
# the default bound of a profiling run per segment type: a GPT layer's 4 blocks x 3
# strategies whole (DESIGN.md). A layer with more blocks (attention cores of their own where
# the batch cannot split) is cut in parts of about that size, whose programs cost several
# times fewer seconds than one part of 256. Not every cut is free: a boundary can land where
# a plan's values must move (assets/bench/paper/NOTE.md, stops 56 and 57).
DEFAULT_CONFIG_CAP = 81


@dataclass(frozen=True, slots=True)
class ProgramCount:
    """The paper's Eq. 7: programs to profile, which does not grow with depth."""

    segment_programs: int
    reshard_programs: int
    per_type: tuple[tuple[int, int], ...]  # (unique type id, configurations)
    per_pair: tuple[tuple[int, int, int], ...]  # (type before, type after, strategy pairs)

    @property
    def total(self) -> int:
        return self.segment_programs + self.reshard_programs

    def formula(self) -> str:
        seg = " + ".join(str(n) for _, n in self.per_type)
        pairs = " + ".join(str(n) for *_, n in self.per_pair) or "0"
        return f"({seg}) + ({pairs}) = {self.total}"


def program_count(
    segmentation: Segmentation,
    analysis: BlockAnalysis,
    dependencies: Sequence[tuple[int, ...]] = (),
    reshards: Mapping[tuple[int, int], Mapping[tuple[int, int], Sequence[object]]] | None = None,
) -> ProgramCount:
    """Eq. 7, with the extra programs of a type whose cost depends on another instance's
    block (`dependencies`, per instance: see `layouts.external_blocks`): one per strategy
    of that block.

    With `reshards` (`space.reshard_signatures`: what each pair's resharding moves, per
    strategy pair), a resharding program is counted once however many boundaries share it,
    and not at all where nothing moves; without, every strategy pair of every pair of types
    counts, as in the paper.
    """
    blocks = analysis.blocks
    first_instance: dict[int, SegmentInstance] = {}
    for instance in segmentation.instances:
        first_instance.setdefault(instance.unique_id, instance)

    def configurations(instance: SegmentInstance) -> int:
        depends = dependencies[instance.index] if dependencies else ()
        return math.prod(len(blocks[b].strategies) for b in (*instance.blocks, *depends))

    per_type = tuple((t, configurations(inst)) for t, inst in sorted(first_instance.items()))

    def edge_strategies(instance: SegmentInstance, last: bool) -> int:
        if not instance.blocks:
            return 1
        return len(blocks[instance.blocks[-1 if last else 0]].strategies)

    pairs: dict[tuple[int, int], int] = {}
    seen: set[object] = set()
    for before, after in zip(segmentation.instances, segmentation.instances[1:], strict=False):
        key = (before.unique_id, after.unique_id)
        if key in pairs:
            continue
        if reshards is None:
            pairs[key] = edge_strategies(before, True) * edge_strategies(after, False)
        else:  # the programs this pair adds: what moves, not yet moved by an earlier pair
            new = {tuple(s) for s in reshards[key].values() if s} - seen
            seen |= new
            pairs[key] = len(new)
    per_pair = tuple((a, b, n) for (a, b), n in sorted(pairs.items()))
    return ProgramCount(
        segment_programs=sum(n for _, n in per_type),
        reshard_programs=sum(n for *_, n in per_pair),
        per_type=per_type,
        per_pair=per_pair,
    )


def check_config_cap(
    segmentation: Segmentation, analysis: BlockAnalysis, cap: int = DEFAULT_CONFIG_CAP
) -> None:
    """Refuse to plan thousands of programs silently: name the segment and its count."""
    count = program_count(segmentation, analysis)
    for type_id, configurations in count.per_type:
        if configurations > cap:
            unique = segmentation.unique[type_id]
            instance = next(i for i in segmentation.instances if i.unique_id == type_id)
            sizes = " x ".join(str(len(analysis.blocks[b].strategies)) for b in instance.blocks)
            if len(instance.blocks) == 1:
                block = analysis.blocks[instance.blocks[0]]
                raise ConfigCapError(
                    f"block {block.index} ({block.scope or 'unscoped'}, head op #{block.head}) "
                    f"alone has {len(block.strategies)} strategies, over the profiling cap "
                    f"of {cap}: a segment is cut only between blocks, so no cut can bring "
                    f"it under. Raise the cap (config_cap=) to at least {len(block.strategies)}."
                )
            raise ConfigCapError(
                f"segment type {type_id} ({unique.label!r}, {unique.block_count} blocks, first "
                f"instance {instance.label!r}) has {configurations} configurations ({sizes}), "
                f"over the profiling cap of {cap}: these segments were cut for a larger "
                f"cap. Build them with this cap (build_segments(..., cap={cap}), as analyze does) "
                "so the type is split at its blocks, or raise the cap (config_cap=)."
            )
