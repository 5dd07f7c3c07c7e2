"""A block plan records the space it was made in where its names do not tell it, so the plan
that is applied (and the whole step kept for it) is cut into the segments it was priced with.
Traced only (`profile=False`): nothing is compiled."""

from __future__ import annotations

import json
from typing import Any

import pytest

import explorer as ex
from explorer.errors import InputError, PlanError
from explorer.evaluation_store import layout_digest
from explorer.ir import Config
from explorer.plan_build import make_plan
from explorer.plan_document import plan_from_json, plan_to_json
from explorer.plan_space import space_of
from explorer.plan_types import PAPER_SPACE, UNRECORDED_CAP, SpaceOptions
from explorer.segments import DEFAULT_CONFIG_CAP


@pytest.fixture(scope="module")
def gpt() -> tuple[Any, Any, Any]:
    """Tiny GPT (2 layers) on 2x2, traced: the step, its arguments and the paper's space."""
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    paper = ex.analyze(step, *args, mesh=(2, 2), profile=False, cache=None)
    return step, args, paper


def _plan(analysis: Any, names: list[str]) -> Any:
    """The block plan of `names` in `analysis`'s space, as its solver would make it."""
    index = [
        [s.name for s in block.strategies].index(name)
        for block, name in zip(analysis.blocks, names, strict=True)
    ]
    return make_plan(
        source="cfp",
        graph=analysis.graph,
        blocks=analysis.block_analysis,
        segments=(),
        config=Config(tuple(index)),
        mesh=analysis.mesh,
        platform=analysis.platform,
        backend=analysis.backend,
        time=1.0,
        memory=1,
        memory_eq9=1,
        budget=None,
        space=analysis.space,
    )


def test_a_wider_space_s_plan_of_the_paper_s_names_records_its_space(gpt: Any) -> None:
    """The whole-mesh space cuts tiny GPT's layers in parts (6 instances; the paper's 4). Its
    plan of the paper's strategies names nothing only that space offers, so it records
    `whole_mesh`: its document, and the key its whole step is kept under, differ from the
    paper's plan of the same names, and applying it cuts the step as its space did. A plan
    of a flattened strategy is told by its names and records nothing."""
    step, args, paper = gpt
    wide = ex.analyze(step, *args, mesh=(2, 2), profile=False, whole_mesh=True, traced=paper.graph)
    assert paper.segments.boundaries != wide.segments.boundaries  # the premise
    names = ["M@x,N@y"] * len(paper.blocks)
    mine, papers = _plan(wide, names), _plan(paper, names)
    assert mine.strategies == papers.strategies
    assert (mine.space, papers.space) == (SpaceOptions(whole_mesh=True), None)
    document = plan_to_json(mine)
    assert document["space"] == {"whole_mesh": True}
    assert "space" not in plan_to_json(papers)
    assert layout_digest(document) != layout_digest(plan_to_json(papers))
    assert plan_from_json(json.loads(mine.to_json())) == mine
    assert space_of(mine, paper.graph)[1].boundaries == wide.segments.boundaries
    assert space_of(papers, paper.graph)[1].boundaries == paper.segments.boundaries
    flattened = _plan(wide, ["N@x+y", *names[1:]])
    assert flattened.space is None
    assert space_of(flattened, paper.graph)[1].boundaries == wide.segments.boundaries


def test_a_plan_cut_under_another_cap_records_it_and_is_cut_so_again(gpt: Any) -> None:
    """A configuration cap of 8 cuts the step elsewhere (10 instances under 8 configurations
    a type), so the plan records it whatever its names."""
    step, args, paper = gpt
    capped = ex.analyze(step, *args, mesh=(2, 2), profile=False, config_cap=8, traced=paper.graph)
    assert len(capped.segments.instances) > len(paper.segments.instances)
    plan = _plan(capped, ["M@x,N@y"] * len(capped.blocks))
    assert plan.space == SpaceOptions(config_cap=8)
    assert plan_to_json(plan)["space"] == {"config_cap": 8}
    assert space_of(plan, paper.graph)[1].boundaries == capped.segments.boundaries


