"""Trace a training step into a flat `Graph` of primitive ops.

One pass: abstract the example arguments, take the jaxpr of the whole step, inline every
call-like primitive (via `_jax_compat`), then annotate each op with its role (forward,
backward, optimizer), its scope, its depth and, for backward ops, the forward op it was
derived from, and classify each leaf of the step's inputs (parameter, optimizer state, data,
RNG).

Input roles are read per pytree leaf from what the step does with it, so a Flax `TrainState`,
an Equinox partitioned model or an optax state nested anywhere classify alike:

- a leaf the step returns updated (same path below its argument, same shape and dtype) is
  state; a float one that the forward pass reads and whose update uses the gradient is a
  **parameter**, the rest (AdamW moments, step counters) **optimizer state**;
- a PRNG key is **rng**; every other leaf (not returned updated) is **data**.

A float leaf returned updated without any gradient in its update (BatchNorm statistics, an
EMA) is ambiguous: it becomes optimizer state with a `RoleWarning`. A step that takes no
gradient trains nothing: its inputs are data. `arg_roles` overrides any of this (see
`ArgRoles`).
"""

from __future__ import annotations

import inspect
import os
import traceback
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from explorer import _jax_compat as jc
from explorer.errors import ArgumentMismatchError, ExplorerError, RoleWarning, TraceError
from explorer.ir import INPUT_KINDS, Graph, OpNode, Role, TensorType, Value, ValueKind

ARG_ROLE_KINDS = {
    "params": ValueKind.PARAMETER,
    "opt_state": ValueKind.OPTIMIZER_STATE,
    "data": ValueKind.DATA,
    "rng": ValueKind.RNG,
}
# Accepted role names: the short ones above and the ValueKind names ("parameter", ...).
_ROLE_NAMES: dict[str, ValueKind] = {**ARG_ROLE_KINDS, **{str(k): k for k in INPUT_KINDS}}

ArgRoles = Sequence[Any] | Callable[[str, Any], str | None]
"""What `trace(..., arg_roles=...)` accepts: the role of some or all input leaves.

- A sequence with one entry per positional argument, each a pytree prefix of its argument
  (as `jax.vmap`'s `in_axes`): a role name covers the whole argument, a nested structure
  of role names covers its parts, and `None` leaves that part to the structural inference.
  `("params", "opt_state", "data")` is the simplest form.
- A callable `(path, leaf) -> role name | None`, called once per input leaf with its path as
  printed in the summary (e.g. `"state.params['Dense_0']['kernel']"`) and its
  `jax.ShapeDtypeStruct`.

Role names: `params`/`parameter`, `opt_state`/`optimizer_state`, `data`, `rng`. A leaf
declared `data` that holds a PRNG key is `rng`.
"""

_INFER = object()  # a leaf whose role the structural inference decides


AMBIGUOUS_ROLES = (
    "{count} float input leaf/leaves are returned updated, but no gradient flows into the "
    "update (e.g. {examples}). They are treated as optimizer state: kept like the parameter "
    "whose path they end with, else replicated. If they are parameters or data, say so with "
    "`arg_roles`, e.g. `arg_roles=lambda path, leaf: 'data' if 'batch_stats' in path else None`."
)

# Ops that only move or retype data: looked through when matching a backward op to the
# forward op that shares its operands (`rev`: a conv's input gradient reads the kernel flipped).
_LAYOUT_OPS = frozenset({"transpose", "reshape", "convert_element_type", "copy", "copy_p", "rev"})


def trace(
    step: Callable[..., Any],
    *example_args: Any,
    arg_roles: ArgRoles | None = None,
) -> Graph:
    """Trace `step(*example_args)` into a flat Graph.

    `example_args` may be arrays or `jax.ShapeDtypeStruct`s (nothing is computed or
    allocated). Each input leaf's role is inferred from what the step does with it (see the
    module doc); `arg_roles` (see `ArgRoles`), or else `step.explorer_arg_roles` (set by the
    model zoo), overrides it for the leaves it names.
    """
    _check_binds(step, example_args)
    abstract_args = _abstract(example_args)
    names = _arg_names(step, len(example_args))
    declared = _declared_roles(step, abstract_args, arg_roles, names)
    _check_against_spec(step, abstract_args)
    closed_jaxpr, out_shape = _make_jaxpr(step, abstract_args)
    program = jc.flatten(closed_jaxpr)
    return _build_graph(program, abstract_args, declared, names, out_shape)


# -- arguments ------------------------------------------------------------------------------


