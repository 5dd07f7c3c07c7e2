"""What two plans of one step choose differently, and what the difference is predicted to cost.

`plan_diff(before, after)` reads the two plan documents only: per block the strategy, per
parameter the layout (FSDP differs from DP only there), per segment instance the profiled
configuration, and the predicted time and memory of each. Plans of another model or mesh
cannot be compared: that is an error, not an empty diff.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from explorer.errors import AnalysisError

if TYPE_CHECKING:
    from explorer.plan import Plan


@dataclass(frozen=True, slots=True)
class BlockChange:
    block: int
    scope: str
    before: str
    after: str


@dataclass(frozen=True, slots=True)
class ParameterChange:
    path: str
    before: tuple[tuple[str, ...], ...]  # mesh axes per dim
    after: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class SegmentChange:
    index: int
    label: str
    before: str  # configuration name
    after: str


@dataclass(frozen=True, slots=True)
class PlanDiff:
    before: str  # the plans' sources
    after: str
    blocks: tuple[BlockChange, ...]
    parameters: tuple[ParameterChange, ...]
    segments: tuple[SegmentChange, ...]
    time_delta: float  # after - before, predicted seconds per step
    memory_delta: int  # after - before, predicted bytes per device

    @property
    def empty(self) -> bool:
        """Whether the two plans make the same choices and the same predictions."""
        return (
            not self.blocks
            and not self.parameters
            and not self.segments
            and self.time_delta == 0
            and self.memory_delta == 0
        )

    def frame(self) -> pd.DataFrame:
        """One row per differing choice: block strategies, parameter layouts, segments."""
        rows: list[dict[str, Any]] = [
            {
                "what": "block",
                "where": f"#{c.block} {c.scope}",
                "before": c.before,
                "after": c.after,
            }
            for c in self.blocks
        ]
        rows += [
            {
                "what": "parameter",
                "where": c.path,
                "before": _spec(c.before),
                "after": _spec(c.after),
            }
            for c in self.parameters
        ]
        rows += [
            {"what": "segment", "where": c.label, "before": c.before, "after": c.after}
            for c in self.segments
        ]
        return pd.DataFrame(rows, columns=["what", "where", "before", "after"])

    def summary(self) -> str:
        return (
            f"{self.before} -> {self.after}: {len(self.blocks)} blocks, {len(self.parameters)} "
            f"parameter layouts, {len(self.segments)} segment configurations differ; time "
            f"{1e3 * self.time_delta:+.4f} ms, memory {self.memory_delta / 2**20:+.2f} MiB"
        )


def plan_diff(before: Plan, after: Plan) -> PlanDiff:
    """The choices `after` makes differently from `before`, and the predicted deltas."""
    for field in ("model_fingerprint", "mesh"):
        x, y = getattr(before, field), getattr(after, field)
        if x != y:
            raise AnalysisError(
                f"plan_diff: the plans differ in field {field!r} ({x!r} and {y!r}): only "
                "plans of one step on one mesh can be compared"
            )
    if len(before.blocks) != len(after.blocks) or len(before.segments) != len(after.segments):
        raise AnalysisError(
            f"plan_diff: the plans have {len(before.blocks)} and {len(after.blocks)} blocks, "
            f"{len(before.segments)} and {len(after.segments)} segment instances"
        )
    blocks = tuple(
        BlockChange(x.index, x.scope, x.strategy, y.strategy)
        for x, y in zip(before.blocks, after.blocks, strict=True)
        if x.strategy != y.strategy
    )
    a, b = before.parameter_layouts, after.parameter_layouts
    parameters = tuple(
        ParameterChange(path, a.get(path, ()), b.get(path, ()))
        for path in sorted(set(a) | set(b))
        if a.get(path) != b.get(path)
    )
    segments = tuple(
        SegmentChange(n, x.label, x.configuration, y.configuration)
        for n, (x, y) in enumerate(zip(before.segments, after.segments, strict=True))
        if x.configuration != y.configuration
    )
    return PlanDiff(
        before=before.source,
        after=after.source,
        blocks=blocks,
        parameters=parameters,
        segments=segments,
        time_delta=after.time - before.time,
        memory_delta=after.memory - before.memory,
    )


def _spec(axes: tuple[tuple[str, ...], ...]) -> str:
    return "(" + ", ".join("+".join(a) if a else "-" for a in axes) + ")"
