"""Alpa-style costs: alpha-beta communication formulas and the alpha and beta of each mesh axis.

**Costs** (step 2 of the method in `explorer.alpa`). Communication only (compute is ignored, as
in Alpa), per mesh axis, from alpha-beta formulas (`all_reduce_cost` ...). Node costs are the
collectives an op's own strategy implies; edge costs are the resharding from the layout a
producer leaves a value in to the layout its consumer wants (all-gather an axis the consumer
does not split, all-to-all an axis it splits on another dim, free slicing otherwise: see
`ops.OpModel.reshard`). Alpha and beta come from the platform file (latency and 1 / bus
bandwidth of the level an axis spans), or Alpa's defaults `mesh_alpha=(1, 1)`,
`mesh_beta=(1, 0.1)` (abstract units).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from explorer.errors import AlpaError
from explorer.mesh import MeshSpec

if TYPE_CHECKING:
    from explorer.platforms import Platform

Kind = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all"]
KINDS: tuple[Kind, ...] = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")

# Alpa's defaults for a logical mesh (inter-host axis, intra-host axis): see
# alpa/device_mesh.py `get_logical_mesh(mesh_alpha=[1, 1], mesh_beta=[1, 0.1])`.
ALPA_MESH_ALPHA = (1.0, 1.0)
ALPA_MESH_BETA = (1.0, 0.1)


# -- alpha-beta formulas -------------------------------------------------------------------------


def all_reduce_cost(alpha: float, beta: float, n: int, nbytes: float) -> float:
    """`alpha + 2 beta (n-1)/n bytes` (ring all-reduce of a `nbytes` buffer over n devices)."""
    return 0.0 if n <= 1 else alpha + 2 * beta * (n - 1) / n * nbytes


def all_gather_cost(alpha: float, beta: float, n: int, nbytes: float) -> float:
    """`alpha + beta (n-1)/n bytes`, `nbytes` the gathered result."""
    return 0.0 if n <= 1 else alpha + beta * (n - 1) / n * nbytes


def reduce_scatter_cost(alpha: float, beta: float, n: int, nbytes: float) -> float:
    """`alpha + beta (n-1)/n bytes`, `nbytes` the buffer before scattering."""
    return 0.0 if n <= 1 else alpha + beta * (n - 1) / n * nbytes


def all_to_all_cost(alpha: float, beta: float, n: int, nbytes: float) -> float:
    """`alpha + beta (n-1)/n^2 bytes (n/2)`: Alpa's all-to-all with its penalty factor n/2."""
    return 0.0 if n <= 1 else alpha + beta * (n - 1) / n**2 * nbytes * (n / 2)


_FORMULAS = {
    "all-reduce": all_reduce_cost,
    "all-gather": all_gather_cost,
    "reduce-scatter": reduce_scatter_cost,
    "all-to-all": all_to_all_cost,
}


@dataclass(frozen=True, slots=True)
class AxisComm:
    """Alpha (seconds or units per collective) and beta (per byte) of one mesh axis."""

    name: str
    size: int
    alpha: tuple[float, float, float, float]  # per KINDS
    beta: tuple[float, float, float, float]

    def cost(self, kind: Kind, nbytes: float) -> float:
        index = KINDS.index(kind)
        return _FORMULAS[kind](self.alpha[index], self.beta[index], self.size, nbytes)


@dataclass(frozen=True, slots=True)
class CommModel:
    axes: tuple[AxisComm, ...]
    units: str  # "seconds" (platform) or "alpa" (Alpa's default alpha/beta)

    def axis(self, name: str) -> AxisComm:
        for axis in self.axes:
            if axis.name == name:
                return axis
        raise KeyError(name)

    def cost(self, kind: Kind, axis: str, nbytes: float) -> float:
        return self.axis(axis).cost(kind, nbytes)


def comm_model(mesh: MeshSpec, platform: Platform | None, *, defaults: bool = False) -> CommModel:
    """Per-axis alpha and beta: from `platform`, or Alpa's defaults when `defaults`.

    Alpa's two values are (inter-host, intra-host); a mesh's axes are aligned on the right, so
    a 1-D mesh is Alpa's single-host logical mesh (alpha 1, beta 0.1), and extra outer axes of
    a 3-D or 4-D mesh take the inter-host values. With a platform, an axis whose device group
    stays inside a node uses the intra-node link figures, else the inter-node ones.
    """
    axes = []
    if defaults:
        count = len(mesh.axes)
        for position, (name, size) in enumerate(mesh.axes):
            index = max(0, len(ALPA_MESH_ALPHA) - count + position)
            a, b = ALPA_MESH_ALPHA[index], ALPA_MESH_BETA[index]
            axes.append(AxisComm(name, size, (a, a, a, a), (b, b, b, b)))
        return CommModel(tuple(axes), "alpa")
    if platform is None:
        raise AlpaError(
            "expected a platform to price collectives in seconds, found None; pass a platform "
            "name such as 'a100-pcie-8', or defaults=True for Alpa's mesh_alpha/mesh_beta"
        )
    for name, size in mesh.axes:
        group = platform.group_devices([name], mesh) if size > 1 else [0]
        nodes = {d // platform.devices_per_node for d in group}
        level = platform.inter if len(nodes) > 1 and platform.inter is not None else platform.intra
        alpha = _per_kind([level[kind].latency_s for kind in KINDS])
        beta = _per_kind([1.0 / level[kind].bandwidth_Bps for kind in KINDS])
        axes.append(AxisComm(name, size, alpha, beta))
    return CommModel(tuple(axes), "seconds")


def _per_kind(values: Sequence[float]) -> tuple[float, float, float, float]:
    return (values[0], values[1], values[2], values[3])


def _platform(platform: Any, defaults: bool) -> Platform | None:
    if defaults or platform is None:
        return None
    from explorer.platforms import Platform, load_platform

    return platform if isinstance(platform, Platform) else load_platform(platform)
