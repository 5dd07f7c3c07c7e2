"""Frontiers kept across runs: read back only for the same question, re-priced when read,
and never at the cost of a run when the store is unusable."""

from __future__ import annotations

import json
import sqlite3
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from test_solve import chains

from explorer.cost import CostModel, Option
from explorer.errors import BytesError, FrontierTooLargeError
from explorer.frontier_store import (
    frontier_store_path,
    question_digest,
    solve_kept,
)
from explorer.solve import solve_frontier


def _option(name: str, time: float, memory: int, choices: tuple[int, ...] = (0,)) -> Option:
    return Option(
        choices=choices, name=name, t_comm=time / 2, t_comp=time / 2, persistent=memory,
        transient=0, peak=memory,
    )  # fmt: skip


def _layers(count: int = 4, *, shared: bool = True) -> CostModel:
    """`count` instances of one type with a fast, large option and a slow, small one (each
    instance its own equal tuple where not `shared`)."""
    layer = (_option("fast", 1.0, 10), _option("small", 3.0, 4))
    options = tuple(layer if shared else tuple([*layer]) for _ in range(count))
    reshard = tuple({(0, 0): 0.0} for _ in range(count - 1))
    return CostModel(tuple(f"layer_{n}" for n in range(count)), options, reshard)


def test_a_second_solve_of_the_same_model_reads_the_kept_frontier(tmp_path: Path) -> None:
    model = _layers()
    store = tmp_path / "frontiers.sqlite"
    first = solve_kept(model, store_path=store)
    again = solve_kept(model, store_path=store)
    assert not first.kept and again.kept
    assert again.frontier == first.frontier == solve_frontier(model)
    assert again.seconds == first.seconds  # the run's that solved it
    assert len(first.frontier.points) == len(model.options) + 1  # 0..4 layers fast


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_any_kept_frontier_reads_back_as_solved(model: CostModel) -> None:
    """Reading re-prices every point with the cost model; a solved point it prices otherwise
    would be a miss, and a kept frontier must equal a fresh solve."""
    from tempfile import TemporaryDirectory

    with TemporaryDirectory() as folder:
        store = Path(folder) / "frontiers.sqlite"
        first = solve_kept(model, store_path=store)
        again = solve_kept(model, store_path=store)
    assert again.kept and again.frontier == first.frontier


def test_each_question_is_kept_apart(tmp_path: Path) -> None:
    model = _layers()
    slower = replace(
        model, options=(tuple(replace(o, t_comp=o.t_comp + 1e-9) for o in model.options[0]),
                        *model.options[1:]),
    )  # fmt: skip
    questions = {
        question_digest(model, None, False),
        question_digest(model, None, True),  # uniform
        question_digest(model, {0: {0: 0}}, False),  # pinned
        question_digest(slower, None, False),  # one figure differs
        # equal options that are not one type (the uniform solver groups types by identity)
        question_digest(_layers(shared=False), None, False),
    }
    assert len(questions) == 5
    store = tmp_path / "frontiers.sqlite"
    solve_kept(model, store_path=store)
    assert not solve_kept(slower, store_path=store).kept
    assert not solve_kept(model, {0: {0: 0}}, store_path=store).kept
    assert solve_kept(model, store_path=store).kept


def test_a_kept_frontier_the_model_prices_otherwise_is_solved_again(tmp_path: Path) -> None:
    model = _layers()
    store = tmp_path / "frontiers.sqlite"
    solved = solve_kept(model, store_path=store)
    with sqlite3.connect(store) as db:  # a row edited by hand: the slowest plan's time
        (text,) = db.execute("SELECT fields FROM frontiers").fetchone()
        fields = json.loads(text)
        fields["times"][0] += 1.0
        db.execute("UPDATE frontiers SET fields = ?", (json.dumps(fields),))
    with pytest.warns(UserWarning, match="unreadable row in 'frontiers'"):
        again = solve_kept(model, store_path=store)
    assert not again.kept and again.frontier == solved.frontier
    assert solve_kept(model, store_path=store).kept  # the fresh answer replaced the bad row


def test_an_unusable_store_costs_the_run_nothing_but_the_time(
    tmp_path: Path, make_read_only: Callable[[Path], Path]
) -> None:
    model = _layers()
    garbage = tmp_path / "not-a-database.sqlite"
    garbage.write_bytes(b"this is not SQLite" * 100)
    with pytest.warns(UserWarning, match="frontier store .*not-a-database.sqlite could not be"):
        found = solve_kept(model, store_path=garbage)
    assert not found.kept and found.frontier == solve_frontier(model)
    assert garbage.read_bytes() == b"this is not SQLite" * 100  # left as it was

    folder = tmp_path / "locked"
    folder.mkdir()
    make_read_only(folder)
    with pytest.warns(UserWarning, match="frontier store .*locked.*could not be opened"):
        found = solve_kept(model, store_path=folder / "sub" / "frontiers.sqlite")
    assert not found.kept and found.frontier == solve_frontier(model)


