"""The fastest plan whose compiled whole step fits the budget (`explorer.compiled_fit`)."""

from __future__ import annotations

import sqlite3
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from helpers import SHARED_CACHE

import explorer as ex
from explorer.compiled_fit import CompiledFit, CompiledTry, fastest_plan_that_fits
from explorer.errors import InputError, NoPlanFitsError
from explorer.evaluation_store import EvaluationStore


@cache
def _tiny_gpt() -> tuple[Any, Any, Any]:
    # tiny GPT on mesh 4, as test_plan and test_target_memory analyse it (the session cache
    # serves all three): 3 frontier plans
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    analysis = ex.analyze(
        step, *args, mesh=(4,), platform="a100-pcie-8", cache=SHARED_CACHE, progress=False
    )
    return step, args, analysis


def _compiled_memory(analysis: Any, step: Any, args: Any, store: EvaluationStore) -> list[int]:
    """What each frontier plan's whole step needs compiled, in the frontier's order."""
    return [
        ex.evaluate(analysis.plan_of(p.selection, source="cfp"), step, *args, store=store).memory
        for p in analysis.frontier.points
    ]


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0])


def test_the_plan_offered_is_the_fastest_whose_compiled_step_fits(tmp_path: Path) -> None:
    step, args, analysis = _tiny_gpt()
    points = analysis.frontier.points  # by increasing memory, decreasing time
    with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
        compiled = _compiled_memory(analysis, step, args, store)
        # a budget at a plan's predicted memory that its compiled step misses: the solver's
        # choice for that budget does not fit, and the search must go down the frontier
        missed = [i for i, p in enumerate(points) if compiled[i] > p.memory]
        assert missed and max(missed) > 0, (
            "the tiny GPT's predicted memory on mesh 4 runs below its compiled steps' (it "
            f"did when this test was written); found {list(zip(points, compiled, strict=True))}"
        )
        budget = points[max(missed)].memory
        predicted_choice = analysis.plan(memory_budget=budget)
        fit = fastest_plan_that_fits(analysis, step, *args, memory_budget=budget, store=store)

    assert isinstance(fit, CompiledFit) and fit.budget == budget
    assert fit.truth.memory <= budget
    assert fit.plan.time > predicted_choice.time  # a slower plan: the faster one was over
    assert fit.tried[0].selection == points[max(missed)].selection
    assert fit.tried[0].compiled_memory == compiled[max(missed)] > budget
    # the faster plans within the budget were passed over: each compiled over it, or counted
    offered = next(i for i, p in enumerate(points) if p.selection == fit.selection)
    passed_over = [i for i, p in enumerate(points) if p.memory <= budget and i > offered]
    assert passed_over and all(compiled[i] > budget for i in passed_over)
    assert set(fit.rejected) <= {points[i].selection for i in passed_over}
    assert len(fit.rejected) + fit.untried_between == len(passed_over)
    # the plans tried and not passed over fit; the plan is the fastest of them
    fitting = [t for t in fit.tried if t.compiled_memory <= budget]
    assert fit.plan.time == min(t.predicted_time for t in fitting)
    # the truth is `evaluate`'s: the same numbers, from a store that did not see this call
    assert fit.truth == ex.evaluate(fit.plan, step, *args)
    assert "plans compiled to find one that fits" in fit.summary()


def test_a_plan_with_room_costs_one_compile_read_back_from_the_store(tmp_path: Path) -> None:
    step, args, analysis = _tiny_gpt()
    path = tmp_path / "evaluations.sqlite"
    with EvaluationStore(path) as store:
        roomy = max(_compiled_memory(analysis, step, args, store))  # every plan fits
        kept = _rows(path)
        fit = fastest_plan_that_fits(analysis, step, *args, memory_budget=roomy, store=store)
        assert store.hits >= 1 and _rows(path) == kept  # read back, nothing compiled again
    assert len(fit.tried) == 1 and fit.rejected == ()
    assert fit.plan.time == analysis.plan(memory_budget=roomy).time
    assert fit.summary().startswith("the fastest plan within")


def test_no_compiled_plan_fitting_says_what_each_needed(tmp_path: Path) -> None:
    step, args, analysis = _tiny_gpt()
    points = analysis.frontier.points
    path = tmp_path / "evaluations.sqlite"
    with EvaluationStore(path) as store:
        compiled = _compiled_memory(analysis, step, args, store)
        missed = [i for i, p in enumerate(points) if compiled[i] > p.memory]
        leanest = points[0].memory
        if 0 in missed:  # the leanest plan alone is within its own predicted memory
            with pytest.raises(NoPlanFitsError, match=r"1 compiled.*no leaner plan is left"):
                fastest_plan_that_fits(analysis, step, *args, memory_budget=leanest, store=store)
        # one compile allowed, at a budget the fastest plan misses: the leaner are not tried
        budget = points[max(missed)].memory
        left = rf"1 compiled \(.*\); {max(missed)} leaner plans not compiled"
        with pytest.raises(NoPlanFitsError, match=left):
            fastest_plan_that_fits(
                analysis, step, *args, memory_budget=budget, store=store, max_compiles=1
            )
        kept = _rows(path)
        # below every prediction: refused by the frontier, before anything is compiled
        with pytest.raises(NoPlanFitsError, match="the smallest plan needs"):
            fastest_plan_that_fits(analysis, step, *args, memory_budget=leanest - 1, store=store)
        for wrong in (0, True, 2.5, "3"):
            with pytest.raises(InputError, match="max_compiles: expected a whole number"):
                fastest_plan_that_fits(analysis, step, *args, max_compiles=wrong)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="memory_budget"):
            fastest_plan_that_fits(analysis, step, *args, memory_budget="lots")
        assert _rows(path) == kept


def test_a_fit_is_the_fastest_plan_tried_that_fits() -> None:
    step, args, analysis = _tiny_gpt()
    plan = analysis.plan()
    truth = ex.evaluate(plan, step, *args)
    budget = truth.memory
    itself = CompiledTry((0,), plan.time, plan.memory, truth.memory)
    over = CompiledTry((1,), plan.time / 2, plan.memory, budget + 1)  # faster, over
    CompiledFit(plan, truth, budget, (itself,))
    CompiledFit(plan, truth, budget, (over, itself), untried_between=3)
    with pytest.raises(ValueError, match="fits its budget compiled"):
        CompiledFit(plan, truth, budget - 1, (itself,))
    faster_fitting = CompiledTry((1,), plan.time / 2, plan.memory, budget)
    with pytest.raises(ValueError, match="the fastest tried that fits"):
        CompiledFit(plan, truth, budget, (faster_fitting, itself))
    with pytest.raises(ValueError, match="is one it tried"):
        CompiledFit(plan, truth, budget, (over,))
    with pytest.raises(ValueError, match="counts plans"):
        CompiledFit(plan, truth, budget, (itself,), untried_between=-1)


def test_what_is_no_profiled_analysis_is_refused_before_any_compile() -> None:
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    segmented = ex.analyze(step, *args, mesh=(4,), profile=False)
    with pytest.raises(ex.ExplorerError, match="has no profiles"):
        fastest_plan_that_fits(segmented, step, *args)
    with pytest.raises(InputError, match=r"expected an Analysis .*found str"):
        fastest_plan_that_fits("analysis.json", step, *args)  # type: ignore[arg-type]
