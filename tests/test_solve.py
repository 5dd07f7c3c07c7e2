"""The solver against brute force on random chains, and budget queries."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from explorer.cost import CostModel, Option
from explorer.errors import AnalysisError
from explorer.solve import NoPlanFitsError, solve_frontier


@st.composite
def chains(draw: Any) -> CostModel:
    length = draw(st.integers(1, 6))
    strategies = draw(st.integers(1, 3))
    options = []
    for n in range(length):
        count = draw(st.integers(1, 9))
        choices = draw(
            st.lists(
                st.tuples(st.integers(0, strategies - 1), st.integers(0, strategies - 1)),
                min_size=count,
                max_size=count,
            )
        )
        options.append(
            tuple(
                Option(
                    choices=c,
                    name=f"{n}:{k}",
                    t_comm=draw(st.floats(0, 5, allow_nan=False)),
                    t_comp=draw(st.floats(0, 5, allow_nan=False)),
                    persistent=draw(st.integers(0, 50)),
                    transient=draw(st.integers(0, 50)),
                    peak=0,
                )
                for k, c in enumerate(choices)
            )
        )
    reshard = tuple(
        {
            (a, b): draw(st.floats(0, 2, allow_nan=False))
            for a in range(strategies)
            for b in range(strategies)
        }
        for _ in range(length - 1)
    )
    return CostModel(tuple(f"s{n}" for n in range(length)), tuple(options), reshard)


def _brute_force(model: CostModel, budget: float) -> float | None:
    best = None
    for selection in itertools.product(*(range(len(o)) for o in model.options)):
        if model.memory(selection) <= budget:
            time = model.time(selection)
            best = time if best is None else min(best, time)
    return best


@settings(max_examples=200, deadline=None)
@given(chains(), st.integers(0, 400))
def test_frontier_lookup_equals_brute_force(model: CostModel, budget: int) -> None:
    frontier = solve_frontier(model)
    expected = _brute_force(model, budget)
    if expected is None:
        with pytest.raises(NoPlanFitsError, match="smallest plan needs"):
            frontier.query(budget)
        return
    point = frontier.query(budget)
    assert point.memory <= budget
    assert point.time == pytest.approx(expected, rel=1e-9, abs=1e-9)
    # the point's numbers are those of the plan it names
    assert model.time(point.selection) == pytest.approx(point.time, rel=1e-9, abs=1e-9)
    assert model.memory(point.selection) == point.memory


@settings(max_examples=150, deadline=None)
@given(chains())
def test_whole_frontier_equals_brute_force_pareto_set(drawn: CostModel) -> None:
    model = _dyadic(drawn)  # exact sums: near-ties cannot flip with the order of additions
    plans = [
        (model.time(s), model.memory(s))
        for s in itertools.product(*(range(len(o)) for o in model.options))
    ]
    plans = [(t, m) for t, m in plans if np.isfinite(t)]
    expected = sorted(
        (m, t)
        for t, m in plans
        if not any(t2 <= t and m2 <= m and (t2, m2) != (t, m) for t2, m2 in plans)
    )
    expected = [p for i, p in enumerate(expected) if i == 0 or p[0] != expected[i - 1][0]]
    found = [(p.memory, p.time) for p in solve_frontier(model).points]
    assert [m for m, _ in found] == [m for m, _ in expected]
    assert [t for _, t in found] == pytest.approx([t for _, t in expected], rel=1e-9, abs=1e-9)


def _dyadic(model: CostModel) -> CostModel:
    """The model with every time rounded to a multiple of 1/64."""
    exact = lambda t: round(t * 64) / 64  # noqa: E731
    return CostModel(
        model.labels,
        tuple(
            tuple(replace(o, t_comm=exact(o.t_comm), t_comp=exact(o.t_comp)) for o in options)
            for options in model.options
        ),
        tuple({k: exact(v) for k, v in table.items()} for table in model.reshard),
    )


@settings(max_examples=100, deadline=None)
@given(chains())
def test_frontier_is_monotone(model: CostModel) -> None:
    points = solve_frontier(model).points
    assert all(a.memory < b.memory and a.time > b.time for a, b in itertools.pairwise(points))


@settings(max_examples=60, deadline=None)
@given(chains(), st.integers(0, 400))
def test_uniform_mode_gives_one_configuration_per_shared_type(
    model: CostModel, budget: int
) -> None:
    shared = CostModel(model.labels, (model.options[0],) * len(model.options), model.reshard)
    frontier = solve_frontier(shared, uniform=True)
    for point in frontier.points:
        assert len(set(point.selection)) == 1
    free = solve_frontier(shared)
    if budget >= frontier.min_memory:  # freedom never makes the best plan slower
        assert free.query(budget).time <= frontier.query(budget).time + 1e-9


def test_uniform_mode_gives_twins_in_instances_of_different_types_one_strategy() -> None:
    """The first and last iterations of a scan are instances of two types (one carries the
    input ops, the other the loss); their blocks are twins, so a uniform plan gives both
    the same strategies although each type alone would pick its own fastest."""
    option = lambda c, t: Option(c, str(c), t, 0.0, 1, 0, 1)  # noqa: E731
    first = (option((0, 1), 1.0), option((1, 1), 4.0), option((1, 0), 2.0))
    last = (option((0, 1), 5.0), option((1, 1), 1.0), option((1, 0), 2.5))
    free = {(a, b): 0.0 for a in (0, 1) for b in (0, 1)}
    model = CostModel(
        ("layer_0", "layer_1"), (first, last), (free,), instance_blocks=((0, 1), (2, 3))
    )
    assert solve_frontier(model, uniform=True).points[-1].selection == (0, 1)  # 1 + 1
    twinned = replace(model, twins=(0, 1, 0, 1))
    points = solve_frontier(twinned, uniform=True).points
    assert [p.selection for p in points] == [(2, 2)]  # 2 + 2.5: the fastest common choice
    assert solve_frontier(twinned).points[-1].selection == (0, 1)  # mixed: twins free
    with pytest.raises(ValueError, match="one twin per block"):
        replace(model, twins=(0, 1))


def test_pins_force_a_block_strategy_and_memory_never_exceeds_the_budget() -> None:
    option = lambda c, t, p: Option(c, str(c), t, 0.0, p, 0, p)  # noqa: E731
    model = CostModel(
        ("a", "b"),
        (
            (option((0,), 1.0, 10), option((1,), 3.0, 2)),
            (option((0,), 1.0, 10), option((1,), 3.0, 2)),
        ),
        ({(0, 0): 0.0, (0, 1): 0.5, (1, 0): 0.5, (1, 1): 0.0},),
    )
    frontier = solve_frontier(model)
    assert frontier.query(100).selection == (0, 0)
    assert frontier.query(12.5).memory <= 12.5
    pinned = solve_frontier(model, pins={1: {0: 1}})
    assert all(p.selection[1] == 1 for p in pinned.points)
    with pytest.raises(NoPlanFitsError, match=r"needs 0.000 GiB \(4 bytes\)"):
        frontier.query(3)


def test_memory_is_persistent_sum_plus_largest_transient() -> None:
    a = Option((0,), "a", 1.0, 0.0, persistent=5, transient=7, peak=12)
    b = Option((0,), "b", 1.0, 0.0, persistent=3, transient=9, peak=12)
    model = CostModel(("x", "y"), ((a,), (b,)), ({(0, 0): 0.0},))
    assert model.memory((0, 0)) == 5 + 3 + 9
    assert model.memory_eq9((0, 0)) == 24  # Eq. 9 counts both transients
    assert np.isclose(model.time((0, 0)), 2.0)


@settings(max_examples=60, deadline=None)
@given(chains(), st.integers(0, 2), st.sampled_from([0.0, 0.5, 3.0]))
def test_neighbour_dependent_options_and_combined_latency_match_brute_force(
    model: CostModel, seed: int, latency: float
) -> None:
    """The first instance's options are priced under each strategy of the last instance's
    last block (a tied parameter), and some options share one combined latency: the
    frontier holds only consistent plans, each timed as `CostModel.time` says, and its
    fastest plan is the fastest consistent plan."""
    if len(model.options) < 2:
        return
    last = len(model.options) - 1
    blocks = tuple((2 * n, 2 * n + 1) for n in range(len(model.options)))
    strategies = sorted({o.choices[1] for o in model.options[last]})
    first = tuple(
        replace(
            option,
            name=f"{option.name}|{s}",
            t_comm=option.t_comm + seed * s,
            context=(s,),
            combined=(("all-reduce@x/4", 1, latency),) if (k + s) % 2 else (),
        )
        for k, option in enumerate(model.options[0])
        for s in strategies
    )
    dependent = CostModel(
        model.labels,
        (first, *model.options[1:]),
        model.reshard,
        dependencies=((blocks[last][1],), *(() for _ in model.options[1:])),
        instance_blocks=blocks,
    )
    frontier = solve_frontier(dependent)
    for point in frontier.points:
        assert dependent.inconsistency(point.selection) is None
        assert point.time == pytest.approx(dependent.time(point.selection))
    consistent = [
        s
        for s in itertools.product(*(range(len(o)) for o in dependent.options))
        if dependent.inconsistency(s) is None and np.isfinite(dependent.time(s))
    ]
    assert min(p.time for p in frontier.points) == pytest.approx(
        min(dependent.time(s) for s in consistent)
    )


def test_combined_latency_is_paid_once_per_bucket() -> None:
    from explorer.cost import COMBINE_COUNT

    def option(count: int) -> Option:
        return Option((0,), "o", 1.0, 0.0, 0, 0, 0, combined=(("all-reduce@x/4", count, 0.5),))

    model = CostModel(("a", "b"), ((option(3),), (option(COMBINE_COUNT),)), ({(0, 0): 0.0},))
    # 3 + 256 elements: two buckets of at most 256, each paying the latency once
    assert model.time((0, 0)) == pytest.approx(2.0 + 2 * 0.5)
    assert model.combined_latency((0, 0)) == pytest.approx(1.0)


def test_a_shared_block_strategy_with_no_way_in_is_skipped_not_fatal() -> None:
    """The embedding is priced per strategy of the head it shares a parameter with; when a
    quick look leaves one head strategy no profiled resharding into it, the plans of the other
    strategies remain, and only when no strategy has a way through is it an error."""
    embed = tuple(Option((), f"-|{s}", 1.0 + s, 0.0, 0, 0, 0, context=(s,)) for s in (0, 1))
    head = tuple(Option((s,), f"h{s}", 1.0, 0.0, 0, 0, 0) for s in (0, 1))

    def model(moves: dict[tuple[int, int], float]) -> CostModel:
        return CostModel(
            ("embed", "head"),
            (embed, head),
            (moves,),
            dependencies=((0,), ()),
            instance_blocks=((), (0,)),
        )

    frontier = solve_frontier(model({(0, 0): 0.0, (0, 1): np.inf}))
    assert [p.selection for p in frontier.points] == [(0, 0)]
    with pytest.raises(AnalysisError, match="no configuration of 'head' can follow"):
        solve_frontier(model({(0, 0): np.inf, (0, 1): np.inf}))
