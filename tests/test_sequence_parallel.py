"""Scattering twins (`analyze(sequence_parallel=True)`): a block that splits its contraction
may reduce-scatter the partial sums onto M instead of all-reducing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import pytest
from helpers import SHARED_CACHE, analysed, assert_trees_close

import explorer as ex
from explorer.blocks import build_blocks
from explorer.ir import Config, DimRole, ValueKind
from explorer.mesh import mesh_spec
from explorer.space import build_space, shardings

RTOL, ATOL = 2e-4, 2e-5


@pytest.mark.parametrize("model", ["gpt", "moe"])
@pytest.mark.parametrize("mesh", [(4,), (2, 2)])
def test_each_strategy_splitting_k_gets_a_scattering_twin_after_the_paper_s(
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
        expected = [
            f"{s.name},rs@{'+'.join(s.axes_of(DimRole.K))}"
            for s in before.strategies
            if s.axes_of(DimRole.K)
            and DimRole.M in sizes
            and sizes[DimRole.M] % spec.axes_size(s.axes_of(DimRole.M) + s.axes_of(DimRole.K)) == 0
        ]
        assert names[len(before.strategies) :] == expected
        assert all(s.scattered == s.axes_of(DimRole.K) for s in after.strategies if s.scattered)
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


@pytest.mark.slow
def test_a_scattering_plan_reduce_scatters_applies_and_is_predicted(tmp_path: Path) -> None:
    """A plan taking every scattering twin: its whole step reduce-scatters where the plain
    K plan all-reduces, it computes the unsharded step's numbers, its JSON records the space
    and loaded back applies the same way, and its prediction is within 5 % of the step."""
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    plain = jax.jit(step)
    _, params, opt_state = plain(*args)
    warm = (params, opt_state, args[2], jax.random.fold_in(args[3], 1))
    shape = ex.analyze(step, *warm, mesh=(4,), sequence_parallel=True, profile=False)
    twins = {
        b.index: next(s.name for s in b.strategies if s.scattered)
        for b in shape.blocks
        if any(s.scattered for s in b.strategies)
    }
    assert len(twins) == len(shape.blocks)  # every block of the tiny GPT splits K and M
    plains = {index: name.split(",rs@")[0] for index, name in twins.items()}

    def pinned(pins: dict[int, str]) -> set[str]:
        return {",".join(pins[b] for b in i.blocks) or "-" for i in shape.segments.instances}

    wanted = pinned(twins) | pinned(plains)

    def only(kind: str, label: str, config: str) -> bool:
        if kind == "reshard":
            return set(config.split("->")) <= {"K@x", "K@x,rs@x", "none"}
        return config in wanted

    analysis = ex.analyze(
        step, *warm, mesh=(4,), sequence_parallel=True, cache=SHARED_CACHE, progress=False,
        only=only,
    )  # fmt: skip
    scattering, reducing = analysis.plan(pins=twins), analysis.plan(pins=plains)
    assert all(",rs@x" in name for name in scattering.strategies)
    truth, plain_truth = ex.evaluate(scattering, step, *warm), ex.evaluate(reducing, step, *warm)
    # one reduce-scatter per head at least (XLA:CPU would all-reduce and slice: `Scatter`)
    scattered = sum(kind == "reduce-scatter" for kind, *_ in truth.emitted)
    assert scattered >= len(twins), truth.emitted
    assert "reduce-scatter" not in {kind for kind, *_ in plain_truth.emitted}
    assert scattering.time == pytest.approx(truth.time, rel=0.05)
    loaded = ex.load_plan(scattering.save(tmp_path / "scattering.json"))
    assert loaded.strategies == scattering.strategies
    assert loaded.space is not None and loaded.space.sequence_parallel
    assert_trees_close(plain(*warm), ex.apply_plan(loaded, step, donate=False)(*warm), RTOL, ATOL)
