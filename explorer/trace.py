"""Trace a training step into a flat `Graph` of primitive ops.

One pass: abstract the example arguments, take the jaxpr of the whole step, inline every
call-like primitive (via `_jax_compat`), then annotate each op with its role (forward,
backward, optimizer), its scope, its depth and, for backward ops, the forward op it was
derived from, and classify the step's inputs (parameter, optimizer state, data, RNG).
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from explorer import _jax_compat as jc
from explorer.errors import ArgumentMismatchError, ExplorerError, TraceError
from explorer.ir import Graph, OpNode, Role, TensorType, Value, ValueKind

ARG_ROLE_KINDS = {
    "params": ValueKind.PARAMETER,
    "opt_state": ValueKind.OPTIMIZER_STATE,
    "data": ValueKind.DATA,
    "rng": ValueKind.RNG,
}

# Ops that only move or retype data: looked through when matching a backward op to the
# forward op that shares its operands.
_LAYOUT_OPS = frozenset({"transpose", "reshape", "convert_element_type", "copy", "copy_p"})


def trace(
    step: Callable[..., Any],
    *example_args: Any,
    arg_roles: Sequence[str] | None = None,
) -> Graph:
    """Trace `step(*example_args)` into a flat Graph.

    `example_args` may be arrays or `jax.ShapeDtypeStruct`s (nothing is computed or
    allocated). `arg_roles` names each positional argument's role (`params`, `opt_state`,
    `data`, `rng`); by default it is read from `step.explorer_arg_roles` (set by the model zoo)
    or taken as `(params, opt_state, data, ...)`, with PRNG keys recognised by dtype.
    """
    roles = _arg_roles(step, example_args, arg_roles)
    abstract_args = _abstract(example_args)
    _check_against_spec(step, abstract_args)
    closed_jaxpr, out_shape = _make_jaxpr(step, abstract_args)
    program = jc.flatten(closed_jaxpr)
    names = _arg_names(step, len(example_args), roles)
    return _build_graph(program, abstract_args, roles, names, out_shape)


# -- arguments ------------------------------------------------------------------------------


def _arg_roles(
    step: Callable[..., Any], args: Sequence[Any], arg_roles: Sequence[str] | None
) -> tuple[str, ...]:
    try:
        inspect.signature(step).bind(*args)
    except TypeError as err:
        raise ArgumentMismatchError(
            f"the step {_name(step)}{_signature(step)} cannot take the {len(args)} example "
            f"argument(s) given: {err}"
        ) from None
    except ValueError:
        pass  # builtins and some wrappers have no signature: let tracing decide
    roles = arg_roles if arg_roles is not None else getattr(step, "explorer_arg_roles", None)
    if roles is None:
        roles = ("params", "opt_state", *("data",) * max(0, len(args) - 2))[: len(args)]
    roles = tuple(roles)
    if len(roles) != len(args):
        raise ArgumentMismatchError(
            f"expected one role per step argument ({len(args)} arguments), found "
            f"{len(roles)} roles: {roles}"
        )
    unknown = [r for r in roles if r not in ARG_ROLE_KINDS]
    if unknown:
        raise ArgumentMismatchError(
            f"unknown argument role(s) {unknown}; expected one of {sorted(ARG_ROLE_KINDS)}"
        )
    return roles


def _arg_names(step: Callable[..., Any], count: int, roles: tuple[str, ...]) -> tuple[str, ...]:
    """Names for input paths: the step's own parameter names where it has them."""
    try:
        params = list(inspect.signature(step).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= count:
        return tuple(positional[:count])
    return tuple(f"{role}{index}" for index, role in enumerate(roles))


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
    roles: tuple[str, ...],
    names: tuple[str, ...],
    out_shape: Any,
) -> Graph:
    input_kind_and_path = _classify_inputs(args, roles, names)
    producer: dict[int, int] = {}
    for op_id, eqn in enumerate(program.eqns):
        for vid in eqn.outvars:
            producer[vid] = op_id

    values = []
    input_info = dict(zip(program.invars, input_kind_and_path, strict=True))
    for vid, (shape, dtype) in enumerate(program.avals):
        ttype = TensorType(shape, dtype)
        if vid in input_info:
            kind, path = input_info[vid]
            values.append(Value(vid, ttype, kind, None, path))
        elif vid in producer:
            values.append(Value(vid, ttype, ValueKind.INTERMEDIATE, producer[vid]))
        else:
            values.append(Value(vid, ttype, ValueKind.CONSTANT))

    roles_of = _op_roles(program, producer)
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
        output_paths=tuple(
            jax.tree_util.keystr(path)
            for path, _ in jax.tree_util.tree_flatten_with_path(out_shape)[0]
        ),
        out_tree=jax.tree_util.tree_structure(out_shape),
    )


def _classify_inputs(
    args: tuple[Any, ...], roles: tuple[str, ...], names: tuple[str, ...]
) -> list[tuple[ValueKind, str]]:
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        role, name = roles[path[0].idx], names[path[0].idx]
        kind = ARG_ROLE_KINDS[role]
        if kind is ValueKind.DATA and _looks_like_key(leaf):
            kind = ValueKind.RNG
        out.append((kind, name + jax.tree_util.keystr(tuple(path[1:]))))
    return out


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