def test_a_cap_is_recorded_only_where_it_cuts_the_step_otherwise_than_an_unrecorded_one() -> None:
    """Tiny GPT at batch 8 on mesh 4: a layer (4 blocks of 3 strategies, 81 configurations)
    is whole under the default cap and under `UNRECORDED_CAP`, so its plan records no cap
    and keeps the document (and the key of its whole step) of a plan cut under 256. At batch
    2 the batch does not split: the attention cores become blocks of 4 strategies, the layer
    is over 81 configurations and the default cap cuts it finer than 256 does, so the plan
    records the cap and is cut so again where it is applied."""
    assert DEFAULT_CONFIG_CAP != UNRECORDED_CAP  # the premise
    for batch, recorded in ((8, None), (2, {"config_cap": DEFAULT_CONFIG_CAP})):
        step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2, batch=batch))
        default = ex.analyze(step, *args, mesh=(4,), profile=False, cache=None)
        unrecorded = ex.analyze(
            step, *args, mesh=(4,), profile=False, config_cap=UNRECORDED_CAP, traced=default.graph
        )
        names = [block.strategies[0].name for block in default.blocks]
        plan, old = _plan(default, names), _plan(unrecorded, names)
        assert plan_to_json(plan).get("space") == recorded
        assert "space" not in plan_to_json(old)
        alike = recorded is None
        assert (layout_digest(plan_to_json(plan)) == layout_digest(plan_to_json(old))) is alike
        assert (default.segments.boundaries == unrecorded.segments.boundaries) is alike
        assert space_of(plan, default.graph)[1].boundaries == default.segments.boundaries
        assert plan_from_json(json.loads(plan.to_json())) == plan


def test_a_1d_mesh_has_one_space_whatever_the_2d_widenings() -> None:
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    flat = ex.analyze(step, *args, mesh=(4,), profile=False, whole_mesh=True, free_axes=True)
    assert flat.space == PAPER_SPACE
    assert _plan(flat, ["M@x"] * len(flat.blocks)).space is None


@pytest.mark.parametrize(
    ("space", "found"),
    [({"whole_mesh": "yes"}, "'yes'"), ({"mesh_axes": True}, "mesh_axes"), ({}, "{}")],
)
def test_a_malformed_space_is_refused_naming_the_field(gpt: Any, space: Any, found: str) -> None:
    _, _, paper = gpt
    document = plan_to_json(_plan(paper, ["M@x,N@y"] * len(paper.blocks)))
    document["space"] = space
    with pytest.raises(PlanError, match="space") as caught:
        plan_from_json(document, "plan.json")
    assert found in str(caught.value)


def test_a_batch_outer_plan_records_its_space_and_applies_with_its_primed_roles() -> None:
    """Tiny GPT at batch 2 on 2x2: the batch does not split 4 ways, so the batch-outer space
    primes M' (E' in the attention cores) in every block. A plan splitting the batch over x
    names roles no other space has: it records the space, its document says so, and
    `space_of` rebuilds the same strategies and segments. At batch 4 nothing is primed:
    that space is the paper's, and records nothing."""
    config = ex.models.GPTConfig.tiny().replace(num_layers=2, batch=2)
    step, args = ex.models.gpt(config)
    outer = ex.analyze(step, *args, mesh=(2, 2), profile=False, cache=None, batch_outer=True)
    assert outer.space == SpaceOptions(batch_outer=True)
    names = [
        next(s.name for s in block.strategies if s.name.startswith(("M'@x", "E'@x")))
        for block in outer.blocks
    ]
    assert outer.space == SpaceOptions(batch_outer=True)
    _assert_recorded_and_rebuilt(_plan(outer, names), outer, {"batch_outer": True})
    step, args = ex.models.gpt(config.replace(batch=4))
    unprimed = ex.analyze(step, *args, mesh=(2, 2), profile=False, cache=None, batch_outer=True)
    assert unprimed.space == PAPER_SPACE


def test_a_batch_inner_plan_records_its_space_primed_or_not(gpt: Any) -> None:
    """The batch-inner space swaps the paper's axes, so on 2x2 it is a space of its own at
    any batch: at batch 4 nothing is primed and its plans still record it (their names,
    "N@x,M@y", are the freed space's too, which cuts the step otherwise), even a plan of
    names the paper's space offers (its segments are its own space's cut). At batch 2 its
    primed plans name M'@y and E'@y; `space_of` rebuilds the strategies and segments of
    each."""
    step, args, paper = gpt
    inner = ex.analyze(
        step, *args, mesh=(2, 2), profile=False, cache=None, batch_inner=True, traced=paper.graph
    )
    assert inner.space == SpaceOptions(batch_inner=True) and not inner.block_analysis.primed
    swapped = _plan(inner, [block.strategies[1].name for block in inner.blocks])
    assert all(name.endswith("M@y") for name in swapped.strategies), swapped.strategies
    _assert_recorded_and_rebuilt(swapped, inner, {"batch_inner": True})
    _assert_recorded_and_rebuilt(
        _plan(inner, ["M@x+y"] * len(inner.blocks)), inner, {"batch_inner": True}
    )
    config = ex.models.GPTConfig.tiny().replace(num_layers=2, batch=2)
    step, args = ex.models.gpt(config)
    primed = ex.analyze(step, *args, mesh=(2, 2), profile=False, cache=None, batch_inner=True)
    names = [
        next(s.name for s in block.strategies if s.name.endswith(("M'@y", "E'@y")))
        for block in primed.blocks
    ]
    _assert_recorded_and_rebuilt(_plan(primed, names), primed, {"batch_inner": True})
    with pytest.raises(InputError, match="batch_outer, batch_inner"):
        ex.analyze(step, *args, mesh=(2, 2), profile=False, batch_outer=True, batch_inner=True)


