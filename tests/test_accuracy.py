"""The composed prediction against the whole step it predicts (`compiled` backend).

The `compiled` backend is deterministic: the same programs always give the same collectives,
FLOPs and memory analysis. So the error between a plan's composed prediction and the whole
step compiled under it is a property of the composition, and is bounded here. Each case
takes 20 plans: half spread over the time/memory frontier, half random consistent plans.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import cache
from typing import Any

import pytest
from helpers import SHARED_CACHE

import explorer as ex
from explorer.accuracy import AccuracyReport, check_accuracy, composed_collectives
from explorer.profile.hlo import emitted, parse_collectives

PLANS = 20
# of which every fifth is also compiled as `apply_plan` runs it
APPLIED_EVERY = 5
# acceptance bounds of the fidelity issue: median and worst absolute time error, median
# absolute memory error, and the rank correlation the benchmark aims at
TIME_MEDIAN, TIME_WORST, MEMORY_MEDIAN, RANK = 0.03, 0.10, 0.05, 0.95
# Measured at e3a5423 and again after pricing read fewer lines (the same to the digit; time
# median / worst, memory median / worst, rank correlation): GPT 4 0.9 % / 3.9 %, 1.9 % /
# 9.0 %, 0.998; LLaMA 4 0.1 % / 8.1 %, 2.2 % / 5.5 %, 0.998; BERT 4 1.8 % / 8.8 %, 1.8 % /
# 4.0 %, 0.998; GPT 2x2 2.7 % / 6.1 %, 2.3 % / 6.5 %, 0.994. (The figures filed before,
# at transposed-18 and leader-19, had BERT's median at 1.0 % and GPT 2x2's worst at 5.0 %:
# changes since moved them, within the bounds, without this comment following.) GPT 2x2
# is predicted high by a few all-reduce latencies: the pieces move the step's bytes exactly
# (per kind and axes), but the step's combiner merges more of the batch-axis gradient
# all-reduces (2-3 to 1 per group) than the profiles mark combinable. The worst time errors
# of the 1-D cases are Megatron-like frontier plans predicted low by one all-reduce latency
# (LLaMA's N,K,N,K,N,K,N,K,M: 20 us of a 247 us step; BERT's worst the same way, 6 batch-axis
# all-reduces composed, 5 emitted, same bytes): the profiles count every combinable
# all-reduce (one that only feeds the step's results) in one bucket per mesh group, and this
# step's combiner emits two. The worst memory errors are GPT frontier plans
# 5-9 % low, where the step fuses a layer's residual sum into the next layer's fusions and
# keeps its two addends, gathered, instead of the sharded sum each segment program keeps.
# (Before memory followed the step's order, LLaMA's random plans were up to 9.5 % high: an
# early layer's working set was added to every layer's saved activations.)


@cache
def _checked(
    name: str, mesh: tuple[int, ...], batch_inner: bool = False
) -> tuple[Any, Any, tuple[Any, ...], AccuracyReport]:
    """The analysis of a case (in the batch-inner space if `batch_inner`) and its accuracy
    report (shared by the tests of this module)."""
    model = ex.models.build(name, "tiny", layers=2)
    step, args = model.step, model.args
    analysis = ex.analyze(
        step,
        *args,
        mesh=mesh,
        platform="a100-pcie-8",
        cache=SHARED_CACHE,
        progress=False,
        batch_inner=batch_inner,
    )
    return analysis, step, tuple(args), check_accuracy(analysis, step, tuple(args), count=PLANS)


# GPT 2x2 once more in the batch-inner space (the paper's rule with the axes swapped; tiny
# GPT's batch splits over the 4 devices, so nothing is primed): its plans put the batch on
# y and the weights on x, and are judged on their own whole steps as the paper space's are.
# Measured when it was added: time median 1.9 %, worst 8.1 % (a frontier plan predicted
# low), memory median 2.3 %, worst 3.8 %, rank correlation 0.994.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "mesh", "batch_inner"),
    [
        ("gpt", (4,), False),
        ("gpt", (2, 2), False),
        ("llama", (4,), False),
        ("bert", (4,), False),
        ("gpt", (2, 2), True),
    ],
)
def test_composed_prediction_matches_the_whole_step(
    name: str, mesh: tuple[int, ...], batch_inner: bool
) -> None:
    _, _, _, report = _checked(name, mesh, batch_inner)
    print(f"{name} {mesh}{' batch-inner' if batch_inner else ''}: {report.summary()}")
    for check in report.checks:
        print(
            f"  {check.kind:8s} {','.join(check.strategies)}: time {check.time_error:+.2%}, "
            f"memory {check.memory_error:+.2%}"
        )
    assert len(report.checks) == PLANS
    assert report.median_time_error <= TIME_MEDIAN, report.summary()
    assert report.worst_time_error <= TIME_WORST, report.summary()
    assert report.median_memory_error <= MEMORY_MEDIAN, report.summary()
    assert report.rank_correlation >= RANK, report.summary()


@pytest.mark.slow
def test_the_program_that_runs_is_the_program_that_was_priced() -> None:
    """For every plan of the set, the collectives `evaluate` prices are the profiled pieces'
    collectives: per kind and mesh axes the same bytes (all-reduces may be combined
    differently), every other kind one for one. For every `APPLIED_EVERY`-th plan (frontier
    and random ones alike) `apply_plan` compiles to exactly the collectives `evaluate` prices;
    compiling all 20 took four of CI's minutes."""
    analysis, step, args, report = _checked("gpt", (4,))
    mesh = analysis.mesh
    assert len(report.checks[::APPLIED_EVERY]) >= 4
    assert {check.kind for check in report.checks[::APPLIED_EVERY]} == {"frontier", "random"}
    for at, check in enumerate(report.checks):
        plan = analysis.plan_of(check.selection, source=check.kind)
        if at % APPLIED_EVERY == 0:
            applied = ex.apply_plan(plan, step).lower(*args).compile()
            ran = Counter(emitted(parse_collectives(applied.as_text(), mesh)))
            assert ran == Counter(check.emitted), plan.strategies
        pieces = composed_collectives(analysis, check.selection)
        assert _totals(pieces) == _totals(check.emitted), plan.strategies
        others = Counter(c for c in check.emitted if c[0] != "all-reduce")
        assert others == Counter(c for c in pieces if c[0] != "all-reduce"), plan.strategies


def _totals(emitted: Any) -> dict[tuple[str, tuple[str, ...]], int]:
    totals: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    for kind, nbytes, axes, _ in emitted:
        totals[(kind, axes)] += nbytes
    return dict(totals)


def test_an_accuracy_report_needs_plans() -> None:
    with pytest.raises(ex.ExplorerError, match="at least one plan"):
        AccuracyReport(())
