"""Segments: unique types independent of depth, full coverage, fingerprints, boundaries."""

from __future__ import annotations

from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import traced

import explorer as ex
from explorer._jax_compat import random_bits_as_accelerators_lower
from explorer.blocks import build_blocks
from explorer.errors import ConfigCapError
from explorer.ir import BlockAnalysis, Config, Graph, Segmentation
from explorer.layouts import instance_dependencies
from explorer.mesh import make_mesh, mesh_spec
from explorer.plan_space import cut_rules
from explorer.platforms import load_platform
from explorer.profile.hlo import parse_collectives
from explorer.profile.runner import profile_all
from explorer.realize import reshard_program, segment_program
from explorer.segments import (
    SKIPPING_FLOATS,
    build_segments,
    check_config_cap,
    program_count,
)
from explorer.space import (
    ANCESTOR_BOUNDARIES,
    OWNED_BOUNDARIES,
    TRACED_BOUNDARIES,
    boundary_moves,
    build_space,
    changed_boundary_rules,
    changed_moves,
    owned_first_changes,
    reshard_signatures,
    segment_input_layouts,
    shardings,
    step_space,
    tracing_changes,
)


@cache
def _segmented(
    name: str, layers: int, mesh: tuple[int, ...] = (4,), **changes: Any
) -> tuple[Graph, BlockAnalysis, Segmentation]:
    fn, config_cls = ex.models.MODELS[name]
    step, args = fn(config_cls.tiny().replace(num_layers=layers, **changes), abstract=True)
    graph = ex.trace(step, *args)
    spec = mesh_spec(mesh)
    analysis = build_space(build_blocks(graph, spec.size), spec)
    return graph, analysis, build_segments(graph, analysis)


@pytest.mark.parametrize("name", ["gpt", "bert", "llama"])
def test_unique_segments_and_program_count_do_not_grow_with_depth(name: str) -> None:
    seen = set()
    for layers in (2, 4, 8, 16, 48):
        _graph, analysis, segmentation = _segmented(name, layers)
        labels = [u.label for u in segmentation.unique]
        assert labels.count("layer") <= 2
        assert {"embed", "head"} <= set(labels)
        assert len(segmentation.instances) == layers + 2
        count = program_count(segmentation, analysis)
        seen.add((len(segmentation.unique), count.total))
        assert segmentation.reuse_found
    assert len(seen) == 1, seen
    print(f"\n[{name}] {segmentation.summary()}\nprograms: {count.formula()}")


def test_gpt_program_count_on_a_mesh_of_four() -> None:
    _, analysis, segmentation = _segmented("gpt", 8)
    count = program_count(segmentation, analysis)
    # embed (no block: 1) + layer (3^4 = 81) + head (3); pairs embed->layer 1x3,
    # layer->layer 3x3, layer->head 3x3. The paper reports 2*81 + 2*9 = 180 for its GPT.
    assert count.per_type == ((0, 1), (1, 81), (2, 3))
    assert count.segment_programs == 85 and count.reshard_programs == 21
    assert count.total == 106


def test_boundaries_that_move_the_same_tensors_share_one_resharding_program() -> None:
    """Counted by what they move, GPT's 21 strategy pairs need 3 resharding programs: the
    residual stream (and its cotangent) between replicated, batch-split and feature-split,
    one program per pair of those layouts. The embedding's replicated output meets 2 of them;
    between layers a third appears and 3 of the 9 pairs move nothing; the head's boundary
    moves exactly what a layer's does."""
    graph, analysis, segmentation = _segmented("gpt", 8)
    reshards = reshard_signatures(graph, analysis.blocks, segmentation, mesh_spec((4,)))
    count = program_count(segmentation, analysis, reshards=reshards)
    assert count.segment_programs == 85 and count.reshard_programs == 3
    assert count.per_pair == ((0, 1, 2), (1, 1, 1), (1, 2, 0))
    assert reshards[(1, 2)] == reshards[(1, 1)]
    assert sum(not s for s in reshards[(1, 1)].values()) == 3
    moved = {s for table in reshards.values() for s in table.values() if s}
    assert len(moved) == 3
    for signature in moved:  # the activation forward, its cotangent back, same shape
        (first, second) = signature
        assert first[:2] == second[:2] == ("float32", (8, 32, 64))
        assert {first[2], first[3]} == {second[2], second[3]}


