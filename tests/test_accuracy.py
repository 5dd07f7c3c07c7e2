"""The composed prediction against the whole step it predicts (`compiled` backend).

The `compiled` backend is deterministic: the same programs always give the same collectives,
FLOPs and memory analysis. So the error between a plan's composed prediction and the whole
step compiled under it is a property of the composition, and is bounded here. Each case
takes 20 plans: half spread over the time/memory frontier, half random consistent plans.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from helpers import SHARED_CACHE

import explorer as ex
from explorer.accuracy import AccuracyReport, check_accuracy, composed_collectives
from explorer.profile.hlo import parse_collectives

PLANS = 20
# acceptance bounds of the fidelity issue: median and worst absolute time error, median
# absolute memory error
TIME_MEDIAN, TIME_WORST, MEMORY_MEDIAN = 0.03, 0.10, 0.05


def _analysis(name: str, mesh: tuple[int, ...]) -> tuple[object, object, tuple[object, ...]]:
    fn, config_cls = ex.models.MODELS[name]
    step, args = fn(config_cls.tiny().replace(num_layers=2))
    analysis = ex.analyze(
        step, *args, mesh=mesh, platform="a100-pcie-8", cache=SHARED_CACHE, progress=False
    )
    return analysis, step, tuple(args)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "mesh"), [("gpt", (4,)), ("gpt", (2, 2)), ("llama", (4,)), ("bert", (4,))]
)
def test_composed_prediction_matches_the_whole_step(name: str, mesh: tuple[int, ...]) -> None:
    analysis, step, args = _analysis(name, mesh)
    report = check_accuracy(analysis, step, args, count=PLANS)
    print(f"{name} {mesh}: {report.summary()}")
    for check in report.checks:
        print(
            f"  {check.kind:8s} {','.join(check.strategies)}: time {check.time_error:+.2%}, "
            f"memory {check.memory_error:+.2%}"
        )
    assert len(report.checks) == PLANS
    assert report.median_time_error <= TIME_MEDIAN, report.summary()
    assert report.worst_time_error <= TIME_WORST, report.summary()
    assert report.median_memory_error <= MEMORY_MEDIAN, report.summary()
    assert report.best_agrees, report.summary()


@pytest.mark.slow
def test_the_program_that_runs_is_the_program_that_was_priced() -> None:
    """For every plan of the set: `apply_plan` compiles to the collectives `evaluate`
    prices, and those are the profiled pieces' collectives: per kind and mesh axes the same
    bytes (all-reduces may be combined differently, every other kind one for one)."""
    analysis, step, args = _analysis("gpt", (4,))
    mesh = analysis.mesh
    for kind, selection in _selections(analysis):
        plan = analysis.plan_of(selection, source=kind)
        truth = ex.plan.evaluate(plan, step, *args)
        applied = ex.apply_plan(plan, step).lower(*args).compile()
        ran = Counter(
            (c.kind.value, c.nbytes, c.axes, c.group_size)
            for c in parse_collectives(applied.as_text(), mesh)
        )
        assert ran == Counter(truth.emitted), plan.strategies
        pieces = composed_collectives(analysis, selection)
        assert _totals(pieces) == _totals(truth.emitted), plan.strategies
        others = [c for c in truth.emitted if c[0] != "all-reduce"]
        assert Counter(others) == Counter(c for c in pieces if c[0] != "all-reduce")


def _selections(analysis: object) -> list[tuple[str, tuple[int, ...]]]:
    from explorer.accuracy import sample_selections

    return sample_selections(analysis, PLANS)


def _totals(emitted: object) -> dict[tuple[str, tuple[str, ...]], int]:
    totals: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    for kind, nbytes, axes, _ in emitted:  # type: ignore[attr-defined]
        totals[(kind, axes)] += nbytes
    return dict(totals)


def test_an_accuracy_report_needs_plans() -> None:
    with pytest.raises(ex.ExplorerError, match="at least one plan"):
        AccuracyReport(())
