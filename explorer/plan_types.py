"""The plan as typed, immutable facts: what the solver chose and what it predicted.

A `Plan` holds the mesh, the platform it was priced on, the backend, the model's
fingerprint, one `InstanceChoice` per segment instance, one `BlockChoice` per block (its
strategy and the `PartitionSpec` of every value it owns), a `PartitionSpec` per parameter and
the `Prediction`. A per-op plan (the Alpa-style ILP) also carries a `PartitionSpec` for every
value (`values`) and for what each contraction reads (`operands`), and the `IlpReport`; when
`values` is present it, not the block strategies, is what applies.

Layouts are `DimAxes` (per dim the mesh axes splitting it, `()` replicated), kept in tuples of
(key, layout) pairs sorted by key: two plans with the same choices compare equal whichever
way they were built. The JSON form lives in `explorer.plan_document`, alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import PlanError
from explorer.ir import DimAxes
from explorer.mesh import MeshSpec

if TYPE_CHECKING:
    from explorer.platforms import Platform


def _check_sorted(keys: Sequence[Any], what: str) -> None:
    """Strictly increasing: sorted, and no key twice."""
    for before, after in itertools.pairwise(keys):
        if not before < after:
            raise ValueError(
                f"{what}: expected keys sorted and unique, found {before!r} then {after!r}"
            )


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the cost model predicted for the plan."""

    time: float  # seconds per training step
    memory: int  # peak bytes per device
    memory_eq9: int  # peak bytes per device by the paper's Eq. 9
    budget: float | None  # the memory budget it was solved under; None: the fastest plan

    def __post_init__(self) -> None:
        if self.time < 0 or self.memory < 0 or self.memory_eq9 < 0:
            raise ValueError(f"a prediction is never negative, found {self}")


@dataclass(frozen=True, slots=True)
class InstanceChoice:
    """The configuration of one segment instance, and its predicted cost. `saved_memory` and
    `gradient_memory` are None where the plan does not record them (older plans)."""

    label: str
    type: int  # the instance's segment type (its unique id)
    configuration: str
    time: float
    persistent_memory: int
    transient_memory: int
    saved_memory: int | None = None
    gradient_memory: int | None = None


@dataclass(frozen=True, slots=True)
class BlockChoice:
    """The strategy of one ParallelBlock and the `PartitionSpec` of each value it owns."""

    index: int
    scope: str
    head: str  # the head contraction, e.g. "float32[8,32,64] x float32[64,192]"
    strategy: str
    values: tuple[tuple[int, DimAxes], ...]  # (value id, layout), by value id

    def __post_init__(self) -> None:
        _check_sorted([vid for vid, _ in self.values], f"block {self.index} values")

    def layout_of(self, value: int) -> DimAxes | None:
        """The layout the block gives `value`; None if the block does not own it."""
        return dict(self.values).get(value)


@dataclass(frozen=True, slots=True)
class IlpReport:
    """The ILP that made a per-op plan (Alpa-style baseline)."""

    objective: float
    units: str
    status: str
    solve_seconds: float
    variables: int
    constraints: int
    integer_variables: int | None = None
    memory: int | None = None  # peak bytes per device in the ILP's liveness model


# The cap of a plan that records none: every plan was cut under it before caps were recorded,
# so a plan records its cap only where the cut differs from this one's (`plan_space.cut_cap`),
# whatever `analyze`'s default cap (`segments.DEFAULT_CONFIG_CAP`) is now.
UNRECORDED_CAP = 256


@dataclass(frozen=True, slots=True)
class SpaceOptions:
    """What `analyze` searched beyond the paper's space (the 2-D widenings `free_axes`,
    `whole_mesh`, `batch_outer` and `batch_inner`, ZeRO twins, scattering twins, K on the
    last contracted dim) and the configuration cap naming its cut: with the step, what
    decides a block plan's strategies and where its segment boundaries fall."""

    free_axes: bool = False
    whole_mesh: bool = False
    shard_parameters: bool = False
    # the cap its cut is named by: the one searched under, or UNRECORDED_CAP where that
    # cuts the step alike (`plan_space.cut_cap`)
    config_cap: int = UNRECORDED_CAP
    batch_outer: bool = False  # appended: a recorded space's fields keep their order
    sequence_parallel: bool = False
    batch_inner: bool = False
    contract_last: bool = False  # K on a head's last contracted dim that splits evenly


