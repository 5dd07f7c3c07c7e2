"""Jaxpr details read as plain Python data: params, dtypes, name stacks and source lines."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from jax._src import source_info_util

# Dtype-valued params are kept as their names; anything not plain data (jaxprs, shardings,
# callables) is dropped from the params we expose.
_PLAIN = (int, float, bool, str, type(None))


def dtype_name(dtype: Any) -> str:
    """The dtype as the graph names it: numpy's name, or JAX's for extended dtypes."""
    try:
        return str(np.dtype(dtype))
    except TypeError:
        return str(dtype)  # extended dtypes such as PRNG keys


def _aval_of(var: Any) -> tuple[tuple[int, ...], str]:
    aval = var.aval
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    return shape, dtype_name(getattr(aval, "dtype", "opaque"))


def plain_params(params: dict[str, Any]) -> dict[str, Any]:
    """The params that describe the op's semantics, as plain hashable Python data."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        plain = _to_plain(value)
        if plain is not _DROP:
            out[key] = plain
    return out


_DROP = object()


def _to_plain(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, np.generic) and not isinstance(value, np.void):
        # NumPy scalars (e.g. broadcast dimensions as np.int64) stay numbers: read as a
        # dtype they would become the dtype's name
        return value.item()
    if isinstance(value, (np.dtype, type)) or (hasattr(value, "dtype") and hasattr(value, "kind")):
        try:
            return str(np.dtype(value))
        except TypeError:
            return _DROP
    if isinstance(value, (tuple, list)):
        items = tuple(_to_plain(v) for v in value)
        return _DROP if any(i is _DROP for i in items) else items
    if hasattr(value, "name") and type(value).__module__.startswith(("jax", "enum")):
        return str(value.name)  # enums such as GatherScatterMode, RoundingMethod
    if hasattr(value, "_asdict"):  # NamedTuple dimension numbers
        return _to_plain(tuple(value))
    try:
        return str(np.dtype(value))
    except TypeError:
        return _DROP


def _strip_transforms(component: str) -> str:
    while True:
        m = re.fullmatch(r"\w+\((.*)\)", component)
        if not m:
            return component
        component = m.group(1)


# Name-stack components JAX adds for rematerialisation: the recomputed forward ops of a
# `jax.checkpoint` / `nn.remat` body sit under them, in the scope of the ops they recompute.
_REMAT_COMPONENTS = frozenset({"rematted_computation", "checkpoint", "remat"})
# the one of them JAX gives the forward ops a `jax.checkpoint` body runs again
REMAT_MARK = "rematted_computation"


def scope_of(name_stack: str) -> str:
    """The user's scope path with autodiff/vmap wrappers removed: `transpose(jvp(a))/b` -> `a/b`.

    A transposed equation's stack repeats the scope it transposes
    (`transpose(jvp(Model))/jvp(Model)/layer_0`), and recomputed ops of a remat body add
    `rematted_computation`: both collapse, so forward, recomputed and backward ops of one
    layer share one scope.
    """
    parts: list[str] = []
    previous_wrapped = False
    for component in name_stack.split("/"):
        stripped = _strip_transforms(component)
        wrapped = stripped != component
        if not stripped or stripped in _REMAT_COMPONENTS:
            continue
        if parts and parts[-1] == stripped and (wrapped or previous_wrapped):
            previous_wrapped = True
            continue
        parts.append(stripped)
        previous_wrapped = wrapped
    return "/".join(parts)


def is_transposed(name_stack: str) -> bool:
    """True for equations produced by transposition (the backward pass of `jax.grad`)."""
    return "transpose(" in name_stack


def remat_region(name_stack: str) -> str | None:
    """The `jax.checkpoint` recomputation an equation belongs to, named by its name stack up
    to JAX's `rematted_computation` mark (one per rematerialised call); None outside one."""
    parts = name_stack.split("/")
    if REMAT_MARK not in parts:
        return None
    return "/".join(parts[: parts.index(REMAT_MARK) + 1])


def is_rematerialised(name_stack: str) -> bool:
    """True for the forward ops a `jax.checkpoint` body runs again for the backward pass."""
    return remat_region(name_stack) is not None


def is_linearized(name_stack: str) -> bool:
    return "jvp(" in name_stack


def _join_stack(outer: str, inner: str) -> str:
    return "/".join(s for s in (outer, inner) if s)


def user_location(source_info: Any) -> str:
    """`file:line (function)` of the innermost user frame, or '<unknown>'."""
    frame = source_info_util.user_frame(source_info.traceback)
    if frame is None:
        return "<unknown>"
    return f"{frame.file_name}:{frame.start_line} ({frame.function_name})"