def test_moe_layers_are_split_under_the_cap_and_repeat() -> None:
    """The GShard MoE layer (7 blocks, 6,912 configurations) is cut into parts of at most
    the default cap's configurations; dense and MoE layers are distinct types, each repeated
    by depth."""
    _graph, analysis, segmentation = _segmented("moe", 4)
    print(segmentation.summary())
    labels = [i.label for i in segmentation.instances]
    parts = [label for label in labels if label.startswith("layer_1 part")]
    assert len(parts) >= 2
    dense = {segmentation.instances[labels.index(f"layer_{k}")].unique_id for k in (0, 2)}
    assert len(dense) == 1
    for part in parts:  # layer_3 repeats every part of layer_1
        suffix = part.removeprefix("layer_1")
        first = segmentation.instances[labels.index(part)].unique_id
        assert segmentation.instances[labels.index(f"layer_3{suffix}")].unique_id == first
        assert first not in dense
    check_config_cap(segmentation, analysis)  # every type fits
    assert any("split over the configuration cap" in note for note in segmentation.notes)


@pytest.mark.parametrize("mesh", [(4,), (2, 4)])
def test_moe_program_count_does_not_grow_with_depth(mesh: tuple[int, ...]) -> None:
    counts = {}
    for layers in (2, 4, 8, 16):
        graph, analysis, segmentation = _segmented("moe", layers, mesh)
        depends = instance_dependencies(graph, analysis, segmentation, mesh_spec(mesh))
        reshards = reshard_signatures(graph, analysis.blocks, segmentation, mesh_spec(mesh))
        counts[layers] = program_count(segmentation, analysis, depends, reshards).total
    print(counts)
    # 2 layers (one dense, one MoE) lack the MoE-to-dense boundary, whose reshardings move
    # what the MoE-to-head boundary moves: counted by content, every depth needs the same
    # programs. Measured 336 on mesh 4; 548 on 2x4, where the expert blocks also take E over
    # both axes.
    assert counts[2] == counts[4] == counts[8] == counts[16]
    assert max(counts.values()) <= (400 if len(mesh) == 1 else 600)


def test_every_op_is_in_exactly_one_segment_and_flops_add_up() -> None:
    step, args, graph = traced("gpt", 2)
    spec = mesh_spec((1,))
    analysis = build_space(build_blocks(graph, 1), spec)
    segmentation = build_segments(graph, analysis)
    ops = sorted(o for i in segmentation.instances for o in i.ops)
    assert ops == list(range(len(graph.ops)))
    assignment = shardings(graph, analysis.blocks, Config((0,) * len(analysis.blocks)), spec)
    mesh = make_mesh(spec)

    def flops(compiled: Any) -> float:
        cost = compiled.cost_analysis()
        return float((cost[0] if isinstance(cost, list) else cost)["flops"])

    # random bits lowered as segment programs lower them (as accelerators do, see
    # realize.StandaloneProgram.lower); the CPU's own rolled loop counts other flops
    with random_bits_as_accelerators_lower():
        whole = flops(jax.jit(step).lower(*args).compile())
    parts = sum(
        flops(segment_program(graph, i.ops, assignment, mesh).lower().compile())
        for i in segmentation.instances
    )
    print(f"\nwhole-step flops {whole:.4g}, sum of segment programs {parts:.4g}")
    assert abs(parts - whole) <= 0.02 * whole


def test_hidden_size_changes_the_fingerprint() -> None:
    small = _segmented("gpt", 2)[2]
    wide = _segmented("gpt", 2, hidden=128, ffn=512)[2]
    layer = lambda s: s.unique[s.instances[1].unique_id].fingerprint  # noqa: E731
    assert layer(small) != layer(wide)