def test_no_store_path_keeps_nothing(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        solved = solve_kept(_layers(), store_path=None)
    assert not solved.kept and list(tmp_path.iterdir()) == []


def test_analyze_keeps_frontiers_beside_its_profile_cache() -> None:
    assert frontier_store_path(Path("/c/profiles.sqlite")) == Path("/c/profiles.frontiers.sqlite")
    assert frontier_store_path(None) is None


def test_a_frontier_over_the_solver_s_memory_is_refused_and_the_refusal_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A space whose partial plans outgrow the solver's limit is refused with what to do,
    not solved until the machine kills the process; asked again with no more room, the kept
    refusal answers at once, and a larger limit solves it."""
    model = _layers(count=6)
    store = tmp_path / "frontiers.sqlite"
    monkeypatch.setenv("EXPLORER_SOLVER_MEMORY_LIMIT", "64")  # bytes: a few partial plans
    with pytest.raises(FrontierTooLargeError, match=r"too large to solve exactly: at .*layer_"):
        solve_kept(model, store_path=store)
    with pytest.raises(FrontierTooLargeError, match="kept from an earlier run"):
        solve_kept(model, store_path=store)
    # a machine with a hair more memory (what its kernel keeps back differs) has no more room
    monkeypatch.setenv("EXPLORER_SOLVER_MEMORY_LIMIT", "66")
    with pytest.raises(FrontierTooLargeError, match="kept from an earlier run"):
        solve_kept(model, store_path=store)
    # an approximate solve refused for memory names its resolution, not "exactly"
    with pytest.raises(FrontierTooLargeError, match=r"even with a memory resolution of 1 KiB: at"):
        solve_frontier(model, memory_resolution=1024)
    monkeypatch.setenv("EXPLORER_SOLVER_MEMORY_LIMIT", "1GiB")
    solved = solve_kept(model, store_path=store)
    assert not solved.kept and solved.frontier == solve_frontier(model)
    assert solve_kept(model, store_path=store).kept
    monkeypatch.setenv("EXPLORER_SOLVER_MEMORY_LIMIT", "lots")
    with pytest.raises(BytesError, match="EXPLORER_SOLVER_MEMORY_LIMIT"):
        solve_frontier(model)


def test_a_frontier_over_the_solver_s_time_is_refused_and_kept_until_given_more_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A space not solved within the solver's time limit is refused; asked again with no more
    time, the kept refusal answers at once (no solve starts), and more time solves it."""
    from explorer import solve

    model = _layers(count=6)
    store = tmp_path / "frontiers.sqlite"
    clock = iter(range(10**6))  # one second each time the solver reads it
    monkeypatch.setattr(solve, "monotonic", lambda: float(next(clock)))
    monkeypatch.setenv("EXPLORER_SOLVER_TIME_LIMIT", "3")
    where = r"not solved within 3 s .* 'layer_1' \(2 of 6\)"
    with pytest.raises(FrontierTooLargeError, match=where + r".* memory_resolution='64MiB'"):
        solve_kept(model, store_path=store)
    read = next(clock)
    with pytest.raises(FrontierTooLargeError, match=r"kept from an earlier run.* approximately"):
        solve_kept(model, store_path=store)
    assert next(clock) == read + 1  # the clock was not read: nothing was solved
    monkeypatch.setenv("EXPLORER_SOLVER_TIME_LIMIT", "2")  # less time: still refused
    with pytest.raises(FrontierTooLargeError, match="kept from an earlier run"):
        solve_kept(model, store_path=store)
    monkeypatch.setenv("EXPLORER_SOLVER_TIME_LIMIT", "none")
    solved = solve_kept(model, store_path=store)
    assert not solved.kept and solved.frontier == solve_frontier(model)
    # the uniform solver enumerates: no memory resolution helps it, and none is suggested
    monkeypatch.setattr(solve, "UNIFORM_CHECK_EVERY", 1)
    monkeypatch.setenv("EXPLORER_SOLVER_TIME_LIMIT", "0")
    with pytest.raises(FrontierTooLargeError) as refused:
        solve_kept(model, uniform=True, store_path=store)
    assert "not solved within 0 s" in str(refused.value)
    assert "memory_resolution" not in str(refused.value)


def test_an_approximate_frontier_is_kept_apart_from_the_exact_one_with_its_slack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from explorer import solve

    monkeypatch.setattr(solve, "APPROXIMATE_ABOVE", 0)  # every step compares in units
    model = _layers(count=6)
    store = tmp_path / "frontiers.sqlite"
    exact = solve_kept(model, store_path=store)
    coarse = solve_kept(model, store_path=store, memory_resolution=8)
    assert not coarse.kept and coarse.frontier.memory_slack == 8 * 6
    assert coarse.frontier != exact.frontier  # 10 and 4 bytes an instance: units of 8 merge
    again = solve_kept(model, store_path=store, memory_resolution=8)
    assert again.kept and again.frontier == coarse.frontier
    assert again.frontier.memory_slack == 8 * 6
    kept_exact = solve_kept(model, store_path=store)
    assert kept_exact.kept and kept_exact.frontier == exact.frontier


def test_analyze_keeps_the_default_frontier_and_those_under_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real analysis: its frontier is kept beside the profile cache, a second analysis of
    the same step reads it, and a frontier under pins is kept and read back the same way."""
    import jax.numpy as jnp
    import optax
    from helpers import mlp_step

    import explorer as ex
    from explorer import frontier_store

    params = {"w_in": jnp.ones((64, 128)), "w_out": jnp.ones((128, 64))}
    args = (params, optax.sgd(0.1).init(params), jnp.ones((16, 64)))
    cache = tmp_path / "profiles.sqlite"
    first = ex.analyze(mlp_step, *args, mesh=(4,), cache=cache, progress=False)
    assert (tmp_path / "profiles.frontiers.sqlite").is_file() and not first.frontier_kept
    strategies = [s.name for s in first.blocks[0].strategies]
    pins = {0: strategies[-1]}
    pinned = first.frontier_for(pins)
    with sqlite3.connect(tmp_path / "profiles.frontiers.sqlite") as db:
        (rows,) = db.execute("SELECT count(*) FROM frontiers").fetchone()
    assert rows == 2  # the default frontier and the pinned one

    def never(*_: object, **__: object) -> None:
        raise AssertionError("solved again: the store should have answered")

    monkeypatch.setattr(frontier_store, "solve_frontier", never)
    again = ex.analyze(mlp_step, *args, mesh=(4,), cache=cache, progress=False)
    assert again.frontier_kept and again.frontier == first.frontier
    assert again.solve_seconds == first.solve_seconds
    assert again.frontier_for(pins) == pinned
    monkeypatch.undo()
    unkept = ex.analyze(mlp_step, *args, mesh=(4,), cache=None, progress=False)
    assert unkept.frontier_store is None and not unkept.frontier_kept  # no file, nothing kept
    assert unkept.frontier_for(pins) == pinned
    # a memory resolution is another question, kept apart, and the pinned frontiers ask it too
    # (this step is far too small for any step to be compared in units: exact, no slack)
    coarse = ex.analyze(
        mlp_step, *args, mesh=(4,), cache=cache, progress=False, memory_resolution="1MiB"
    )
    assert coarse.memory_resolution == 2**20 and not coarse.frontier_kept
    assert coarse.frontier == first.frontier and coarse.frontier.memory_slack == 0
    assert coarse.frontier_for(pins) == pinned
    with sqlite3.connect(tmp_path / "profiles.frontiers.sqlite") as db:
        (rows,) = db.execute("SELECT count(*) FROM frontiers").fetchone()
    assert rows == 4


def test_a_run_that_compiled_part_of_its_programs_keeps_its_frontier_for_the_next_warm_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache answers the later configurations and the run compiles the earlier ones:
    its profiles come back in the jobs' order all the same, so the frontier it keeps is the
    one the next (warm) analysis asks for, and that one solves nothing."""
    import jax.numpy as jnp
    import optax
    from helpers import mlp_step

    import explorer as ex
    from explorer import frontier_store

    params = {"w_in": jnp.ones((64, 128)), "w_out": jnp.ones((128, 64))}
    args = (params, optax.sgd(0.1).init(params), jnp.ones((16, 64)))
    cache = tmp_path / "profiles.sqlite"
    later = ex.analyze(
        mlp_step, *args, mesh=(4,), cache=cache, progress=False,
        only=lambda kind, label, config: kind == "reshard" or not config.startswith("M@x"),
    )  # fmt: skip
    assert not later.profiles["config"].str.startswith("M@x").any()
    mixed = ex.analyze(mlp_step, *args, mesh=(4,), cache=cache, progress=False)
    assert mixed.profiles["config"].str.startswith("M@x").any() and not mixed.frontier_kept

    def never(*_: object, **__: object) -> None:
        raise AssertionError("solved again: the store should have answered")

    monkeypatch.setattr(frontier_store, "solve_frontier", never)
    warm = ex.analyze(mlp_step, *args, mesh=(4,), cache=cache, progress=False)
    assert warm.frontier_kept and warm.frontier == mixed.frontier
    assert list(warm.profiles["config"]) == list(mixed.profiles["config"])
