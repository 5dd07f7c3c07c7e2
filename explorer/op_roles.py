"""Per op of a traced step: its role (forward, backward, optimizer), its depth, and for a
backward op the forward op it was derived from."""

from __future__ import annotations

from collections import defaultdict

from explorer import _jax_compat as jc
from explorer.ir import Role

# Ops that only move or retype data: looked through when matching a backward op to the
# forward op that shares its operands (`rev`: a conv's input gradient reads the kernel flipped).
_LAYOUT_OPS = frozenset({"transpose", "reshape", "convert_element_type", "copy", "copy_p", "rev"})


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