def _layer_step(extra_in_layer: int | None) -> Any:
    opt = optax.sgd(0.1)

    def loss(params: Any, x: jax.Array) -> jax.Array:
        for i, layer in enumerate(params):
            with jax.named_scope(f"layer_{i}"):
                h = jax.nn.relu(x @ layer["w_in"])
                y = h @ layer["w_out"]
                if i == extra_in_layer:
                    y = y * 1.5  # an extra elementwise op on the residual path
                x = x + y
        with jax.named_scope("head"):  # the loss is its own segment, as in the model zoo
            return jnp.mean(x**2)

    def step(params: Any, opt_state: Any, x: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(params, x)
        updates, opt_state = opt.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    params = [{"w_in": jnp.ones((16, 32)), "w_out": jnp.ones((32, 16))} for _ in range(3)]
    return step, (params, opt.init(params), jnp.ones((8, 16)))


def test_an_extra_elementwise_op_keeps_the_fingerprint() -> None:
    for extra in (None, 1):
        step, args = _layer_step(extra)
        graph = ex.trace(step, *args)
        segmentation = build_segments(graph, build_blocks(graph, 4))
        labels = [i.label for i in segmentation.instances]
        assert labels == ["layer_0", "layer_1", "layer_2", "head"]
        assert segmentation.instances[1].unique_id == segmentation.instances[2].unique_id
        _the_first_layer_reading_data_is_its_own_type(segmentation)


def _the_first_layer_reading_data_is_its_own_type(segmentation: Any) -> None:
    """`layer_0` reads the step's data: its backward makes no input cotangent, so its program
    lacks the matmul (and collectives) the later layers run for theirs."""
    first, second = segmentation.instances[:2]
    assert segmentation.boundaries[0].backward  # layer_1 sends layer_0 its cotangent
    assert first.unique_id != second.unique_id


def _no_repeat_step(params: Any, opt_state: Any, x: jax.Array) -> Any:
    opt = optax.sgd(0.1)

    def loss(p: Any) -> jax.Array:
        h = x
        for w in p:  # widths 16 -> 32 -> 8 -> 24: nothing repeats
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return value, optax.apply_updates(params, updates), opt_state


def test_no_repeated_structure_makes_every_sequence_its_own_segment() -> None:
    params = [jnp.ones((16, 32)), jnp.ones((32, 8)), jnp.ones((8, 24))]
    graph = ex.trace(_no_repeat_step, params, optax.sgd(0.1).init(params), jnp.ones((4, 16)))
    analysis = build_blocks(graph, 4)
    segmentation = build_segments(graph, analysis)
    assert segmentation.method == "repeats"
    assert not segmentation.reuse_found
    assert any("no reuse found" in note for note in segmentation.notes)
    covered = sorted(b for i in segmentation.instances for b in i.blocks)
    assert covered == list(range(len(analysis.blocks)))


def test_tandem_repeats_are_found_without_scopes() -> None:
    step, args = _layer_step(None)
    graph = ex.trace(step, *args)
    # the same graph with every scope erased, as a user step without named scopes would be
    stripped = type(graph)(
        ops=tuple(
            type(op)(**{**{f: getattr(op, f) for f in op.__slots__}, "scope": ""})
            for op in graph.ops
        ),
        values=graph.values,
        inputs=graph.inputs,
        outputs=graph.outputs,
        output_paths=graph.output_paths,
        program=graph.program,
    )
    segmentation = build_segments(stripped, build_blocks(stripped, 4))
    assert segmentation.method == "repeats"
    assert [len(i.blocks) for i in segmentation.instances] == [2, 2, 2, 0]  # 3 layers, loss
    assert segmentation.instances[1].unique_id == segmentation.instances[2].unique_id
    _the_first_layer_reading_data_is_its_own_type(segmentation)


def test_a_block_alone_over_the_cap_is_refused_with_its_count() -> None:
    graph, analysis, _ = _segmented("gpt", 2)
    segmentation = build_segments(graph, analysis, cap=2)  # every block has 3 strategies
    with pytest.raises(ConfigCapError, match=r"alone has 3 strategies.*cap of 2"):
        check_config_cap(segmentation, analysis, cap=2)


def test_analyze_cuts_segments_at_its_config_cap() -> None:
    """`analyze(config_cap=)` is the cap segments are cut for: GPT's layer (81 configurations)
    comes out in parts of at most 27, and profiling a space cut for a larger cap is refused
    before anything compiles, naming the type and how to cut it."""
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2), abstract=True)
    analysis = ex.analyze(step, *args, mesh=(4,), profile=False, config_cap=27)
    count = analysis.program_counts
    assert max(n for _, n in count.per_type) <= 27
    assert any("split over the configuration cap" in n for n in analysis.segments.notes)
    wide = ex.analyze(step, *args, mesh=(4,), profile=False)  # cut for the default cap
    with pytest.raises(ConfigCapError, match=r"81 configurations.*cap=27"):
        profile_all(
            wide.graph, wide.block_analysis, wide.segments, wide.mesh,
            platform=load_platform("a100-pcie-8"), config_cap=27, progress=False,
        )  # fmt: skip


