"""Platforms travel with plans as objects: a plan priced on a scaled platform records it in
full, and evaluating the plan (or its saved copy) prices on that platform, never on a
platform looked up again by name."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path
from typing import Any

import jax
import pytest
from helpers import SHARED_CACHE

import explorer as ex
from explorer.baselines import baseline_choices
from explorer.evaluation_store import EvaluationStore
from explorer.ir import Config
from explorer.plan import Plan, PlanError, evaluate_on, make_plan
from explorer.plan_document import plan_to_json
from explorer.platforms import load_platform

BASE = "a100-pcie-8"
BASELINES = ("dp", "megatron", "fsdp", "alpa")


@cache
def _model() -> tuple[Any, tuple[Any, ...]]:
    # tiny GPT as test_plan's: the session's profile cache serves both modules (profiles are
    # keyed by program and mesh, not platform)
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    _, params, opt_state = jax.jit(step)(*args)
    return step, (params, opt_state, args[2], jax.random.fold_in(args[3], 1))


@cache
def _dp_plan() -> tuple[Any, tuple[Any, ...], Plan, Any]:
    """A data-parallel plan priced on the scaled platform, without profiling."""
    step, args = _model()
    scaled = load_platform(BASE).scaled(2)
    shape = ex.analyze(step, *args, mesh=(4,), platform=scaled, cache=None, profile=False)
    plan = make_plan(
        source="dp",
        graph=shape.graph,
        blocks=shape.block_analysis,
        segments=[],
        config=Config(baseline_choices("dp", shape.block_analysis, shape.segments)),
        mesh=shape.mesh,
        platform=shape.platform,
        backend="compiled",
        time=1e-3,
        memory=2**20,
        memory_eq9=2**20,
        budget=None,
    )
    return step, args, plan, scaled


@pytest.mark.slow
def test_the_plan_and_every_baseline_of_a_scaled_platform_evaluate_on_it(
    tmp_path: Path,
) -> None:
    """The issue's acceptance test: analyze on `load_platform(...).scaled(2)`, then evaluate
    the CFP plan and every baseline."""
    step, args = _model()
    scaled = load_platform(BASE).scaled(2)
    analysis = ex.analyze(
        step, *args, mesh=(4,), platform=scaled, cache=SHARED_CACHE, progress=False
    )
    assert scaled.name == f"{BASE}-bw2x"
    plans = {"cfp": analysis.plan(), **{name: analysis.baseline(name) for name in BASELINES}}
    with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
        for name, plan in plans.items():
            assert plan.platform_name == scaled.name, name
            assert plan.platform == scaled, name
            both = evaluate_on(plan, [scaled, BASE], step, *args, store=store)
            on_scaled, on_base = both[scaled], both[BASE]
            hits = store.hits
            assert ex.evaluate(plan, step, *args, store=store) == on_scaled, name
            assert store.hits == hits + 1, name  # the scaled platform's row, not recompiled
            # one program, priced twice: computation alike, communication at twice the
            # bandwidth (same latencies) strictly faster wherever the step communicates
            assert on_scaled.t_comp == on_base.t_comp, name
            assert on_scaled.emitted == on_base.emitted, name
            if on_scaled.collectives:
                assert on_scaled.t_comm < on_base.t_comm, name
            else:
                assert on_scaled.t_comm == on_base.t_comm == 0.0, name
            if name in ("fsdp", "alpa"):  # predicted by their evaluation on their platform
                assert plan.time == pytest.approx(on_scaled.time, rel=1e-6), name


def test_a_plan_evaluates_and_saves_with_its_scaled_platform(tmp_path: Path) -> None:
    step, args, plan, scaled = _dp_plan()
    assert plan.platform_name == scaled.name
    assert plan.platform == scaled
    loaded = ex.load_plan(plan.save(tmp_path / "plan.json"))
    assert loaded == plan
    assert loaded.platform == scaled
    with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
        on_both = evaluate_on(loaded, [scaled, BASE], step, *args, store=store)
        assert ex.evaluate(loaded, step, *args, store=store) == on_both[scaled]
        assert store.hits == 1  # the scaled platform's row, kept by evaluate_on
    on_scaled, on_base = on_both[scaled], on_both[BASE]
    assert on_scaled.collectives > 0  # data parallelism all-reduces its gradients
    assert on_scaled.t_comp == on_base.t_comp
    assert on_scaled.t_comm < on_base.t_comm


def test_the_store_keys_on_the_platform_content_not_its_name(tmp_path: Path) -> None:
    step, args, plan, _ = _dp_plan()
    base = load_platform(BASE)
    # the same name, twice the bandwidth: another platform, whose evaluation is its own
    impostor = dataclasses.replace(base.scaled(2), name=base.name)
    with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
        on_base = evaluate_on(plan, [base], step, *args, store=store)[base]
        on_impostor = evaluate_on(plan, [impostor], step, *args, store=store)[impostor]
        assert store.hits == 0
        assert on_impostor.t_comm < on_base.t_comm
        assert evaluate_on(plan, [BASE], step, *args, store=store)[BASE] == on_base
        assert store.hits == 1


def test_recorded_platforms_are_checked_and_old_plans_name_a_preset(tmp_path: Path) -> None:
    _, _, plan, scaled = _dp_plan()
    document = plan_to_json(plan)
    path = tmp_path / "plan.json"
    spoiled = json.loads(json.dumps(document))
    spoiled["platform_spec"]["intra"]["per_kind"]["all-reduce"]["bandwidth_Bps"] = -1
    path.write_text(json.dumps(spoiled))
    with pytest.raises(PlanError, match=r"field 'platform_spec': .*bandwidth_Bps"):
        ex.load_plan(path)
    path.write_text(json.dumps({**document, "platform": BASE}))
    with pytest.raises(PlanError, match=f"field 'platform': expected '{scaled.name}'"):
        ex.load_plan(path)
    # a plan written before platforms were recorded: its preset name still resolves ...
    old = {k: v for k, v in document.items() if k != "platform_spec"}
    path.write_text(json.dumps({**old, "platform": BASE}))
    assert ex.load_plan(path).platform == load_platform(BASE)
    # ... but a name that is no preset is never read as a file
    path.write_text(json.dumps({**old, "platform": str(tmp_path / "platform.json")}))
    with pytest.raises(PlanError, match="field 'platform_spec': expected the platform"):
        _ = ex.load_plan(path).platform
