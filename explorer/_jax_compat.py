"""The only module that touches jaxpr internals.

JAX's public API gives us `jax.make_jaxpr`, but reading the equations (primitives, params,
variables, name stacks, source lines) needs `jax._src` objects whose names move between
releases. Everything version-dependent is funnelled through here, and the rest of the package
sees plain Python data: `FlatProgram` of `FlatEqn`s over integer value ids.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax._src import core as jax_core
from jax._src import source_info_util

from explorer.errors import (
    CONTROL_FLOW_HINT,
    GENERIC_HINT,
    UnsupportedPrimitiveError,
)

# Primitives whose body is a jaxpr we can splice into the parent: they add no semantics
# beyond "call this function" for the purpose of sharding analysis. `remat2` loses its
# rematerialisation policy when inlined, which only matters for memory estimates of
# checkpointed models.
_INLINE_PARAM = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
}

_CONTROL_FLOW = {"scan", "while", "cond", "switch", "fori_loop"}

# Primitives that run a body we cannot flatten into the parent graph. Other primitives may
# carry a jaxpr as a parameter too (scatter's update computation, generic reduce), and those
# are ordinary ops.
_OPAQUE_BODIES = {
    "custom_linear_solve",
    "custom_transpose_call",
    "shard_map",
    "xla_pmap",
    "xla_call",
    "pure_callback",
    "io_callback",
    "linear_call",
}

JAX_VERSION = jax.__version__

# Dtype-valued params are kept as their names; anything not plain data (jaxprs, shardings,
# callables) is dropped from the params we expose.
_PLAIN = (int, float, bool, str, type(None))


@dataclass(frozen=True, slots=True)
class FlatEqn:
    """One primitive application with its operands renamed to integer value ids.

    `invars` entries are value ids; literals and closed-over constants are values too (their
    content sits in `FlatProgram.constants`).
    """

    primitive: Any  # jax Primitive, kept to re-bind the op when realising a sharded program
    params: dict[str, Any]
    invars: tuple[int, ...]
    outvars: tuple[int, ...]
    name_stack: str
    source: str
    source_line: str


@dataclass(frozen=True, slots=True)
class FlatProgram:
    """An inlined jaxpr: equations in topological order over integer value ids."""

    eqns: tuple[FlatEqn, ...]
    invars: tuple[int, ...]
    outvars: tuple[int, ...]
    avals: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype name) per value id
    constants: dict[int, Any]  # value id -> concrete constant (literals, closed-over consts)
    dtypes: tuple[Any, ...] = ()  # the dtype objects themselves (PRNG key types included)

    def subprogram(self, eqn_indices: Sequence[int]) -> FlatProgram:
        """The equations at `eqn_indices` as a program of their own.

        Inputs: every value they read but do not make (constants excluded); outputs: every
        value they make that an equation outside the selection, or the whole program, reads.
        """
        chosen = sorted(set(eqn_indices))
        inside = set(chosen)
        made: set[int] = set()
        inputs: list[int] = []
        for index in chosen:
            for vid in self.eqns[index].invars:
                if vid not in made and vid not in self.constants and vid not in inputs:
                    inputs.append(vid)
            made.update(self.eqns[index].outvars)
        read_outside = set(self.outvars)
        for index, eqn in enumerate(self.eqns):
            if index not in inside:
                read_outside.update(v for v in eqn.invars if v in made)
        outputs = [v for i in chosen for v in self.eqns[i].outvars if v in read_outside]
        return FlatProgram(
            eqns=tuple(self.eqns[i] for i in chosen),
            invars=tuple(inputs),
            outvars=tuple(dict.fromkeys(outputs)),
            avals=self.avals,
            constants=self.constants,
            dtypes=self.dtypes,
        )

    def abstract(self, vid: int, sharding: Any = None) -> Any:
        shape, _ = self.avals[vid]
        return jax.ShapeDtypeStruct(shape, self.dtypes[vid], sharding=sharding)


def make_jaxpr(fn: Callable[..., Any], *args: Any) -> Any:
    """`jax.make_jaxpr` with the tree of outputs; split out so trace.py can wrap errors."""
    return jax.make_jaxpr(fn, return_shape=True)(*args)


def _dtype_name(dtype: Any) -> str:
    try:
        return str(np.dtype(dtype))
    except TypeError:
        return str(dtype)  # extended dtypes such as PRNG keys


def _aval_of(var: Any) -> tuple[tuple[int, ...], str]:
    aval = var.aval
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    return shape, _dtype_name(getattr(aval, "dtype", "opaque"))


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


def is_linearized(name_stack: str) -> bool:
    return "jvp(" in name_stack


def _join_stack(outer: str, inner: str) -> str:
    return "/".join(s for s in (outer, inner) if s)


def flatten(closed_jaxpr: Any) -> FlatProgram:
    """Inline every call-like primitive of `closed_jaxpr` into one flat list of equations.

    Raises UnsupportedPrimitiveError for control flow and for any other primitive that carries
    a sub-jaxpr we do not know how to splice.
    """
    ids: dict[Any, int] = {}
    avals: list[tuple[tuple[int, ...], str]] = []
    dtypes: list[Any] = []
    constants: dict[int, Any] = {}
    eqns: list[FlatEqn] = []

    def new_value(var: Any) -> int:
        avals.append(_aval_of(var))
        dtypes.append(getattr(var.aval, "dtype", None))
        return len(avals) - 1

    def bind_var(var: Any) -> int:
        vid = new_value(var)
        ids[var] = vid
        return vid

    def read(var: Any, env: dict[Any, int]) -> int:
        if isinstance(var, jax_core.Literal):
            vid = new_value(var)
            constants[vid] = var.val
            return vid
        return env[var]

    def inline(jaxpr: Any, consts: Sequence[Any], args: Sequence[int], stack: str) -> list[int]:
        env: dict[Any, int] = {}
        for var, const in zip(jaxpr.constvars, consts, strict=True):
            vid = new_value(var)
            constants[vid] = const
            env[var] = vid
        for var, vid in zip(jaxpr.invars, args, strict=True):
            env[var] = vid
        for eqn in jaxpr.eqns:
            eqn_stack = _join_stack(stack, str(eqn.source_info.name_stack))
            name = eqn.primitive.name
            operands = [read(v, env) for v in eqn.invars]
            sub = _sub_jaxpr(eqn)
            if name in _INLINE_PARAM and sub is not None:
                sub_jaxpr, sub_consts = sub
                results = inline(sub_jaxpr, sub_consts, operands, eqn_stack)
                for var, vid in zip(eqn.outvars, results, strict=True):
                    env[var] = vid
                continue
            if name in _CONTROL_FLOW or name in _OPAQUE_BODIES:
                hint = CONTROL_FLOW_HINT if name in _CONTROL_FLOW else GENERIC_HINT
                raise UnsupportedPrimitiveError(name, user_location(eqn.source_info), hint)
            outs = []
            for var in eqn.outvars:
                vid = new_value(var)
                if not isinstance(var, jax_core.DropVar):
                    env[var] = vid
                outs.append(vid)
            eqns.append(
                FlatEqn(
                    primitive=eqn.primitive,
                    params=dict(eqn.params),
                    invars=tuple(operands),
                    outvars=tuple(outs),
                    name_stack=eqn_stack,
                    source=source_info_util.summarize(eqn.source_info),
                    source_line=user_location(eqn.source_info),
                )
            )
        return [read(v, env) for v in jaxpr.outvars]

    jaxpr = closed_jaxpr.jaxpr
    top_env_args = [bind_var(v) for v in jaxpr.invars]
    outvars = inline(jaxpr, closed_jaxpr.consts, top_env_args, "")
    return FlatProgram(
        eqns=tuple(eqns),
        invars=tuple(top_env_args),
        outvars=tuple(outvars),
        avals=tuple(avals),
        constants=constants,
        dtypes=tuple(dtypes),
    )


def _sub_jaxpr(eqn: Any) -> tuple[Any, Sequence[Any]] | None:
    """The (jaxpr, consts) an equation calls, if it carries exactly one we could inline."""
    key = _INLINE_PARAM.get(eqn.primitive.name)
    candidates = [eqn.params[key]] if key and key in eqn.params else list(eqn.params.values())
    for value in candidates:
        if isinstance(value, jax_core.ClosedJaxpr):
            return value.jaxpr, value.consts
        if isinstance(value, jax_core.Jaxpr):
            return value, ()
    return None


def user_location(source_info: Any) -> str:
    """`file:line (function)` of the innermost user frame, or '<unknown>'."""
    frame = source_info_util.user_frame(source_info.traceback)
    if frame is None:
        return "<unknown>"
    return f"{frame.file_name}:{frame.start_line} ({frame.function_name})"


def evaluate(
    program: FlatProgram,
    args: Sequence[Any],
    on_value: Callable[[int, Any], Any] | None = None,
    on_operand: Callable[[int, int, Any], Any] | None = None,
) -> list[Any]:
    """Re-execute a flat program by binding each primitive in order.

    `on_value(value_id, array)` may return a replacement for an op result (e.g. the array
    with a sharding constraint); `on_operand(eqn_index, position, array)` may replace what one
    op reads without changing what other readers see.
    """
    env: dict[int, Any] = dict(program.constants)
    env.update(zip(program.invars, args, strict=True))
    for index, eqn in enumerate(program.eqns):
        operands = [env[v] for v in eqn.invars]
        if on_operand is not None:
            operands = [on_operand(index, p, x) for p, x in enumerate(operands)]
        # Re-enter the original name stack so compiled HLO metadata keeps the user's scopes
        # and the forward/backward marks (`transpose(jvp(...))`) profiling relies on.
        with source_info_util.set_name_stack(_name_stacks(eqn.name_stack)):
            results = eqn.primitive.bind(*operands, **eqn.params)
        if not eqn.primitive.multiple_results:
            results = (results,)
        for vid, result in zip(eqn.outvars, results, strict=True):
            env[vid] = on_value(vid, result) if on_value else result
    return [env[v] for v in program.outvars]


def _name_stacks(name_stack: str) -> Any:
    stack = source_info_util.new_name_stack()
    for part in name_stack.split("/"):
        if part:
            stack = stack.extend(part)
    return stack