def test_layer_boundaries_carry_the_activation_and_its_cotangent() -> None:
    graph, _, segmentation = _segmented("gpt", 4)
    for boundary in segmentation.boundaries[1:-1]:  # between two layers
        forward_shapes = {graph.values[v].type.shape for v in boundary.forward}
        backward_shapes = {graph.values[v].type.shape for v in boundary.backward}
        assert (8, 32, 64) in forward_shapes and (8, 32, 64) in backward_shapes


def test_resharding_between_layers_costs_only_when_layouts_differ() -> None:
    graph, analysis, segmentation = _segmented("gpt", 2)
    spec = mesh_spec((4,))
    mesh = make_mesh(spec)
    last = analysis.blocks[segmentation.instances[1].blocks[-1]]  # layer_0 MLP-out
    first = analysis.blocks[segmentation.instances[2].blocks[0]]  # layer_1 QKV
    index = lambda block, name: [s.name for s in block.strategies].index(name)  # noqa: E731
    for before, after, expect_comm in (("M@x", "M@x", False), ("M@x", "N@x", True)):
        moves = boundary_moves(
            graph,
            analysis.blocks,
            segmentation,
            1,
            spec,
            last_choice=index(last, before),
            first_choice=index(first, after),
        )
        producers = [graph.producer(v) for v, _, _ in moves]
        # the activation and its cotangent
        assert {p.role.value for p in producers if p is not None} == {"forward", "backward"}
        hlo = reshard_program(graph, moves, mesh).lower().compile().as_text()
        assert bool(parse_collectives(hlo, spec)) is expect_comm, (before, after)


def test_a_scalar_broadcast_crossing_a_boundary_moves_for_free() -> None:
    # MoE's backward sends a broadcast scalar (a cotangent of zeros) across a boundary. The
    # whole step makes it where it is wanted; a resharding program given it as an input
    # would all-gather it (on MoE-7.1B at batch 16, 7 x 80 MiB the step does not move)
    graph, analysis, segmentation = _segmented("moe", 4)
    seen = 0
    for boundary in range(len(segmentation.boundaries)):
        ends = segmentation.instances[boundary].blocks, segmentation.instances[boundary + 1].blocks
        if not all(ends):
            continue  # no block on one side: the step's own inputs or results
        before, after = analysis.blocks[ends[0][-1]], analysis.blocks[ends[1][0]]
        for last in range(len(before.strategies)):
            for first in range(len(after.strategies)):
                moves = boundary_moves(
                    graph, analysis.blocks, segmentation, boundary, mesh_spec((4,)),
                    last_choice=last, first_choice=first,
                )  # fmt: skip
                kept = {v for v, _, _ in changed_moves(graph, moves)}
                for v, source, target in moves:
                    producer = graph.producer(v)
                    broadcast = (
                        producer is not None
                        and producer.primitive == "broadcast_in_dim"
                        and all(graph.values[i].type.rank == 0 for i in producer.inputs)
                    )
                    if broadcast and source != target:
                        seen += 1
                        assert v not in kept
                    elif source != target:
                        assert v in kept, (boundary, last, first, v)
    assert seen > 0, "the MoE step sends a scalar broadcast across a boundary"


