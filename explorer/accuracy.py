"""Prediction against truth: composed plans checked against their whole compiled step.

`check_accuracy` takes plans spread over the frontier and random consistent plans of an
analysis, prices each by compiling the whole step under it (`plan.evaluate_on`, the same
backend and platform) and reports the relative errors of the composed time and memory. The
`compiled` backend is deterministic, so these errors are properties of the composition, not
noise: the tests bound them and the benchmark reports them per case.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from explorer.errors import AnalysisError

if TYPE_CHECKING:
    from explorer.analysis import Analysis


@dataclass(frozen=True, slots=True)
class PlanCheck:
    """One plan: what the cost model predicted and what the whole step costs."""

    kind: str  # "frontier" or "random"
    selection: tuple[int, ...]  # option index per segment instance
    strategies: tuple[str, ...]
    predicted_time: float
    evaluated_time: float
    predicted_memory: int
    evaluated_memory: int
    collectives: int  # in the whole step
    emitted: tuple[tuple[str, int, tuple[str, ...], int], ...] = ()  # see plan.Evaluation

    @property
    def time_error(self) -> float:
        return (self.predicted_time - self.evaluated_time) / self.evaluated_time

    @property
    def memory_error(self) -> float:
        return (self.predicted_memory - self.evaluated_memory) / self.evaluated_memory


@dataclass(frozen=True, slots=True)
class AccuracyReport:
    checks: tuple[PlanCheck, ...]
    # ops the follow rule could not place (results replicated in every plan): where the
    # prediction may miss communication the compiler adds around them
    unplaced: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.checks:
            raise AnalysisError("an accuracy report needs at least one plan")

    @property
    def median_time_error(self) -> float:
        return statistics.median(abs(c.time_error) for c in self.checks)

    @property
    def worst_time_error(self) -> float:
        return max(abs(c.time_error) for c in self.checks)

    @property
    def median_memory_error(self) -> float:
        return statistics.median(abs(c.memory_error) for c in self.checks)

    @property
    def worst_memory_error(self) -> float:
        return max(abs(c.memory_error) for c in self.checks)

    @property
    def rank_correlation(self) -> float:
        """Spearman's rank correlation of predicted and evaluated time (ties averaged)."""
        return _spearman(
            [c.predicted_time for c in self.checks], [c.evaluated_time for c in self.checks]
        )

    @property
    def best_agrees(self) -> bool:
        """Whether the plan predicted fastest is the one evaluated fastest (ties allowed)."""
        predicted = min(self.checks, key=lambda c: c.predicted_time)
        fastest = min(c.evaluated_time for c in self.checks)
        return math.isclose(predicted.evaluated_time, fastest, rel_tol=1e-9)

    def summary(self) -> str:
        return (
            f"{len(self.checks)} plans: time error median {self.median_time_error:.2%}, worst "
            f"{self.worst_time_error:.2%}; memory error median {self.median_memory_error:.2%}, "
            f"worst {self.worst_memory_error:.2%}; rank correlation "
            f"{self.rank_correlation:.3f}; predicted best is evaluated best: {self.best_agrees}"
            + (
                f"; {len(self.unplaced)} unplaced ops ({', '.join(self.unplaced[:5])})"
                if self.unplaced
                else ""
            )
        )


def sample_selections(
    analysis: Any, count: int, seed: int = 0
) -> list[tuple[str, tuple[int, ...]]]:
    """Up to `count` plans: half spread over the frontier, the rest random consistent ones."""
    model = analysis.cost_model
    points = analysis.frontier.points
    chosen: list[tuple[str, tuple[int, ...]]] = []
    wanted = min(len(points), count // 2)
    for k in _spread(len(points), wanted):
        chosen.append(("frontier", points[k].selection))
    rng = random.Random(seed)
    seen = {s for _, s in chosen}
    for _ in range(200 * count):
        if len(chosen) >= count:
            break
        pick = tuple(rng.randrange(len(options)) for options in model.options)
        if pick in seen or not math.isfinite(model.time(pick)):
            continue
        if model.inconsistency(pick) is not None:
            continue
        seen.add(pick)
        chosen.append(("random", pick))
    return chosen


def check_accuracy(
    analysis: Any,
    step: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    count: int = 20,
    seed: int = 0,
    backend: str = "compiled",
) -> AccuracyReport:
    """Compose, then evaluate, `count` plans of `analysis` (see the module doc)."""
    from explorer.plan import evaluate_each

    platform = analysis.platform_name
    sampled = sample_selections(analysis, count, seed)
    plans = [analysis.plan_of(selection, source=kind) for kind, selection in sampled]
    truths = evaluate_each(plans, [platform], step, *args, backend=backend)
    checks = []
    for (kind, selection), plan, evaluated in zip(sampled, plans, truths, strict=True):
        assert evaluated is not None  # without `on_error` a failure raises
        truth = evaluated[platform]
        checks.append(
            PlanCheck(
                kind=kind,
                selection=selection,
                strategies=plan.strategies,
                predicted_time=plan.time,
                evaluated_time=truth.time,
                predicted_memory=plan.memory,
                evaluated_memory=truth.memory,
                collectives=truth.collectives,
                emitted=truth.emitted,
            )
        )
    graph = analysis.graph
    unplaced = tuple(f"#{o} {graph.ops[o].primitive}" for o in analysis.unplaced_ops())
    return AccuracyReport(tuple(checks), unplaced)


def _spread(n: int, k: int) -> list[int]:
    """`k` indices spread evenly over `range(n)`."""
    if k <= 0:
        return []
    if k == 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def _spearman(a: list[float], b: list[float]) -> float:
    if len(a) < 2:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    mean_a, mean_b = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(ra, rb, strict=True))
    var = math.sqrt(sum((x - mean_a) ** 2 for x in ra) * sum((y - mean_b) ** 2 for y in rb))
    return cov / var if var else math.nan


Emitted = tuple[str, int, tuple[str, ...], int]  # kind, bytes, mesh axes, group size


def composed_collectives(analysis: Analysis, selection: tuple[int, ...]) -> tuple[Emitted, ...]:
    """The collectives the profiled pieces of a plan emit: every segment program's and every
    boundary's resharding program's, as the profiles recorded them."""
    import json

    from explorer.profile.hlo import emitted
    from explorer.profile.records import collective_from_json

    model = analysis.cost_model  # a SegmentedStep has none: a NotProfiledError names it
    profiles = analysis.profile_records
    out: list[Emitted] = []

    def collect(found: list[Any]) -> None:
        if len(found) != 1:
            raise AnalysisError(f"expected one profile, found {len(found)}")
        out.extend(emitted(collective_from_json(c) for c in json.loads(found[0].collectives)))

    segments, reshards = profiles.segments, profiles.reshards
    instances = analysis.segments.instances
    for n, instance in enumerate(instances):
        option = model.options[n][selection[n]]
        collect(
            [p for p in segments if p.segment == instance.unique_id and p.config == option.name]
        )
        if n:
            before = model.options[n - 1][selection[n - 1]]
            pair = (instances[n - 1].unique_id, instance.unique_id)
            ends = (before.last, option.first)
            collect(
                [r for r in reshards if (r.before, r.after) == pair and (r.last, r.first) == ends]
            )
    return tuple(out)
