"""The role of each leaf of a training step's inputs (parameter, optimizer state, data, RNG):
declared by `arg_roles`, else inferred from what the step does with it (see `explorer.trace`'s
module doc for the rules)."""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from explorer import _jax_compat as jc
from explorer.errors import RoleWarning
from explorer.ir import Role, ValueKind

AMBIGUOUS_ROLES = (
    "{count} float input leaf/leaves are returned updated, but no gradient flows into the "
    "update (e.g. {examples}). They are treated as optimizer state: kept like the parameter "
    "whose path they end with, else replicated. If they are parameters or data, say so with "
    "`arg_roles`, e.g. `arg_roles=lambda path, leaf: 'data' if 'batch_stats' in path else None`."
)


def _leaf_path(path: Any, names: tuple[str, ...]) -> str:
    """`state.params['w']`: the argument's name, then the path inside it."""
    return names[path[0].idx] + jax.tree_util.keystr(tuple(path[1:]))


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
