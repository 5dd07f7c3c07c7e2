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


def test_an_earlier_trace_gives_the_same_analysis_of_another_space_and_is_checked() -> None:
    """`traced=`: another space of one step without tracing it again (the paper bench's
    wider spaces), refused where the graph cannot be this step's with these arguments."""
    from explorer.errors import ArgumentMismatchError, InputError

    step, args = ex.models.gpt(abstract=True)
    first = ex.analyze(step, *args, mesh=(2, 2), cache=None, profile=False)
    fresh = ex.analyze(step, *args, mesh=(2, 2), cache=None, profile=False, whole_mesh=True)
    reused = ex.analyze(
        step, *args, mesh=(2, 2), cache=None, profile=False, whole_mesh=True,
        traced=first.graph,
    )  # fmt: skip
    assert reused.graph is first.graph
    assert reused.blocks == fresh.blocks and reused.segments == fresh.segments
    assert reused.program_count == fresh.program_count > first.program_count

    with pytest.raises(InputError, match=r"traced: expected the Graph .* found tuple"):
        ex.analyze(step, *args, mesh=(4,), cache=None, profile=False, traced=(1, 2))
    with pytest.raises(InputError, match=r"arg_roles: .* decided when `traced` was traced"):
        ex.analyze(
            step, *args, mesh=(4,), cache=None, profile=False, traced=first.graph,
            arg_roles=("params", "opt_state", "data"),
        )  # fmt: skip
    wider = ex.models.build("gpt", "tiny", batch=16, abstract=True)
    with pytest.raises(ArgumentMismatchError, match=r"traced: example argument #2.* is "):
        ex.analyze(
            wider.step, *wider.args, mesh=(4,), cache=None, profile=False, traced=first.graph
        )
    llama_step, llama_args = ex.models.llama(abstract=True)
    with pytest.raises(ArgumentMismatchError, match="traced: the graph was traced from"):
        ex.analyze(
            llama_step, *llama_args, mesh=(4,), cache=None, profile=False, traced=first.graph
        )