def test_a_layer_segment_compiles_from_abstract_shapes_with_its_boundary_layouts() -> None:
    graph, analysis, segmentation = _segmented("gpt", 2)
    spec = mesh_spec((4,))
    instance = segmentation.instances[1]
    choices = (0, 0, 0, 0)  # every block batch-split
    config = Config(tuple(0 for _ in analysis.blocks))
    layouts = segment_input_layouts(graph, analysis.blocks, segmentation, 1, choices, mesh=spec)
    assert layouts and all(dims[0] == ("x",) for dims in layouts.values())
    program = segment_program(
        graph,
        instance.ops,
        shardings(graph, analysis.blocks, config, spec),
        make_mesh(spec),
        layouts,
    )
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in program.inputs)
    collectives = parse_collectives(program.lower().compile().as_text(), spec)
    # data parallel inside a layer: only its own weight gradients are all-reduced
    assert collectives and all(c.is_backward for c in collectives if not c.is_scalar)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_segment_reads_its_cotangent_only_after_sending_its_activation(dtype: str) -> None:
    """Standalone, a layer could run its backward all-reduces with its forward ones (the
    compiler combines them); in the step the cotangent comes back only after the activation
    went out. The program must keep that order in bf16 as in f32 (numpy does not count
    bfloat16 as floating, which once left bf16 programs untied: -8 % time, +-20 % memory)."""
    graph, analysis, segmentation = _segmented("llama", 2, dtype=dtype)
    spec = mesh_spec((4,))
    index = 1
    instance = segmentation.instances[index]
    blocks = analysis.blocks
    # the attention's qkv block batch-split, the rest split on the model dim (N): a layout
    # whose forward RMSNorm sum needs an all-reduce the compiler would otherwise delay
    wanted = ("M@x", "N@x", "N@x", "N@x")
    choices = tuple(
        [s.name for s in blocks[b].strategies].index(name)
        for b, name in zip(instance.blocks, wanted, strict=True)
    )
    chosen = dict(zip(instance.blocks, choices, strict=True))
    config = Config(tuple(chosen.get(b, 0) for b in range(len(blocks))))
    crossing = segmentation.boundaries[index]
    program = segment_program(
        graph,
        instance.ops,
        shardings(graph, blocks, config, spec),
        make_mesh(spec),
        segment_input_layouts(graph, blocks, segmentation, index, choices, mesh=spec),
        after=(crossing.backward, crossing.forward),
    )
    collectives = parse_collectives(program.lower().compile().as_text(), spec)
    assert collectives
    mixed = [c.name for c in collectives if len({"transpose(" in name for name in c.op_names}) > 1]
    assert not mixed, f"forward and backward collectives combined: {mixed}"


