"""Mesh shapes, axis names and PartitionSpec helpers.

A mesh is given by the user as a shape tuple (`(4,)`, `(2, 4)`: default axis names `x`, `y`,
`z`, outermost first) or as a dict of axis name to size. `MeshSpec` is the normalised form
every stage receives; a `jax.sharding.Mesh` is made from it only where devices are needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from explorer.errors import MeshError
from explorer.ir import DimAxes

DEFAULT_AXIS_NAMES = ("x", "y", "z", "w")


@dataclass(frozen=True, slots=True)
class MeshSpec:
    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise MeshError("expected a mesh with at least one axis, found none")
        names = [name for name, _ in self.axes]
        if len(set(names)) != len(names):
            raise MeshError(f"mesh axis names must be distinct, found {names}")
        for name, size in self.axes:
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise MeshError(f"mesh axis {name!r}: expected a positive int size, found {size!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def axis_size(self, name: str) -> int:
        return dict(self.axes)[name]

    def axes_size(self, names: Sequence[str]) -> int:
        return math.prod(self.axis_size(n) for n in names)

    def __str__(self) -> str:
        return "x".join(str(s) for s in self.shape) + f" ({', '.join(self.names)})"


def mesh_spec(mesh: Any) -> MeshSpec:
    """Normalise a user mesh: `(4,)`, `(2, 4)`, `4`, `"2x4"`, `{"data": 2, "model": 4}`."""
    if isinstance(mesh, MeshSpec):
        return mesh
    if isinstance(mesh, Mesh):
        return MeshSpec(tuple((str(n), int(s)) for n, s in mesh.shape.items()))
    if isinstance(mesh, str):
        try:
            mesh = tuple(int(part) for part in mesh.lower().split("x"))
        except ValueError:
            raise MeshError(f"expected a mesh like '4' or '2x4', found {mesh!r}") from None
    if isinstance(mesh, int) and not isinstance(mesh, bool):
        mesh = (mesh,)
    if isinstance(mesh, Mapping):
        return MeshSpec(tuple((str(k), v) for k, v in mesh.items()))
    if isinstance(mesh, (tuple, list)):
        if len(mesh) > len(DEFAULT_AXIS_NAMES):
            raise MeshError(
                f"expected at most {len(DEFAULT_AXIS_NAMES)} mesh axes, found {len(mesh)}"
            )
        return MeshSpec(tuple(zip(DEFAULT_AXIS_NAMES, mesh, strict=False)))
    raise MeshError(
        f"expected a mesh shape tuple such as (2, 4) or a dict of axis name to size, "
        f"found {type(mesh).__name__} {mesh!r}"
    )


def make_mesh(spec: MeshSpec, devices: Sequence[Any] | None = None) -> Mesh:
    """A jax Mesh over the first `spec.size` devices (all of them must exist)."""
    available = list(devices) if devices is not None else jax.devices()
    if len(available) < spec.size:
        raise MeshError(
            f"mesh {spec} needs {spec.size} devices, but JAX sees {len(available)} "
            f"({available[0].platform if available else 'none'}). On CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={spec.size} before importing "
            "JAX, or join more processes with jax.distributed."
        )
    grid = np.array(available[: spec.size], dtype=object).reshape(spec.shape)
    return Mesh(grid, spec.names)


def partition_spec(dims: DimAxes) -> PartitionSpec:
    entries: list[Any] = []
    for axes in dims:
        if not axes:
            entries.append(None)
        elif len(axes) == 1:
            entries.append(axes[0])
        else:
            entries.append(tuple(axes))
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def named_sharding(mesh: Mesh, dims: DimAxes) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(dims))


def spec_to_json(dims: DimAxes) -> list[list[str] | None]:
    return [list(a) if a else None for a in dims]