def _check_binds(step: Callable[..., Any], args: Sequence[Any]) -> None:
    try:
        inspect.signature(step).bind(*args)
    except TypeError as err:
        raise ArgumentMismatchError(
            f"the step {_name(step)}{_signature(step)} cannot take the {len(args)} example "
            f"argument(s) given: {err}"
        ) from None
    except ValueError:
        pass  # builtins and some wrappers have no signature: let tracing decide


def _declared_roles(
    step: Callable[..., Any],
    args: tuple[Any, ...],
    arg_roles: ArgRoles | None,
    names: tuple[str, ...],
) -> list[ValueKind | None]:
    """The role `arg_roles` (or `step.explorer_arg_roles`) gives each input leaf, None where
    it leaves the leaf to inference."""
    spec = arg_roles if arg_roles is not None else getattr(step, "explorer_arg_roles", None)
    flat = jax.tree_util.tree_flatten_with_path(args)[0]
    if spec is None:
        return [None] * len(flat)
    if callable(spec):
        return [
            _role_kind(spec(_leaf_path(path, names), leaf), _leaf_path(path, names))
            for path, leaf in flat
        ]
    if isinstance(spec, str) or not isinstance(spec, Sequence) or len(spec) != len(args):
        found = f"{len(spec)} roles: {tuple(spec)}" if isinstance(spec, Sequence) else repr(spec)
        raise ArgumentMismatchError(
            f"expected one role per step argument ({len(args)} arguments), found {found}. "
            "Give a sequence of role names or pytree prefixes (None: infer), or a callable "
            "(path, leaf) -> role"
        )
    per_leaf: list[ValueKind | None] = []
    for index, (prefix, arg) in enumerate(zip(spec, args, strict=True)):
        for role in _broadcast_prefix(prefix, arg, names[index]):
            per_leaf.append(None if role is _INFER else _role_kind(role, names[index]))
    return per_leaf


def _broadcast_prefix(prefix: Any, arg: Any, name: str) -> list[Any]:
    """One entry of `prefix` per leaf of `arg` (`_INFER` for None)."""

    def is_role(node: Any) -> bool:
        return node is None or isinstance(node, str)

    def spread(role: Any, subtree: Any) -> Any:
        return jax.tree.map(lambda _: _INFER if role is None else role, subtree)

    try:
        expanded = jax.tree.map(spread, prefix, arg, is_leaf=is_role)
    except (ValueError, TypeError) as err:
        raise ArgumentMismatchError(
            f"arg_roles for argument {name!r} is not a pytree prefix of it: "
            f"{_first_lines(str(err), 2)}. Give one role name for the whole argument, a "
            "structure matching its top levels with role names (or None) as leaves, or a "
            "callable (path, leaf) -> role"
        ) from None
    return jax.tree.leaves(expanded)


def _role_kind(role: Any, where: str) -> ValueKind | None:
    if role is None:
        return None
    if isinstance(role, str) and role in _ROLE_NAMES:
        return _ROLE_NAMES[role]
    raise ArgumentMismatchError(
        f"unknown argument role(s) [{role!r}] for {where}; expected one of "
        f"{sorted(_ROLE_NAMES)} (or None to infer it)"
    )


def _leaf_path(path: Any, names: tuple[str, ...]) -> str:
    """`state.params['w']`: the argument's name, then the path inside it."""
    return names[path[0].idx] + jax.tree_util.keystr(tuple(path[1:]))


def _arg_names(step: Callable[..., Any], count: int) -> tuple[str, ...]:
    """Names for input paths: the step's own parameter names where it has them."""
    try:
        params = list(inspect.signature(step).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= count:
        return tuple(positional[:count])
    return tuple(f"arg{index}" for index in range(count))


def _abstract(args: Sequence[Any]) -> tuple[Any, ...]:
    def to_struct(path: Any, leaf: Any) -> jax.ShapeDtypeStruct:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype)
        if isinstance(leaf, (bool, int, float, complex, np.generic)):
            value = np.asarray(leaf)
            return jax.ShapeDtypeStruct((), jax.dtypes.canonicalize_dtype(value.dtype))
        raise ArgumentMismatchError(
            f"example argument {_argument_path(path)}: expected an array, a "
            f"jax.ShapeDtypeStruct or a Python scalar, found {type(leaf).__name__}"
        )

    return tuple(jax.tree_util.tree_map_with_path(to_struct, tuple(args)))


