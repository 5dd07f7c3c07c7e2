"""Placement: every value of the step has a layout, boundaries are constrained on both sides,
and a segment that reads a value another instance's block decides depends on that block."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import analysed, mlp_step, traced
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import explorer as ex
from explorer.baselines import baseline_choices
from explorer.blocks import build_blocks
from explorer.ir import Config
from explorer.layouts import (
    MOVED_ONCE,
    boundary_shared_moves,
    external_blocks,
    instance_dependencies,
    loop_twins,
    place,
    shared_moves,
)
from explorer.mesh import make_mesh, mesh_spec
from explorer.plan_build import make_plan
from explorer.profile.hlo import CollectiveKind, parse_collectives
from explorer.realize import realize, segment_program
from explorer.segments import build_segments
from explorer.space import build_space


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


def _sequence_parallel_with_hidden_split_projections() -> tuple[Any, Any, Any, Config]:
    """Megatron's plan of the tiny GPT with every block's scattering twin, but the blocks
    that offer a row-parallel twin and no column-parallel one (the attention's output
    projection) split on N (their output) instead: the layer norm after such a block is
    made split on the hidden dim, and the next segment's first block (a column-parallel
    twin) reads it on M-shards, in its forward contraction and in its weight gradient's."""
    graph, _ = analysed("gpt", (4,))
    spec = mesh_spec((4,))
    space = build_space(build_blocks(graph, 4), spec, sequence_parallel=True)
    segmentation = build_segments(graph, space)
    megatron = baseline_choices("megatron", space, segmentation)
    choices = []
    for block, plain in zip(space.blocks, megatron, strict=True):
        names = [s.name for s in block.strategies]
        name = names[plain]
        if "N@x,rs@x" not in names and name == "K@x":
            name = "N@x"
        elif f"{name},rs@x" in names:
            name = f"{name},rs@x"
        choices.append(names.index(name))
    return graph, space, segmentation, Config(tuple(choices))


def test_readers_of_a_boundary_tensor_in_one_layout_share_one_move() -> None:
    """The resharding program prices one move per boundary tensor, and the next segment's
    program receives it as one input. The whole step moved it once per reader: two
    resharded copies, each gathered again by the contraction reading it (on GPT-6.7B one
    all-gather of 128 MiB more per layer than was priced, a prediction 5.8 % low). Now the
    readers of one boundary tensor in one layout read one moved copy."""
    graph, space, segmentation, config = _sequence_parallel_with_hidden_split_projections()
    spec = mesh_spec((4,))
    assignment = place(graph, space.blocks, config, spec, segmentation).assignment
    shared = shared_moves(graph, assignment)
    assert shared, "a boundary tensor read twice on M-shards"
    crossing = {v for b in segmentation.boundaries for v in (*b.forward, *b.backward)}
    made = dict(assignment.values)
    reads = {(op, position): dims for op, position, dims in assignment.operands}
    for op, position in assignment.crossing_reads:
        vid = graph.ops[op].inputs[position]
        assert vid in crossing and reads[(op, position)] != made[vid]
    assert {vid for vid, _ in shared} <= crossing

    _, args, _ = traced("gpt")

    def gathers(placed: Any) -> list[int]:
        lowered = realize(graph, placed, make_mesh(spec)).lower(*args)
        found = parse_collectives(lowered.compile().as_text(), spec)
        return sorted(c.nbytes for c in found if c.kind is CollectiveKind.ALL_GATHER)

    once, per_reader = gathers(assignment), gathers(replace(assignment, crossing_reads=()))
    assert len(once) < len(per_reader)
    assert Counter(once) - Counter(per_reader) == Counter()  # no gather that was not there
    # segment programs: every read of a boundary tensor is of an input already in its layout
    plain = replace(assignment, crossing_reads=())
    first_reader = next(segmentation.segment_of_op[op] for op, _ in assignment.crossing_reads)
    instance = segmentation.instances[first_reader]
    programs = [
        segment_program(graph, instance.ops, placed, make_mesh(spec)).lower().as_text()
        for placed in (assignment, plain)
    ]
    assert programs[0] == programs[1]


def test_a_plan_whose_step_shares_a_move_is_marked() -> None:
    """Its whole step compiles otherwise than before the rule, so its document (the key of a
    kept evaluation) carries `MOVED_ONCE`; a plan whose step moves nothing shared keeps the
    document it had."""
    graph, space, segmentation, config = _sequence_parallel_with_hidden_split_projections()

    def plan(chosen: Config) -> Any:
        return make_plan(
            source="cfp", graph=graph, blocks=space, segments=(), config=chosen,
            mesh=mesh_spec((4,)), platform="a100-pcie-8", backend="compiled", time=1.0,
            memory=1, memory_eq9=1, budget=None, segmentation=segmentation,
        )  # fmt: skip

    assert MOVED_ONCE in plan(config).boundary_rules
    data_parallel = Config((0,) * len(space.blocks))
    assert plan(data_parallel).boundary_rules == ()


@pytest.mark.parametrize(
    ("name", "mesh", "sequence_parallel", "with_a_shared_move"),
    [
        ("gpt", (4,), True, True),
        ("gpt", (2, 2), True, False),
        ("llama", (4,), False, False),
        ("moe", (2, 2), False, False),
        ("bert", (4,), True, False),
    ],
)
def test_shared_moves_found_from_the_boundaries_are_the_placed_steps(
    name: str, mesh: tuple[int, ...], sequence_parallel: bool, with_a_shared_move: bool
) -> None:
    """A plan's `MOVED_ONCE` mark is read from its boundaries (`boundary_shared_moves`)
    rather than from the whole step placed (`place`, a walk over every op, once per plan
    built): the two agree on the baselines' configurations and on random ones."""
    _, _, graph = traced(name)
    spec = mesh_spec(mesh)
    space = build_space(build_blocks(graph, spec.size), spec, sequence_parallel=sequence_parallel)
    segmentation = build_segments(graph, space)
    rng = np.random.default_rng(7)
    configs = [Config(baseline_choices(b, space, segmentation)) for b in ("dp", "megatron")]
    configs += [
        Config(tuple(int(rng.integers(len(b.strategies))) for b in space.blocks)) for _ in range(12)
    ]
    if with_a_shared_move:  # (the tiny GPT on 4 devices, sequence-parallel)
        configs.append(_sequence_parallel_with_hidden_split_projections()[3])
    shared_somewhere = False
    for config in configs:
        placed = place(graph, space.blocks, config, spec, segmentation).assignment
        expected = shared_moves(graph, placed)
        found = boundary_shared_moves(graph, space.blocks, config, spec, segmentation)
        assert sorted(found) == sorted(expected), config
        shared_somewhere |= bool(found)
    if with_a_shared_move:
        assert shared_somewhere  # the comparison covers a step that does share a move
