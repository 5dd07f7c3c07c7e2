"""The typed plan and its JSON form: plan files read into `Plan` and write back unchanged.

tests/golden/plans/ holds plans of a small MLP (mesh 4, a100-pcie-8) for the CFP solver and
every baseline. The first set was written by the explorer before plans were typed (when a plan
was its JSON dict; commit 8faa9e5); the files were written again at PROGRAM_VERSION
transposed-18, in the same format, because the engine's plans changed: the MLP's weights are
square, their gradients' transposed dots are no longer block-owned, and the CFP plan went
from data parallel to N@x, K@x. Reading one and writing it again gives the same bytes, so
plan files and evaluation caches (keyed by a digest of the JSON) stay valid.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import jax
import pytest
from helpers import SHARED_CACHE

import explorer as ex
from explorer.evaluation_store import layout_digest
from explorer.plan import Plan, PlanError
from explorer.plan_document import plan_from_json, plan_to_json
from explorer.plan_types import BlockChoice
from explorer.platforms import load_platform

GOLDEN = Path(__file__).parent / "golden" / "plans"
SOURCES = ("cfp", "dp", "megatron", "fsdp", "alpa")


@pytest.mark.parametrize("source", SOURCES)
def test_a_plan_file_reads_and_writes_back_byte_identical(source: str, tmp_path: Path) -> None:
    golden = GOLDEN / f"{source}.json"
    plan = ex.load_plan(golden)
    assert plan.source == source
    written = plan.save(tmp_path / "plan.json")
    assert written.read_bytes() == golden.read_bytes()
    assert plan.to_json() + "\n" == golden.read_text()
    # the digest the evaluation store keys by is the one of the file's JSON
    assert layout_digest(plan_to_json(plan)) == layout_digest(json.loads(golden.read_text()))
    assert ex.load_plan(written) == plan


def test_a_plan_placed_under_a_changed_boundary_rule_keys_another_whole_step() -> None:
    """`boundary_rules` is written only where some rule applies, so every plan made before it
    keeps its file and digest; where one applies the evaluation store keys the plan's whole
    step apart from the one compiled under the rule before."""
    plan = ex.load_plan(GOLDEN / "cfp.json")
    marked = replace(plan, boundary_rules=("owned-21",))
    document = plan_to_json(marked)
    assert document["boundary_rules"] == ["owned-21"]
    assert "boundary_rules" not in plan_to_json(plan)
    assert layout_digest(document) != layout_digest(plan_to_json(plan))
    assert plan_from_json(json.loads(marked.to_json())) == marked


def test_the_typed_fields_say_what_the_file_says() -> None:
    document = json.loads((GOLDEN / "alpa.json").read_text())
    plan = ex.load_plan(GOLDEN / "alpa.json")
    assert plan.mesh.names == tuple(document["mesh"]["axes"])
    assert plan.mesh.shape == tuple(document["mesh"]["shape"])
    assert plan.platform == load_platform(document["platform"])
    assert (plan.time, plan.memory) == (
        document["predicted"]["time"],
        document["predicted"]["memory"],
    )
    assert plan.predicted.memory_eq9 == document["predicted"]["memory_eq9"]
    assert plan.strategies == tuple(b["strategy"] for b in document["blocks"])
    assert plan.per_op and plan.ilp is not None
    assert plan.ilp.status == document["ilp"]["status"]
    assert plan.values is not None and len(plan.values) == len(document["values"])
    vid, dims = plan.values[0]
    assert [list(a) or None for a in dims] == document["values"][str(vid)]
    block = plan.blocks[0]
    for key, spec in document["blocks"][0]["values"].items():
        assert [list(a) if a else None for a in block.layout_of(int(key)) or ()] == spec
    assert not ex.load_plan(GOLDEN / "dp.json").per_op


def test_a_plan_without_its_platform_in_full_writes_back_without_it(tmp_path: Path) -> None:
    """Plans written before platforms were recorded in full name a preset only."""
    document = json.loads((GOLDEN / "dp.json").read_text())
    del document["platform_spec"]
    plan = plan_from_json(document)
    assert plan.priced_on is None and plan.platform == load_platform(document["platform"])
    assert plan_to_json(plan) == document
    assert json.loads(plan.save(tmp_path / "plan.json").read_text()) == document


def test_layout_keys_are_value_ids_and_op_positions(tmp_path: Path) -> None:
    document = json.loads((GOLDEN / "alpa.json").read_text())
    path = tmp_path / "plan.json"
    for field, key, message in (
        ("values", "01", r"field 'values\.01': expected the id of a value"),
        ("values", "-1", r"field 'values\.-1': expected the id of a value"),
        ("operands", "3", r"field 'operands\.3': expected 'op:position'"),
        ("operands", "3:x", r"field 'operands\.3:x': expected 'op:position'"),
    ):
        path.write_text(json.dumps({**document, field: {key: [None]}}))
        with pytest.raises(PlanError, match=message):
            ex.load_plan(path)
    blocks = document["blocks"]
    spoiled = [{**blocks[0], "values": {"x1": [None]}}, *blocks[1:]]
    path.write_text(json.dumps({**document, "blocks": spoiled}))
    with pytest.raises(PlanError, match=r"field 'blocks\.0\.values\.x1'"):
        ex.load_plan(path)


def test_the_plan_types_check_their_invariants() -> None:
    plan = ex.load_plan(GOLDEN / "dp.json")
    with pytest.raises(ValueError, match="sorted and unique"):
        BlockChoice(0, "s", "h", "M@x", ((3, ()), (1, ())))
    with pytest.raises(ValueError, match="sorted and unique"):
        replace(plan, parameters=tuple(reversed(plan.parameters)))
    with pytest.raises(ValueError, match="platform_name"):
        replace(plan, platform_name="another")
    with pytest.raises(ValueError, match="never negative"):
        replace(plan.predicted, time=-1.0)


@cache
def _made_plans() -> dict[str, Plan]:
    """The plans of the golden files, made again (the MLP is the one of test_alpa)."""
    from test_alpa import _mlp_graph

    step, args, _ = _mlp_graph(8, 64, 64)
    analysis = ex.analyze(
        step, *args, mesh=(4,), platform="a100-pcie-8", cache=SHARED_CACHE, progress=False
    )
    return {"cfp": analysis.plan(), **{s: analysis.baseline(s) for s in SOURCES[1:]}}


@pytest.mark.parametrize("source", SOURCES)
def test_a_made_plan_round_trips_and_writes_what_its_golden_file_holds(
    source: str, tmp_path: Path
) -> None:
    plan = _made_plans()[source]
    written = plan.save(tmp_path / "plan.json")
    loaded = ex.load_plan(written)
    assert loaded == plan
    assert loaded.save(tmp_path / "again.json").read_bytes() == written.read_bytes()
    # what decides the program is what the explorer wrote before plans were typed; the
    # timings follow XLA and the ILP solver's clock
    made, golden = (
        json.loads(written.read_text()),
        json.loads((GOLDEN / f"{source}.json").read_text()),
    )
    assert made["versions"]["jax"] == jax.__version__
    timed: tuple[Any, ...] = ("predicted", "segments", "ilp", "versions")
    assert {k: v for k, v in made.items() if k not in timed} == {
        k: v for k, v in golden.items() if k not in timed
    }
    assert [s["configuration"] for s in made["segments"]] == [
        s["configuration"] for s in golden["segments"]
    ]
