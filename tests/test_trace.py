"""Tracing: inlining, roles, backward links, input classes and errors on bad input."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import networkx as nx
import optax
import pytest

import explorer as ex
from explorer.errors import ArgumentMismatchError, TraceError, UnsupportedPrimitiveError
from explorer.ir import Role, ValueKind

OPT = optax.adamw(1e-3)


def _dense(x: jax.Array, w: jax.Array) -> jax.Array:
    return x @ w  # one helper for every matmul: backward links must still be unambiguous


def _mlp_loss(params: list[dict[str, jax.Array]], x: jax.Array, key: jax.Array) -> jax.Array:
    for i, layer in enumerate(params):
        with jax.named_scope(f"layer_{i}"):
            h = jax.nn.gelu(_dense(x, layer["w1"]))
            h = jax.checkpoint(lambda a: a * jax.nn.sigmoid(a))(h)
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.9, h.shape)
            x = _dense(h * keep, layer["w2"]) + x
    return jnp.mean(x**2)


def _mlp_step(params: Any, opt_state: Any, x: jax.Array, key: jax.Array) -> Any:
    loss, grads = jax.value_and_grad(_mlp_loss)(params, x, key)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def _mlp_args(layers: int = 2) -> tuple[Any, ...]:
    params = [{"w1": jnp.full((4, 8), 0.1), "w2": jnp.full((8, 4), 0.1)} for _ in range(layers)]
    return params, OPT.init(params), jnp.ones((3, 4)), jax.random.PRNGKey(0)


def test_hand_written_step_is_inlined_and_classified() -> None:
    graph = ex.trace(_mlp_step, *_mlp_args())
    primitives = {op.primitive for op in graph.ops}
    # jit (random), custom_jvp_call (gelu, sigmoid) and remat2 (checkpoint) are inlined away
    assert not primitives & {"jit", "pjit", "custom_jvp_call", "remat2", "checkpoint"}
    kinds = {graph.values[v].path: graph.values[v].kind for v in graph.inputs}
    assert kinds["params[0]['w1']"] is ValueKind.PARAMETER
    assert kinds["opt_state[0].count"] is ValueKind.OPTIMIZER_STATE
    assert kinds["x"] is ValueKind.DATA
    assert kinds["key"] is ValueKind.RNG
    assert len(graph.inputs_of_kind(ValueKind.PARAMETER)) == 4


def test_roles_partition_ops_and_scopes_survive_inlining() -> None:
    graph = ex.trace(_mlp_step, *_mlp_args())
    counts = graph.role_counts()
    assert sum(counts.values()) == len(graph.ops)
    assert all(counts[role] > 0 for role in Role)
    forward_dots = [op for op in graph.contractions() if op.role is Role.FORWARD]
    assert [op.scope for op in forward_dots] == ["layer_0", "layer_0", "layer_1", "layer_1"]
    # the optimizer reads gradients: every optimizer op comes after some backward op
    first_backward = min(op.id for op in graph.ops if op.role is Role.BACKWARD)
    assert all(op.id > first_backward for op in graph.ops_with_role(Role.OPTIMIZER))


def test_backward_dots_link_to_the_forward_dot_sharing_their_operand() -> None:
    graph = ex.trace(_mlp_step, *_mlp_args())
    for op in graph.contractions():
        if op.role is not Role.BACKWARD:
            continue
        forward = graph.ops[op.forward_op] if op.forward_op is not None else None
        assert forward is not None and forward.primitive == "dot_general", str(op)
        assert forward.scope == op.scope
        # the backward dot shares the weight or the saved activation with its forward dot
        weight = forward.inputs[1]
        shapes = {t.shape for t in op.input_types} | {op.output_types[0].shape}
        assert graph.values[weight].type.shape in shapes or forward.input_types[0].shape in shapes


def test_networkx_view_matches_graph() -> None:
    graph = ex.trace(_mlp_step, *_mlp_args())
    view = graph.nx
    assert view.number_of_nodes() == len(graph.ops)
    assert nx.is_directed_acyclic_graph(view)
    for op in graph.ops[:50]:
        for vid in op.inputs:
            producer = graph.values[vid].producer
            if producer is not None:
                assert view.has_edge(producer, op.id)


def test_abstract_args_trace_without_allocating() -> None:
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _mlp_args())
    abstract = ex.trace(_mlp_step, *args)
    concrete = ex.trace(_mlp_step, *_mlp_args())
    assert [op.primitive for op in abstract.ops] == [op.primitive for op in concrete.ops]


@pytest.mark.parametrize(
    ("primitive", "body"),
    [
        ("while", lambda x: jax.lax.while_loop(lambda c: c.sum() < 10, lambda c: c * 2, x).sum()),
        ("cond", lambda x: jax.lax.cond(x.sum() > 0, jnp.sum, jnp.mean, x)),
    ],
)
def test_control_flow_is_rejected_with_the_primitive_and_the_line(
    primitive: str, body: Any
) -> None:
    def step(params: Any, opt_state: Any, x: jax.Array) -> Any:
        return body(x * params)

    with pytest.raises(UnsupportedPrimitiveError) as info:
        ex.trace(step, jnp.ones(()), (), jnp.ones(5))
    message = str(info.value)
    assert f"`{primitive}`" in message
    assert "test_trace.py" in message
    assert "Python `for` loop" in message
    assert isinstance(info.value, ex.ExplorerError)


def test_wrong_number_of_arguments_says_what_the_step_takes() -> None:
    with pytest.raises(ArgumentMismatchError, match=r"\(params, opt_state, x, key\)"):
        ex.trace(_mlp_step, *_mlp_args()[:3])


def test_wrong_rank_is_a_trace_error_naming_the_user_line() -> None:
    params, opt_state, _, key = _mlp_args()
    with pytest.raises(TraceError) as info:
        ex.trace(_mlp_step, params, opt_state, jnp.ones((3, 5)), key)
    message = str(info.value)
    assert "float32[3, 5]" in message
    assert "_dense" in message


def test_declared_arg_spec_gives_the_exact_mismatch() -> None:
    def step(params: Any, x: jax.Array) -> Any:
        return (x @ params["w"]).sum()

    step.explorer_arg_spec = (  # type: ignore[attr-defined]
        {"w": jax.ShapeDtypeStruct((4, 2), jnp.float32)},
        jax.ShapeDtypeStruct((3, 4), jnp.float32),
    )
    step.explorer_arg_roles = ("params", "data")  # type: ignore[attr-defined]
    with pytest.raises(ArgumentMismatchError, match=r"#1: expected float32\[3, 4\], found"):
        ex.trace(step, {"w": jnp.ones((4, 2))}, jnp.ones((3, 4, 1)))
    with pytest.raises(ArgumentMismatchError, match="structure"):
        ex.trace(step, {"v": jnp.ones((4, 2))}, jnp.ones((3, 4)))


def test_non_array_argument_is_rejected() -> None:
    with pytest.raises(ArgumentMismatchError, match="found str"):
        ex.trace(_mlp_step, "weights", (), jnp.ones((3, 4)), jax.random.PRNGKey(0))


def test_facts_derived_from_a_graph_are_found_once_per_graph_and_shared() -> None:
    """What depends on the graph alone (the recomputed values, the blocks for a split, the
    model fingerprint) is found once and shared by every space, cut and mesh of the step;
    another graph finds its own."""
    import dataclasses

    from helpers import traced

    from explorer.mesh import mesh_spec
    from explorer.plan_build import model_fingerprint
    from explorer.segments.recompute import recomputed_values
    from explorer.space import step_blocks

    _, _, graph = traced("gpt")
    blocks = step_blocks(graph, mesh_spec((4,)))
    assert step_blocks(graph, mesh_spec((2, 2))) is blocks  # four parts either way
    outer = step_blocks(graph, mesh_spec((2, 2)), batch_outer=True)
    assert outer is not blocks and outer.outer_parts == 2
    assert step_blocks(graph, mesh_spec((8,))).parallelism == 8
    assert recomputed_values(graph) is recomputed_values(graph)
    assert model_fingerprint(graph) is model_fingerprint(graph)
    again = dataclasses.replace(graph)  # equal, but another graph: nothing carried over
    assert step_blocks(again, mesh_spec((4,))) is not blocks
    assert step_blocks(again, mesh_spec((4,))) == blocks
    assert model_fingerprint(again) == model_fingerprint(graph)
