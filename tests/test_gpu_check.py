"""The GPU check's one-device selection (`benchmarks/gpu_check.py`): on a mesh of one device
every strategy that splits no weight is the same program, so it profiles one configuration
per segment and the boundaries joining them, and must still leave every instance a plan."""

from __future__ import annotations

import pytest

import explorer as ex
from benchmarks.gpu_check import FirstUnsplit
from explorer.models import build


def test_one_configuration_per_segment_and_the_boundaries_joining_them() -> None:
    only = FirstUnsplit()
    # A dense layer's part 2 and a MoE layer's share a label; each keeps its own choice.
    assert only("segment", "layer part 2", "M@x,M@x")
    assert not only("segment", "layer part 2", "M@x,N@x")  # splits a weight
    assert not only("segment", "layer part 2", "E@x,M@x")  # a second choice, same type
    assert only("segment", "layer part 2", "M@x,E@x,E@x,E@x")
    assert only("segment", "layer part 3", "E@x")  # (offered without its context)
    # The boundary into the expert part joins what the segments chose, not the first one.
    assert not only("reshard", "layer part 2->layer part 3", "M@x->M@x")
    assert only("reshard", "layer part 2->layer part 3", "M@x->E@x")
    assert only("reshard", "layer part 2->layer part 3", "E@x->E@x")
    assert not only("reshard", "layer part 2->layer part 3", "K@x->E@x")
    # A segment without blocks ("-") is "none" on a boundary's side.
    assert only("segment", "embed", "-")
    assert only("reshard", "embed->layer part 2", "none->M@x")
    assert not only("reshard", "embed->layer part 2", "none->N@x")


@pytest.mark.slow
def test_a_moe_step_on_one_device_gets_a_plan_from_the_selection() -> None:
    """Before the selection joined boundaries to segments, the tiny MoE step's expert part
    was left without a boundary it could follow, and `analyze` refused the step."""
    built = build("moe", "tiny", layers=2, batch=8, abstract=True)
    analysis = ex.analyze(
        built.step,
        *built.args,
        mesh=(1,),
        platform="h200-sxm-8",
        cache=None,
        progress=False,
        only=FirstUnsplit(),
    )
    plan = analysis.plan()
    assert plan.time > 0
    segments = analysis.profiles[analysis.profiles["kind"] == "segment"]
    # one configuration per segment type (its rows differ only in the other blocks' context)
    own = segments["config"].str.split("|").str[0].str.strip()
    blocks = own.str.count(",") + 1
    assert (
        segments.assign(own=own, blocks=blocks).groupby(["label", "blocks"])["own"].nunique() == 1
    ).all()
