"""Placement: every value of the step has a layout, boundaries are constrained on both sides,
and a segment that reads a value another instance's block decides depends on that block."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import analysed, mlp_step, traced
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import explorer as ex
from explorer.ir import Config
from explorer.layouts import external_blocks, instance_dependencies, loop_twins, place
from explorer.mesh import mesh_spec
from explorer.profile.hlo import CollectiveKind, parse_collectives
from explorer.segments import build_segments


def _numeric(dtype: str) -> bool:
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_every_value_of_the_step_is_placed(name: str) -> None:
    _, _, graph = traced(name)
    _, analysis = analysed(name, (4,))
    segmentation = build_segments(graph, analysis)
    for choice in range(3):
        config = Config(tuple(min(choice, len(b.strategies) - 1) for b in analysis.blocks))
        placement = place(graph, analysis.blocks, config, mesh_spec((4,)), segmentation)
        placed = dict(placement.assignment.values)
        inputs = set(graph.inputs)
        missing = [
            v.id
            for v in graph.values
            if v.producer is not None
            and v.id not in inputs
            and v.type.rank > 0
            and _numeric(v.type.dtype)
            and v.id not in placed
        ]
        assert missing == []
        assert placement.unplaced == ()
        for vid, dims in placed.items():
            assert len(dims) == graph.values[vid].type.rank


def test_boundary_tensors_are_constrained_at_the_producer_and_at_every_reader() -> None:
    _, _, graph = traced("gpt")
    _, analysis = analysed("gpt", (4,))
    segmentation = build_segments(graph, analysis)
    config = Config(tuple(1 if len(b.strategies) > 1 else 0 for b in analysis.blocks))  # N
    assignment = place(graph, analysis.blocks, config, mesh_spec((4,)), segmentation).assignment
    produced = dict(assignment.values)
    reads = {(op, position): dims for op, position, dims in assignment.operands}
    boundary = segmentation.boundaries[1]  # layer_0 -> layer_1
    assert boundary.forward and boundary.backward
    for vid in boundary.forward:
        assert vid in produced
        readers = [
            (u, p)
            for u in graph.users(vid)
            if segmentation.segment_of_op[u] == 2
            for p, operand in enumerate(graph.ops[u].inputs)
            if operand == vid
        ]
        assert readers
        for key in readers:
            # a reader in the next instance reads where that instance's first block wants
            # it, whether or not that differs from where it was made
            wanted = reads.get(key, produced[vid])
            assert len(wanted) == graph.values[vid].type.rank


def test_tied_embedding_makes_the_embedding_depend_on_the_head() -> None:
    _, _, graph = traced("gpt")
    _, analysis = analysed("gpt", (4,))
    segmentation = build_segments(graph, analysis)
    mesh = mesh_spec((4,))
    depends = instance_dependencies(graph, analysis, segmentation, mesh)
    head = segmentation.instances[-1].blocks
    assert depends[0] == head  # the embedding reads wte, laid out by the LM head's block
    assert all(d == () for d in depends[1:])
    zero = place(graph, analysis.blocks, Config((0,) * len(analysis.blocks)), mesh, segmentation)
    twins = loop_twins(graph, analysis.blocks)
    assert twins == tuple(range(len(analysis.blocks)))  # no scan: every block its own twin
    assert external_blocks(zero, graph, segmentation, 1, twins) == ()


def test_combinable_all_reduces_are_marked_per_element() -> None:
    """An all-reduce whose value reaches only the results named terminal is combinable; one
    that feeds another result is not, even inside one combined tuple all-reduce."""
    mesh = jax.make_mesh((4,), ("x",))
    split = NamedSharding(mesh, P("x"))

    def f(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jnp.sum(a, axis=0), jnp.sum(b, axis=0) * 2.0

    compiled = (
        jax.jit(f, in_shardings=(split, split))
        .lower(jnp.ones((8, 16)), jnp.ones((8, 16)))
        .compile()
    )
    spec = mesh_spec((4,))
    found = parse_collectives(compiled.as_text(), spec, frozenset({0, 1}))
    reduces = [c for c in found if c.kind is CollectiveKind.ALL_REDUCE]
    assert reduces and all(c.fully_combinable for c in reduces)
    only_first = parse_collectives(compiled.as_text(), spec, frozenset({0}))
    flags = [
        flag for c in only_first if c.kind is CollectiveKind.ALL_REDUCE for flag in c.combinable
    ]
    assert sorted(flags) == [False, True]
    assert parse_collectives(compiled.as_text(), spec)[0].combinable == ()


def test_a_replicated_value_is_computed_split_where_all_its_readers_read_it_split() -> None:
    """The loss's one-hot of the labels (a step input, replicated) is read only by ops split
    on the batch under a batch-split head. It was computed whole on every device (LLaMA-7B
    shapes: 2.1 GB per device where the batch split needs 0.26 GB); slicing it moves nothing,
    so it is computed split, and so is everything made from it."""
    _, _, graph = traced("llama")
    _, analysis = analysed("llama", (4,))
    segmentation = build_segments(graph, analysis)
    config = Config((0,) * len(analysis.blocks))
    assert {b.strategies[0].name for b in analysis.blocks} == {"M@x"}  # the batch split
    placement = place(graph, analysis.blocks, config, mesh_spec((4,)), segmentation)
    placed = dict(placement.assignment.values)
    integer_inputs = {v for v in graph.inputs if graph.values[v].type.dtype.startswith("int")}

    def reaches(vid: int) -> set[int]:
        """The step inputs `vid` is computed from."""
        producer = graph.values[vid].producer
        if producer is None:
            return {vid}
        return {i for operand in graph.ops[producer].inputs for i in reaches(operand)}

    one_hots = [
        op.outputs[0]
        for op in graph.ops
        if op.primitive == "eq"
        and graph.values[op.outputs[0]].type.rank == 3
        and set().union(*(reaches(v) for v in op.inputs)) <= integer_inputs
    ]
    assert one_hots, "the loss compares the labels with an iota"
    for vid in one_hots:
        assert placed[vid] == (("x",), (), ())
        for user in graph.users(vid):  # its conversion to floats, read by the split loss
            assert placed[graph.ops[user].outputs[0]] == (("x",), (), ())


def test_a_weight_gradient_dot_follows_its_operand_split_over_more_devices() -> None:
    # 2-D Megatron: batch on x, w_in N and w_out K on y. w_out's gradient dot reads the saved
    # activation (split on x and y) and the cotangent (split on x only, and deeper). Led by the
    # cotangent, the step gathered the activation on y; led by the activation, only the
    # all-reduces Megatron needs move anything over y.
    params = {"w_in": jnp.ones((64, 128)), "w_out": jnp.ones((128, 64))}
    args = (params, optax.sgd(0.1).init(params), jnp.ones((16, 64)))
    analysis = ex.analyze(mlp_step, *args, mesh=(2, 2), profile=False)
    megatron_2d = tuple(
        [s.name for s in block.strategies].index(name)
        for block, name in zip(analysis.blocks, ("M@x,N@y", "M@x,K@y"), strict=True)
    )
    plan = analysis._evaluated_plan("manual", megatron_2d, None)
    truth = ex.evaluate(plan, mlp_step, *args)
    over_y = {kind for kind, _bytes, axes, _group in truth.emitted if axes == ("y",)}
    assert over_y == {"all-reduce"}