def test_a_contract_last_plan_records_its_space_where_a_block_s_k_moved() -> None:
    """Tiny MoE on 4 devices with `contract_last=True`: its combine einsums' K moves to their
    experts' dim, under the paper's names, so its plans record the space and `space_of`
    rebuilds those blocks, not the paper's. Where no block's K moves (tiny GPT), the space
    is the paper's and records nothing. A switch that is no bool is refused first."""
    step, args = ex.models.moe(ex.models.MoEConfig.tiny().replace(num_layers=2))
    paper = ex.analyze(step, *args, mesh=(4,), profile=False, cache=None)
    last = ex.analyze(
        step, *args, mesh=(4,), profile=False, cache=None, contract_last=True, traced=paper.graph
    )
    assert last.space == SpaceOptions(contract_last=True) and paper.space == PAPER_SPACE
    names = [next(s.name for s in b.strategies if s.name.startswith("K@")) for b in last.blocks]
    plan = _plan(last, names)
    _assert_recorded_and_rebuilt(plan, last, {"contract_last": True})
    space, _ = space_of(plan, last.graph)
    assert space.blocks == last.block_analysis.blocks != paper.block_analysis.blocks
    assert layout_digest(plan_to_json(plan)) != layout_digest(plan_to_json(_plan(paper, names)))
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    gpt = ex.analyze(step, *args, mesh=(4,), profile=False, cache=None, contract_last=True)
    assert gpt.space == PAPER_SPACE
    with pytest.raises(InputError, match="contract_last: expected True or False"):
        ex.analyze(step, *args, mesh=(4,), profile=False, contract_last="yes")


def _assert_recorded_and_rebuilt(plan: Any, analysis: Any, recorded: dict[str, bool]) -> None:
    """`plan` records its space as `recorded`, survives its JSON, and `space_of` rebuilds
    `analysis`' strategies and segments from it."""
    assert plan.space == analysis.space
    assert plan_to_json(plan)["space"] == recorded
    assert plan_from_json(json.loads(plan.to_json())) == plan
    space, segments = space_of(plan, analysis.graph)
    assert [[s.name for s in b.strategies] for b in space.blocks] == [
        [s.name for s in b.strategies] for b in analysis.blocks
    ]
    assert segments.boundaries == analysis.segments.boundaries


def test_a_scattering_plan_records_its_space_and_applies_with_its_twins(gpt: Any) -> None:
    """Tiny GPT on 2x2 with scattering twins (`sequence_parallel=True`): a plan of twins
    names strategies no other space offers, a plan of the space's plain strategies names
    only the paper's, and both record the space, so `space_of` rebuilds its strategies and
    the segments its twins cut the step into. A switch that is no bool is refused first."""
    step, args, paper = gpt
    twinned = ex.analyze(
        step, *args, mesh=(2, 2), profile=False, cache=None, sequence_parallel=True,
        traced=paper.graph,
    )  # fmt: skip
    assert twinned.space.sequence_parallel and twinned.space != PAPER_SPACE
    twins = [next(s.name for s in b.strategies if s.scattered) for b in twinned.blocks]
    assert all(name.endswith(",rs@y") for name in twins)
    plain = [twinned.blocks[i].strategies[0].name for i in range(len(twinned.blocks))]
    for names in (twins, plain):
        plan = _plan(twinned, names)
        assert plan.space == twinned.space
        assert plan_to_json(plan)["space"]["sequence_parallel"] is True
        assert plan_from_json(json.loads(plan.to_json())) == plan
        space, segments = space_of(plan, twinned.graph)
        assert [[s.name for s in b.strategies] for b in space.blocks] == [
            [s.name for s in b.strategies] for b in twinned.blocks
        ]
        assert segments.boundaries == twinned.segments.boundaries
    with pytest.raises(InputError, match="sequence_parallel"):
        ex.analyze(step, *args, mesh=(2, 2), profile=False, sequence_parallel="yes")
