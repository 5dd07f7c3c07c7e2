"""ParallelBlocks on the model zoo (the paper's Algorithm 1) and their bad inputs."""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import analysed, layer_of, mlp_step

import explorer as ex
from explorer.blocks import build_blocks
from explorer.errors import AnalysisError
from explorer.ir import DimRole, Role
from explorer.mesh import mesh_spec
from explorer.space import build_space, config_count, step_space


@pytest.mark.parametrize("name", ["gpt", "bert", "llama"])
def test_every_layer_has_the_four_paper_blocks(name: str) -> None:
    graph, analysis = analysed(name, (4,))
    print(f"\n[{name}] {graph.summary()}\n{analysis.summary(graph)}")
    by_layer = defaultdict(list)
    for block in analysis.blocks:
        by_layer[layer_of(block.scope)].append(block)
    layers = sorted(k for k in by_layer if k.startswith("layer_"))
    assert layers == ["layer_0", "layer_1"]
    for layer in layers:
        blocks = by_layer[layer]
        assert len(blocks) == 4, [b.scope for b in blocks]
        hidden = graph.ops[blocks[0].head].input_types[0].shape[-1]
        weights = [graph.ops[b.head].input_types[1].shape for b in blocks]
        qkv, out, mlp_in, mlp_out = weights
        assert qkv == (hidden, 3 * hidden)
        assert out == (hidden, hidden)
        assert mlp_in[0] == hidden and mlp_out[1] == hidden
        assert mlp_out[0] in (mlp_in[1], mlp_in[1] // 2)  # SwiGLU fuses gate and up


@pytest.mark.parametrize("name", ["gpt", "bert", "llama"])
def test_attention_matmuls_and_softmax_join_the_qkv_block(name: str) -> None:
    graph, analysis = analysed(name, (4,))
    qkv = analysis.blocks[0]
    members = [graph.ops[o] for o in qkv.forward_ops]
    batched_dots = [op for op in members if op.primitive == "dot_general" and op.id != qkv.head]
    assert len(batched_dots) == 2  # scores and the weighted sum of values
    primitives = {op.primitive for op in members}
    assert {"reduce_max", "exp", "div"} <= primitives  # the softmax
    # and the attention-output matmul starts the next block: its K is the heads split
    assert graph.ops[analysis.blocks[1].head].scope.endswith("attn")


@pytest.mark.parametrize("name", ["gpt", "llama", "bert", "moe"])
def test_backward_ops_share_their_forward_ops_block(name: str) -> None:
    graph, analysis = analysed(name, (4,))
    checked = 0
    for op in graph.ops:
        if op.role is not Role.BACKWARD or op.forward_op is None:
            continue
        forward_block = analysis.block_of_op[op.forward_op]
        if forward_block is not None:
            assert analysis.block_of_op[op.id] == forward_block, str(op)
            checked += 1
    assert checked > 20
    # every backward dot of a block's head lands in that block
    for block in analysis.blocks:
        backward_dots = [o for o in block.backward_ops if graph.ops[o].primitive == "dot_general"]
        assert len(backward_dots) >= 1


@pytest.mark.parametrize("name", ["gpt", "bert", "llama"])
def test_one_d_mesh_of_four_gives_three_strategies_per_block(name: str) -> None:
    _, analysis = analysed(name, (4,))
    layer_blocks = [b for b in analysis.blocks if b.scope.startswith("layer_0")]
    for block in layer_blocks:
        assert [s.name for s in block.strategies] == ["M@x", "N@x", "K@x"]
    assert config_count(tuple(layer_blocks)) == 81


def test_moe_expert_block_has_the_expert_strategy_too() -> None:
    graph, analysis = analysed("moe", (4,))
    print(f"\n[moe] {analysis.summary(graph)}")
    experts = [
        b
        for b in analysis.blocks
        if DimRole.E in b.roles and graph.ops[b.head].input_types[1].rank == 3
    ]
    assert experts, "the batched expert matmul heads a block"
    for block in experts:
        assert [s.name for s in block.strategies] == ["E@x", "M@x", "N@x", "K@x"]
    dense = [b for b in analysis.blocks if b.scope.startswith("layer_0")]
    assert all(len(b.strategies) == 3 for b in dense)


def test_two_d_mesh_pins_batch_to_the_outer_axis_by_default() -> None:
    graph, _ = analysed("gpt", (4,))
    spec = mesh_spec((2, 2))
    pinned = build_space(build_blocks(graph, spec.size), spec)
    free = build_space(build_blocks(graph, spec.size), spec, free_axes=True)
    block = pinned.blocks[0]
    assert [s.name for s in block.strategies] == ["M@x+y", "M@x,N@y", "M@x,K@y"]
    assert len(free.blocks[0].strategies) == 9


def test_the_whole_mesh_space_adds_the_flattened_mesh_strategies_after_the_paper_s() -> None:
    # whole_mesh: each block also splits any dim over every device (the 1-D strategies of
    # the flattened mesh), listed after the pinned ones so their indices stay; the experts'
    # E@x+y, already offered, is not offered twice; on a 1-D mesh nothing changes
    for model in ("gpt", "moe"):
        graph, _ = analysed(model, (4,))
        spec = mesh_spec((2, 2))
        blocks = build_blocks(graph, spec.size)
        pinned = build_space(blocks, spec)
        whole = build_space(blocks, spec, whole_mesh=True)
        for before, after in zip(pinned.blocks, whole.blocks, strict=True):
            names = [s.name for s in after.strategies]
            assert names[: len(before.strategies)] == [s.name for s in before.strategies]
            added = names[len(before.strategies) :]
            assert len(set(names)) == len(names)
            if DimRole.M not in before.roles:
                assert not added  # such a block's space is already every assignment
                continue
            sizes = dict(before.role_sizes)
            assert sorted(added) == sorted(
                f"{role.value}@x+y"
                for role in before.roles
                if role not in (DimRole.M, DimRole.E) and sizes[role] % spec.size == 0
            ), names
        assert {"N@x+y", "K@x+y"} <= {s.name for s in whole.blocks[0].strategies}
        flat = mesh_spec((4,))
        one_d = build_space(build_blocks(graph, 4), flat)
        assert build_space(build_blocks(graph, 4), flat, whole_mesh=True) == one_d
    free = build_space(blocks, spec, free_axes=True)
    assert build_space(blocks, spec, free_axes=True, whole_mesh=True) == free


def test_two_d_mesh_offers_the_experts_over_both_axes() -> None:
    # the 1-D expert plan (E over every device) stays reachable on a 2-D mesh; dense
    # blocks keep the pinned space of three
    graph, _ = analysed("moe", (4,))
    spec = mesh_spec((2, 2))
    pinned = build_space(build_blocks(graph, spec.size), spec)
    experts = [
        b
        for b in pinned.blocks
        if DimRole.E in b.roles and graph.ops[b.head].input_types[1].rank == 3
    ]
    assert experts, "the batched expert matmul heads a block"
    for block in experts:
        names = [s.name for s in block.strategies]
        assert names == ["M@x,E@y", "E@x+y", "M@x+y", "M@x,N@y", "M@x,K@y"], names
    dense = [b for b in pinned.blocks if DimRole.E not in b.roles]
    assert dense and all("E@x+y" not in [s.name for s in b.strategies] for b in dense)
    assert all(len(b.strategies) == 3 for b in dense if b.scope.startswith("layer_0"))


def test_a_mesh_that_divides_nothing_leaves_the_replicated_strategy_with_a_reason() -> None:
    graph, _ = analysed("gpt", (4,))
    spec = mesh_spec((5,))
    analysis = build_space(build_blocks(graph, spec.size), spec)
    for block in analysis.blocks:
        assert [s.name for s in block.strategies] == ["replicated"]
        reasons = " ".join(e.reason for e in block.excluded)
        assert "does not divide into 5 parts" in reasons
        assert "stays replicated" in reasons


def _unknown_op_step(params: Any, opt_state: Any, x: jax.Array) -> Any:
    def loss(p: Any) -> jax.Array:
        h = x @ p["w1"]
        h = jax.lax.reduce_window(h, 0.0, jax.lax.add, (1, 2), (1, 1), "SAME")
        return jnp.mean((h @ p["w2"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = optax.sgd(0.1).update(grads, opt_state, params)
    return value, optax.apply_updates(params, updates), opt_state


def test_an_unknown_op_ends_the_block_and_is_reported() -> None:
    params = {"w1": jnp.ones((8, 16)), "w2": jnp.ones((16, 4))}
    graph = ex.trace(_unknown_op_step, params, optax.sgd(0.1).init(params), jnp.ones((8, 8)))
    analysis = build_blocks(graph, 4)
    assert "reduce_window_sum" in analysis.unknown_primitives
    first = analysis.blocks[0]
    assert any("reduce_window_sum" in reason for reason in first.ends)
    assert len(analysis.blocks) == 2


def test_blocks_are_disjoint_and_block_of_op_agrees() -> None:
    graph, analysis = analysed("gpt", (4,))
    for block in analysis.blocks:
        for op in block.ops:
            assert analysis.block_of_op[op] == block.index
    owned = sum(len(b.ops) for b in analysis.blocks)
    assert owned == sum(1 for b in analysis.block_of_op if b is not None)
    assert owned < len(graph.ops)  # layer norms, embedding and optimizer stay outside


def test_parameter_branches_join_the_consuming_block() -> None:
    graph, analysis = analysed("gpt", (4,))
    qkv = analysis.blocks[0]
    branch = [graph.ops[o] for o in qkv.branch_ops]
    assert [op.primitive for op in branch] == ["broadcast_in_dim"]  # the QKV bias
    bias = branch[0].inputs[0]
    assert graph.values[bias].path.endswith("['b_qkv']")
    layout = qkv.layout_of(bias)
    assert layout is not None and layout.dim_of(DimRole.N) == 0


def _shared_weight_step(params: Any, opt_state: Any, x: jax.Array) -> Any:
    def loss(p: Any) -> jax.Array:
        h = jax.nn.relu(x @ p["w"])  # w as [in, out]: its columns are N
        return jnp.mean(jnp.tanh(h @ p["w"].T) ** 2)  # w.T: the same columns are now K

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = optax.sgd(0.1).update(grads, opt_state, params)
    return value, optax.apply_updates(params, updates), opt_state


def test_a_weight_wanted_by_two_blocks_is_a_recorded_conflict() -> None:
    params = {"w": jnp.ones((16, 32))}
    graph = ex.trace(_shared_weight_step, params, optax.sgd(0.1).init(params), jnp.ones((8, 16)))
    analysis = build_blocks(graph, 4)
    assert len(analysis.blocks) == 2
    (conflict,) = analysis.conflicts
    assert conflict.blocks == (0, 1) and conflict.chosen == 0
    assert "params['w']" in conflict.reason
    first = analysis.blocks[0].layout_of(conflict.value)
    assert first is not None and first.dim_of(DimRole.N) == 1


def test_a_square_weights_transposed_gradient_keeps_the_split_its_dot_gives_it() -> None:
    # JAX differentiates `h @ w` with respect to w as a dot giving [out, in], then a
    # transpose. For a square w that dot's result has w's shape but not its layout: taking
    # w's layout (K on dim 0) for it made the compiler gather and all-to-all the gradient of
    # every square Megatron-K weight (LLaMA-7B's attention output: 115 ms of 999 a step).
    params = {"w_in": jnp.ones((64, 64)), "w_out": jnp.ones((64, 64))}
    args = (params, optax.sgd(0.1).init(params), jnp.ones((16, 64)))
    analysis = ex.analyze(mlp_step, *args, mesh=(4,), profile=False)
    megatron = tuple(  # w_in N@x, w_out K@x: one all-reduce each way and nothing else
        [s.name for s in block.strategies].index(name)
        for block, name in zip(analysis.blocks, ("N@x", "K@x"), strict=True)
    )
    plan = analysis._evaluated_plan("manual", megatron, None)
    truth = ex.evaluate(plan, mlp_step, *args)
    assert {kind for kind, _bytes, _axes, _group in truth.emitted} == {"all-reduce"}
    w_out_gradient = [
        op
        for op in analysis.graph.ops
        if op.role is Role.BACKWARD
        and op.primitive == "dot_general"
        and analysis.block_analysis.block_of_op[op.id] == 1
        and analysis.graph.values[op.outputs[0]].type.shape == (64, 64)
    ]
    assert w_out_gradient, "the square weight's gradient dot is in its block"
    for op in w_out_gradient:
        layout = analysis.blocks[1].layout_of(op.outputs[0])
        assert layout is None or layout.dim_of(DimRole.K) == 1  # [out, in]: K is `in`


def _batched_step(params: Any, opt_state: Any, x: jax.Array, *, sum_batch: bool = False) -> Any:
    """A two-layer MLP over `[batch, seq, d]` activations; `sum_batch` sums the hidden
    activations over the batch (an op a split of the batch cannot pass)."""

    def loss(p: Any) -> jax.Array:
        h = jax.nn.relu(x @ p["w_in"])
        if sum_batch:
            h = h.sum(0)
        return jnp.mean((h @ p["w_out"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = optax.sgd(0.1).update(grads, opt_state, params)
    return value, optax.apply_updates(params, updates), opt_state


def _batched_graph(sum_batch: bool = False, batch: int = 2) -> Any:
    params = {"w_in": jnp.ones((16, 32)), "w_out": jnp.ones((32, 16))}
    return ex.trace(
        functools.partial(_batched_step, sum_batch=sum_batch),
        params,
        optax.sgd(0.1).init(params),
        jnp.ones((batch, 8, 16)),  # a batch of 2 does not split 8 ways; the sequence does
    )


def _unprimed(block: Any) -> list[tuple[int, tuple[tuple[DimRole, int], ...]]]:
    return [
        (layout.value, tuple((r, d) for r, d in layout.dims if not r.outer_only))
        for layout in block.layouts
    ]


def test_the_batch_the_whole_mesh_does_not_split_is_kept_for_the_outer_axis() -> None:
    # on 2x4 M takes the sequence (the batch of 2 does not split 8 ways); with the outer
    # axis's size M' takes the batch for that axis, and the blocks are otherwise the same
    graph = _batched_graph()
    plain, primed = build_blocks(graph, 8), build_blocks(graph, 8, outer=2)
    assert len(plain.blocks) == len(primed.blocks) == 2
    for before, after in zip(plain.blocks, primed.blocks, strict=True):
        assert before.ops == after.ops
        assert _unprimed(after) == _unprimed(before)
        assert dict(before.role_sizes)[DimRole.M] == 8
        assert dict(after.role_sizes)[DimRole.M_OUTER] == 2
        assert "M': lhs dim 0 (size 2) splits over the outer axis (2 parts)" in " ".join(
            after.role_notes
        )
    head = graph.ops[primed.blocks[0].head]
    out = primed.blocks[0].layout_of(head.outputs[0])
    assert out is not None and (out.dim_of(DimRole.M_OUTER), out.dim_of(DimRole.M)) == (0, 1)
    # where the batch splits over the whole mesh, M takes it and nothing is primed
    whole = build_blocks(_batched_graph(batch=8), 8, outer=2)
    assert [b.roles for b in whole.blocks] == [(DimRole.M, DimRole.N, DimRole.K)] * 2


def test_the_batch_outer_space_adds_the_batch_on_the_outer_axis_after_the_paper_s() -> None:
    graph = _batched_graph()
    spec = mesh_spec((2, 4))
    paper = build_space(build_blocks(graph, 8), spec)
    outer = build_space(build_blocks(graph, 8, outer=2), spec)
    for before, after in zip(paper.blocks, outer.blocks, strict=True):
        names = [s.name for s in after.strategies]
        assert names[: len(before.strategies)] == [s.name for s in before.strategies]
        assert names[len(before.strategies) :] == ["M'@x,M@y", "M'@x,N@y", "M'@x,K@y"]
    free = build_space(build_blocks(graph, 8, outer=2), spec, free_axes=True)
    primed = [s for b in free.blocks for s in b.strategies if s.axes_of(DimRole.M_OUTER)]
    assert primed and all(s.axes_of(DimRole.M_OUTER) == ("x",) for s in primed)


def _swapped(strategy: Any) -> frozenset[tuple[DimRole, tuple[str, ...]]]:
    """`strategy`'s assignment with the two axes of a 2-D mesh swapped."""
    swap = {"x": "y", "y": "x"}
    return frozenset(
        (role, tuple(sorted(swap[a] for a in axes))) for role, axes in strategy.assignment
    )


def test_the_batch_inner_space_is_the_batch_outer_space_with_the_axes_swapped() -> None:
    # on a square mesh both spaces prime the same blocks (4 parts either way), and each
    # block's batch-inner strategies are its batch-outer ones with x and y swapped
    graph = _batched_graph()
    spec = mesh_spec((2, 2))
    outer = step_space(graph, spec, batch_outer=True)
    inner = step_space(graph, spec, batch_inner=True)
    assert outer.primed and inner.primed
    for by_outer, by_inner in zip(outer.blocks, inner.blocks, strict=True):
        assert by_outer.ops == by_inner.ops and by_outer.layouts == by_inner.layouts
        swapped = {_swapped(s) for s in by_outer.strategies}
        assert swapped == {frozenset(s.assignment) for s in by_inner.strategies}
        assert len(by_inner.strategies) == len(by_outer.strategies)
    # the paper's strategies with the axes swapped: no strategy pins the batch to x
    names = [s.name for s in inner.blocks[0].strategies]
    assert names[:3] == ["M@x+y", "N@x,M@y", "K@x,M@y"]
    assert names[3:] == ["M@x,M'@y", "N@x,M'@y", "K@x,M'@y"]


def test_the_batch_inner_space_primes_for_the_inner_axis_alone() -> None:
    # a batch of 4 on 2x4: it splits over y (4) but not over all 8 devices. The batch-inner
    # space primes it for y, and the batch-outer space for x (2 parts); each pins its
    # primed role to its own axis, the free-axes enumeration too
    graph = _batched_graph(batch=4)
    spec = mesh_spec((2, 4))
    inner = step_space(graph, spec, batch_inner=True)
    outer = step_space(graph, spec, batch_outer=True)
    assert inner.outer_parts == 4 and outer.outer_parts == 2
    for block in inner.blocks:
        assert dict(block.role_sizes)[DimRole.M_OUTER] == 4
        primed = [s for s in block.strategies if s.axes_of(DimRole.M_OUTER)]
        assert [s.name for s in primed] == ["M@x,M'@y", "N@x,M'@y", "K@x,M'@y"]
    free = step_space(graph, spec, batch_inner=True, free_axes=True)
    primed = [s for b in free.blocks for s in b.strategies if s.axes_of(DimRole.M_OUTER)]
    assert primed and all(s.axes_of(DimRole.M_OUTER) == ("y",) for s in primed)
    with pytest.raises(AnalysisError, match="found both"):
        step_space(graph, spec, batch_outer=True, batch_inner=True)


def test_contract_last_moves_k_of_the_combine_einsum_alone() -> None:
    # tiny MoE's combine einsum `gsec,egcm->gsm` contracts its capacity c and its experts e
    # (8 each, listed c first): K takes c, the first that divides into 4 parts, and with
    # contract_last e. Only those blocks change, and only where K lands; a step whose
    # contractions each contract one dim has the paper's blocks
    graph, paper = analysed("moe", (4,))
    spec = mesh_spec((4,))
    last = step_space(graph, spec, contract_last=True)
    assert last.contracted_last and not paper.contracted_last
    moved = [(a, b) for a, b in zip(paper.blocks, last.blocks, strict=True) if a != b]
    assert moved and all(a.scope.endswith("gsec,egcm->gsm") for a, _ in moved), moved
    for before, after in zip(paper.blocks, last.blocks, strict=True):
        assert before.ops == after.ops and before.role_sizes == after.role_sizes
        assert [s.name for s in before.strategies] == [s.name for s in after.strategies]
    for before, after in moved:
        head = graph.ops[before.head]
        paper_k, last_k = (
            {o.position: o.layout.dim_of(DimRole.K) for o in b.operand_layouts if o.op == head.id}
            for b in (before, after)
        )
        assert paper_k == {0: 3, 1: 2}  # c: gsec's dim 3, egcm's dim 2
        assert last_k == {0: 2, 1: 0}  # e: gsec's dim 2, egcm's dim 0
        assert any("(contract_last)" in note for note in after.role_notes)
    gpt, _ = analysed("gpt", (4,))
    assert step_space(gpt, spec, contract_last=True) == step_space(gpt, spec)


def test_a_primed_role_an_op_cannot_carry_is_dropped_and_the_block_goes_on() -> None:
    # summing over the batch ends a split of the batch, not of the sequence: the block
    # keeps the sum and every op it had without the outer axis, and drops M' (saying where)
    graph = _batched_graph(sum_batch=True)
    plain, primed = build_blocks(graph, 8), build_blocks(graph, 8, outer=2)
    first = primed.blocks[0]
    assert first.ops == plain.blocks[0].ops
    assert _unprimed(first) == _unprimed(plain.blocks[0])
    assert DimRole.M_OUTER not in first.roles
    assert any(n.startswith("M' dropped: #") and "reduce_sum" in n for n in first.role_notes)
    assert first.layouts == plain.blocks[0].layouts  # no layout keeps a split of the batch


@pytest.mark.parametrize("outer", [1, 3, 8])
def test_an_outer_axis_that_is_no_proper_divisor_is_refused(outer: int) -> None:
    with pytest.raises(ValueError, match=f"proper divisor of the parallelism 8.*found {outer}"):
        build_blocks(_batched_graph(), 8, outer=outer)
