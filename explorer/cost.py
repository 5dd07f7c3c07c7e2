"""The cost model: profiles composed along the chain of segment instances (paper Eq. 8, 9).

Time (Eq. 8): `C_T = sum_n (T_C[n][i_n] + T_P[n][i_n]) + sum_n T_R[n][i_{n-1}][i_n]`, where the
resharding term depends only on the previous instance's last block strategy and this
instance's first block strategy.

Collectives the compiler combines across segments (independent all-reduces that reach only the
step's results, e.g. gradient all-reduces: `hlo.parse_collectives` marks them) pay their
bandwidth in each segment's T_C but their latency once per combined bucket of the whole plan,
as XLA's all-reduce combiner merges them (on XLA:CPU, which compiles the programs the
`compiled` backend prices: any number of bytes, at most `COMBINE_COUNT` operands per bucket).

A segment whose program depends on another instance's block (a parameter tied to the head,
read by the embedding) has one option per strategy of that block (`Option.context`); a plan
is consistent when each option's context is what the other instance chose.

Memory: Eq. 9 sums each segment program's peak, which counts a parameter read by two segments
twice, and every parameter and optimizer state twice (as argument and as updated result,
where the training step donates them). The prediction follows the step's order instead. The
step runs the forward parts in chain order, then the backward parts in reverse: instance n's
backward part runs while the activations saved by instances 0..n are alive (those of n+1..
were read and freed) and after the gradients of n+1.. for another instance's optimizer were
made. So, with `persistent` held the whole step, `saved` from an instance's forward part to
its backward part, `gradients` from its backward part on, and `transient` while it runs
(`profile.accounting.HeldMemory`):

    memory = sum_n persistent[n] + max(sum_n gradients[n],
                                       max_n (sum_{k<=n} saved[k] + sum_{k>n} gradients[k]
                                              + transient[n]))

(the first term of the max: after the backward parts every gradient waits for its optimizer).

A value made from constants alone that a backward part reads (a broadcast scale, the zeros a
gradient is scattered into) is held from the first instance of its type on, once for all its
instances (the compiler merges equal constants): `constants`, added at that first instance.

An early layer's working set coexists with the activations saved before it, not with every
layer's. Each step input counts once, in the segment that owns it. Eq. 9 stays available for
comparison.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from explorer.errors import AnalysisError
from explorer.ir import Segmentation, SegmentInstance
from explorer.profile.profiles import Profiles

# XLA:CPU's all-reduce combiner (cpu_compiler.cc: kCombineBytes = int64 max, kCombineCount =
# 256): the compiler whose optimised HLO the `compiled` backend reads.
COMBINE_COUNT = 256


@dataclass(frozen=True, slots=True)
class Option:
    """One profiled configuration of a segment instance."""

    choices: tuple[int, ...]  # strategy index per block of the instance
    name: str
    t_comm: float
    t_comp: float
    persistent: int
    transient: int
    peak: int  # the segment program's own peak (Eq. 9 term)
    # held from the instance's forward part to its backward part, and from its backward part
    # to the optimizer (`profile.accounting.HeldMemory`)
    saved: int = 0
    gradients: int = 0
    # made from constants alone, held from the first instance of the type on, once for all
    # of its instances (the compiler merges the equal buffers)
    constants: int = 0
    # strategies of the instance's dependencies (CostModel.dependencies), in order
    context: tuple[int, ...] = ()
    # per combining group ("kind@axes/size"): combinable elements and their latency
    combined: tuple[tuple[str, int, float], ...] = ()

    @property
    def time(self) -> float:
        return self.t_comm + self.t_comp

    @property
    def first(self) -> int:
        return self.choices[0] if self.choices else 0

    @property
    def last(self) -> int:
        return self.choices[-1] if self.choices else 0


@dataclass(frozen=True, slots=True)
class CostModel:
    """Per instance its options; per boundary the resharding time by (last, first) strategy."""

    labels: tuple[str, ...]  # instance labels, e.g. "layer_3"
    options: tuple[tuple[Option, ...], ...]  # per instance
    reshard: tuple[dict[tuple[int, int], float], ...]  # per boundary n -> n+1
    # per instance: the blocks (of other instances) its options' context refers to
    dependencies: tuple[tuple[int, ...], ...] = ()
    # per instance: its blocks, in order (to find a dependency's instance and position)
    instance_blocks: tuple[tuple[int, ...], ...] = ()
    # per block: its twin (`layouts.loop_twins`: the same block of a scan's first iteration,
    # whose strategy a uniform plan gives it); empty when every block is its own twin
    twins: tuple[int, ...] = ()
    # per instance: whether it is the first of its segment type, the one whose constants
    # count (`Option.constants`); empty: every instance is its own type
    opens: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if len(self.reshard) != max(0, len(self.options) - 1):
            raise ValueError("one resharding table per boundary between instances")
        used = [b for blocks in self.instance_blocks for b in blocks]
        if self.twins and used and max(used) >= len(self.twins):
            raise ValueError(
                f"expected one twin per block: instances hold block {max(used)}, twins cover "
                f"{len(self.twins)} blocks"
            )
        for label, options in zip(self.labels, self.options, strict=True):
            if not options:
                raise AnalysisError(f"segment instance {label!r} has no feasible configuration")
        if self.dependencies and len(self.dependencies) != len(self.options):
            raise ValueError("one dependency tuple per instance")

    def time(self, selection: Sequence[int]) -> float:
        """Eq. 8 for one option index per instance, with combined collectives' latency."""
        chosen = [self.options[n][i] for n, i in enumerate(selection)]
        total = sum(o.time for o in chosen)
        for n in range(1, len(chosen)):
            total += self.reshard[n - 1].get((chosen[n - 1].last, chosen[n].first), 0.0)
        return total + self.combined_latency(selection)

    def combined_latency(self, selection: Sequence[int]) -> float:
        """One latency per bucket of combinable collectives the plan's segments emit."""
        counts: Counter[str] = Counter()
        latency: dict[str, float] = {}
        for n, i in enumerate(selection):
            for key, count, seconds in self.options[n][i].combined:
                counts[key] += count
                latency[key] = seconds
        return sum(latency[k] * math.ceil(c / COMBINE_COUNT) for k, c in counts.items())

    def twin(self, block: int) -> int:
        """The block whose strategy `block` takes in a uniform plan (itself outside scans)."""
        return self.twins[block] if self.twins else block

    def block_choice(self, selection: Sequence[int], block: int) -> int:
        """The strategy `selection` gives `block`."""
        for n, blocks in enumerate(self.instance_blocks):
            if block in blocks:
                return self.options[n][selection[n]].choices[blocks.index(block)]
        raise AnalysisError(f"block {block} belongs to no segment instance")

    def inconsistency(self, selection: Sequence[int]) -> str | None:
        """Why `selection` is not one program (an option priced under another strategy of a
        block it depends on than the one chosen), or None."""
        for n, depends in enumerate(self.dependencies):
            option = self.options[n][selection[n]]
            actual = tuple(self.block_choice(selection, b) for b in depends)
            if actual != option.context:
                return (
                    f"instance {self.labels[n]!r} was priced with blocks {list(depends)} on "
                    f"strategies {list(option.context)}, but the plan gives them {list(actual)}"
                )
        return None

    def opens_type(self, n: int) -> bool:
        """Whether instance `n` is the first of its type: the one whose constants count."""
        return not self.opens or self.opens[n]

    def memory(self, selection: Sequence[int]) -> int:
        """The largest memory held while one instance's backward part runs (module doc)."""
        chosen = [self.options[n][i] for n, i in enumerate(selection)]
        # counted from the optimizer's level, where every gradient waits for its update
        persistent = sum(o.persistent + o.gradients for o in chosen)
        saved = 0  # saved by instances 0..n, less their gradients (not made before n's level)
        largest = 0
        for n, option in enumerate(chosen):
            saved += option.saved - option.gradients
            if self.opens_type(n):
                saved += option.constants
            largest = max(largest, saved + option.transient)
        return persistent + largest

    def memory_eq9(self, selection: Sequence[int]) -> int:
        """The paper's Eq. 9: the sum of every segment program's peak."""
        return sum(self.options[n][i].peak for n, i in enumerate(selection))


