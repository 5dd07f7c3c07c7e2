"""The solver against brute force on random chains, and budget queries."""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from explorer.cost import CostModel, Option, build_cost_model
from explorer.errors import AnalysisError, NoPlanFitsError
from explorer.ir import Boundary, Segmentation, SegmentInstance, SegmentType
from explorer.profile.profiles import Profiles, SegmentProfile
from explorer.solve import solve_frontier


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
                    saved=draw(st.integers(0, 50)),
                    gradients=draw(st.integers(0, 20)),
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
    found = [(p.memory, p.time) for p in solve_frontier(model).points]
    _assert_same_pareto_set(found, plans)


def _assert_same_pareto_set(found: list[tuple[int, float]], plans: list[tuple[float, int]]) -> None:
    """`found` (memory, time) are exactly the Pareto points of the finite (time, memory) plans."""
    plans = [(t, m) for t, m in plans if np.isfinite(t)]
    expected = sorted(
        (m, t)
        for t, m in plans
        if not any(t2 <= t and m2 <= m and (t2, m2) != (t, m) for t2, m2 in plans)
    )
    expected = [p for i, p in enumerate(expected) if i == 0 or p[0] != expected[i - 1][0]]
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


def test_memory_follows_the_order_of_the_step() -> None:
    """An instance's working set coexists with the activations saved by the instances before
    it and the gradients the later ones made, not with those of every instance."""
    embed = Option((0,), "e", 1.0, 0.0, persistent=10, transient=60, peak=0, saved=2, gradients=3)
    layer = Option((0,), "l", 1.0, 0.0, persistent=5, transient=8, peak=0, saved=20, gradients=4)
    head = Option((0,), "h", 1.0, 0.0, persistent=7, transient=30, peak=0)
    model = CostModel(
        ("embed", "layer", "head"), ((embed,), (layer,), (head,)), ({(0, 0): 0.0},) * 2
    )
    levels = {
        "head, where the step turns: all saved": 2 + 20 + 30,
        "the layer's backward: all saved, its own gradient in its working set": 2 + 20 + 8,
        "embed's backward: its saved activations, the layer's gradient": 2 + 60 + 4,
        "the optimizer: both gradients": 3 + 4,
    }
    assert model.memory((0, 0, 0)) == 10 + 5 + 7 + max(levels.values())
    # the embedding's large working set is not added to the layer's saved activations, as
    # it would be were everything held the whole step
    everything_held = sum(o.persistent + o.saved + o.gradients for o in (embed, layer, head))
    assert model.memory((0, 0, 0)) == everything_held + 60 - 23


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


@st.composite
def sharing_chains(draw: Any) -> CostModel:
    """Chains whose options are priced under the strategies of other instances' blocks
    (`Option.context`): forward or backward, adjacent or not, on first, middle or last blocks;
    some instances share one type's options; some reshardings failed to profile. Small enough
    for brute force: at most 4096 plans, with dyadic times (exact sums)."""
    length = draw(st.integers(2, 6))
    strategies = draw(st.integers(1, 3))
    strategy = st.integers(0, strategies - 1)
    types = draw(st.integers(1, length))
    type_of = [draw(st.integers(0, types - 1)) for _ in range(length)]
    widths = [draw(st.integers(1, 3)) for _ in range(types)]
    starts = list(itertools.accumulate((widths[t] for t in type_of), initial=0))
    blocks = tuple(tuple(range(starts[n], starts[n + 1])) for n in range(length))
    others = [starts[-1] - widths[t] for t in type_of]  # blocks of other instances
    depend_counts = [
        draw(st.integers(0, min([2] + [others[n] for n in range(length) if type_of[n] == t])))
        for t in range(types)
    ]
    dependencies = tuple(
        tuple(
            draw(
                st.lists(
                    st.sampled_from([b for m in range(length) if m != n for b in blocks[m]]),
                    min_size=depend_counts[type_of[n]],
                    max_size=depend_counts[type_of[n]],
                    unique=True,
                )
            )
        )
        for n in range(length)
    )
    dyadic = st.integers(0, 256).map(lambda k: k / 64)
    most = int(round(4096 ** (1 / length), 9))  # brute force walks at most 4096 plans
    per_type = [
        tuple(
            Option(
                choices=tuple(draw(strategy) for _ in range(widths[t])),
                name=f"{t}:{k}",
                t_comm=draw(dyadic),
                t_comp=draw(dyadic),
                persistent=draw(st.integers(0, 50)),
                transient=draw(st.integers(0, 50)),
                peak=0,
                saved=draw(st.integers(0, 50)),
                gradients=draw(st.integers(0, 20)),
                context=tuple(draw(strategy) for _ in range(depend_counts[t])),
                combined=draw(st.sampled_from([(), (("all-reduce@x/4", 1, 0.5),)])),
            )
            for k in range(draw(st.integers(1, most)))
        )
        for t in range(types)
    ]
    moves = st.sampled_from([0.0, 0.25, 1.5, np.inf])
    reshard = tuple(
        {(a, b): draw(moves) for a in range(strategies) for b in range(strategies)}
        for _ in range(length - 1)
    )
    return CostModel(
        tuple(f"s{n}" for n in range(length)),
        tuple(per_type[t] for t in type_of),
        reshard,
        dependencies=dependencies,
        instance_blocks=blocks,
    )


