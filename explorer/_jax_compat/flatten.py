"""Inlining a closed jaxpr into one `FlatProgram`: call-like primitives spliced, scans unrolled."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import core as jax_core
from jax._src import source_info_util

from explorer._jax_compat.plain import _aval_of, _join_stack, user_location
from explorer._jax_compat.program import FlatEqn, FlatProgram, LoopIteration, LoopRegion
from explorer.errors import GENERIC_HINT, LOOP_HINT, UnsupportedPrimitiveError

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

# `scan` is unrolled (see `flatten`); these keep a trip count or a branch known only at run
# time, which a flat graph cannot hold.
_CONTROL_FLOW = {"while", "cond", "switch", "fori_loop"}

# Unrolling a scan beyond this many equations in the whole flat program is refused.
MAX_UNROLLED_EQNS = 100_000

SCAN_TOO_LARGE_HINT = (
    "Unrolling it for the analysis would make more than {limit} primitive ops (the scan has "
    "{length} iterations of {size} ops each). Trace a shallower copy of the model (fewer "
    "layers: the plan's per-layer choices do not depend on depth), or split the scan."
)

SCAN_EMPTY_HINT = (
    "A scan of length 0 runs no iteration: there is nothing to analyse. Remove it from the step."
)

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


def make_jaxpr(fn: Callable[..., Any], *args: Any) -> Any:
    """`jax.make_jaxpr` with the tree of outputs; split out so trace.py can wrap errors."""
    return jax.make_jaxpr(fn, return_shape=True)(*args)


def flatten(closed_jaxpr: Any) -> FlatProgram:
    """Inline every call-like primitive of `closed_jaxpr` into one flat list of equations.

    A `scan` (forward, the reverse one `jax.grad` makes for its backward pass, nested ones)
    is unrolled: per iteration, each scanned operand is sliced at the iteration's index
    (`slice` + `squeeze`), the body is inlined with the carry threaded through, and the
    per-iteration ys are stacked (`broadcast_in_dim` + `concatenate`). Each unrolled scan is
    recorded as a `LoopRegion`, so a program can be re-executed with the loop kept
    (`evaluate(..., keep_loops=True)`). Slicing is shared: a scanned operand sliced twice at
    one index (the weights the backward scan reads again) is sliced once, and a slice of
    stacked ys is the per-iteration value itself (the residuals the backward scan reads are
    the forward iteration's values), so the unrolled step reads like a Python `for` loop;
    the stacking nobody reads is then dropped.

    Raises UnsupportedPrimitiveError for other control flow and for any other primitive that
    carries a sub-jaxpr we do not know how to splice.
    """
    return _Flattener().run(closed_jaxpr)


class _Flattener:
    """The state of one `flatten` call."""

    def __init__(self) -> None:
        self.avals: list[tuple[tuple[int, ...], str]] = []
        self.dtypes: list[Any] = []
        self.constants: dict[int, Any] = {}
        self.eqns: list[FlatEqn] = []
        self.loops: list[LoopRegion] = []
        self.glue: set[int] = set()  # equations the unrolling added (slices, stacks, copies)
        self.slices: dict[tuple[int, int], int] = {}  # (value, index) -> its slice
        self.stacked: dict[int, tuple[int, ...]] = {}  # stacked ys -> per-index values
        self.depth = 0
        self.glue_jaxprs: dict[Any, Any] = {}

    def run(self, closed_jaxpr: Any) -> FlatProgram:
        jaxpr = closed_jaxpr.jaxpr
        args = [self.new_value(v) for v in jaxpr.invars]
        outvars = self.inline(jaxpr, closed_jaxpr.consts, args, "")
        if not self.loops:
            return FlatProgram(
                eqns=tuple(self.eqns),
                invars=tuple(args),
                outvars=tuple(outvars),
                avals=tuple(self.avals),
                constants=self.constants,
                dtypes=tuple(self.dtypes),
            )
        eqns, loops = self._drop_unread_glue(outvars)
        return FlatProgram(
            eqns=eqns,
            invars=tuple(args),
            outvars=tuple(outvars),
            avals=tuple(self.avals),
            constants=self.constants,
            dtypes=tuple(self.dtypes),
            loops=loops,
        )

    # -- values ------------------------------------------------------------------------------

    def new_value(self, var: Any) -> int:
        self.avals.append(_aval_of(var))
        self.dtypes.append(getattr(var.aval, "dtype", None))
        return len(self.avals) - 1

    def read(self, var: Any, env: dict[Any, int]) -> int:
        if isinstance(var, jax_core.Literal):
            vid = self.new_value(var)
            self.constants[vid] = var.val
            return vid
        return env[var]

    # -- inlining ----------------------------------------------------------------------------

    def inline(
        self,
        jaxpr: Any,
        consts: Sequence[Any],
        args: Sequence[int],
        stack: str,
        made: list[int] | None = None,
    ) -> list[int]:
        """Splice `jaxpr` in; `made` collects the flat ids of its equations' outvars."""
        env: dict[Any, int] = {}
        for var, const in zip(jaxpr.constvars, consts, strict=True):
            vid = self.new_value(var)
            self.constants[vid] = const
            env[var] = vid
        for var, vid in zip(jaxpr.invars, args, strict=True):
            env[var] = vid
        for eqn in jaxpr.eqns:
            eqn_stack = _join_stack(stack, str(eqn.source_info.name_stack))
            name = eqn.primitive.name
            operands = [self.read(v, env) for v in eqn.invars]
            sub = _sub_jaxpr(eqn)
            if name in _INLINE_PARAM and sub is not None:
                sub_jaxpr, sub_consts = sub
                results = self.inline(sub_jaxpr, sub_consts, operands, eqn_stack)
            elif name == "scan":
                results = self.unroll_scan(eqn, operands, eqn_stack)
            elif name in _CONTROL_FLOW or name in _OPAQUE_BODIES:
                hint = LOOP_HINT if name in _CONTROL_FLOW else GENERIC_HINT
                raise UnsupportedPrimitiveError(name, user_location(eqn.source_info), hint)
            else:
                results = [self.new_value(var) for var in eqn.outvars]
                self.eqns.append(
                    FlatEqn(
                        primitive=eqn.primitive,
                        params=dict(eqn.params),
                        invars=tuple(operands),
                        outvars=tuple(results),
                        name_stack=eqn_stack,
                        source=source_info_util.summarize(eqn.source_info),
                        source_line=user_location(eqn.source_info),
                    )
                )
            for var, vid in zip(eqn.outvars, results, strict=True):
                if not isinstance(var, jax_core.DropVar):
                    env[var] = vid
            if made is not None:
                made.extend(results)
        return [self.read(v, env) for v in jaxpr.outvars]

    # -- scans -------------------------------------------------------------------------------

    def unroll_scan(self, eqn: Any, operands: list[int], stack: str) -> list[int]:
        params = eqn.params
        length, reverse = int(params["length"]), bool(params["reverse"])
        num_consts, num_carry = int(params["num_consts"]), int(params["num_carry"])
        body = params["jaxpr"]
        where = user_location(eqn.source_info)
        if length == 0:
            raise UnsupportedPrimitiveError("scan", where, SCAN_EMPTY_HINT)
        size = _size(body.jaxpr)
        if len(self.eqns) + length * size > MAX_UNROLLED_EQNS:
            hint = SCAN_TOO_LARGE_HINT.format(limit=MAX_UNROLLED_EQNS, length=length, size=size)
            raise UnsupportedPrimitiveError("scan", where, hint)
        consts = operands[:num_consts]
        carry = operands[num_consts : num_consts + num_carry]
        xs = operands[num_consts + num_carry :]
        start = len(self.eqns)
        self.depth += 1
        iterations = []
        ys: dict[int, list[int]] = {}
        for position, index in enumerate(range(length - 1, -1, -1) if reverse else range(length)):
            slices = [self.slice_at(x, index, stack, eqn.source_info) for x in xs]
            inputs = [*consts, *carry, *slices]
            if position == 0:
                inputs = self.distinct(inputs, stack, eqn.source_info)
            body_start = len(self.eqns)
            made: list[int] = []
            outs = self.inline(body.jaxpr, body.consts, inputs, stack, made)
            iterations.append(
                LoopIteration(
                    index=index,
                    inputs=tuple(inputs),
                    outputs=tuple(outs),
                    values=tuple(made),
                    start=body_start,
                    stop=len(self.eqns),
                )
            )
            carry = outs[:num_carry]
            ys[index] = outs[num_carry:]
        self.depth -= 1
        stacked = []
        for j in range(len(eqn.outvars) - num_carry):
            parts = tuple(ys[index][j] for index in range(length))
            (vid,) = self.emit_glue(_stack_fn, parts, stack, eqn.source_info)
            self.stacked[vid] = parts
            stacked.append(vid)
        results = [*carry, *stacked]
        self.loops.append(
            LoopRegion(
                params=dict(params),
                operands=tuple(operands),
                results=tuple(results),
                start=start,
                stop=len(self.eqns),
                iterations=tuple(iterations),
                depth=self.depth,
                name_stack=stack,
                source_line=where,
            )
        )
        return results

    def slice_at(self, vid: int, index: int, stack: str, source_info: Any) -> int:
        """`vid[index]` along its leading axis: the stacked value itself when `vid` stacks
        per-iteration values, the same slice when it was sliced there before."""
        if vid in self.stacked:
            return self.stacked[vid][index]
        if (vid, index) not in self.slices:
            (self.slices[vid, index],) = self.emit_glue(
                _slice_fn(index), (vid,), stack, source_info
            )
        return self.slices[vid, index]

    def distinct(self, inputs: list[int], stack: str, source_info: Any) -> list[int]:
        """`inputs` with a copy for each value that repeats (a carry initialised with a
        const): the first iteration's body must read each body input under its own id."""
        seen: set[int] = set()
        out = []
        for vid in inputs:
            fresh = vid
            if vid in seen:
                (fresh,) = self.emit_glue(jax.lax.copy_p.bind, (vid,), stack, source_info)
            seen.add(fresh)
            out.append(fresh)
        return out

    def emit_glue(
        self, fn: Callable[..., Any], operands: Sequence[int], stack: str, source_info: Any
    ) -> list[int]:
        """Append the equations of `fn` applied to `operands`, at the scan's scope and line."""
        structs = tuple(jax.ShapeDtypeStruct(self.avals[v][0], self.dtypes[v]) for v in operands)
        key = (fn, structs)
        if key not in self.glue_jaxprs:
            self.glue_jaxprs[key] = jax.make_jaxpr(fn)(*structs)
        closed = self.glue_jaxprs[key]
        env: dict[Any, int] = dict(zip(closed.jaxpr.invars, operands, strict=True))
        for eqn in closed.jaxpr.eqns:
            outs = [self.new_value(var) for var in eqn.outvars]
            env.update(zip(eqn.outvars, outs, strict=True))
            self.glue.add(len(self.eqns))
            self.eqns.append(
                FlatEqn(
                    primitive=eqn.primitive,
                    params=dict(eqn.params),
                    invars=tuple(self.read(v, env) for v in eqn.invars),
                    outvars=tuple(outs),
                    name_stack=stack,
                    source=source_info_util.summarize(source_info),
                    source_line=user_location(source_info),
                )
            )
        return [self.read(v, env) for v in closed.jaxpr.outvars]

    def _drop_unread_glue(
        self, outvars: Sequence[int]
    ) -> tuple[tuple[FlatEqn, ...], tuple[LoopRegion, ...]]:
        """Remove the slices and stacks nothing reads, renumbering the loop regions."""
        reads: dict[int, int] = dict.fromkeys(outvars, 1)
        for eqn in self.eqns:
            for vid in eqn.invars:
                reads[vid] = reads.get(vid, 0) + 1
        dropped: set[int] = set()
        for index in sorted(self.glue, reverse=True):  # readers come after what they read
            eqn = self.eqns[index]
            if not any(reads.get(v, 0) for v in eqn.outvars):
                dropped.add(index)
                for vid in eqn.invars:
                    reads[vid] -= 1
        kept = [i for i in range(len(self.eqns)) if i not in dropped]
        renumber = np.searchsorted(np.asarray(kept, dtype=np.int64), np.arange(len(self.eqns) + 1))

        def moved(index: int) -> int:
            return int(renumber[index])

        loops = tuple(
            dataclasses.replace(
                loop,
                start=moved(loop.start),
                stop=moved(loop.stop),
                iterations=tuple(
                    dataclasses.replace(it, start=moved(it.start), stop=moved(it.stop))
                    for it in loop.iterations
                ),
            )
            for loop in self.loops
        )
        return tuple(self.eqns[i] for i in kept), loops


def _slice_fn(index: int) -> Callable[[Any], Any]:
    return functools.partial(_slice_at, index=index)


def _slice_at(x: Any, index: int) -> Any:
    return jax.lax.squeeze(jax.lax.slice_in_dim(x, index, index + 1, axis=0), (0,))


def _stack_fn(*parts: Any) -> Any:
    return jax.lax.concatenate([jax.lax.expand_dims(p, (0,)) for p in parts], 0)


def _size(jaxpr: Any) -> int:
    """Equations `jaxpr` inlines to, counting call bodies and scans unrolled."""
    total = 0
    for eqn in jaxpr.eqns:
        sub = _sub_jaxpr(eqn)
        if eqn.primitive.name == "scan":
            total += int(eqn.params["length"]) * _size(eqn.params["jaxpr"].jaxpr)
        elif eqn.primitive.name in _INLINE_PARAM and sub is not None:
            total += _size(sub[0])
        else:
            total += 1
    return total


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