def test_a_type_whose_instances_depend_on_other_blocks_is_split_before_profiling() -> None:
    """Tiny LLaMA at batch 2 with the mesh axes freed: the third part of layer 0 and of
    layer 1 are one type by their contractions, but the residual stream skips a part, so
    layer 0's reads the next layer's cotangent (one block) and layer 1's the previous
    layer's output and the head's cotangent (two). No program of layer 0's can stand for
    layer 1's; it used to fail after profiling every program (LLaMA-7B: 15 minutes on 2
    cores). The type is split, each part of it profiled at its own first instance."""
    from explorer.layouts import instance_dependencies

    built = ex.models.build("llama", "tiny", batch=2, abstract=True)
    step = ex.analyze(
        built.step, *built.args, mesh=(2, 4), free_axes=True, profile=False, config_cap=256
    )  # the cut whose third parts repeat (the default cap cuts the layers finer)
    segments, blocks = step.segments, step.block_analysis.blocks
    labels = {u.id: u.label for u in segments.unique}
    by_label = {i.label: labels[i.unique_id] for i in segments.instances}
    assert by_label["layer_0 part 3"] == "layer part 3"
    assert by_label["layer_1 part 3"] == "layer part 3 (2)"
    assert any("'layer part 3' split in 2" in note for note in segments.notes)
    # every instance of a type now depends on blocks with the strategies of its first's
    dependencies = instance_dependencies(step.graph, step.block_analysis, segments, step.mesh)
    first: dict[int, tuple[tuple[str, ...], ...]] = {}
    for instance in segments.instances:
        signature = tuple(
            tuple(s.name for s in blocks[b].strategies) for b in dependencies[instance.index]
        )
        assert first.setdefault(instance.unique_id, signature) == signature, instance.label
    # splitting only renames types: each instance keeps its ops and blocks, so it depends on
    # what it did before (`analyze` hands the dependencies it split by to profiling)
    unsplit = build_segments(step.graph, step.block_analysis, cap=256)
    assert [(i.ops, i.blocks) for i in unsplit.instances] == [
        (i.ops, i.blocks) for i in segments.instances
    ]
    assert instance_dependencies(step.graph, step.block_analysis, unsplit, step.mesh) == (
        dependencies
    )
    assert [u.instance_count for u in segments.unique] == [
        sum(i.unique_id == u.id for i in segments.instances) for u in segments.unique
    ]
    # where every instance depends alike nothing is split: the pinned space, or batch 8
    for mesh, batch, free in (((2, 4), 2, False), ((2, 4), 8, True)):
        built = ex.models.build("llama", "tiny", batch=batch, abstract=True)
        plain = ex.analyze(
            built.step, *built.args, mesh=mesh, free_axes=free, profile=False, config_cap=256
        )
        assert not any("split in" in note for note in plain.segments.notes)
        assert all("(2)" not in u.label for u in plain.segments.unique)


@cache
def _llama_whole_mesh_cut() -> tuple[Any, Any, Any, Segmentation, int, dict[str, int]]:
    """LLaMA-7B (2 layers, batch 2) on 4x2 with whole-mesh strategies, cut at 256
    configurations a type (the cap its plans were first compiled under): its graph, mesh,
    blocks and segments, the boundary cutting a layer between the attention core and its
    output projection, and the flat mesh's Megatron pair there (core `E@x+y`, projection
    `K@x+y`) as `boundary_moves` takes it."""
    model = ex.models.build("llama", "llama_7b_bf16", layers=2, batch=2, abstract=True)
    spec = mesh_spec((4, 2))
    graph = ex.trace(model.step, *model.args)
    space = step_space(graph, spec, whole_mesh=True)
    blocks, segmentation = space.blocks, build_segments(graph, space, cap=256)
    cut = next(
        b
        for b, boundary in enumerate(segmentation.boundaries)
        if segmentation.instances[b].label.endswith("part 1")
        and graph.producer(boundary.forward[0]).primitive == "reshape"
    )
    core = blocks[segmentation.instances[cut].blocks[-1]]
    projection = blocks[segmentation.instances[cut + 1].blocks[0]]
    index = lambda block, name: [s.name for s in block.strategies].index(name)  # noqa: E731
    pair = {"last_choice": index(core, "E@x+y"), "first_choice": index(projection, "K@x+y")}
    return graph, spec, blocks, segmentation, cut, pair