def build_cost_model(
    segmentation: Segmentation,
    profiles: Profiles,
    dependencies: tuple[tuple[int, ...], ...] = (),
    twins: tuple[int, ...] = (),
) -> CostModel:
    """Options per instance from its unique type's profiles; T_R from the boundary profiles.

    `dependencies` (per instance, see `layouts.external_blocks`) tells which blocks the
    profiles' `context` refers to; `twins` (per block, see `layouts.loop_twins`) which blocks
    a uniform plan gives one strategy. A type's options keep the profiles' order."""
    by_type: dict[int, tuple[Option, ...]] = {}
    feasible = [p for p in profiles.segments if p.ok]
    for unique in segmentation.unique:
        by_type[unique.id] = tuple(
            Option(
                choices=p.choices,
                name=p.config,
                t_comm=p.t_comm,
                t_comp=p.t_comp,
                persistent=p.persistent_memory,
                transient=p.transient_memory,
                peak=p.memory,
                saved=p.saved_memory,
                gradients=p.gradient_memory,
                constants=p.constant_memory,
                context=p.context,
                combined=p.combined,
            )
            for p in feasible
            if p.segment == unique.id
        )
    pairs: dict[tuple[int, int], dict[tuple[int, int], float]] = {}
    for r in profiles.reshards:
        if r.ok:
            pairs.setdefault((r.before, r.after), {})[(r.last, r.first)] = r.t_total
    instances = segmentation.instances
    first_of: dict[int, int] = {}  # per type: its first instance (whose constants count)
    for instance in instances:
        first_of.setdefault(instance.unique_id, instance.index)
    _check_contexts(segmentation, by_type, dependencies)
    reshard = []
    for before, after in itertools.pairwise(instances):
        table = pairs.get((before.unique_id, after.unique_id), {})
        lasts = {o.last for o in by_type[before.unique_id]}
        firsts = {o.first for o in by_type[after.unique_id]}
        # a boundary whose resharding failed to profile is unusable: priced as infinite
        reshard.append({(a, b): table.get((a, b), math.inf) for a in lasts for b in firsts})
    return CostModel(
        labels=tuple(i.label for i in instances),
        options=tuple(by_type[i.unique_id] for i in instances),
        reshard=tuple(reshard),
        dependencies=dependencies or tuple(() for _ in instances),
        instance_blocks=tuple(i.blocks for i in instances),
        twins=twins,
        opens=tuple(first_of[i.unique_id] == i.index for i in instances),
    )


def _check_contexts(
    segmentation: Segmentation,
    by_type: dict[int, tuple[Option, ...]],
    dependencies: tuple[tuple[int, ...], ...],
) -> None:
    """A type is profiled at its first instance, under the strategies of that instance's
    dependencies. An instance that depends on a different number of outside blocks can
    never match those contexts: say so, naming both, rather than let the solver find no
    consistent plan."""
    profiled_at: dict[int, SegmentInstance] = {}
    for instance in segmentation.instances:
        profiled = profiled_at.setdefault(instance.unique_id, instance)
        options = by_type[instance.unique_id]
        depends = dependencies[instance.index] if dependencies else ()
        found = {len(o.context) for o in options}
        if options and found != {len(depends)}:
            raise AnalysisError(
                f"segment instance {instance.label!r} depends on {len(depends)} block(s) of "
                f"other instances {list(depends)}, but its type was profiled at "
                f"{profiled.label!r} under {sorted(found)} such block(s): the two are not one "
                "program type (a segmentation error; please report the model)"
            )
