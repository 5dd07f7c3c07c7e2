"""What a profiling run hands on: one typed record per program read for this run.

`profile_all` returns `Profiles`; the cost model, the accuracy checks and the cluster run read
its typed fields. `Profiles.frame()` is the display view (the table the UI, the benches and
the tests show), one row per record in the order the run read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

from explorer.profile.cache_record import Status

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["COLUMNS", "Profile", "Profiles", "ReshardProfile", "SegmentProfile"]

# per combining group ("kind@axes/size"): combinable elements and that group's latency
Combined = tuple[str, int, float]

COLUMNS = [
    "kind", "segment", "label", "config", "choices", "t_comm", "t_comp", "t_total", "memory",
    "persistent_memory", "transient_memory", "saved_memory", "gradient_memory",
    "constant_memory", "status",
    "reason", "collectives", "cached", "seconds", "context", "combined", "program",
]  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class _Priced:
    """What pricing one program (or failing to) gave, for the platform of the run."""

    label: str
    config: str  # the configuration's name, e.g. "M@x,N@x" or "M@x->N@x"
    t_comm: float  # seconds, less the latency of its combinable collectives (`combined`)
    t_comp: float  # seconds
    memory: int  # the program's own peak, bytes per device (Eq. 9 term)
    persistent_memory: int  # bytes held the whole step (`profile.accounting.HeldMemory`)
    transient_memory: int  # while it runs
    saved_memory: int  # from its forward part to its backward part
    gradient_memory: int  # from its backward part to another instance's optimizer
    constant_memory: int  # made from constants alone, once per segment type
    status: Status
    reason: str  # why infeasible; "" if ok
    collectives: str  # JSON text listing the collectives, as the cache keeps it
    cached: bool  # read from the cache rather than priced by this run
    seconds: float  # how long profiling it took
    combined: tuple[Combined, ...]
    program: str  # the compiled program's cache key; "" where nothing moves (no program)

    def __post_init__(self) -> None:
        if self.status not in get_args(Status):
            raise ValueError(
                f"a profile's status must be one of {list(get_args(Status))}, found "
                f"{self.status!r} for {self.label!r} {self.config!r}"
            )

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def t_total(self) -> float:
        return self.t_comm + self.t_comp

    def _row(
        self, kind: str, segment: Any, choices: tuple[int, ...], context: Any
    ) -> dict[str, Any]:
        return {
            "kind": kind,
            "segment": segment,
            "label": self.label,
            "config": self.config,
            "choices": choices,
            "t_comm": self.t_comm,
            "t_comp": self.t_comp,
            "t_total": self.t_total,
            "memory": self.memory,
            "persistent_memory": self.persistent_memory,
            "transient_memory": self.transient_memory,
            "saved_memory": self.saved_memory,
            "gradient_memory": self.gradient_memory,
            "constant_memory": self.constant_memory,
            "status": self.status,
            "reason": self.reason,
            "collectives": self.collectives,
            "cached": self.cached,
            "seconds": self.seconds,
            "context": context,
            "combined": self.combined,
            "program": self.program,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentProfile(_Priced):
    """One configuration of a unique segment type, priced at the type's first instance."""

    segment: int  # the unique type's id
    choices: tuple[int, ...]  # strategy index per block of the instance
    # strategies of the blocks of other instances the program depends on (see
    # `layouts.external_blocks`), in the order of the type's first instance's dependencies
    context: tuple[int, ...] = ()

    def row(self) -> dict[str, Any]:
        return self._row("segment", self.segment, self.choices, self.context)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReshardProfile(_Priced):
    """The resharding between two consecutive types, by the strategy of the last block
    before and of the first block after."""

    before: int  # unique type id before the boundary
    after: int  # and after it
    last: int  # strategy of the last block before
    first: int  # strategy of the first block after

    def row(self) -> dict[str, Any]:
        return self._row("reshard", (self.before, self.after), (self.last, self.first), ())


Profile = SegmentProfile | ReshardProfile


@dataclass(frozen=True, slots=True)
class Profiles:
    """Every program of a profiling run, in the order it read them (the cost model numbers a
    type's options in this order)."""

    entries: tuple[Profile, ...]

    @property
    def segments(self) -> tuple[SegmentProfile, ...]:
        return tuple(p for p in self.entries if isinstance(p, SegmentProfile))

    @property
    def reshards(self) -> tuple[ReshardProfile, ...]:
        return tuple(p for p in self.entries if isinstance(p, ReshardProfile))

    @property
    def programs(self) -> int:
        """How many programs the profiles were priced from: boundaries that move the same
        tensors share one, and a boundary where nothing moves has none."""
        return len({p.program for p in self.entries if p.program})

    def __len__(self) -> int:
        return len(self.entries)

    def frame(self) -> pd.DataFrame:
        """The display view: one row per profile, columns `COLUMNS`."""
        import pandas as pd

        return pd.DataFrame([p.row() for p in self.entries], columns=COLUMNS)
