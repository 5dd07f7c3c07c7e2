"""What an attribution is: one row per collective (element) of a plan's whole step, where it
is from, and the per-block totals (`attribution.attribute` makes them; the module doc there
says how)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import pandas as pd

from explorer.errors import AnalysisError


class Target(StrEnum):
    BLOCK = "block"
    BOUNDARY = "boundary"
    OP = "op"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class AttributedCollective:
    """One collective of the whole step (one element of a combined one) and where it is from."""

    name: str  # HLO instruction
    element: int  # element of a combined (tuple) collective; 0 otherwise
    elements: int  # elements of the collective
    kind: str  # "all-reduce", "all-gather", ...
    nbytes: int  # bytes of this element (of the whole collective when it has one)
    axes: tuple[str, ...]  # mesh axes its replica groups span
    group_size: int
    time: float  # seconds: the collective's price, shared among its elements by bytes
    target: Target
    block: int | None  # the block (for a boundary: the consumer's block)
    block_name: str
    source_block: int | None  # for a boundary: the producer's block
    segment: int | None  # segment instance index
    segment_label: str
    op: int | None  # the graph op it was traced to (for a boundary: a consumer)
    source: str  # "file:line (function)" of that op
    op_name: str  # the HLO metadata op name
    reason: str

    def __post_init__(self) -> None:
        if self.target is Target.BLOCK and self.block is None:
            raise ValueError(f"{self.name}[{self.element}]: a block attribution without a block")
        if self.time < 0 or not math.isfinite(self.time):
            raise ValueError(f"{self.name}[{self.element}]: time {self.time} is not a duration")


@dataclass(frozen=True, slots=True)
class BlockShare:
    """The communication one block makes the compiler emit under the plan."""

    block: int
    name: str
    strategy: str
    segment: int
    segment_label: str
    collectives: int  # rows attributed to the block (elements of combined collectives count)
    nbytes: int
    time: float  # seconds, collectives attributed to the block itself
    boundary_time: float  # seconds of resharding into the block from another block


@dataclass(frozen=True, slots=True)
class Attribution:
    """Every collective of a plan's whole step, attributed (see the module doc)."""

    source: str  # the plan's source ("cfp", "dp", ...)
    mesh: str
    platform: str
    t_comm: float  # the whole step's collective seconds, as `evaluate` prices them
    collectives: tuple[AttributedCollective, ...]
    blocks: tuple[BlockShare, ...]

    def __post_init__(self) -> None:
        total = math.fsum(c.time for c in self.collectives)
        if not math.isclose(total, self.t_comm, rel_tol=1e-9, abs_tol=1e-15):
            raise AnalysisError(
                f"attributed collective time {total} s differs from the step's {self.t_comm} s"
            )

    @property
    def unknown(self) -> tuple[AttributedCollective, ...]:
        return tuple(c for c in self.collectives if c.target is Target.UNKNOWN)

    def time_of(self, target: Target) -> float:
        return math.fsum(c.time for c in self.collectives if c.target is target)

    def frame(self) -> pd.DataFrame:
        """One row per collective (element), slowest first, for display."""
        rows = [
            {
                "collective": c.name if c.elements == 1 else f"{c.name}[{c.element}]",
                "kind": c.kind,
                "bytes": c.nbytes,
                "axes": ",".join(c.axes),
                "group": c.group_size,
                "time": c.time,
                "target": c.target.value,
                "block": c.block,
                "block_name": c.block_name,
                "from_block": c.source_block,
                "segment": c.segment_label,
                "source": c.source,
                "op_name": c.op_name,
                "reason": c.reason,
            }
            for c in self.collectives
        ]
        return pd.DataFrame(rows).sort_values("time", ascending=False, kind="stable")

    def block_frame(self) -> pd.DataFrame:
        """One row per block: its strategy and the communication attributed to it."""
        return pd.DataFrame(
            [
                {
                    "block": b.block,
                    "name": b.name,
                    "strategy": b.strategy,
                    "segment": b.segment_label,
                    "collectives": b.collectives,
                    "bytes": b.nbytes,
                    "time": b.time,
                    "boundary_time": b.boundary_time,
                }
                for b in self.blocks
            ]
        )

    def summary(self) -> str:
        parts = ", ".join(
            f"{t.value} {sum(c.target is t for c in self.collectives)} "
            f"({1e6 * self.time_of(t):.1f} us)"
            for t in Target
        )
        return (
            f"{self.source} plan on {self.mesh} ({self.platform}): {len(self.collectives)} "
            f"collectives, {1e6 * self.t_comm:.1f} us: {parts}"
        )
