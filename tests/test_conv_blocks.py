"""Contractions beyond the plain matmul: convolutions head ParallelBlocks, and a role with
several candidate dims takes the first one that splits."""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from user_models import linen_cnn

import explorer as ex
from explorer import affine
from explorer.blocks import build_blocks
from explorer.ir import DimRole, Graph, OpNode, Role
from explorer.mesh import mesh_spec
from explorer.space import build_space

NHWC = ("NHWC", "HWIO", "NHWC")
NCHW = ("NCHW", "OIHW", "NCHW")

# (lhs shape, rhs shape, conv keyword arguments, whether the map is exact, not a superset)
CONVS = {
    "1x1": ((2, 3, 3, 4), (1, 1, 4, 6), {"dimension_numbers": NHWC}, True),
    "3x3 strided, padded, NCHW": (
        (2, 4, 5, 5),
        (6, 4, 3, 3),
        {"dimension_numbers": NCHW, "window_strides": (2, 2), "padding": "SAME"},
        False,
    ),
    "dilated": (
        (2, 5, 5, 2),
        (2, 2, 2, 3),
        {
            "dimension_numbers": NHWC,
            "padding": ((0, 0), (1, 0)),
            "lhs_dilation": (2, 1),
            "rhs_dilation": (1, 2),
        },
        False,
    ),
    "grouped 1x1": (
        (2, 2, 2, 4),
        (1, 1, 2, 6),
        {"dimension_numbers": NHWC, "feature_group_count": 2},
        True,
    ),
    "depthwise 3x3": (
        (2, 4, 4, 4),
        (3, 3, 1, 4),
        {"dimension_numbers": NHWC, "feature_group_count": 4, "padding": "SAME"},
        False,
    ),
    "batch groups (a grouped conv's kernel gradient)": (
        (4, 2, 2, 3),
        (1, 1, 3, 4),
        {"dimension_numbers": NHWC, "batch_group_count": 2},
        True,
    ),
}


def _conv(lhs: jax.Array, rhs: jax.Array, **kwargs: Any) -> jax.Array:
    kwargs.setdefault("window_strides", (1, 1))
    kwargs.setdefault("padding", "VALID")
    return jax.lax.conv_general_dilated(lhs, rhs, **kwargs)


def _traced_conv(lhs: jax.Array, rhs: jax.Array, kwargs: dict[str, Any]) -> OpNode:
    graph = ex.trace(lambda a, b: _conv(a, b, **kwargs), lhs, rhs)
    (op,) = (op for op in graph.ops if op.primitive == "conv_general_dilated")
    return op


def _dependencies(jacobian: np.ndarray, out_shape: tuple[int, ...]) -> dict[Any, set[Any]]:
    """Output index -> the operand indices its value actually depends on (non-zero slope)."""
    rank = len(out_shape)
    found: dict[Any, set[Any]] = {}
    for index in itertools.product(*map(range, out_shape)):
        nonzero = np.argwhere(jacobian[index] != 0)
        found[index] = {tuple(int(i) for i in row) for row in nonzero}
        assert nonzero.shape[1:] == (jacobian.ndim - rank,)
    return found


@pytest.mark.parametrize("name", list(CONVS))
def test_conv_maps_cover_exactly_what_each_output_reads(name: str) -> None:
    lhs_shape, rhs_shape, kwargs, exact = CONVS[name]
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.normal(size=lhs_shape), jnp.float32)
    rhs = jnp.asarray(rng.normal(size=rhs_shape), jnp.float32)
    op = _traced_conv(lhs, rhs, kwargs)
    maps = affine.traced_op_maps(op)
    assert maps is not None and len(maps) == 2
    out_shape = op.output_types[0].shape
    slopes = (
        jax.jacfwd(lambda a: _conv(a, rhs, **kwargs))(lhs),
        jax.jacfwd(lambda b: _conv(lhs, b, **kwargs))(rhs),
    )
    for operand, (op_map, jacobian) in enumerate(zip(maps, slopes, strict=True)):
        assert op_map is not None
        for index, reads in _dependencies(np.asarray(jacobian), out_shape).items():
            claimed = set(op_map.evaluate(index))
            assert reads <= claimed, f"operand {operand} at output {index}"
            if exact:
                assert reads == claimed, f"operand {operand} at output {index}"