def test_a_value_a_reshape_hands_across_a_boundary_keeps_its_block_s_split() -> None:
    """LLaMA-7B on 4x2 with whole-mesh strategies cuts a layer between the attention core
    and its output projection: what crosses is the heads merged by a reshape after the core,
    which no block owns and no block value shares a shape with. It once crossed replicated
    (gathered at the end of one segment, split again at the start of the next); traced
    through the reshape to the core's split heads it crosses as it is, both ways. The layer
    boundaries, where the rule before tracing already had a layout, are left alone (their
    profiles stay valid), as is every boundary of the paper's space under that cap."""
    graph, spec, blocks, segmentation, cut, pair = _llama_whole_mesh_cut()
    now = boundary_moves(graph, blocks, segmentation, cut, spec, **pair)
    before = boundary_moves(graph, blocks, segmentation, cut, None, **pair)  # before tracing
    heads = segmentation.boundaries[cut].forward[0]
    merged = {v: (produced, wanted) for v, produced, wanted in now}[heads]
    assert merged == (((), (), ("x", "y")),) * 2  # split on the merged heads, unmoved
    assert {v: produced for v, produced, _ in before}[heads] == ((), (), ())
    assert len(changed_moves(graph, now)) < len(changed_moves(graph, before))
    assert tracing_changes(graph, blocks, segmentation, cut, spec)
    layer_ends = [
        b
        for b in range(len(segmentation.boundaries))
        if segmentation.instances[b + 1].label.endswith("part 1")
    ]
    assert layer_ends and not any(
        tracing_changes(graph, blocks, segmentation, b, spec) for b in layer_ends
    )
    paper = step_space(graph, spec)
    plain = build_segments(graph, paper, cap=256)  # as its kept whole steps were cut
    assert not any(
        tracing_changes(graph, paper.blocks, plain, b, spec) for b in range(len(plain.boundaries))
    )


def test_a_cotangent_a_block_makes_crosses_where_the_block_made_it() -> None:
    """The same cut, backward: the residual stream's cotangent passes through the output
    projection's backward (an add of the block's own) and crosses back to the core's part.
    By shape it once took the projection's input layout (split on the hidden dim over every
    device) where the projection holds it whole: sliced where made, gathered where read, a
    move the whole step never makes. Owned values first, the flat mesh's Megatron layers
    cross the cut with nothing to move; only the whole-mesh space's cut boundaries change
    (their types' keys are marked), never a boundary of the paper's space under that cap."""
    graph, spec, blocks, segmentation, cut, pair = _llama_whole_mesh_cut()
    projection = blocks[segmentation.instances[cut + 1].blocks[0]]
    now = boundary_moves(graph, blocks, segmentation, cut, spec, **pair)
    before = boundary_moves(graph, blocks, segmentation, cut, spec, **pair, owned_first=False)
    assert changed_moves(graph, now) == ()
    (moved,) = changed_moves(graph, before)
    cotangent, made, read = moved
    assert cotangent in segmentation.boundaries[cut].backward
    assert projection.layout_of(cotangent) is not None  # the projection's own value
    assert (made, read) == (((), (), ("x", "y")), ((), (), ()))
    assert owned_first_changes(graph, blocks, segmentation, cut, spec)
    paper = step_space(graph, spec)
    plain = build_segments(graph, paper, cap=256)  # as its kept whole steps were cut
    assert not any(
        owned_first_changes(graph, paper.blocks, plain, b, spec)
        for b in range(len(plain.boundaries))
    )


def test_a_segmentation_a_boundary_rule_changed_is_marked_for_its_plans() -> None:
    """The whole-mesh cut changed under both boundary rules since its plans were first
    compiled, so its plans record both (`Plan.boundary_rules`): their whole steps are kept
    apart from those compiled before (`layout_digest`). The paper's space under that cap,
    whose boundaries no rule changed, marks none: the kept whole steps of its plans stay
    valid. (Under the default cap of 81 its finer cut is marked: those plans are new.)"""
    graph, spec, blocks, segmentation, _cut, _pair = _llama_whole_mesh_cut()
    marks = changed_boundary_rules(graph, blocks, segmentation, spec)
    assert marks == (TRACED_BOUNDARIES, OWNED_BOUNDARIES)
    paper = step_space(graph, spec)
    plain = build_segments(graph, paper, cap=256)  # as its kept whole steps were cut
    assert changed_boundary_rules(graph, paper.blocks, plain, spec) == ()