def _pins(data: st.DataObject, model: CostModel) -> dict[int, dict[int, int]]:
    """No pins, or one block of one instance pinned to a strategy some option of it has."""
    if not data.draw(st.booleans()):
        return {}
    n = data.draw(st.integers(0, len(model.options) - 1))
    choices = data.draw(st.sampled_from(model.options[n])).choices
    k = data.draw(st.integers(0, len(choices) - 1))
    return {n: {k: choices[k]}}


def _obeys(model: CostModel, selection: tuple[int, ...], pins: dict[int, dict[int, int]]) -> bool:
    return all(
        model.options[n][selection[n]].choices[k] == s
        for n, wanted in pins.items()
        for k, s in wanted.items()
    )


@settings(max_examples=200, deadline=None)
@given(sharing_chains(), st.data())
def test_shared_blocks_frontier_equals_brute_force_over_consistent_plans(
    model: CostModel, data: st.DataObject
) -> None:
    """With options priced under other instances' blocks, pointing either way along the chain,
    the frontier is the Pareto set of the consistent plans, each one consistent and priced as
    `CostModel` prices it; with no consistent plan, the error names where the chain died."""
    pins = _pins(data, model)
    plans = [
        s
        for s in itertools.product(*(range(len(o)) for o in model.options))
        if model.inconsistency(s) is None and np.isfinite(model.time(s)) and _obeys(model, s, pins)
    ]
    if not plans:
        with pytest.raises(AnalysisError, match=r"no configuration of 's\d' can follow"):
            solve_frontier(model, pins)
        return
    frontier = solve_frontier(model, pins)
    for point in frontier.points:
        assert model.inconsistency(point.selection) is None
        assert _obeys(model, point.selection, pins)
        assert point.time == model.time(point.selection)
        assert point.memory == model.memory(point.selection)
    found = [(p.memory, p.time) for p in frontier.points]
    _assert_same_pareto_set(found, [(model.time(s), model.memory(s)) for s in plans])


@settings(max_examples=150, deadline=None)
@given(sharing_chains(), st.data())
def test_uniform_mode_with_shared_blocks_equals_brute_force(
    model: CostModel, data: st.DataObject
) -> None:
    """One configuration per type: the frontier is the Pareto set of the consistent uniform
    plans, pins included."""
    pins = _pins(data, model)
    types: dict[int, list[int]] = {}
    for n, options in enumerate(model.options):
        types.setdefault(id(options), []).append(n)
    plans = []
    for combo in itertools.product(*(range(len(model.options[g[0]])) for g in types.values())):
        selection = [0] * len(model.options)
        for group, choice in zip(types.values(), combo, strict=True):
            for n in group:
                selection[n] = choice
        s = tuple(selection)
        if model.inconsistency(s) is None and np.isfinite(model.time(s)) and _obeys(model, s, pins):
            plans.append(s)
    if not plans:
        with pytest.raises(AnalysisError, match="no common configuration"):
            solve_frontier(model, pins, uniform=True)
        return
    frontier = solve_frontier(model, pins, uniform=True)
    for point in frontier.points:
        assert point.selection in plans
    found = [(p.memory, p.time) for p in frontier.points]
    _assert_same_pareto_set(found, [(model.time(s), model.memory(s)) for s in plans])