def test_conv_splits_follow_batch_and_whole_feature_groups() -> None:
    lhs_shape, rhs_shape, kwargs, _ = CONVS["depthwise 3x3"]
    op = _traced_conv(jnp.ones(lhs_shape), jnp.ones(rhs_shape), kwargs)
    lhs_map, rhs_map = affine.traced_op_maps(op) or (None, None)
    assert lhs_map is not None and rhs_map is not None
    assert lhs_map.split_target(0, 2) == 0  # batch -> batch
    assert lhs_map.split_target(3, 2) == 3  # 4 groups in 2 parts -> output features
    assert lhs_map.split_target(3, 8) is None  # half a group: not a block split
    assert lhs_map.split_target(1, 2) is None  # a spatial dim reads across the block edge
    assert rhs_map.split_target(3, 2) == 3  # kernel output features -> output features
    assert rhs_map.split_target(0, 3) is None  # the kernel window is contracted


# -- convolutions head blocks -----------------------------------------------------------------


def _forward_convs(graph: Graph) -> list[OpNode]:
    return [
        op for op in graph.ops if op.primitive == "conv_general_dilated" and op.role is Role.FORWARD
    ]


def test_every_conv_of_a_flax_cnn_heads_a_block_with_its_backward_convs() -> None:
    user = linen_cnn()
    graph = ex.trace(user.step, *user.args)
    analysis = build_blocks(graph, 4)
    print(f"\n{graph.summary()}\n{analysis.summary(graph)}")
    heads = {block.head: block for block in analysis.blocks}
    convs = _forward_convs(graph)
    assert len(convs) == 3
    for conv in convs:
        block = heads[conv.id]
        assert block.roles == (DimRole.M, DimRole.N, DimRole.K)
        backward = [
            op.id
            for op in graph.ops
            if op.primitive == "conv_general_dilated" and op.forward_op == conv.id
        ]
        assert backward, f"{conv}: no backward conv linked"  # 1 for the first conv, else 2
        assert set(backward) <= set(block.backward_ops)
        # the input is split on its batch (and channels for K); the kernel on its output
        # channels (HWIO: dim 3)
        lhs, rhs = block.operand_layouts[0].layout, block.layout_of(conv.inputs[1])
        assert lhs.dim_of(DimRole.M) == 0
        assert rhs is not None and rhs.dim_of(DimRole.N) == 3
        if dict(block.role_sizes)[DimRole.K] % 4 == 0:
            assert lhs.dim_of(DimRole.K) == 3 and rhs.dim_of(DimRole.K) == 2
    assert sum(op.primitive == "conv_general_dilated" for op in graph.ops) == 3 + 5


def test_conv_blocks_get_the_dense_strategies_on_both_meshes() -> None:
    user = linen_cnn()
    graph = ex.trace(user.step, *user.args)
    for shape, expected in (
        ((4,), ["M@x", "N@x", "K@x"]),
        ((2, 2), ["M@x+y", "M@x,N@y", "M@x,K@y"]),
    ):
        spec = mesh_spec(shape)
        analysis = build_space(build_blocks(graph, spec.size), spec)
        second_conv = next(b for b in analysis.blocks if b.scope.endswith("Conv_1"))
        assert [s.name for s in second_conv.strategies] == expected


