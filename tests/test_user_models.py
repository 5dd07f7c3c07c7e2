"""Training steps written with Flax (linen, NNX, TrainState), Equinox and plain JAX: each
traces, its inputs get their roles per pytree leaf without hints, and every dense layer and
convolution heads a ParallelBlock. Nothing here profiles."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from user_models import BUILDERS, DEEP_BUILDERS, UserStep, linen_fused_qkv

import explorer as ex
from explorer import models
from explorer.blocks import build_blocks
from explorer.errors import ArgumentMismatchError, RoleWarning
from explorer.ir import CONTRACTION_PRIMITIVES, DimRole, Graph, OpNode, Role, ValueKind
from explorer.layouts import instance_dependencies
from explorer.segments import check_config_cap


@functools.cache
def _traced(name: str) -> tuple[UserStep, Graph]:
    user = BUILDERS[name]()
    return user, ex.trace(user.step, *user.args)


def _kinds(graph: Graph) -> dict[str, ValueKind]:
    return {graph.values[v].path: graph.values[v].kind for v in graph.inputs}


# -- roles per pytree leaf --------------------------------------------------------------------


@pytest.mark.parametrize("name", list(BUILDERS))
def test_roles_are_right_without_hints(name: str) -> None:
    user, graph = _traced(name)
    print(f"\n[{name}] {graph.summary()}\n{graph.role_summary()}")
    params = len(graph.inputs_of_kind(ValueKind.PARAMETER))
    assert params == user.param_leaves
    # AdamW: a step count and two moments per parameter (a TrainState adds its own step)
    counters = 2 if name == "train_state" else 1
    assert len(graph.inputs_of_kind(ValueKind.OPTIMIZER_STATE)) == 2 * params + counters
    data = [v.path for v in graph.inputs_of_kind(ValueKind.DATA)]
    assert data[0] == user.data_path
    assert "inferred" in graph.role_summary()


def test_a_train_state_is_classified_leaf_by_leaf() -> None:
    _, graph = _traced("train_state")
    kinds = _kinds(graph)
    assert kinds["state.step"] is ValueKind.OPTIMIZER_STATE  # a Python int in the state
    assert kinds["batch"] is ValueKind.DATA
    assert all(
        kind is ValueKind.PARAMETER
        for path, kind in kinds.items()
        if path.startswith("state.params")
    )
    assert all(
        kind is ValueKind.OPTIMIZER_STATE
        for path, kind in kinds.items()
        if path.startswith("state.opt_state")
    )


@pytest.mark.parametrize("name", ["gpt", "moe"])
def test_inferred_roles_agree_with_the_zoo_declared_ones(name: str) -> None:
    model = ex.models.build(name, "tiny", abstract=True)
    step, args = model.step, model.args
    declared = ex.trace(step, *args)
    inferred = ex.trace(functools.partial(step), *args)  # a partial hides the declared roles
    assert "declared" in declared.role_summary() and "inferred" in inferred.role_summary()
    assert _kinds(inferred) == _kinds(declared)


def _running_mean_step(params: Any, stats: jax.Array, x: jax.Array) -> Any:
    """A step carrying a running mean of its inputs: updated, float, and no gradient in it."""

    def loss(p: Any) -> jax.Array:
        return jnp.mean((x @ p["w"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return value, params, 0.9 * stats + 0.1 * x.mean(axis=0)


def _running_mean_args() -> tuple[Any, ...]:
    return {"w": jnp.ones((4, 2))}, jnp.zeros(4), jnp.ones((3, 4))


def test_a_float_leaf_updated_without_a_gradient_is_a_warning_not_a_guess() -> None:
    with pytest.warns(RoleWarning, match=r"no gradient flows into the update \(e.g. stats\)"):
        graph = ex.trace(_running_mean_step, *_running_mean_args())
    kinds = _kinds(graph)
    assert kinds == {
        "params['w']": ValueKind.PARAMETER,
        "stats": ValueKind.OPTIMIZER_STATE,
        "x": ValueKind.DATA,
    }
    assert "no gradient flows" in graph.role_summary()


@pytest.mark.parametrize(
    "arg_roles",
    [
        (None, "data", None),  # a pytree prefix: None leaves the rest to inference
        ("params", "data", "data"),  # the positional form
        lambda path, leaf: "data" if path == "stats" else None,  # a callable per leaf
    ],
    ids=["prefix", "positional", "callable"],
)
def test_declared_roles_override_the_inference_and_silence_the_warning(arg_roles: Any) -> None:
    graph = ex.trace(_running_mean_step, *_running_mean_args(), arg_roles=arg_roles)
    assert _kinds(graph)["stats"] is ValueKind.DATA
    assert _kinds(graph)["params['w']"] is ValueKind.PARAMETER


def test_a_nested_prefix_declares_part_of_an_argument() -> None:
    user, _ = _traced("train_state")
    state = user.args[0]
    prefix = state.replace(step="opt_state", params="params", opt_state=None)
    graph = ex.trace(user.step, *user.args, arg_roles=(prefix, None))
    assert "declared" in graph.role_summary()
    assert len(graph.inputs_of_kind(ValueKind.PARAMETER)) == user.param_leaves


@pytest.mark.parametrize(
    ("arg_roles", "match"),
    [
        (("params", "weights", "data"), r"unknown argument role\(s\) \['weights'\] for stats"),
        (("params", "data"), r"one role per step argument \(3 arguments\), found 2 roles"),
        (({"v": "params"}, "data", "data"), "arg_roles for argument 'params' is not a pytree"),
    ],
)
def test_bad_declared_roles_say_what_was_expected(arg_roles: Any, match: str) -> None:
    with pytest.raises(ArgumentMismatchError, match=match):
        ex.trace(_running_mean_step, *_running_mean_args(), arg_roles=arg_roles)


# -- every dense layer and convolution heads a block ------------------------------------------


def _parameter_derived(graph: Graph) -> list[bool]:
    """Values computed from parameters alone outside the backward pass (casts, transposes)."""
    derived = [v.kind is ValueKind.PARAMETER for v in graph.values]
    for op in graph.ops:
        if op.role is Role.BACKWARD or op.primitive in CONTRACTION_PRIMITIVES:
            continue
        sources = [v for v in op.inputs if graph.values[v].kind is not ValueKind.CONSTANT]
        if sources and all(derived[v] for v in sources):
            for vid in op.outputs:
                derived[vid] = True
    return derived


def _layers(graph: Graph) -> list[OpNode]:
    """The dense layers and convolutions: forward contractions reading a weight."""
    derived = _parameter_derived(graph)
    return [
        op
        for op in graph.contractions()
        if op.role is Role.FORWARD and any(derived[v] for v in op.inputs)
    ]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_dense_layer_and_conv_heads_a_block(name: str) -> None:
    _, graph = _traced(name)
    analysis = build_blocks(graph, 4)
    print(f"\n[{name}] {analysis.summary(graph)}")
    layers = _layers(graph)
    heads = {block.head for block in analysis.blocks}
    assert [op.id for op in layers] == sorted(heads)
    # 6 per decoder layer (q, k, v, out, MLP in and out) and the LM head; 3 convs and a head;
    # 2 per scanned MLP layer and the head
    assert len(layers) == {"cnn": 4, "linen_scan": 5}.get(name, 13)
    # the attention's own contractions (scores, weighted values) join a block too
    forward = [op for op in graph.contractions() if op.role is Role.FORWARD]
    assert all(analysis.block_of_op[op.id] is not None for op in forward)


def test_a_fused_qkv_projection_offers_head_parallelism() -> None:
    user = linen_fused_qkv()
    graph = ex.trace(user.step, *user.args)
    analysis = build_blocks(graph, 4)
    qkv = next(block for block in analysis.blocks if block.scope.endswith("qkv"))
    head = graph.ops[qkv.head]
    assert head.input_types[1].shape == (64, 3, 4, 16)
    assert dict(qkv.role_sizes)[DimRole.N] == 4  # the heads, not the size-3 q/k/v dim
    result = qkv.layout_of(head.outputs[0])
    assert result is not None and result.dim_of(DimRole.N) == 3
    assert any("size 3" in note for note in qkv.role_notes)
    # the attention's score and value contractions carry the heads split
    assert sum(graph.ops[o].primitive == "dot_general" for o in qkv.forward_ops) == 3


# -- repeats found from structure, bounded profiling ------------------------------------------


@pytest.mark.parametrize("name", list(DEEP_BUILDERS))
def test_repeated_layers_are_recognised_whatever_the_depth(name: str) -> None:
    """Program count (the paper's Eq. 7) is the same at 2 and 4 layers: every layer after
    the first is a repeat, found from structure (Flax loops, remat and `nn.scan`, NNX
    without a name stack, Equinox), and no unique segment exceeds the configuration cap."""
    counts, summaries = {}, {}
    for layers in (2, 4):
        user = DEEP_BUILDERS[name](layers)
        analysis = ex.analyze(user.step, *user.args, mesh=(4,), profile=False)
        counts[layers] = analysis.program_count
        summaries[layers] = analysis.segments.summary()
        assert analysis.segments.reuse_found
        check_config_cap(analysis.segments, analysis.block_analysis)
    print(f"\n[{name}] programs {counts}\n{summaries[4]}")
    assert counts[2] == counts[4]
    assert counts[4] <= 320


def test_remat_recomputation_joins_the_blocks_it_recomputes() -> None:
    """Under `nn.remat` the recomputed forward ops are linked to the forward op they repeat
    and join its block, like its backward ops."""
    _, graph = _traced("linen_remat")
    analysis = build_blocks(graph, 4)
    forward_dots = [op for op in graph.contractions() if op.role is Role.FORWARD]
    for op in graph.contractions():
        if op.role is Role.BACKWARD:
            assert op.forward_op is not None, str(op)
    for block in analysis.blocks:
        assert block.backward_ops, f"block {block.index} has no backward op"
    # two transposes per forward contraction, plus one recomputation inside each layer
    backward = [op for op in graph.contractions() if op.role is Role.BACKWARD]
    assert len(backward) > 2 * len(forward_dots)


def test_remat_costs_no_more_programs_or_dependencies_than_the_plain_model() -> None:
    """What the backward pass recomputes under `nn.remat` and hands to the next layer (its
    norm's output) is an activation crossing a boundary, like the forward value it repeats,
    not a value the next layer reads from outside: the rematted step has the plain step's
    segment programs and instance dependencies. (Its boundaries carry the recomputed value
    too, so a few resharding programs move more than the plain step's: 108 against 105.)"""
    found = {}
    for name in ("linen", "linen_remat"):
        user = BUILDERS[name]()
        analysis = ex.analyze(user.step, *user.args, mesh=(4,), profile=False)
        dependencies = instance_dependencies(
            analysis.graph, analysis.block_analysis, analysis.segments, analysis.mesh
        )
        counts = analysis.program_counts
        found[name] = (counts.segment_programs, [len(d) for d in dependencies])
        crossing = {v for b in analysis.segments.boundaries for v in b.forward}
        made_backward = {v for v in crossing if analysis.graph.producer(v).role is Role.BACKWARD}
        if name == "linen":
            assert not made_backward
        else:
            assert made_backward, "no recomputed value crosses a boundary"
    assert found["linen_remat"] == found["linen"], found


def test_an_applied_plan_keeps_the_steps_rematerialisation() -> None:
    """`jax.checkpoint` lowers its recomputation behind an optimization barrier; without one
    XLA finds the recomputed ops equal to the forward ops they repeat and keeps the forward
    results, so nothing would be rematerialised. A plan applied to a rematted step keeps the
    barriers (one per checkpointed layer, as `jax.jit` of the step has), a plain step gets
    none, and the applied step computes what the step computes."""
    for remat in (False, True):
        model = models.build("gpt", "tiny", layers=2, remat=remat)
        plan = ex.analyze(model.step, *model.args, mesh=(4,), profile=False).baseline("dp")
        applied = ex.apply_plan(plan, model.step, donate=False)
        barriers = applied.lower(*model.args).as_text().count("optimization_barrier")
        expected = jax.jit(model.step).lower(*model.args).as_text().count("optimization_barrier")
        assert barriers == expected == (2 if remat else 0), (remat, barriers, expected)
        for got, want in zip(
            jax.tree.leaves(applied(*model.args)),
            jax.tree.leaves(jax.jit(model.step)(*model.args)),
            strict=True,
        ):
            # atol: attention's key bias has a pure rounding-noise gradient (softmax does not
            # see it); sharded and unsharded sums round it apart, by ~1e-6 after one step
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_a_rematted_layer_cut_in_parts_costs_no_more_segment_programs() -> None:
    """A MoE layer is cut in parts over the configuration cap, each part a segment of one
    scope. Under remat the backward part recomputes the whole layer: what one part's
    recomputation hands the next (the router's gates and dispatch) is an activation crossing
    a boundary, even where a recomputed op matches no forward op (the router's top-2 choice
    does not), so the rematted step has the plain step's segment programs and dependencies.
    It once had 7x the programs (336 -> 2466): the parts read those values as if made far
    away and took their blocks as context."""
    found = {}
    for remat in (False, True):
        model = models.build("moe", "tiny", layers=4, remat=remat, abstract=True)
        analysis = ex.analyze(model.step, *model.args, mesh=(4,), profile=False)
        assert any("part" in i.label for i in analysis.segments.instances)  # cut in parts
        dependencies = instance_dependencies(
            analysis.graph, analysis.block_analysis, analysis.segments, analysis.mesh
        )
        found[remat] = (analysis.program_counts.segment_programs, dependencies)
    assert found[True] == found[False], found