def test_a_chain_dead_on_shared_blocks_names_the_segment_where_it_died() -> None:
    """A block's strategy the plan so far fixed (owned before, or assumed by an earlier
    option's context) that no option of a later segment agrees with ends the chain there."""
    option = lambda c, ctx=(): Option(c, str(c), 1.0, 0.0, 0, 0, 0, context=ctx)  # noqa: E731
    moves = {(0, 0): 0.0}
    backward = CostModel(
        ("a", "b", "c"),
        ((option((0,)),), (option((0,)),), (option((0,), (1,)),)),
        (moves, moves),
        dependencies=((), (), (0,)),
        instance_blocks=((0,), (1,), (2,)),
    )
    with pytest.raises(AnalysisError, match=r"no configuration of 'c' can follow.*\(\[0\]\)"):
        solve_frontier(backward)
    forward = replace(
        backward,
        options=((option((0,), (1,)),), (option((0,)),), (option((0,)),)),
        dependencies=((2,), (), ()),
    )
    with pytest.raises(AnalysisError, match=r"no configuration of 'c' can follow.*\(\[2\]\)"):
        solve_frontier(forward)


def test_an_option_giving_a_shared_block_another_strategy_is_not_pruned_as_dominated() -> None:
    """Same ends, but the slower option gives the middle block the strategy a later segment is
    priced under: it is the only way to a consistent plan."""
    a = (Option((0, 0, 0), "fast", 1.0, 0.0, 0, 0, 0), Option((0, 1, 0), "slow", 2.0, 0.0, 0, 0, 0))
    b = (Option((0,), "b", 1.0, 0.0, 0, 0, 0, context=(1,)),)
    model = CostModel(
        ("a", "b"),
        (a, b),
        ({(0, 0): 0.0},),
        dependencies=((), (1,)),
        instance_blocks=((0, 1, 2), (3,)),
    )
    assert [p.selection for p in solve_frontier(model).points] == [(1, 0)]


def _deep_model(repeats: int, seed: int = 0) -> CostModel:
    """`repeats` layers of 4 instances of 3 blocks (3, 4 and 3 strategies); each instance is
    priced under the middle block of the instance before it and of the one two ahead (a residual
    skip), 3 random configurations per context: 12 to 48 options per instance."""
    rng = random.Random(seed)
    strategies = (3, 4, 3)
    length = 4 * repeats
    blocks = tuple(tuple(range(3 * n, 3 * n + 3)) for n in range(length))
    dependencies = tuple(
        tuple(blocks[m][1] for m in (n - 1, n + 2) if 0 <= m < length) for n in range(length)
    )
    configurations = list(itertools.product(*(range(s) for s in strategies)))
    types: dict[tuple[int, bool, bool], tuple[Option, ...]] = {}
    options = []
    for n in range(length):
        kind = (n % 4, n > 0, n + 2 < length)  # the chain's ends depend on fewer blocks
        if kind not in types:
            types[kind] = tuple(
                Option(
                    choices=c,
                    name=f"{c}|{context}",
                    t_comm=rng.uniform(0, 2e-3),
                    t_comp=rng.uniform(1e-3, 3e-3),
                    persistent=rng.randrange(1, 64) * 2**24,
                    transient=rng.randrange(1, 16) * 2**26,
                    peak=0,
                    context=context,
                )
                for context in itertools.product(range(4), repeat=len(dependencies[n]))
                for c in rng.sample(configurations, 3)
            )
        options.append(types[kind])
    moves = {(a, b): 0.0 if a == b else rng.uniform(0, 5e-4) for a in range(3) for b in range(3)}
    return CostModel(
        tuple(f"layer_{n // 4}.{n % 4}" for n in range(length)),
        tuple(options),
        (moves,) * (length - 1),
        dependencies=dependencies,
        instance_blocks=blocks,
    )


