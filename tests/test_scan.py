"""Steps whose layers are a `scan` (Flax `nn.scan`, `jax.lax.scan`): the tracer unrolls the
loop and remembers it, the analysis sees one repeated layer per iteration, and an applied plan
keeps the loop (a `while` in the compiled program) and computes what the unsharded step does."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import SHARED_CACHE, assert_trees_close
from scan_models import ScanStep, scanned_decoder, scanned_mlp

import explorer as ex
from explorer import _jax_compat as jc
from explorer.baselines import baseline_choices
from explorer.errors import UnsupportedPrimitiveError
from explorer.ir import Config, Graph, Role, ValueKind
from explorer.layouts import loop_twins, place, twin_config
from explorer.plan import PlanError, make_plan
from explorer.profile.runner import distinct_programs

RTOL = ATOL = 1e-5  # as in test_plan: compared on the second AdamW step


@functools.cache
def _scanned(kind: str, layers: int) -> tuple[ScanStep, Graph]:
    user = {"decoder": scanned_decoder, "mlp": scanned_mlp}[kind](layers)
    return user, ex.trace(user.step, *user.args)


@functools.cache
def _warm(kind: str, layers: int = 2) -> tuple[ScanStep, tuple[Any, ...], Any]:
    """The arguments of the second AdamW step, and what the unsharded step returns there."""
    user, _ = _scanned(kind, layers)
    plain = jax.jit(user.step)
    _, params, opt_state = plain(*user.args)
    warm = (params, opt_state, user.args[2])
    return user, warm, plain(*warm)


def _ops_by_role(graph: Graph) -> dict[Role, int]:
    return {role: len(graph.ops_with_role(role)) for role in Role}


# -- tracing --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mlp", "decoder"])
def test_the_scan_unrolls_into_the_same_ops_per_layer(kind: str) -> None:
    sizes = {}
    for layers in (2, 3, 4):
        _, graph = _scanned(kind, layers)
        sizes[layers] = _ops_by_role(graph)
        forward, backward = graph.loops  # the layers' scan and its transpose
        assert (forward.length, forward.reverse) == (layers, False)
        assert (backward.length, backward.reverse) == (layers, True)
        assert [it.index for it in backward.iterations] == list(range(layers - 1, -1, -1))
        for loop in graph.loops:
            lengths = {it.stop - it.start for it in loop.iterations}
            assert len(lengths) == 1, lengths  # every iteration inlines the same body
            assert loop.start <= loop.iterations[0].start
            assert loop.iterations[-1].stop <= loop.stop
    per_layer = {role: sizes[3][role] - sizes[2][role] for role in Role}
    assert per_layer[Role.FORWARD] > 0 and per_layer[Role.BACKWARD] > 0
    for role in Role:  # ops per layer x layers: depth adds the same ops per layer
        assert sizes[4][role] - sizes[3][role] == per_layer[role], role
    contractions = {n: sum(1 for _ in _scanned(kind, n)[1].contractions()) for n in (2, 4)}
    per_layer_dots = {"mlp": 2 * 3, "decoder": 8 * 3}[kind]  # forward + 2 backward each
    assert contractions[4] - contractions[2] == 2 * per_layer_dots


def test_each_iteration_records_its_body_values_and_scopes_stay_readable() -> None:
    _, graph = _scanned("decoder", 2)
    forward = graph.loops[0]
    body = forward.params["jaxpr"].jaxpr
    for iteration in forward.iterations:
        assert len(iteration.inputs) == len(body.invars)
        assert len(iteration.outputs) == len(body.outvars)
        assert len(iteration.values) == sum(len(e.outvars) for e in body.eqns)
    dense = [
        op
        for op in graph.contractions()
        if op.role is Role.FORWARD and op.scope == "ScannedDecoder/layers/Dense_0"
    ]
    assert len(dense) == 2  # one per iteration, in the scan's scope
    assert forward.iteration_of(dense[1].id) == (1, dense[0].id - forward.iterations[0].start)


def test_a_step_without_scan_records_no_loop() -> None:
    def step(w: jax.Array, x: jax.Array) -> jax.Array:
        return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

    graph = ex.trace(step, jnp.ones((4, 4)), jnp.ones((2, 4)))
    assert graph.loops == () and graph.program.loops == ()


def test_the_unrolled_and_the_looped_program_compute_the_step() -> None:
    user, graph = _scanned("decoder", 2)
    flat = jax.tree.leaves(user.args)
    expected = jax.tree.leaves(jax.jit(user.step)(*user.args))
    for keep_loops in (False, True):
        found = jax.jit(lambda *a, k=keep_loops: jc.evaluate(graph.program, a, keep_loops=k))(*flat)
        for a, b in zip(expected, found, strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-4)


def test_nested_and_reverse_scans_keep_their_results() -> None:
    def step(w: jax.Array, x: jax.Array) -> Any:
        def outer(h: jax.Array, w_row: jax.Array) -> tuple[jax.Array, jax.Array]:
            def inner(g: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
                return jnp.tanh(g * v), g.sum()

            h, sums = jax.lax.scan(inner, h, w_row, reverse=True)
            return h, sums

        def loss(w: jax.Array) -> jax.Array:
            h, sums = jax.lax.scan(outer, x, w)
            return h.sum() + sums.sum()

        return jax.value_and_grad(loss)(w)

    w = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 5))
    x = jnp.linspace(0.0, 1.0, 5)
    graph = ex.trace(step, w, x)
    assert sorted(loop.depth for loop in graph.loops) == [0, 0, 1, 1, 1, 1, 1, 1]
    expected = jax.tree.leaves(step(w, x))
    for keep_loops in (False, True):
        found = jax.jit(lambda *a, k=keep_loops: jc.evaluate(graph.program, a, keep_loops=k))(w, x)
        for a, b in zip(expected, found, strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_a_carry_initialised_with_a_const_keeps_its_own_value() -> None:
    def step(x: jax.Array) -> Any:
        def body(carry: Any, _: Any) -> tuple[Any, None]:
            a, b = carry
            return (a * 2.0 + x, b), None

        return jax.lax.scan(body, (x, x), None, length=3)[0]

    x = jnp.arange(4.0)
    graph = ex.trace(step, x)
    found = jax.jit(lambda a: jc.evaluate(graph.program, (a,), keep_loops=True))(x)
    for a, b in zip(jax.tree.leaves(step(x)), found, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a))


# -- analysis -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mlp", "decoder"])
def test_the_program_count_does_not_grow_with_the_scan_length(kind: str) -> None:
    """Every iteration reads the stacked parameters, whose one layout all iterations' blocks
    decide: a dependency on the same block of another iteration is one on its own strategy
    (`layouts.loop_twins`), so no segment is profiled once per strategy of the others."""
    counts = {}
    per_layer = {"mlp": 2, "decoder": 6}[kind]  # blocks; the decoder adds its head
    for layers in (2, 3, 4):
        user, _ = _scanned(kind, layers)
        analysis = ex.analyze(user.step, *user.args, mesh=(4,), profile=False)
        assert len(analysis.blocks) == layers * per_layer + (kind == "decoder")
        counts[layers] = analysis.program_counts
        twins = loop_twins(analysis.graph, analysis.blocks)
        assert twins[: layers * per_layer] == tuple(range(per_layer)) * layers
    # the segment programs are the same at every length; from 3 layers on so is every
    # boundary (2 layers have no boundary between two instances of the later layers' type).
    # Every iteration is one type, but for the MLP's first, which reads the step's data and
    # makes no input cotangent; the stacked parameters' updates are segments of their own.
    assert counts[2].segment_programs == counts[3].segment_programs == counts[4].segment_programs
    assert counts[2].total <= counts[3].total == counts[4].total
    assert counts[4].total <= {"mlp": 36, "decoder": 512}[kind]  # was 756 and 236,370


def test_a_later_iteration_is_profiled_with_the_stacked_parameters_a_uniform_plan_places() -> None:
    """The stacked parameters take their layout from the first iteration's blocks; a segment
    type whose first instance is a later iteration is profiled with those twins on its own
    strategies (`twin_config`), as the uniform plan that picks it places them."""
    user, graph = _scanned("mlp", 2)
    analysis = ex.analyze(user.step, *user.args, mesh=(4,), profile=False)
    blocks, segments = analysis.blocks, analysis.segments
    twins = loop_twins(graph, blocks)
    # iteration 1: the first of its type (iteration 0 reads the data, a type of its own)
    later = next(i for i in segments.instances if i.blocks and twins[i.blocks[0]] != i.blocks[0])
    assert [i.unique_id for i in segments.instances].index(later.unique_id) == later.index
    assert all(twins[b] != b for b in later.blocks)
    choices = tuple(len(blocks[b].strategies) - 1 for b in later.blocks)  # not strategy 0
    config = twin_config(twins, later.blocks, choices)
    uniform = dict(zip((twins[b] for b in later.blocks), choices, strict=True))
    assert config == Config(tuple(uniform[t] for t in twins))
    alone = [0] * len(blocks)
    for block, choice in zip(later.blocks, choices, strict=True):
        alone[block] = choice

    def stacked(config: Config) -> list[Any]:
        inputs = place(graph, blocks, config, analysis.mesh, segments).assignment.inputs
        return [dims for vid, dims in zip(graph.inputs, inputs, strict=True)
                if graph.values[vid].kind is ValueKind.PARAMETER]  # fmt: skip

    assert any(any(dims) for dims in stacked(config))  # split as the later blocks say
    assert stacked(config) != stacked(Config(tuple(alone)))  # iteration 0's blocks decide


# -- applying a plan ------------------------------------------------------------------------


def _baseline_plan(name: str, user: ScanStep, args: tuple[Any, ...]) -> Any:
    """A DP or Megatron plan built from its block configuration, without profiling."""
    analysis = ex.analyze(user.step, *args, mesh=(4,), profile=False)
    choices = baseline_choices(name, analysis.block_analysis, analysis.segments)
    return make_plan(
        source=name,
        graph=analysis.graph,
        blocks=analysis.block_analysis,
        segments=[],
        config=Config(choices),
        mesh=analysis.mesh,
        platform="a100-pcie-8",
        backend="compiled",
        time=0.0,
        memory=0,
        memory_eq9=0,
        budget=None,
    )


@pytest.mark.parametrize(("kind", "name"), [("decoder", "dp"), ("decoder", "megatron"),
                                            ("mlp", "megatron")])  # fmt: skip
def test_an_applied_plan_keeps_the_scan_and_matches_the_unsharded_step(
    kind: str, name: str
) -> None:
    user, warm, expected = _warm(kind)
    plan = _baseline_plan(name, user, warm)
    wanted = {"dp": {"M@x"}, "megatron": {"N@x", "K@x"}}[name]
    assert wanted <= set(plan.strategies)
    sharded = ex.apply_plan(plan, user.step, donate=False)
    assert_trees_close(expected, sharded(*warm), RTOL, ATOL)
    hlo = sharded.lower(*warm).compile().as_text()
    assert " while(" in hlo  # the scan stays a loop: not unrolled


def test_a_profiled_plan_keeps_the_scan_computes_the_step_and_predicts_it() -> None:
    """Profile the scanned MLP, apply the plan chosen, and check it against the unsharded
    step (numbers), the compiled program (the loop stays) and the whole step (time)."""
    user, warm, expected = _warm("mlp")
    analysis = ex.analyze(
        user.step, *warm, mesh=(4,), platform="a100-pcie-8", cache=SHARED_CACHE, progress=False
    )
    assert distinct_programs(analysis.profiles) == analysis.program_count
    plan = analysis.plan()
    twins = loop_twins(analysis.graph, analysis.blocks)
    assert all(plan.strategies[b] == plan.strategies[t] for b, t in enumerate(twins))
    sharded = ex.apply_plan(plan, user.step, donate=False)
    assert " while(" in sharded.lower(*warm).compile().as_text()
    assert_trees_close(expected, sharded(*warm), RTOL, ATOL)
    truth = ex.evaluate(plan, user.step, *warm)
    error = (plan.time - truth.time) / truth.time
    print(f"scanned MLP {plan.strategies}: predicted {plan.time:.3e} s, whole step "
          f"{truth.time:.3e} s ({error:+.2%}); memory {plan.memory} vs {truth.memory}")  # fmt: skip
    assert abs(error) < 0.05


def test_a_plan_giving_two_iterations_different_strategies_is_refused() -> None:
    user, warm, _ = _warm("mlp")
    plan = _baseline_plan("dp", user, warm)
    blocks = list(plan.blocks)
    blocks[2] = replace(blocks[2], strategy="N@x")  # the second layer's first block
    mixed = replace(plan, blocks=tuple(blocks))
    with pytest.raises(PlanError, match=r"iteration 1 of the scan at .*scan_models"):
        ex.apply_plan(mixed, user.step, donate=False)(*warm)


# -- what stays refused ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("primitive", "body"),
    [
        ("while", lambda x: jax.lax.while_loop(lambda c: c.sum() < 10, lambda c: c * 2, x).sum()),
        (
            "while",
            lambda x: jax.lax.fori_loop(0, x.astype(jnp.int32)[0], lambda i, c: c * 2, x).sum(),
        ),
        ("cond", lambda x: jax.lax.cond(x.sum() > 0, jnp.sum, jnp.mean, x)),
        (
            "while",
            lambda x: jax.lax.scan(
                lambda c, a: (jax.lax.while_loop(lambda v: v < a, lambda v: v * 2, c), c), 1.0, x
            )[0],
        ),
    ],
)
def test_data_dependent_control_flow_is_refused_with_a_clear_error(
    primitive: str, body: Any
) -> None:
    def step(params: Any, x: jax.Array) -> Any:
        return body(x * params)

    with pytest.raises(UnsupportedPrimitiveError) as info:
        ex.trace(step, jnp.ones(()), jnp.ones(5))
    message = str(info.value)
    assert f"`{primitive}`" in message and "test_scan.py" in message
    assert "`jax.lax.scan`" in message and "Python `for` loop" in message
    assert isinstance(info.value, ex.ExplorerError)


def test_a_scan_too_long_to_unroll_is_refused() -> None:
    def step(x: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, _: (jnp.sin(c) * 2.0, None), x, None, length=200_000)[0]

    with pytest.raises(UnsupportedPrimitiveError, match=r"more than 100000 primitive ops"):
        ex.trace(step, jnp.ones(3))