PAPER_SPACE = SpaceOptions()  # the paper's space, cut as a plan recording no cap is


@dataclass(frozen=True, slots=True)
class Versions:
    """The versions of the explorer and JAX that wrote the plan."""

    explorer: str
    jax: str


@dataclass(frozen=True, slots=True)
class Plan:
    """A plan (see assets/plan.schema.json for its JSON form).

    `platform_name` is the name of the platform the plan was priced on; `priced_on` is that
    platform in full, None for a plan written before platforms were recorded in full (it
    names a preset only: `platform` resolves it)."""

    source: str  # cfp, or the baseline that made the plan
    mesh: MeshSpec
    platform_name: str
    priced_on: Platform | None
    backend: str  # "compiled" or "measured"
    model_fingerprint: str
    segments: tuple[InstanceChoice, ...]
    blocks: tuple[BlockChoice, ...]
    parameters: tuple[tuple[str, DimAxes], ...]  # (parameter path, layout), by path
    predicted: Prediction
    versions: Versions
    # per-op plans only: (value id, layout) and ((op id, operand position), layout), by key
    values: tuple[tuple[int, DimAxes], ...] | None = None
    operands: tuple[tuple[tuple[int, int], DimAxes], ...] | None = None
    ilp: IlpReport | None = None
    # the boundary rules that changed how this plan's segments are placed in its whole step
    # (`space.changed_boundary_rules`): part of what decides its compiled program
    boundary_rules: tuple[str, ...] = ()
    # the space the plan was made in, where its strategy names alone do not tell it
    # (`plan_space.recorded_space`); None: the first space offering every name it has
    # (`plan_space.candidate_spaces`), under the default cap
    space: SpaceOptions | None = None

    def __post_init__(self) -> None:
        _check_sorted([path for path, _ in self.parameters], "parameters")
        if self.values is not None:
            _check_sorted([vid for vid, _ in self.values], "values")
        if self.operands is not None:
            _check_sorted([key for key, _ in self.operands], "operands")
        if self.priced_on is not None and self.priced_on.name != self.platform_name:
            raise ValueError(
                f"platform_name {self.platform_name!r} is not the name of the platform the "
                f"plan was priced on, {self.priced_on.name!r}"
            )

    @property
    def time(self) -> float:
        """Predicted seconds per training step."""
        return float(self.predicted.time)

    @property
    def memory(self) -> int:
        """Predicted peak bytes per device."""
        return int(self.predicted.memory)

    @property
    def per_op(self) -> bool:
        """A per-op plan: its `values` layouts apply, not its block strategies."""
        return self.values is not None

    @property
    def platform(self) -> Platform:
        """The platform the plan was priced on, as the plan records it: a scaled or
        calibrated platform too. A plan written before platforms were recorded in full names
        a preset only; a name that is no preset is an error, never a file read."""
        from explorer.platforms import list_platforms, load_platform

        if self.priced_on is not None:
            return self.priced_on
        if self.platform_name not in list_platforms():
            raise PlanError(
                f"field 'platform_spec': expected the platform the plan was priced on, found "
                f"it missing and 'platform' {self.platform_name!r}, which is no preset "
                f"({list_platforms()}); re-export the plan with this explorer"
            )
        return load_platform(self.platform_name)

    @property
    def strategies(self) -> tuple[str, ...]:
        return tuple(block.strategy for block in self.blocks)

    @property
    def parameter_layouts(self) -> dict[str, DimAxes]:
        """The layout of every parameter, by path."""
        return dict(self.parameters)

    def save(self, path: str | Path) -> Path:
        """Write the plan as a validated JSON file; returns the path written."""
        from explorer.plan_document import save_plan

        return save_plan(self, path)

    def to_json(self) -> str:
        """The plan as validated JSON text."""
        from explorer.plan_document import plan_json_text

        return plan_json_text(self)

    def summary(self) -> str:
        return (
            f"{self.source} plan on mesh {self.mesh} ({self.platform_name}, "
            f"{self.backend}): {1e3 * self.time:.3f} ms/step, "
            f"{self.memory / 2**30:.3f} GiB/device"
        )
