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

Input roles are classified in `explorer.input_roles`; op roles, depths and backward-to-forward
links in `explorer.op_roles`.
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from explorer import _jax_compat as jc
from explorer.errors import ArgumentMismatchError, ExplorerError, InputError, TraceError
from explorer.input_roles import AMBIGUOUS_ROLES, _classify_inputs, _leaf_path
from explorer.ir import INPUT_KINDS, Graph, OpNode, TensorType, Value, ValueKind
from explorer.op_roles import _depths, _link_backward_to_forward, _op_roles

__all__ = ["AMBIGUOUS_ROLES", "ARG_ROLE_KINDS", "ArgRoles", "trace", "traced_again"]

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


def traced_again(graph: Any, step: Callable[..., Any], *example_args: Any) -> Graph:
    """`graph`, an earlier `trace(step, *example_args)` (an analysis' `.graph`), for another
    analysis of the same step without tracing it again (tracing a 7B model takes seconds).

    It is checked against the arguments: the same pytree structure and, leaf by leaf, the
    same shape and dtype. A graph of another step taking equal arguments cannot be told
    apart, so pass only one this step gave."""
    if not isinstance(graph, Graph):
        raise InputError(
            f"traced: expected the Graph an earlier analysis of this step traced (its "
            f"`.graph`), found {type(graph).__name__}"
        )
    _check_binds(step, example_args)
    abstract = _abstract(example_args)
    found = jax.tree_util.tree_structure(abstract)
    if graph.in_tree is not None and graph.in_tree != found:
        raise ArgumentMismatchError(
            f"traced: the graph was traced from arguments of another structure than those "
            f"given to {_name(step)}.\nexpected: {graph.in_tree}\nfound:    {found}"
        )
    leaves = jax.tree_util.tree_flatten_with_path(abstract)[0]
    if len(leaves) != len(graph.inputs):
        raise ArgumentMismatchError(
            f"traced: the graph has {len(graph.inputs)} inputs, the arguments given to "
            f"{_name(step)} have {len(leaves)} leaves"
        )
    for (path, leaf), vid in zip(leaves, graph.inputs, strict=True):
        want = graph.values[vid].type
        got = TensorType(tuple(leaf.shape), jc.dtype_name(leaf.dtype))
        if got != want:
            raise ArgumentMismatchError(
                f"traced: example argument {_argument_path(path)} is {got}, the graph was "
                f"traced with {want}"
            )
    return graph


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
