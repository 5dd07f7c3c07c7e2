"""Scattering twins (`analyze(sequence_parallel=True)`): a block that splits its contraction
may reduce-scatter the partial sums onto M instead of all-reducing them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import pytest
from helpers import SHARED_CACHE, analysed, assert_trees_close

import explorer as ex
from explorer.baselines import baseline_choices
from explorer.blocks import build_blocks
from explorer.ir import Config, DimRole, Strategy, ValueKind
from explorer.layouts import CONTEXT_SEPARATOR, MOVED_ONCE
from explorer.mesh import make_mesh, mesh_spec
from explorer.plan_build import make_plan
from explorer.plan_types import SpaceOptions
from explorer.platforms import load_platform
from explorer.profile.backends import Backend
from explorer.profile.jobs import _Context
from explorer.profile.runner import DYNAMIC_LIMIT_FACTOR
from explorer.segments import build_segments
from explorer.space import GATHERED_READS, build_space, scattering_marks, shardings

RTOL, ATOL = 2e-4, 2e-5


@pytest.mark.parametrize("model", ["gpt", "moe"])
@pytest.mark.parametrize("mesh", [(4,), (2, 2)])
def test_each_strategy_splitting_k_or_n_gets_a_scattering_twin_after_the_paper_s(
    model: str, mesh: tuple[int, ...]
) -> None:
    graph, _ = analysed(model, (4,))
    spec = mesh_spec(mesh)
    blocks = build_blocks(graph, spec.size)
    paper = build_space(blocks, spec)
    twinned = build_space(blocks, spec, sequence_parallel=True)
    assert sum(len(b.strategies) for b in twinned.blocks) > sum(
        len(b.strategies) for b in paper.blocks
    )
    for before, after in zip(paper.blocks, twinned.blocks, strict=True):
        names = [s.name for s in after.strategies]
        assert names[: len(before.strategies)] == [s.name for s in before.strategies]
        sizes = dict(before.role_sizes)

        def scattering(s: Strategy) -> DimRole:
            return DimRole.K if s.axes_of(DimRole.K) else DimRole.N

        expected = [
            f"{s.name},rs@{'+'.join(s.axes_of(scattering(s)))}"
            for s in before.strategies
            if s.axes_of(scattering(s))
            and before.partial_sums_over(scattering(s))
            and DimRole.M in sizes
            and sizes[DimRole.M] % spec.axes_size(s.axes_of(DimRole.M) + s.axes_of(scattering(s)))
            == 0
        ]
        assert names[len(before.strategies) :] == expected
        for s in after.strategies:
            if s.scattered:
                assert s.scattering_role is scattering(s)
                assert s.scattered == s.axes_of(scattering(s))
    # row parallel (K) twins everywhere the head splits K; column parallel (N) twins only
    # where a backward contraction over N makes a gradient holding M: not in every block
    kinds = {s.scattering_role for b in twinned.blocks for s in b.strategies if s.scattered}
    assert kinds == {DimRole.K, DimRole.N}
    assert any(
        not b.partial_sums_over(DimRole.N) and any(s.axes_of(DimRole.N) for s in b.strategies)
        for b in twinned.blocks
    )
    # with ZeRO twins too: a scattering twin that splits the batch stores its weights as well
    both = build_space(
        blocks,
        spec,
        sequence_parallel=True,
        stored_parameters=frozenset(v.id for v in graph.inputs_of_kind(ValueKind.PARAMETER)),
    )
    if len(mesh) > 1:
        assert "M@x,K@y,rs@y,params@x" in {s.name for b in both.blocks for s in b.strategies}


def test_a_scattering_twin_splits_m_from_the_head_s_result_on_and_k_before_it() -> None:
    """Under `K@x,rs@x` the head's operands are split on K as under `K@x`; its result, the
    ops after it and their gradients are split on M over x, where `K@x` leaves them whole."""
    graph, _ = analysed("gpt", (4,))
    spec = mesh_spec((4,))
    space = build_space(build_blocks(graph, 4), spec, sequence_parallel=True)
    block = space.blocks[1]  # the attention's output projection: M, N and K
    names = [s.name for s in block.strategies]
    plain, twin = names.index("K@x"), names.index("K@x,rs@x")

    def assigned(choice: int) -> Any:
        choices = [0] * len(space.blocks)
        choices[block.index] = choice
        return shardings(graph, space.blocks, Config(tuple(choices)), spec)

    head = graph.ops[block.head]

    def wanted(assignment: Any, position: int) -> Any:
        """How the head gets its operand: as it asks for it, or where the step's input
        (the weight) is placed."""
        asked = {(op, pos): dims for op, pos, dims in assignment.operands}
        if (head.id, position) in asked:
            return asked[(head.id, position)]
        return assignment.inputs[graph.inputs.index(head.inputs[position])]

    m_dim = block.layout_of(head.outputs[0]).dim_of(DimRole.M)
    twin_assignment, plain_assignment = assigned(twin), assigned(plain)
    values, plain_values = twin_assignment.value_map(), plain_assignment.value_map()
    # the head's operands (the activation, the weight): K over x, M whole, as under `K@x`
    for position in range(2):
        assert wanted(twin_assignment, position) == wanted(plain_assignment, position)
        assert ("x",) in wanted(twin_assignment, position)
    # the head's result: M over x, whole under the plain strategy
    assert values[head.outputs[0]][m_dim] == ("x",)
    assert not any(plain_values[head.outputs[0]])
    # every forward value the block owns after the head holding M is split there too
    after = [
        layout
        for layout in block.layouts
        if graph.values[layout.value].producer in block.forward_ops
        and layout.dim_of(DimRole.M) is not None
        and layout.dim_of(DimRole.K) is None
    ]
    assert len(after) > 1
    for layout in after:
        assert values[layout.value][layout.dim_of(DimRole.M)] == ("x",)
    # backward: what holds M alone (the gradients of the ops after the head) is split on M
    # over x; anything holding K (none here: the operands' gradients are their owners')
    # as under `K@x`
    holding = {"K": 0, "M": 0}
    for layout in block.layouts:
        if graph.values[layout.value].producer not in block.backward_ops:
            continue
        if layout.dim_of(DimRole.K) is not None:
            assert values[layout.value] == plain_values[layout.value]
            holding["K"] += 1
        elif layout.dim_of(DimRole.M) is not None:
            assert values[layout.value][layout.dim_of(DimRole.M)] == ("x",)
            holding["M"] += 1
    assert holding["M"], holding


def test_a_column_parallel_twin_scatters_the_input_gradient_and_gathers_its_input() -> None:
    """Under `N@x,rs@x` every value holding N is split as under `N@x`; the head reads its
    input whole as under `N@x`; the backward contraction over N making the head's input
    gradient reduce-scatters it onto M over x (`Scatter`), where `N@x` leaves it whole; the
    weight gradient's contraction reads the head's input whole, not on M-shards."""
    graph, _ = analysed("gpt", (4,))
    spec = mesh_spec((4,))
    space = build_space(build_blocks(graph, 4), spec, sequence_parallel=True)
    block = space.blocks[2]  # the MLP's first projection: column parallel under N@x
    names = [s.name for s in block.strategies]
    plain, twin = names.index("N@x"), names.index("N@x,rs@x")
    assert block.strategies[twin].scattering_role is DimRole.N

    def assigned(choice: int) -> Any:
        choices = [0] * len(space.blocks)
        choices[block.index] = choice
        return shardings(graph, space.blocks, Config(tuple(choices)), spec)

    twin_assignment, plain_assignment = assigned(twin), assigned(plain)
    values, plain_values = twin_assignment.value_map(), plain_assignment.value_map()
    scattering = [s for s in twin_assignment.scatters if s.op in block.backward_ops]
    (scatter,) = scattering
    assert not [s for s in plain_assignment.scatters if s.op in block.ops]
    made = graph.ops[scatter.op].outputs[0]
    layout = block.layout_of(made)
    assert layout.dim_of(DimRole.N) is None and scatter.dim == layout.dim_of(DimRole.M)
    assert values[made][scatter.dim] == ("x",) and not any(plain_values[made])
    for owned in block.layouts:  # what holds N is split as the plain strategy splits it
        if owned.dim_of(DimRole.N) is not None and owned.value in values:
            assert values[owned.value] == plain_values[owned.value]
    head = graph.ops[block.head]
    reads = {(op, pos): dims for op, pos, dims in twin_assignment.operands}
    plain_reads = {(op, pos): dims for op, pos, dims in plain_assignment.operands}
    assert reads[(head.id, 0)] == plain_reads[(head.id, 0)]
    assert not any(reads[(head.id, 0)])  # the input whole: gathered where it came on shards
    # the weight gradient: a backward contraction reading the head's input, read whole there
    gradient = [
        (op, pos)
        for op in block.backward_ops
        for pos, vid in enumerate(graph.ops[op].inputs)
        if vid == head.inputs[0] and op != scatter.op
    ]
    assert gradient and all(not any(reads[key]) for key in gradient)
    assert not any(key in plain_reads for key in gradient)


def test_a_row_parallel_twin_s_backward_contractions_read_its_cotangent_whole() -> None:
    """Under `K@x,rs@x` the gradient of the head's result is split on M over x; the block's
    backward contractions read it whole (gathered once), as Megatron's backward does, not
    on M-shards: a weight gradient following the M-shards sums them into a whole weight."""
    graph, _ = analysed("gpt", (4,))
    spec = mesh_spec((4,))
    space = build_space(build_blocks(graph, 4), spec, sequence_parallel=True)
    block = space.blocks[3]  # the MLP's second projection: row parallel under K@x
    twin = [s.name for s in block.strategies].index("K@x,rs@x")
    choices = [0] * len(space.blocks)
    choices[block.index] = twin
    assignment = shardings(graph, space.blocks, Config(tuple(choices)), spec)
    values = assignment.value_map()
    reads = {(op, pos): dims for op, pos, dims in assignment.operands}
    gathered = 0
    for op in block.backward_ops:
        node = graph.ops[op]
        if node.primitive != "dot_general":
            continue
        for pos, vid in enumerate(node.inputs):
            owned = block.layout_of(vid)
            if owned is None or owned.dim_of(DimRole.K) is not None:
                continue
            if values[vid][owned.dim_of(DimRole.M)] == ("x",):  # kept on M-shards
                assert not any(reads[(op, pos)]), (op, pos)
                gathered += 1
    assert gathered >= 1


def test_twins_programs_and_plans_carry_the_gathered_reads_mark() -> None:
    """A program or plan choosing a scattering twin carries `GATHERED_READS` (its name is
    the same as before the rule); one choosing none keeps its key and document as before."""
    graph, _ = analysed("gpt", (4,))
    spec = mesh_spec((4,))
    space = build_space(build_blocks(graph, 4), spec, sequence_parallel=True)
    twin = space.blocks[3].strategies[
        [s.name for s in space.blocks[3].strategies].index("K@x,rs@x")
    ]
    assert scattering_marks([twin, space.blocks[3].strategies[0]]) == (GATHERED_READS,)
    assert scattering_marks(space.blocks[3].strategies[:3]) == ()
    context = _Context(
        graph, space, build_segments(graph, space), spec, make_mesh(spec),
        load_platform("a100-pcie-8"), Backend.COMPILED, DYNAMIC_LIMIT_FACTOR,
    )  # fmt: skip
    marked = {
        job.config: job.key.extra.endswith(f":{GATHERED_READS}") for job in context.segment_jobs()
    }
    assert any(marked.values()) and not all(marked.values())
    for config, mark in marked.items():
        assert mark == (",rs@" in config), config

    def plan(choice: int) -> Any:
        choices = [0] * len(space.blocks)
        choices[3] = choice
        return make_plan(
            source="cfp", graph=graph, blocks=space, segments=(), config=Config(tuple(choices)),
            mesh=spec, platform="a100-pcie-8", backend="compiled", time=1.0, memory=1,
            memory_eq9=1, budget=None, space=SpaceOptions(sequence_parallel=True),
        )  # fmt: skip

    twinned, plain = plan(space.blocks[3].strategies.index(twin)), plan(2)
    assert twinned.boundary_rules == (GATHERED_READS,) and plain.boundary_rules == ()
    assert json.loads(twinned.to_json())["boundary_rules"] == [GATHERED_READS]
    assert "boundary_rules" not in json.loads(plain.to_json())


@pytest.mark.slow
def test_a_scattering_plan_reduce_scatters_applies_and_is_predicted(tmp_path: Path) -> None:
    """Megatron's sequence parallelism, block by block: Megatron's plan with every block's
    twin (row parallel blocks scattering the head's partial sums, column parallel ones their
    input gradient's). Its whole step reduce-scatters where Megatron's all-reduces, it
    computes the unsharded step's numbers, its JSON records the space and loaded back
    applies the same way, and its prediction is within 5 % of the step."""
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    plain = jax.jit(step)
    _, params, opt_state = plain(*args)
    warm = (params, opt_state, args[2], jax.random.fold_in(args[3], 1))
    shape = ex.analyze(step, *warm, mesh=(4,), sequence_parallel=True, profile=False)
    megatron = baseline_choices("megatron", shape.block_analysis, shape.segments)
    plains = {b.index: b.strategies[c].name for b, c in zip(shape.blocks, megatron, strict=True)}
    offered = [{s.name for s in b.strategies} for b in shape.blocks]
    twins = {
        i: f"{name},rs@x" if f"{name},rs@x" in offered[i] else name for i, name in plains.items()
    }
    twinned = [name for name in twins.values() if ",rs@x" in name]
    assert {name[0] for name in twinned} == {"K", "N"}  # row and column parallel twins
    scatters = sum(
        len(shape.blocks[i].partial_sums_over(DimRole.K if n.startswith("K") else DimRole.N))
        for i, n in twins.items()
        if ",rs@x" in n
    )

    def pinned(pins: dict[int, str]) -> set[str]:
        return {",".join(pins[b] for b in i.blocks) or "-" for i in shape.segments.instances}

    wanted = pinned(twins) | pinned(plains)
    allowed = set(twins.values()) | set(plains.values()) | {"none"}

    def only(kind: str, label: str, config: str) -> bool:
        if kind == "reshard":
            return set(config.split("->")) <= allowed
        return config in wanted

    analysis = ex.analyze(
        step, *warm, mesh=(4,), sequence_parallel=True, cache=SHARED_CACHE, progress=False,
        only=only,
    )  # fmt: skip
    scattering, reducing = analysis.plan(pins=twins), analysis.plan(pins=plains)
    assert sum(",rs@x" in name for name in scattering.strategies) == len(twinned)
    truth, plain_truth = ex.evaluate(scattering, step, *warm), ex.evaluate(reducing, step, *warm)
    # one reduce-scatter per scattered contraction (XLA:CPU would all-reduce and slice)
    scattered = sum(kind == "reduce-scatter" for kind, *_ in truth.emitted)
    assert scattered >= scatters >= len(twinned), truth.emitted
    # each all-reduce of a whole activation Megatron's step makes, the twins' scatters
    activation = max(n for kind, n, *_ in truth.emitted if kind == "reduce-scatter")

    def whole(emitted: Any) -> int:
        return sum(kind == "all-reduce" and n >= activation for kind, n, *_ in emitted)

    assert whole(truth.emitted) <= whole(plain_truth.emitted) - scatters
    assert truth.memory < plain_truth.memory
    assert "reduce-scatter" not in {kind for kind, *_ in plain_truth.emitted}
    assert scattering.time == pytest.approx(truth.time, rel=0.05)
    loaded = ex.load_plan(scattering.save(tmp_path / "scattering.json"))
    assert loaded.strategies == scattering.strategies
    assert loaded.space is not None and loaded.space.sequence_parallel
    assert_trees_close(plain(*warm), ex.apply_plan(loaded, step, donate=False)(*warm), RTOL, ATOL)


@pytest.mark.slow
def test_a_hidden_split_projection_among_twins_is_predicted_as_its_step_runs() -> None:
    """Megatron's twins with the attention's output projections split on their output (N@x,
    plain): the layer norm they feed is made split on the hidden dim and read on M-shards by
    the next segment's first block, forward and backward. The whole step moved it once per
    reader and gathered each copy, and the prediction was 3.8 % under it here (5.6 % on
    GPT-6.7B at batch 8 on 8 devices); moved once, as priced, it is within 1 %."""
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    shape = ex.analyze(step, *args, mesh=(4,), sequence_parallel=True, profile=False)
    megatron = baseline_choices("megatron", shape.block_analysis, shape.segments)
    pins = {}
    for block, plain in zip(shape.blocks, megatron, strict=True):
        names = [s.name for s in block.strategies]
        name = names[plain]
        if "N@x,rs@x" not in names and name == "K@x":
            name = "N@x"  # the output projection, where Megatron splits K
        elif f"{name},rs@x" in names:
            name = f"{name},rs@x"
        pins[block.index] = name
    assert "N@x" in pins.values()
    wanted = {",".join(pins[b] for b in i.blocks) or "-" for i in shape.segments.instances}
    allowed = set(pins.values()) | {"none"}

    def only(kind: str, label: str, config: str) -> bool:
        if kind == "reshard":
            return set(config.split("->")) <= allowed
        return config.split(CONTEXT_SEPARATOR, maxsplit=1)[0] in wanted  # under any context

    analysis = ex.analyze(
        step, *args, mesh=(4,), sequence_parallel=True, cache=SHARED_CACHE, progress=False,
        only=only,
    )  # fmt: skip
    plan = analysis.plan(pins=pins)
    assert MOVED_ONCE in plan.boundary_rules
    truth = ex.evaluate(plan, step, *args)
    assert plan.time == pytest.approx(truth.time, rel=0.01)
