"""`analyze` gives two types: a `SegmentedStep` without profiles, an `Analysis` with them."""

from __future__ import annotations

import pytest

import explorer as ex
from explorer.errors import AnalysisError, NotProfiledError


def test_analyze_without_profiling_gives_a_segmented_step_that_refuses_plans_clearly() -> None:
    step, args = ex.models.gpt(abstract=True)
    shape = ex.analyze(step, *args, mesh=(4,), cache=None, profile=False)
    assert type(shape) is ex.SegmentedStep and shape.profiled is False
    assert shape.program_count > 0 and len(shape.blocks) > 0  # what segmenting gives
    for name in ("plan", "frontier", "profiles", "plan_of", "cost_model"):
        with pytest.raises(NotProfiledError, match=rf"{name}: .*profile=False"):
            getattr(shape, name)
        assert not hasattr(shape, name)  # an AttributeError too: hasattr answers honestly
    with pytest.raises(AnalysisError):  # what code written against one Analysis type caught
        shape.plan()
    with pytest.raises(AttributeError, match="no attribute 'plam'"):
        shape.plam  # noqa: B018  (a typo stays an ordinary AttributeError)


def _data_parallel(kind: str, label: str, config: str) -> bool:
    """Only the data-parallel programs: a profiled analysis in seconds."""
    return not any(role in config for role in ("N@", "K@", "E@"))


def test_a_profiled_analysis_is_a_segmented_step_with_plans() -> None:
    step, args = ex.models.gpt(abstract=True)
    analysis = ex.analyze(step, *args, mesh=(4,), cache=None, progress=False, only=_data_parallel)
    assert isinstance(analysis, ex.SegmentedStep) and analysis.profiled is True
    assert type(analysis) is ex.Analysis
    plan = analysis.plan()
    assert plan.time == analysis.frontier.points[-1].time
    assert (
        "profiled" in analysis.summary()
        and "profiled"
        not in ex.analyze(step, *args, mesh=(4,), cache=None, profile=False).summary()
    )


def test_a_segmented_step_prices_a_baseline_by_compiling_the_whole_step() -> None:
    """Baselines need no profiles: without them a template is priced by its whole step."""
    step, args = ex.models.gpt(abstract=True)
    shape = ex.analyze(step, *args, mesh=(4,), cache=None, profile=False)
    plan = shape.baseline("dp")
    truth = ex.evaluate(plan, step, *args)
    assert plan.source == "dp" and set(plan.strategies) <= {"M@x", ""}
    assert (plan.time, plan.memory) == (truth.time, truth.memory)