def test_a_dropout_key_does_not_decide_where_a_span_over_the_cap_is_cut() -> None:
    """BERT-large (2 layers, batch 2) on 2x4 with whole-mesh strategies: the fused QKV
    projection, the scores (`bqhd,bkhd->bhqk`) and their product with the values take 5 x 7 x
    7 configurations, over the cap of 81, so the span is cut once. The rule before counted
    the dropout key read past the first cut (8 bytes of integers, replicated under every
    strategy) as a skipping tensor, and cut between the scores and the product instead, past
    the values `v` the projection made: the scores block, last before that cut, has no
    layout for them, so the boundary replicated them and even the flat Megatron plan
    gathered them (BERT-large b8 on 2x8: 194.1 ms against 139.2 uncut). Counting floats
    only, the cut falls after the projection, which fewer bytes cross, and the values cross
    as it made them. Back across it comes the projection's cotangent, which the later part
    assembles from the scores' and the product's cotangents (padded into place and summed:
    JAX links those ops to no forward op, so they go with their terms). The scores block
    has no layout of its own for that shape, and replicated it until it took the layout of
    the tensor its `q` and `k` are sliced from (`ANCESTOR_BOUNDARIES`): now nothing moves at
    any boundary inside the layer under that plan. Plans of the new cut are marked with both
    rules (`cut_rules`, `changed_boundary_rules`), so they are not kept under the keys of the
    old cut's plans."""
    model = ex.models.build("bert", "bert_large", layers=2, batch=2, abstract=True)
    spec = mesh_spec((2, 4))
    graph = ex.trace(model.step, *model.args)
    space = step_space(graph, spec, whole_mesh=True)
    blocks = space.blocks
    flat = ("N@x+y", "E@x+y", "E@x+y", "K@x+y", "N@x+y", "K@x+y")  # the layer's Megatron plan

    def moved_inside_layer(segmentation: Segmentation) -> list[tuple[int, ...]]:
        layer = [
            b for i in segmentation.instances if i.label.startswith("layer_0") for b in i.blocks
        ]
        assert len(layer) == len(flat)
        choice = {
            b: [s.name for s in blocks[b].strategies].index(n)
            for b, n in zip(layer, flat, strict=True)
        }
        shapes = []
        for b, instance in enumerate(segmentation.instances[:-1]):
            after = segmentation.instances[b + 1]
            if not (instance.label.startswith("layer_0") and after.label.startswith("layer_0")):
                continue
            moves = boundary_moves(
                graph,
                blocks,
                segmentation,
                b,
                spec,
                last_choice=choice[instance.blocks[-1]],
                first_choice=choice[after.blocks[0]],
            )
            shapes += [graph.values[v].type.shape for v, _, _ in changed_moves(graph, moves)]
        return shapes

    new = build_segments(graph, space, cap=81)
    old = build_segments(graph, space, cap=81, floats_only=False)
    layer_parts = lambda s: [i.blocks for i in s.instances if i.label.startswith("layer_0")]  # noqa: E731
    assert layer_parts(old) == [(0, 1), (2,), (3,), (4, 5)]
    assert layer_parts(new) == [(0,), (1, 2), (3,), (4, 5)]
    v_shape = (2, 512, 16, 64)  # batch, sequence, heads, head dim
    qkv_shape = (2, 512, 16, 3, 64)  # the fused projection's result
    assert sorted(moved_inside_layer(old)) == sorted([v_shape, qkv_shape])
    assert moved_inside_layer(new) == []
    assert ANCESTOR_BOUNDARIES in changed_boundary_rules(graph, blocks, new, spec)
    assert cut_rules(graph, space, new, 81) == (SKIPPING_FLOATS,)
    assert cut_rules(graph, space, old, 81) == ()  # the rule before cut it so
    paper = step_space(graph, spec)  # nothing skips where the paper's space is cut at 81
    assert cut_rules(graph, paper, build_segments(graph, paper, cap=81), 81) == ()
