"""Mesh shapes, axis names and PartitionSpec helpers.

A mesh is given by the user as a shape tuple (`(4,)`, `(2, 4)`: default axis names `x`, `y`,
`z`, outermost first) or as a dict of axis name to size: `MeshLike` names every accepted form.
`MeshSpec` is the normalised form every stage receives; a `jax.sharding.Mesh` is made from it
only where devices are needed. Axis names are ASCII identifiers: XLA aborts the whole process
on some other names, so they are refused here, where they enter.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from explorer.errors import MeshError
from explorer.ir import DimAxes

DEFAULT_AXIS_NAMES = ("x", "y", "z", "w")
ACCEPTED = (
    "a shape such as 4, (2, 4) or '2x4' (axes named x, y, z, w), a dict of axis name to size "
    "such as {'data': 2, 'model': 4}, or a jax.sharding.Mesh"
)


@dataclass(frozen=True, slots=True)
class MeshSpec:
    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise MeshError("mesh: expected at least one axis, found none")
        names = [name for name, _ in self.axes]
        for name in names:
            if not (isinstance(name, str) and name.isascii() and name.isidentifier()):
                raise MeshError(
                    "mesh axis name: expected an ASCII identifier such as 'data' or 'model' "
                    f"(letters, digits and _, not starting with a digit), found {name!r}"
                )
        if len(set(names)) != len(names):
            raise MeshError(f"mesh axis names: expected distinct names, found {names}")
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


# What users may pass as a mesh: `4`, `"2x4"`, `(2, 4)`, `{"data": 2, "model": 4}`, a
# `jax.sharding.Mesh` or a `MeshSpec` (see `ACCEPTED`).
MeshLike: TypeAlias = int | str | Sequence[int] | Mapping[str, int] | Mesh | MeshSpec


def mesh_spec(mesh: MeshLike) -> MeshSpec:
    """Normalise a user mesh: `(4,)`, `(2, 4)`, `4`, `"2x4"`, `{"data": 2, "model": 4}`."""
    if isinstance(mesh, MeshSpec):
        return mesh
    if isinstance(mesh, Mesh):
        return MeshSpec(tuple((str(n), int(s)) for n, s in mesh.shape.items()))
    shape: Any = mesh
    if isinstance(mesh, str):
        try:
            shape = tuple(int(part) for part in mesh.lower().split("x"))
        except ValueError:
            raise MeshError(f"mesh: expected {ACCEPTED}, found {mesh!r}") from None
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if isinstance(shape, Mapping):
        return MeshSpec(tuple((k, _size(v, k)) for k, v in shape.items()))
    if isinstance(shape, (tuple, list)):
        if len(shape) > len(DEFAULT_AXIS_NAMES):
            raise MeshError(
                f"mesh: expected at most {len(DEFAULT_AXIS_NAMES)} axes (or a dict naming "
                f"them), found {len(shape)} in {mesh!r}"
            )
        names = DEFAULT_AXIS_NAMES[: len(shape)]
        return MeshSpec(tuple((n, _size(v, n)) for n, v in zip(names, shape, strict=True)))
    raise MeshError(f"mesh: expected {ACCEPTED}, found {type(mesh).__name__} {mesh!r}")


def _size(value: Any, axis: object) -> Any:
    """An axis size as a Python int where it is an integer (numpy's included); anything else
    is passed on for `MeshSpec` to refuse, naming the axis."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def require_devices(spec: MeshSpec) -> None:
    """A `MeshError` unless JAX sees at least the mesh's devices (checked before tracing,
    so a run that could never place its programs stops at once)."""
    found = jax.device_count()
    if found < spec.size:
        raise MeshError(
            f"mesh {spec}: expected at most the {found} devices JAX sees "
            f"({jax.default_backend()}), found a mesh of {spec.size}. On CPU, set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={spec.size} before importing JAX, or join "
            "more processes with jax.distributed; or use a smaller mesh."
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