def _check_against_spec(step: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Compare the args with `step.explorer_arg_spec` when the step declares one."""
    spec = getattr(step, "explorer_arg_spec", None)
    if spec is None:
        return
    expected = jax.tree_util.tree_structure(tuple(spec))
    found = jax.tree_util.tree_structure(args)
    if expected != found:  # type: ignore[operator]
        raise ArgumentMismatchError(
            f"the example arguments do not have the structure {_name(step)} expects.\n"
            f"expected: {expected}\nfound:    {found}"
        )
    flat_spec = jax.tree_util.tree_flatten_with_path(tuple(spec))[0]
    for (path, want), got in zip(flat_spec, jax.tree_util.tree_leaves(args), strict=True):
        if tuple(want.shape) != tuple(got.shape) or want.dtype != got.dtype:
            raise ArgumentMismatchError(
                f"example argument {_argument_path(path)}: expected "
                f"{want.dtype}{list(want.shape)}, found {got.dtype}{list(got.shape)}"
            )


def _make_jaxpr(step: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, Any]:
    try:
        return jc.make_jaxpr(step, *args)
    except ExplorerError:
        raise
    except Exception as err:  # JAX raises TypeError/ValueError/etc. from deep inside
        structure = ", ".join(_describe(a) for a in args)
        raise TraceError(
            f"tracing {_name(step)} failed with the example arguments given ({structure}).\n"
            f"{type(err).__name__}: {_first_lines(str(err))}\n"
            f"where: {_user_frame(err)}\n"
            "Check that the arguments have the pytree structure, ranks and dtypes the step "
            "expects (a model from explorer.models returns matching example args)."
        ) from err


# -- graph ----------------------------------------------------------------------------------


def _build_graph(
    program: jc.FlatProgram,
    args: tuple[Any, ...],
    declared: list[ValueKind | None],
    names: tuple[str, ...],
    out_shape: Any,
) -> Graph:
    producer: dict[int, int] = {}
    for op_id, eqn in enumerate(program.eqns):
        for vid in eqn.outvars:
            producer[vid] = op_id
    roles_of = _op_roles(program, producer)
    outputs = jax.tree_util.tree_flatten_with_path(out_shape)[0]
    classes = _classify_inputs(
        program,
        roles_of,
        args=args,
        declared=declared,
        names=names,
        outputs=[path for path, _ in outputs],
    )

    values = []
    input_info = dict(
        zip(program.invars, zip(classes.kinds, classes.paths, strict=True), strict=True)
    )
    for vid, (shape, dtype) in enumerate(program.avals):
        ttype = TensorType(shape, dtype)
        if vid in input_info:
            kind, path = input_info[vid]
            values.append(Value(vid, ttype, kind, None, path))
        elif vid in producer:
            values.append(Value(vid, ttype, ValueKind.INTERMEDIATE, producer[vid]))
        else:
            values.append(Value(vid, ttype, ValueKind.CONSTANT))

    depths = _depths(program, producer)
    forward_links = _link_backward_to_forward(program, producer, roles_of)

    ops = []
    for op_id, eqn in enumerate(program.eqns):
        ops.append(
            OpNode(
                id=op_id,
                primitive=eqn.primitive.name,
                params=tuple(sorted(jc.plain_params(eqn.params).items())),
                inputs=eqn.invars,
                outputs=eqn.outvars,
                input_types=tuple(values[v].type for v in eqn.invars),
                output_types=tuple(values[v].type for v in eqn.outvars),
                role=roles_of[op_id],
                scope=jc.scope_of(eqn.name_stack),
                name_stack=eqn.name_stack,
                source=eqn.source_line,
                depth=depths[op_id],
                forward_op=forward_links.get(op_id),
            )
        )
    return Graph(
        ops=tuple(ops),
        values=tuple(values),
        inputs=program.invars,
        outputs=program.outvars,
        program=program,
        in_tree=jax.tree_util.tree_structure(args),
        output_paths=tuple(jax.tree_util.keystr(path) for path, _ in outputs),
        out_tree=jax.tree_util.tree_structure(out_shape),
        input_notes=classes.notes,
    )


# -- input roles ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _InputClasses:
    kinds: tuple[ValueKind, ...]  # per flattened input leaf
    paths: tuple[str, ...]
    notes: tuple[str, ...]  # how the roles were decided, for `Graph.role_summary`


def _classify_inputs(
    program: jc.FlatProgram,
    op_roles: list[Role],
    *,
    args: tuple[Any, ...],
    declared: list[ValueKind | None],
    names: tuple[str, ...],
    outputs: list[Any],
) -> _InputClasses:
    """The role of each input leaf: declared where `declared` says, else inferred (module doc).

    `outputs` are the key paths of the step's flattened results."""
    flat = jax.tree_util.tree_flatten_with_path(args)[0]
    paths = tuple(_leaf_path(path, names) for path, _ in flat)
    trains = Role.BACKWARD in op_roles  # without a gradient nothing is trained: all data
    updates = _updated_outputs(program, [p for p, _ in flat], outputs) if trains else {}
    from_gradient = _gradient_derived(program, op_roles)
    read_forward = {
        vid
        for eqn, role in zip(program.eqns, op_roles, strict=True)
        if role is Role.FORWARD
        for vid in eqn.invars
    }
    kinds: list[ValueKind] = []
    ambiguous: list[str] = []
    for index, ((_, leaf), given) in enumerate(zip(flat, declared, strict=True)):
        if given is not None:  # as declared, but a key declared data is rng
            kinds.append(
                ValueKind.RNG if given is ValueKind.DATA and _looks_like_key(leaf) else given
            )
            continue
        update = updates.get(index)
        uses_grad = update in from_gradient
        kind = _inferred_kind(leaf, update, program.invars[index] in read_forward, uses_grad)
        if kind is ValueKind.OPTIMIZER_STATE and _is_float(leaf) and not uses_grad:
            ambiguous.append(paths[index])
        kinds.append(kind)
    notes = [_how_decided(declared)]
    if not trains and None in declared:
        notes.append("the step takes no gradient: inputs not declared by arg_roles are data")
    if ambiguous:
        message = AMBIGUOUS_ROLES.format(count=len(ambiguous), examples=", ".join(ambiguous[:3]))
        warnings.warn(message, RoleWarning, stacklevel=4)
        notes.append(message)
    return _InputClasses(tuple(kinds), paths, tuple(notes))


def _inferred_kind(leaf: Any, update: int | None, read_forward: bool, uses_grad: bool) -> ValueKind:
    """A leaf's role from its dtype, whether the step returns it updated (`update`: the
    value id of the update), whether the forward pass reads it and whether its update uses
    a gradient."""
    if _looks_like_key(leaf):
        return ValueKind.RNG
    if update is None:
        return ValueKind.DATA
    if _is_float(leaf) and read_forward and uses_grad:
        return ValueKind.PARAMETER
    return ValueKind.OPTIMIZER_STATE


def _how_decided(declared: list[ValueKind | None]) -> str:
    given = sum(kind is not None for kind in declared)
    if given == 0:
        return "input roles inferred from how the step updates its inputs"
    if given == len(declared):
        return "input roles declared by arg_roles"
    return f"input roles: {given} leaves declared by arg_roles, {len(declared) - given} inferred"


def _updated_outputs(
    program: jc.FlatProgram, inputs: list[Any], outputs: list[Any]
) -> dict[int, int]:
    """Input leaf index -> value id of the output the step returns as its update.

    An update has the input's shape and dtype and the same path: the same full path
    (`step(state, batch) -> (state, loss)`) or, failing that, the same path below the
    positional argument (`step(params, opt, x) -> (loss, params, opt)`, or a step returning
    one pytree). An output that is the input itself, passed through, is no update.
    """
    passed_through = set(program.invars)
    exact: dict[tuple[str, Any], list[int]] = defaultdict(list)
    below: dict[tuple[str, Any], list[int]] = defaultdict(list)
    for path, vid in zip(outputs, program.outvars, strict=True):
        if vid in passed_through:
            continue
        aval = program.avals[vid]
        exact[(_keystr(path), aval)].append(vid)
        below[(_keystr(path), aval)].append(vid)  # a step returning one pytree
        if path:
            below[(_keystr(path[1:]), aval)].append(vid)  # one of a tuple of results
    found: dict[int, int] = {}
    claimed: set[int] = set()
    for table, skip in ((exact, 0), (below, 1)):  # every exact match first
        for index, path in enumerate(inputs):
            key = (_keystr(path[skip:]), program.avals[program.invars[index]])
            free = [vid for vid in table.get(key, ()) if vid not in claimed]
            if index not in found and free:
                found[index] = free[0]
                claimed.add(free[0])
    return found


def _keystr(path: Sequence[Any]) -> str:
    return jax.tree_util.keystr(tuple(path))


def _gradient_derived(program: jc.FlatProgram, op_roles: list[Role]) -> set[int]:
    """Values the backward pass makes, and everything computed from them (the updates)."""
    derived: set[int] = set()
    for eqn, role in zip(program.eqns, op_roles, strict=True):
        if role is Role.BACKWARD or any(v in derived for v in eqn.invars):
            derived.update(eqn.outvars)
    return derived


def _is_float(leaf: Any) -> bool:
    return bool(jax.dtypes.issubdtype(leaf.dtype, np.inexact))


def _looks_like_key(leaf: Any) -> bool:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return True
    return bool(leaf.dtype == np.uint32 and tuple(leaf.shape) == (2,))


def _op_roles(program: jc.FlatProgram, producer: dict[int, int]) -> list[Role]:
    """Backward: made by transposition. Forward: linearised, or feeding the backward pass.

    Everything else (moment updates, step counters, the parameter update) is the optimizer.
    A step without any backward op is all forward.
    """
    eqns = program.eqns
    backward = [jc.is_transposed(e.name_stack) for e in eqns]
    if not any(backward):
        return [Role.FORWARD] * len(eqns)
    feeds_backward = [False] * len(eqns)
    for op_id in range(len(eqns) - 1, -1, -1):
        if backward[op_id] or feeds_backward[op_id]:
            for vid in eqns[op_id].invars:
                if vid in producer and not backward[producer[vid]]:
                    feeds_backward[producer[vid]] = True
    roles = []
    for op_id, eqn in enumerate(eqns):
        if backward[op_id]:
            roles.append(Role.BACKWARD)
        elif feeds_backward[op_id] or jc.is_linearized(eqn.name_stack):
            roles.append(Role.FORWARD)
        else:
            roles.append(Role.OPTIMIZER)
    return roles


def _depths(program: jc.FlatProgram, producer: dict[int, int]) -> list[int]:
    depths: list[int] = []
    for eqn in program.eqns:
        deps = [depths[producer[v]] for v in eqn.invars if v in producer]
        depths.append(1 + max(deps, default=0))
    return depths


def _link_backward_to_forward(
    program: jc.FlatProgram, producer: dict[int, int], roles: list[Role]
) -> dict[int, int]:
    """Map each backward op to the forward op it was derived from.

    JAX keeps the primal equation's source location on the equations its transpose makes,
    so the candidates are forward ops of the same primitive at the same source line and user
    scope. Layers unrolled in a loop and shared helpers (one `dense()` for every matmul) give
    several candidates; the right one shares an operand with the backward op (the weight for
    the input cotangent, the saved activation for the weight cotangent), looked up through
    transposes, reshapes and casts.
    """
    eqns = program.eqns

    def origin(vid: int) -> int:
        while vid in producer and eqns[producer[vid]].primitive.name in _LAYOUT_OPS:
            vid = eqns[producer[vid]].invars[0]
        return vid

    candidates: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for op_id, eqn in enumerate(eqns):
        if roles[op_id] is Role.FORWARD:
            key = (eqn.primitive.name, eqn.source, jc.scope_of(eqn.name_stack))
            candidates[key].append(op_id)

    links: dict[int, int] = {}
    for op_id, eqn in enumerate(eqns):
        if roles[op_id] is not Role.BACKWARD:
            continue
        key = (eqn.primitive.name, eqn.source, jc.scope_of(eqn.name_stack))
        found = candidates.get(key, [])
        if len(found) == 1:
            links[op_id] = found[0]
        elif found:
            mine = {origin(v) for v in eqn.invars}
            shared = [
                len(mine & {origin(v) for v in (*eqns[f].invars, *eqns[f].outvars)}) for f in found
            ]
            best = max(range(len(found)), key=shared.__getitem__)
            if shared[best] > 0:
                links[op_id] = found[best]
    return links


# -- messages -------------------------------------------------------------------------------


def _name(step: Callable[..., Any]) -> str:
    return f"`{getattr(step, '__qualname__', getattr(step, '__name__', repr(step)))}`"


def _signature(step: Callable[..., Any]) -> str:
    try:
        return "(" + ", ".join(inspect.signature(step).parameters) + ")"
    except (TypeError, ValueError):
        return "(...)"


def _argument_path(path: Any) -> str:
    if not path:
        return "<args>"
    return f"#{path[0].idx}" + jax.tree_util.keystr(tuple(path[1:]))


def _describe(arg: Any) -> str:
    leaves = jax.tree_util.tree_leaves(arg)
    if len(leaves) == 1 and leaves[0] is arg:
        return f"{arg.dtype}{list(arg.shape)}"
    return f"{type(arg).__name__} of {len(leaves)} arrays"


def _first_lines(text: str, count: int = 6) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:count]) + ("\n..." if len(lines) > count else "")


def _user_frame(err: BaseException) -> str:
    """The innermost frame of the failing call that is neither JAX's nor ours."""
    jax_dir = os.path.dirname(jax.__file__)
    ours = os.path.dirname(__file__)
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not f.filename.startswith(jax_dir)
        and not (f.filename.startswith(ours) and "models" not in f.filename)
    ]
    if not frames:
        return "<inside JAX>"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} ({frame.name}): {frame.line}"
