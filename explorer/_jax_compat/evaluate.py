"""Re-executing a `FlatProgram` primitive by primitive, unrolled or with its scans kept."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax._src import source_info_util

from explorer._jax_compat.plain import remat_region
from explorer._jax_compat.program import FlatProgram, LoopRegion


def evaluate(
    program: FlatProgram,
    args: Sequence[Any],
    on_value: Callable[[int, Any], Any] | None = None,
    on_operand: Callable[[int, int, Any], Any] | None = None,
    *,
    keep_loops: bool = False,
    rebind: Mapping[int, Callable[[Any, list[Any]], Any]] | None = None,
) -> list[Any]:
    """Re-execute a flat program by binding each primitive in order.

    `on_value(value_id, array)` may return a replacement for an op result (e.g. the array
    with a sharding constraint); `on_operand(eqn_index, position, array)` may replace what one
    op reads without changing what other readers see. `rebind[eqn_index](eqn, operands)`
    computes an equation's results in place of binding its primitive (the same numbers,
    computed otherwise: a contraction whose partial sums are reduce-scattered explicitly).

    With `keep_loops`, each unrolled scan (`program.loops`) runs as a `jax.lax.scan` again:
    its body is the first iteration's equations, with that iteration's hooks (value ids and
    equation indices), so every iteration takes the first one's layouts. Without it the
    program runs unrolled: that is what whole-step pricing and segment programs compile,
    because XLA's cost analysis counts a while loop's body once, not once per trip.
    """
    env: dict[int, Any] = dict(program.constants)
    env.update(zip(program.invars, args, strict=True))
    runner = _Runner(program, on_value, on_operand, keep_loops, rebind or {})
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
        rebind: Mapping[int, Callable[[Any, list[Any]], Any]],
    ) -> None:
        self.program = program
        self.on_value = on_value
        self.on_operand = on_operand
        self.rebind = rebind
        # rematerialisation: per value, the remat region whose recomputation made it (None:
        # made elsewhere); per region, what it reads from outside, in the order first read;
        # per (region, value), that value behind the region's optimization barrier
        self.region_of = [remat_region(eqn.name_stack) for eqn in program.eqns]
        self.made_in: dict[int, str | None] = {}
        self.reads: dict[str, list[int]] = {}
        for eqn, region in zip(program.eqns, self.region_of, strict=True):
            if region is not None:
                outside = self.reads.setdefault(region, [])
                fresh = [v for v in eqn.invars if self.made_in.get(v) != region]
                outside += [v for v in dict.fromkeys(fresh) if v not in outside]
            self.made_in.update((v, region) for v in eqn.outvars)
        self.shielded: dict[tuple[str, int], Any] = {}
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
            operands = [self.operand(v, env, self.region_of[index]) for v in eqn.invars]
            if self.on_operand is not None:
                operands = [self.on_operand(index, p, x) for p, x in enumerate(operands)]
            # Re-enter the original name stack so compiled HLO metadata keeps the user's
            # scopes and the forward/backward marks (`transpose(jvp(...))`) profiling relies on.
            with source_info_util.set_name_stack(_name_stacks(eqn.name_stack)):
                instead = self.rebind.get(index)
                if instead is not None:
                    results = instead(eqn, operands)
                else:
                    results = eqn.primitive.bind(*operands, **eqn.params)
            if not eqn.primitive.multiple_results:
                results = (results,)
            for vid, result in zip(eqn.outvars, results, strict=True):
                env[vid] = self.value(vid, result)
            index += 1

    def operand(self, vid: int, env: dict[int, Any], region: str | None) -> Any:
        """What an equation reads: a recomputation under remat reads what its region did not
        make through an optimization barrier, as `jax.checkpoint` lowers it. Without one XLA
        finds the recomputed ops equal to the forward ops they repeat and keeps the forward
        results instead: the rematerialisation the user asked for would be undone."""
        if region is None or self.made_in.get(vid) == region:
            return env[vid]
        if (region, vid) not in self.shielded:
            # one barrier over everything the region reads that exists by now (JAX puts one
            # over the checkpointed call's arguments)
            ready = [v for v in self.reads[region] if v in env and (region, v) not in self.shielded]
            shielded = jax.lax.optimization_barrier(tuple(env[v] for v in ready))
            self.shielded.update(((region, v), x) for v, x in zip(ready, shielded, strict=True))
        return self.shielded[(region, vid)]

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