@pytest.mark.parametrize("repeats", [4, 8, 16])
def test_deep_chain_of_skip_dependencies_solves_in_one_pass(repeats: int) -> None:
    """4^instances joint strategies of the shared blocks (every middle block), but at most
    three are open at any cut: the frontier comes in seconds (printed, not asserted: the
    machine is too noisy)."""
    model = _deep_model(repeats)
    start = time.perf_counter()
    frontier = solve_frontier(model)
    elapsed = time.perf_counter() - start
    print(f"{repeats} layers: {len(frontier.points)} plans in {elapsed:.2f} s")
    assert frontier.points
    for point in frontier.points:
        assert model.inconsistency(point.selection) is None
        assert point.memory == model.memory(point.selection)


def test_an_instance_depending_on_more_blocks_than_its_profiled_first_instance_is_named() -> None:
    """Profiles of a type are keyed on its first instance's dependencies; a later instance
    with another count could match none of them. The cost model says which, before any
    solve (the scanned decoder once failed later with a vague "no common configuration")."""
    segmentation = Segmentation(
        instances=(
            SegmentInstance(0, 0, "embed", (0,), (0,)),
            SegmentInstance(1, 1, "layer_0", (1,), (1,)),
            SegmentInstance(2, 1, "layer_1", (2,), (2,)),
        ),
        unique=(SegmentType(0, "e", "embed", 1, 1), SegmentType(1, "l", "layer", 1, 2)),
        boundaries=(Boundary(0, (), ()), Boundary(1, (), ())),
        segment_of_op=(0, 1, 2),
        method="scopes",
    )
    priced: dict[str, Any] = dict(
        label="", status="ok", t_comm=1.0, t_comp=1.0, persistent_memory=1, transient_memory=1,
        saved_memory=0, gradient_memory=0, constant_memory=0, memory=2, combined=(), reason="",
        collectives="[]", cached=False, seconds=0.0, program="",
    )  # fmt: skip
    profiles = Profiles(
        (
            SegmentProfile(**priced, segment=0, choices=(0,), config="a", context=()),
            # layer_0, the profiled instance, depends on no outside block
            SegmentProfile(**priced, segment=1, choices=(0,), config="b", context=()),
        )
    )
    fine = build_cost_model(segmentation, profiles, ((), (), ()))
    assert fine.labels == ("embed", "layer_0", "layer_1")
    with pytest.raises(AnalysisError, match=r"'layer_1' depends on 1 block.*profiled at 'layer_0'"):
        build_cost_model(segmentation, profiles, ((), (), (0,)))