def _helper_step(params: Any, opt_state: Any, images: jax.Array) -> Any:
    """Three convs through one helper: one source line, no scopes to tell them apart."""

    def loss(p: Any) -> jax.Array:
        h = images
        for kernel in p:
            h = jax.nn.relu(_conv(h, kernel, dimension_numbers=NHWC, padding="SAME"))
        return jnp.mean(h**2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = optax.sgd(0.1).update(grads, opt_state, params)
    return value, optax.apply_updates(params, updates), opt_state


def test_backward_convs_of_a_shared_helper_find_their_own_forward_conv() -> None:
    """The input gradient reads the kernel flipped (`rev`): still the forward conv's kernel."""
    params = [jnp.ones((3, 3, 4, 8)), jnp.ones((3, 3, 8, 8)), jnp.ones((3, 3, 8, 8))]
    graph = ex.trace(_helper_step, params, optax.sgd(0.1).init(params), jnp.ones((8, 6, 6, 4)))
    analysis = build_blocks(graph, 4)
    convs = _forward_convs(graph)
    for conv, block in zip(convs, analysis.blocks, strict=True):
        assert block.head == conv.id
        backward = [
            op
            for op in graph.ops
            if op.primitive == "conv_general_dilated" and op.forward_op == conv.id
        ]
        assert len(backward) == (1 if conv is convs[0] else 2)  # no input gradient for data
        assert {op.id for op in backward} <= set(block.backward_ops)
        kernel_gradient = next(op for op in backward if op.output_types[0] == conv.input_types[1])
        layout = block.layout_of(kernel_gradient.outputs[0])
        assert layout is not None and layout.dim_of(DimRole.N) == 3


def _grouped_step(params: Any, opt_state: Any, images: jax.Array) -> Any:
    opt = optax.sgd(0.1)

    def loss(p: Any) -> jax.Array:
        h = _conv(images, p["grouped"], dimension_numbers=NHWC, feature_group_count=4)
        h = _conv(jax.nn.relu(h), p["depthwise"], dimension_numbers=NHWC, feature_group_count=16)
        return jnp.mean(h**2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return value, optax.apply_updates(params, updates), opt_state


def test_a_grouped_conv_splits_whole_groups_and_says_why_not_n_or_k() -> None:
    params = {"grouped": jnp.ones((3, 3, 2, 16)), "depthwise": jnp.ones((3, 3, 1, 16))}
    graph = ex.trace(_grouped_step, params, optax.sgd(0.1).init(params), jnp.ones((8, 6, 6, 8)))
    analysis = build_blocks(graph, 4)
    print(f"\n{analysis.summary(graph)}")
    (block,) = analysis.blocks
    assert block.role_sizes == ((DimRole.E, 4), (DimRole.M, 8))
    assert any("feature_group_count=4" in note for note in block.role_notes)
    assert block.operand_layouts[0].layout.dims == ((DimRole.E, 3), (DimRole.M, 0))
    kernel = block.layout_of(graph.ops[block.head].inputs[1])
    assert kernel is not None and kernel.dims == ((DimRole.E, 3),)
    # 4 groups split in 4 keep the depthwise conv's channels whole: it joins the block
    depthwise = _forward_convs(graph)[1]
    assert depthwise.id in block.forward_ops
    spec = mesh_spec((4,))
    spaced = build_space(analysis, spec)
    assert [s.name for s in spaced.blocks[0].strategies] == ["E@x", "M@x"]


# -- a role takes the first dim that splits ---------------------------------------------------


def _einsum_step(spec: str) -> Any:
    def step(params: Any, opt_state: Any, x: jax.Array) -> Any:
        def loss(p: Any) -> jax.Array:
            return jnp.mean(jnp.tanh(jnp.einsum(spec, x, p["w"])) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optax.sgd(0.1).update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    return step


@pytest.mark.parametrize(("parts", "dim"), [(4, 3), (3, 2)])
def test_a_fused_qkv_projection_offers_the_heads(parts: int, dim: int) -> None:
    """`[b, s, d] x [d, 3, heads, hd]`: N splits the heads, unless the size-3 dim divides."""
    params = {"w": jnp.ones((16, 3, 4, 8))}
    step = _einsum_step("bsd,dqhk->bsqhk")
    graph = ex.trace(step, params, optax.sgd(0.1).init(params), jnp.ones((6, 12, 16)))
    block = build_blocks(graph, parts).blocks[0]
    head = graph.ops[block.head]
    result = block.layout_of(head.outputs[0])
    assert result is not None and result.dim_of(DimRole.N) == dim
    assert dict(block.role_sizes)[DimRole.N] == (4 if parts == 4 else 3)
    noted = any("rhs dim 1 (size 3) does not divide into 4 parts" in n for n in block.role_notes)
    assert noted == (parts == 4)


def test_a_dot_with_two_batch_dims_splits_the_one_that_divides() -> None:
    """`[g, b, s, d] x [g, b, d, e]` with g = 3: E takes the b dim on a split in 4."""
    params = {"w": jnp.ones((3, 4, 16, 8))}
    step = _einsum_step("gbsd,gbde->gbse")
    graph = ex.trace(step, params, optax.sgd(0.1).init(params), jnp.ones((3, 4, 6, 16)))
    block = build_blocks(graph, 4).blocks[0]
    assert dict(block.role_sizes)[DimRole.E] == 4
    weight = block.layout_of(graph.ops[block.head].inputs[1])
    assert weight is not None and weight.dim_of(DimRole.E) == 1
    assert any(note.startswith("E: lhs dim 0 / rhs dim 0 (size 3)") for note in block.role_notes)
