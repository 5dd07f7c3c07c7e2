"""ParallelBlocks and the configuration space: head dim roles, strategies, the blocks an
analysis found, one strategy per block (`Config`) and where it puts every value."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from explorer.ir.graph import CONTRACTION_PRIMITIVES, Graph

# Per dim of a value: the mesh axes splitting it, outermost first (empty tuple: not split).
DimAxes = tuple[tuple[str, ...], ...]


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

    E' and M' exist only in a space built for the outer axis (`build_blocks(outer=...)`):
    where E or M passed over its first candidate dim because it does not split over the
    whole mesh, but that dim does split over the mesh's outer axis (a batch of 4 on 2x4),
    the primed role keeps it for that axis alone, so the batch can still be split there.
    """

    E = "E"
    M = "M"
    N = "N"
    K = "K"
    E_OUTER = "E'"
    M_OUTER = "M'"

    @property
    def outer_only(self) -> bool:
        """Whether the role splits over the mesh's outer axis only (E', M')."""
        return self in (DimRole.E_OUTER, DimRole.M_OUTER)


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
    """One partition choice of a block: which mesh axes split which head dim roles.

    `stored`: mesh axes over which the parameters the block owns are *kept* sharded between
    steps though the block computes with them whole there (ZeRO-3 / FSDP on the batch axes):
    gathered where the block uses them, their gradient reduce-scattered, their optimizer
    state sharded. Memory for communication, a trade the solver makes per block.

    `scattered`: mesh axes over which a contraction's partial sums are reduce-scattered
    onto M instead of all-reduced (Megatron's sequence parallelism where M is the sequence;
    `scattering_role` says which split leaves them). Splitting K, the head's own partial
    sums: every op of the block after the head works on M-shards. Splitting N (and not K),
    the backward contraction's that makes the head's input gradient: that gradient leaves
    the block on M-shards. Half an all-reduce's bytes, activations split that much more,
    and whoever wants them whole gathers them (the other half)."""

    assignment: tuple[tuple[DimRole, tuple[str, ...]], ...]
    stored: tuple[str, ...] = ()
    scattered: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        if not self.assignment:
            return "replicated"
        split = ",".join(f"{role.value}@{'+'.join(axes)}" for role, axes in self.assignment)
        if self.scattered:
            split = f"{split},rs@{'+'.join(self.scattered)}"
        return f"{split},params@{'+'.join(self.stored)}" if self.stored else split

    @property
    def partial_sum_role(self) -> DimRole:
        """The role whose split leaves the partial sums a scattering twin would reduce-scatter:
        K where the strategy splits K (the head contracts it), else N (the input gradient's
        contraction does)."""
        return DimRole.K if self.axes_of(DimRole.K) else DimRole.N

    @property
    def scattering_role(self) -> DimRole | None:
        """A scattering strategy's `partial_sum_role`: values holding that role's dim keep its
        split, the others are split on M (None: the strategy scatters nothing)."""
        return self.partial_sum_role if self.scattered else None

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
    # per role (K, N), the block's contractions summing over its dim into a result holding M
    # (the head for K; the input gradient's, backward, for N): what a scattering twin scatters
    partial_sums: tuple[tuple[DimRole, tuple[int, ...]], ...] = ()

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

    def partial_sums_over(self, role: DimRole) -> tuple[int, ...]:
        """The contractions whose partial sums a strategy splitting `role` leaves, each
        making a value that holds M (`partial_sums`)."""
        return dict(self.partial_sums).get(role, ())

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
    # the size of the axis E' and M' were placed for, if any: the outer one's, or the inner
    # one's in the batch-inner space (`space.step_blocks`)
    outer_parts: int | None = None
    # whether some block's K took a later contracted dim than the paper's (built with
    # `contract_last`): where none did, the space is the one built without it
    contracted_last: bool = False

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for block in self.blocks:
            ops = set(block.ops)
            if ops & seen:
                raise ValueError(f"blocks overlap on ops {sorted(ops & seen)[:5]}")
            seen |= ops

    @property
    def primed(self) -> bool:
        """Whether some block kept a primed role (E', M') for the outer axis."""
        return any(role.outer_only for block in self.blocks for role in block.roles)

    @property
    def scattering(self) -> bool:
        """Whether some block offers a scattering twin (`Strategy.scattered`)."""
        return any(s.scattered for block in self.blocks for s in block.strategies)

    def summary(self, graph: Graph) -> str:
        outer = f", E'/M' for a batch axis of {self.outer_parts}" if self.outer_parts else ""
        if self.contracted_last:
            outer += ", K on the last contracted dim that splits (contract_last)"
        lines = [f"{len(self.blocks)} ParallelBlocks (P={self.parallelism}{outer})"]
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
class Scatter:
    """A contraction whose partial sums are reduce-scattered (`Strategy.scattered`): it
    computes on `operands`' layouts, and its result, split over `axes` on `dim` beside the
    splits the operands give it, is `result`.

    Realised explicitly (`realize`): XLA:GPU turns an all-reduce whose result is sliced into a
    reduce-scatter, XLA:CPU does not, so left to the partitioner the profiled program would
    all-reduce whole activations and pay for the split it was chosen to save."""

    op: int
    operands: tuple[DimAxes, ...]  # per operand of the op
    result: DimAxes
    dim: int
    axes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShardingAssignment:
    """Where every constrained value of the step lives on the mesh under one Config."""

    mesh_axes: tuple[tuple[str, int], ...]
    inputs: tuple[DimAxes, ...]  # per flattened step argument
    outputs: tuple[DimAxes, ...]  # per flattened step result
    values: tuple[tuple[int, DimAxes], ...]  # producer side: value id -> layout
    operands: tuple[tuple[int, int, DimAxes], ...]  # consumer side: (op id, position) -> layout
    scatters: tuple[Scatter, ...] = ()  # by op id
    # (op id, position), sorted, of the reads in `operands` of a tensor made split that
    # crosses a segment boundary: its readers in one layout read one moved copy, as the
    # resharding program prices one move (T_R) and a segment program receives one input
    crossing_reads: tuple[tuple[int, int], ...] = ()

    def value_map(self) -> dict[int, DimAxes]:
        return dict(self.values)
