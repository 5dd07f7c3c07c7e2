"""The only module that touches jaxpr internals.

JAX's public API gives us `jax.make_jaxpr`, but reading the equations (primitives, params,
variables, name stacks, source lines) needs `jax._src` objects whose names move between
releases. Everything version-dependent is funnelled through here, and the rest of the package
sees plain Python data: `FlatProgram` of `FlatEqn`s over integer value ids.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax._src import core as jax_core
from jax._src import source_info_util

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
class LoopIteration:
    """One unrolled iteration of a scan: which flat values its body read and made.

    `inputs` are the flat ids bound to the body's invars (consts, carry, then the slices of
    the scanned operands at `index`), `outputs` the flat ids of its outvars (carry, then the
    per-iteration ys), `values` the flat id of every outvar of every top-level body equation,
    in body order. The body's own equations are the flat equations `start` to `stop - 1`
    (slicing and stacking, which the tracer adds, lie outside that range).
    """

    index: int  # position along the scanned axis
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    values: tuple[int, ...]
    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class LoopRegion:
    """A `scan` of the step, unrolled into the flat program at equations `start` to `stop - 1`.

    `params` are the scan equation's own (its closed body `jaxpr`, `length`, `reverse`,
    `num_consts`, `num_carry`, ...); `operands` and `results` are the flat ids of what it read
    and made (final carry, then the stacked ys); `iterations` are in execution order (for a
    `reverse` scan, the last index first). `depth` is 0 for a scan of the step itself, one
    more for each scan whose body holds it.
    """

    params: dict[str, Any]
    operands: tuple[int, ...]
    results: tuple[int, ...]
    start: int
    stop: int
    iterations: tuple[LoopIteration, ...]
    depth: int
    name_stack: str
    source_line: str

    def __post_init__(self) -> None:
        if len(self.iterations) != self.length:
            raise ValueError(
                f"scan at {self.source_line}: expected {self.length} iterations, found "
                f"{len(self.iterations)}"
            )

    @property
    def length(self) -> int:
        return int(self.params["length"])

    @property
    def reverse(self) -> bool:
        return bool(self.params["reverse"])

    @property
    def num_consts(self) -> int:
        return int(self.params["num_consts"])

    @property
    def num_carry(self) -> int:
        return int(self.params["num_carry"])

    def iteration_of(self, eqn_index: int) -> tuple[int, int] | None:
        """(iteration position, offset in its body) of a body equation, None elsewhere."""
        for position, iteration in enumerate(self.iterations):
            if iteration.start <= eqn_index < iteration.stop:
                return position, eqn_index - iteration.start
        return None


@dataclass(frozen=True, slots=True)
class FlatProgram:
    """An inlined jaxpr: equations in topological order over integer value ids.

    `loops` records every scan the tracer unrolled (outermost after the scans its body
    holds); a program without scans has none.
    """

    eqns: tuple[FlatEqn, ...]
    invars: tuple[int, ...]
    outvars: tuple[int, ...]
    avals: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype name) per value id
    constants: dict[int, Any]  # value id -> concrete constant (literals, closed-over consts)
    dtypes: tuple[Any, ...] = ()  # the dtype objects themselves (PRNG key types included)
    loops: tuple[LoopRegion, ...] = ()

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
    *,
    keep_loops: bool = False,
) -> list[Any]:
    """Re-execute a flat program by binding each primitive in order.

    `on_value(value_id, array)` may return a replacement for an op result (e.g. the array
    with a sharding constraint); `on_operand(eqn_index, position, array)` may replace what one
    op reads without changing what other readers see.

    With `keep_loops`, each unrolled scan (`program.loops`) runs as a `jax.lax.scan` again:
    its body is the first iteration's equations, with that iteration's hooks (value ids and
    equation indices), so every iteration takes the first one's layouts. Without it the
    program runs unrolled: that is what whole-step pricing and segment programs compile,
    because XLA's cost analysis counts a while loop's body once, not once per trip.
    """
    env: dict[int, Any] = dict(program.constants)
    env.update(zip(program.invars, args, strict=True))
    runner = _Runner(program, on_value, on_operand, keep_loops)
    runner.run(0, len(program.eqns), env, depth=0)
    return [env[v] for v in program.outvars]


class _Runner:
    """Binds a range of a flat program's equations into an environment of value ids."""

    def __init__(
        self,
        program: FlatProgram,
        on_value: Callable[[int, Any], Any] | None,
        on_operand: Callable[[int, int, Any], Any] | None,
        keep_loops: bool,
    ) -> None:
        self.program = program
        self.on_value = on_value
        self.on_operand = on_operand
        # loops by (depth, first equation); a region with no equation has nothing to run
        self.loops = {
            (loop.depth, loop.start): loop
            for loop in (program.loops if keep_loops else ())
            if loop.stop > loop.start
        }

    def run(self, start: int, stop: int, env: dict[int, Any], depth: int) -> None:
        index = start
        while index < stop:
            loop = self.loops.get((depth, index))
            if loop is not None:
                self.run_loop(loop, env)
                index = loop.stop
                continue
            eqn = self.program.eqns[index]
            operands = [env[v] for v in eqn.invars]
            if self.on_operand is not None:
                operands = [self.on_operand(index, p, x) for p, x in enumerate(operands)]
            # Re-enter the original name stack so compiled HLO metadata keeps the user's
            # scopes and the forward/backward marks (`transpose(jvp(...))`) profiling relies on.
            with source_info_util.set_name_stack(_name_stacks(eqn.name_stack)):
                results = eqn.primitive.bind(*operands, **eqn.params)
            if not eqn.primitive.multiple_results:
                results = (results,)
            for vid, result in zip(eqn.outvars, results, strict=True):
                env[vid] = self.value(vid, result)
            index += 1

    def value(self, vid: int, x: Any) -> Any:
        return self.on_value(vid, x) if self.on_value is not None else x

    def run_loop(self, loop: LoopRegion, env: dict[int, Any]) -> None:
        """`jax.lax.scan` over the first iteration's equations; binds the loop's results."""
        first = loop.iterations[0]
        consts = [env[v] for v in loop.operands[: loop.num_consts]]
        init = [env[v] for v in loop.operands[loop.num_consts : loop.num_consts + loop.num_carry]]
        xs = [env[v] for v in loop.operands[loop.num_consts + loop.num_carry :]]
        carry_ids = first.inputs[loop.num_consts : loop.num_consts + loop.num_carry]
        carry_out = first.outputs[: loop.num_carry]
        xs_ids = first.inputs[loop.num_consts + loop.num_carry :]

        def body(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            local: dict[int, Any] = dict(self.program.constants)
            local.update(zip(first.inputs[: loop.num_consts], consts, strict=True))
            # the loop state takes the layout the body gives its carry out
            for vid, out, value in zip(carry_ids, carry_out, carry, strict=True):
                local[vid] = self.value(out, value)
            for vid, value in zip(xs_ids, x, strict=True):
                local[vid] = self.value(vid, value)
            self.run(first.start, first.stop, local, loop.depth + 1)
            outs = [local[v] for v in first.outputs]
            return outs[: loop.num_carry], outs[loop.num_carry :]

        with source_info_util.set_name_stack(_name_stacks(loop.name_stack)):
            carry, ys = jax.lax.scan(
                body, init, xs, length=loop.length, reverse=loop.reverse, unroll=1
            )
        for vid, result in zip(loop.results, [*carry, *ys], strict=True):
            env[vid] = self.value(vid, result)


def _name_stacks(name_stack: str) -> Any:
    stack = source_info_util.new_name_stack()
    for part in name_stack.split("/"):
        if part:
            stack = stack.extend(part)
    return stack


# --- compiling a lowered program in another process -----------------------------------------
#
# `jax.stages.Lowered` cannot cross a process boundary, and a compile-only profiler needs only
# what XLA makes of the module. A `CompileRequest` carries exactly what `Lowered.compile`
# hands XLA (the StableHLO module, the device assignment, the propagation flags, the compiler
# options), so the executable compiled from it elsewhere is the same program.


@dataclass(frozen=True, slots=True)
class CompileRequest:
    module: bytes  # StableHLO bytecode
    name: str
    tuple_args: bool
    allow_prop_to_inputs: tuple[bool, ...]
    allow_prop_to_outputs: tuple[bool, ...]
    device_ids: tuple[int, ...]
    platform: str
    options: tuple[tuple[str, Any], ...]
    # JAX settings that shape the compile options (`_compile_settings`), as in force here
    settings: tuple[tuple[str, Any], ...] = ()


def _compile_settings() -> tuple[Any, ...]:
    """The JAX settings `compiler.get_compile_options` reads: a user may have changed them
    in this process with `jax.config.update`, which a fresh process would not see."""
    from jax._src import config

    return (
        config.use_shardy_partitioner,
        config.exec_time_optimization_effort,
        config.memory_fitting_effort,
        config.optimization_level,
        config.memory_fitting_level,
        config.enable_remat_opt_pass,
        config.jax_xla_profile_version,
    )


@dataclass(frozen=True, slots=True)
class CompiledText:
    """What compile-only pricing reads from an executable, as plain data."""

    hlo: str  # the optimised HLO module, as text
    cost: dict[str, float] | None  # XLA's cost analysis; None where the backend has none
    # bytes per device: (arguments, outputs, temporaries, aliased); None where there is none
    memory: tuple[int, int, int, int] | None


def compile_request(lowered: Any, options: dict[str, Any]) -> CompileRequest | None:
    """The request that compiles `lowered` with `options` elsewhere; None for a program that
    cannot leave this process (host callbacks run Python of this process)."""
    from jax._src.interpreters import mlir, pxla

    lowering = lowered._lowering
    if not isinstance(lowering, pxla.MeshComputation):
        return None
    args = lowering.compile_args
    if args.get("host_callbacks") or lowering._device_list is None:
        return None
    to_inputs, to_outputs = pxla.get_prop_to_input_output(
        args["in_shardings"], args["out_shardings"], len(args["ordered_effects"])
    )
    devices = tuple(lowering._device_list)
    return CompileRequest(
        module=mlir.module_to_bytecode(lowering.stablehlo()),
        name=lowering._name,
        tuple_args=bool(args["tuple_args"]),
        allow_prop_to_inputs=tuple(to_inputs),
        allow_prop_to_outputs=tuple(to_outputs),
        device_ids=tuple(d.id for d in devices),
        platform=devices[0].platform,
        options=tuple(lowering._compiler_options_kvs) + tuple(options.items()),
        settings=tuple((holder.name, holder.value) for holder in _compile_settings()),
    )


def compile_from_request(request: CompileRequest) -> CompiledText:
    """Compile a request on this process's devices of its platform, as `Lowered.compile`
    would, and read the executable. The request's JAX settings are applied to this process
    (a worker's, made to compile requests)."""
    from jax._src import compiler, xla_bridge
    from jax._src.interpreters import mlir, pxla
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    for name, value in request.settings:
        jax.config.update(name, value)
    backend = xla_bridge.get_backend(request.platform)
    by_id = {device.id: device for device in backend.devices()}
    missing = [i for i in request.device_ids if i not in by_id]
    if missing:
        raise ValueError(
            f"this process has no {request.platform} devices with ids {missing} "
            f"(it has {len(by_id)})"
        )
    devices = np.array([by_id[i] for i in request.device_ids], dtype=object)
    device_list = xla_client.DeviceList(tuple(devices))
    with mlir.make_ir_context():
        module = ir.Module.parse(request.module)
        options = pxla.create_compile_options(
            module,
            request.tuple_args,
            request.allow_prop_to_inputs,
            request.allow_prop_to_outputs,
            backend,
            devices,
            dict(request.options),
        )
        executable = compiler.compile_or_get_cached(
            backend, module, devices, options, (), device_list, None
        )
    return read_executable(executable)


def read_executable(executable: Any) -> CompiledText:
    """The optimised HLO, cost and memory analyses of an XLA executable or of a
    `jax.stages.Compiled`."""
    if hasattr(executable, "as_text"):  # jax.stages.Compiled
        hlo, cost, stats = (
            executable.as_text(),
            executable.cost_analysis(),
            executable.memory_analysis(),
        )
    else:
        hlo = executable.get_hlo_text()
        cost = executable.cost_analysis()
        stats = executable.get_compiled_memory_stats()
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    memory = (
        None
        if stats is None
        else (
            int(stats.argument_size_in_bytes),
            int(stats.output_size_in_bytes),
            int(stats.temp_size_in_bytes),
            int(stats.alias_size_in_bytes),
        )
    )
    return CompiledText(
        hlo=hlo,
        cost=None if cost is None else {k: float(v) for k, v in cost.items()},
        memory=memory,
    )


@contextlib.contextmanager
def random_bits_as_accelerators_lower() -> Iterator[None]:
    """Lower `threefry2x32` (JAX's random bits) as GPUs and TPUs do while inside.

    On the CPU, JAX lowers it to a rolled `while` loop to keep compiles short; XLA's SPMD
    partitioner cannot split that loop's state, so every device computes the random bits of
    the whole global shape. A dropout mask of GPT-2.6B's attention (batch 32, 32 heads, 1024
    tokens) is then 4 GiB of u32 counters per device, twice, where an accelerator's
    elementwise (unrolled) lowering keeps only its shard. Profiles and whole steps priced
    for an accelerator are lowered the accelerator's way; the program computes the same
    bits either way."""
    from jax._src.interpreters import mlir
    from jax._src.random import threefry2x32 as threefry

    # counted, so that threads lowering at once share one swap and the last restores it
    table = mlir._platform_specific_lowerings["cpu"]
    with _RANDOM_LOWERING["lock"]:
        if _RANDOM_LOWERING["inside"] == 0:
            _RANDOM_LOWERING["cpu_rule"] = table.pop(threefry.threefry2x32_p, None)
        _RANDOM_LOWERING["inside"] += 1
    try:
        yield  # without a CPU rule, the rule every platform shares applies
    finally:
        with _RANDOM_LOWERING["lock"]:
            _RANDOM_LOWERING["inside"] -= 1
            rule = _RANDOM_LOWERING["cpu_rule"]
            if _RANDOM_LOWERING["inside"] == 0 and rule is not None:
                table[threefry.threefry2x32_p] = rule


_RANDOM_LOWERING: dict[str, Any] = {"lock": threading.Lock(), "inside": 0, "cpu_rule": None}