@pytest.mark.parametrize("scale", [1, 2**40, 2**61])
def test_earlier_least_value_matches_a_loop_whatever_the_range(scale: int) -> None:
    """The skyline's first sweep keeps runs apart by shifting values, with no sort; at a
    range that could overflow the shift it ranks the values instead. Both give the loop's
    answer."""
    from explorer.pareto import _earlier_least_value

    rng = np.random.default_rng(7)
    values = rng.integers(0, 1000, size=400).astype(np.int64) * (scale // 1000 or 1)
    run = np.sort(rng.integers(0, 9, size=400))
    expected = []
    for k in range(len(values)):
        before = [int(v) for v, r in zip(values[:k], run[:k], strict=True) if r == run[k]]
        expected.append(min(before, default=np.iinfo(np.int64).max))
    assert _earlier_least_value(values, run).tolist() == expected


@settings(max_examples=150, deadline=None)
@given(chains(), st.integers(1, 12), st.booleans())
def test_pruning_in_chunks_finds_the_plans_one_pass_finds(
    drawn: CostModel, chunk: int, ties: bool
) -> None:
    """A wide space's candidates are pruned in chunks of partial plans (`CANDIDATE_CHUNK`):
    the frontier, down to which of two equal plans it names, is the one pass's."""
    from explorer import solve

    model = drawn
    if ties:  # whole seconds: many plans of equal time, where the order decides
        model = replace(
            drawn,
            options=tuple(
                tuple(replace(o, t_comm=float(round(o.t_comm)), t_comp=0.0) for o in options)
                for options in drawn.options
            ),
        )
    whole = solve_frontier(model)
    original = solve.CANDIDATE_CHUNK
    solve.CANDIDATE_CHUNK = chunk
    try:
        chunked = solve_frontier(model)
    finally:
        solve.CANDIDATE_CHUNK = original
    assert chunked == whole


class _Clock:
    """A clock that moves one second each time it is read: the solver's time limit, checked
    without waiting for it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_space_not_solved_within_the_time_limit_is_refused_naming_where(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from explorer import solve
    from explorer.errors import FrontierTooLargeError

    model = _deep_model(3)
    monkeypatch.setattr(solve, "monotonic", _Clock())
    monkeypatch.setenv(solve.TIME_LIMIT_VARIABLE, "4.5")
    with pytest.raises(FrontierTooLargeError) as refused:
        solve_frontier(model)
    said = str(refused.value)
    assert "not solved within 4.5 s ($EXPLORER_SOLVER_TIME_LIMIT" in said
    assert f"of {len(model.options)}) with" in said and "partial plans over" in said
    assert "too large to solve exactly" in said
    # an approximate solve refused says so, at its resolution, not "exactly"
    with pytest.raises(FrontierTooLargeError, match="even with a memory resolution of 64 MiB"):
        solve_frontier(model, memory_resolution=64 * 2**20)
    # the uniform solver's enumeration is bounded the same way; it takes no resolution
    monkeypatch.setattr(solve, "UNIFORM_CHECK_EVERY", 1)
    with pytest.raises(FrontierTooLargeError, match=r"exactly: .*common configurations tried"):
        solve_frontier(model, uniform=True, memory_resolution=64 * 2**20)
    monkeypatch.setenv(solve.TIME_LIMIT_VARIABLE, "none")
    assert solve_frontier(model).points


@pytest.mark.parametrize("text", ["soon", "-1", "nan", "10 min"])
def test_a_time_limit_that_is_not_seconds_is_named(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from explorer import solve
    from explorer.errors import InputError

    monkeypatch.setenv(solve.TIME_LIMIT_VARIABLE, text)
    with pytest.raises(InputError, match=f"EXPLORER_SOLVER_TIME_LIMIT: expected .* found '{text}'"):
        solve_frontier(_deep_model(1))


def test_the_time_limit_reads_seconds_none_and_infinity(monkeypatch: pytest.MonkeyPatch) -> None:
    from explorer import solve

    monkeypatch.delenv(solve.TIME_LIMIT_VARIABLE, raising=False)
    assert solve.solver_time_limit() == solve.DEFAULT_TIME_LIMIT
    for text, seconds in (("90", 90.0), (" 1e4 ", 1e4), ("NONE", None), ("inf", None)):
        monkeypatch.setenv(solve.TIME_LIMIT_VARIABLE, text)
        assert solve.solver_time_limit() == seconds


@settings(max_examples=200, deadline=None)
@given(st.one_of(chains().map(_dyadic), sharing_chains()), st.integers(1, 40))
def test_a_memory_resolution_keeps_for_every_exact_plan_one_no_slower_within_its_slack(
    model: CostModel, resolution: int
) -> None:
    """Compared in units of memory at every step (the threshold lowered to 0), the frontier
    names real, consistent plans, says it is approximate by the resolution times the steps,
    and holds for each plan of the exact frontier one no slower within that much memory. On
    spaces this small the default threshold leaves every step exact."""
    from explorer import solve

    try:
        exact = solve_frontier(model)
    except AnalysisError:
        return  # no consistent plan: the dead end is tested above
    assert exact.memory_slack == 0
    assert solve_frontier(model, memory_resolution=resolution) == exact
    original = solve.APPROXIMATE_ABOVE
    solve.APPROXIMATE_ABOVE = 0
    try:
        coarse = solve_frontier(model, memory_resolution=resolution)
    finally:
        solve.APPROXIMATE_ABOVE = original
    assert coarse.memory_slack == resolution * len(model.options)
    for point in coarse.points:
        assert model.inconsistency(point.selection) is None
        assert point.time == model.time(point.selection)
        assert point.memory == model.memory(point.selection)
    for wanted in exact.points:
        assert any(
            found.time <= wanted.time and found.memory < wanted.memory + coarse.memory_slack
            for found in coarse.points
        ), (wanted, coarse.points)
