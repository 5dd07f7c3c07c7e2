"""The Alpa-style ILP baseline: cost formulas, hand-checkable choices, plans that apply."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from dataclasses import replace
from functools import cache, partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from helpers import SHARED_CACHE, assert_trees_close, traced

import explorer as ex
from explorer.alpa import (
    AlpaBudgetError,
    AlpaTimeLimitWarning,
    IlpAnswerStore,
    OpModel,
    all_gather_cost,
    all_reduce_cost,
    all_to_all_cost,
    comm_model,
    reduce_scatter_cost,
    solve_alpa,
    solve_alpa_kept,
    symbolic_config_costs,
)
from explorer.ir import TensorType
from explorer.layouts import layout_assignment
from explorer.mesh import make_mesh, mesh_spec
from explorer.plan import PlanError
from explorer.plan_document import plan_to_json
from explorer.platforms import load_platform
from explorer.realize import realize

RTOL = ATOL = 1e-5  # as in test_plan: compared on the second AdamW step
PLATFORM = "a100-pcie-8"


# -- alpha-beta formulas ----------------------------------------------------------------------


def test_alpha_beta_formulas() -> None:
    alpha, beta, nbytes = 2e-5, 1 / 18e9, 4 * 2**20
    assert all_reduce_cost(alpha, beta, 4, nbytes) == pytest.approx(
        alpha + 2 * beta * 3 / 4 * nbytes
    )
    assert all_gather_cost(alpha, beta, 4, nbytes) == pytest.approx(alpha + beta * 3 / 4 * nbytes)
    assert reduce_scatter_cost(alpha, beta, 8, nbytes) == pytest.approx(
        alpha + beta * 7 / 8 * nbytes
    )
    # Alpa's all-to-all: (n-1)/n^2 of the buffer per device, times its penalty factor n/2
    assert all_to_all_cost(alpha, beta, 4, nbytes) == pytest.approx(
        alpha + beta * 3 / 16 * nbytes * 2
    )
    # a ring all-reduce moves what a reduce-scatter and an all-gather move together
    assert all_reduce_cost(0, beta, 4, nbytes) == pytest.approx(
        reduce_scatter_cost(0, beta, 4, nbytes) + all_gather_cost(0, beta, 4, nbytes)
    )
    for formula in (all_reduce_cost, all_gather_cost, reduce_scatter_cost, all_to_all_cost):
        assert formula(alpha, beta, 1, nbytes) == 0.0  # one device: nothing to move


def test_alpha_and_beta_come_from_the_platform_or_alpa_defaults() -> None:
    platform = load_platform(PLATFORM)
    one_node = comm_model(mesh_spec((4,)), platform)
    link = platform.intra["all-reduce"]
    assert one_node.axis("x").alpha[0] == link.latency_s
    assert one_node.axis("x").beta[0] == pytest.approx(1 / link.bandwidth_Bps)
    assert one_node.units == "seconds"
    # an axis whose device group spans nodes is priced on the network between them
    two_nodes = load_platform("a100-ib-2x8")
    assert two_nodes.inter is not None
    model = comm_model(mesh_spec((2, 8)), two_nodes)
    assert model.axis("x").alpha[1] == two_nodes.inter["all-gather"].latency_s
    assert model.axis("y").alpha[1] == two_nodes.intra["all-gather"].latency_s
    # Alpa's mesh_alpha=(1, 1), mesh_beta=(1, 0.1): (inter-host, intra-host), right-aligned
    flat = comm_model(mesh_spec((4,)), None, defaults=True)
    assert (flat.axis("x").alpha[0], flat.axis("x").beta[0]) == (1.0, 0.1)
    square = comm_model(mesh_spec((2, 2)), None, defaults=True)
    assert [(a.alpha[0], a.beta[0]) for a in square.axes] == [(1.0, 1.0), (1.0, 0.1)]
    assert square.units == "alpa"


def test_resharding_costs_by_hand() -> None:
    _, _, graph = _mlp_graph(8, 16, 16)
    mesh = mesh_spec((2, 2))
    comm = comm_model(mesh, None, defaults=True)
    model = OpModel(graph, mesh, comm)
    tt = TensorType((8, 16), "float32")  # 512 bytes
    x, y = comm.axis("x"), comm.axis("y")
    assert model.reshard(tt, ((), ()), (("x",), ("y",))) == 0.0  # slicing is free
    # gathering y from a value also split by x: the group's buffer is half the value
    assert model.reshard(tt, (("x",), ("y",)), (("x",), ())) == pytest.approx(
        all_gather_cost(y.alpha[1], y.beta[1], 2, 256)
    )
    # x moves from dim 0 to dim 1: all-to-all over x
    assert model.reshard(tt, (("x",), ()), ((), ("x",))) == pytest.approx(
        all_to_all_cost(x.alpha[3], x.beta[3], 2, 512)
    )


# -- a 2-matmul MLP: the choice by hand ----------------------------------------------------------


@cache
def _mlp_graph(batch: int, features: int, hidden: int) -> tuple[Any, Any, Any]:
    k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": 0.02 * jax.random.normal(k1, (features, hidden)),
        "w2": 0.02 * jax.random.normal(k2, (hidden, features)),
    }
    data = {
        "x": jax.random.normal(k3, (batch, features)),
        "y": jax.random.normal(k4, (batch, features)),
    }

    def step(params: Any, data: Any) -> Any:
        def loss(p: Any) -> Any:
            h = jax.nn.relu(data["x"] @ p["w1"])
            return jnp.mean((h @ p["w2"] - data["y"]) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return value, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)

    step.explorer_arg_roles = ("params", "data")  # type: ignore[attr-defined]
    args = (params, data)
    return step, args, ex.trace(step, *args)


def _inputs(graph: Any, solution: Any) -> dict[str, Any]:
    layouts = solution.layout_map()
    return {graph.values[v].path: layouts[v] for v in graph.inputs}


@pytest.mark.parametrize("defaults", [False, True])
def test_large_weights_and_small_activations_make_it_pick_tensor_parallelism(
    defaults: bool,
) -> None:
    """Weights of 4 MiB, activations of 32 KiB: one all-reduce of the MLP's output (Megatron)
    moves far less than all-reducing both weight gradients (data parallel)."""
    step, args, graph = _mlp_graph(8, 1024, 1024)
    solution = solve_alpa(graph, (4,), PLATFORM, defaults=defaults)
    forward = [n for o, n in solution.strategies if graph.ops[o].role.value == "forward"]
    assert forward == ["N@x", "K@x"]
    inputs = _inputs(graph, solution)
    assert inputs["params['w1']"] == ((), ("x",))  # column split
    assert inputs["params['w2']"] == (("x",), ())  # row split
    assert solution.status == "optimal"
    if not defaults:  # the layouts run and compute what the unsharded step computes
        mesh = mesh_spec((4,))
        operands = {(o, p): d for o, p, d in solution.operands}
        assignment = layout_assignment(graph, mesh, solution.layout_map(), operands)
        sharded = realize(graph, assignment, make_mesh(mesh))
        assert_trees_close(jax.jit(step)(*args), sharded(*args), RTOL, ATOL)


@pytest.mark.parametrize("defaults", [False, True])
def test_tiny_weights_and_a_large_batch_make_it_pick_data_parallelism(defaults: bool) -> None:
    """Weights of 16 KiB, activations of 2 MiB: all-reducing the weight gradients wins."""
    _, _, graph = _mlp_graph(8192, 64, 64)
    solution = solve_alpa(graph, (4,), PLATFORM, defaults=defaults)
    forward = [n for o, n in solution.strategies if graph.ops[o].role.value == "forward"]
    assert forward == ["M@x", "M@x"]
    inputs = _inputs(graph, solution)
    assert inputs["params['w1']"] == ((), ()) and inputs["params['w2']"] == ((), ())
    # the two weight-gradient contractions reduce over the batch: partial sums, all-reduced
    backward = {graph.ops[o].output_types[0].shape: n for o, n in solution.strategies}
    assert backward[(64, 64)] == "K@x"


# -- whole models: plans that apply ------------------------------------------------------------


@cache
def _warm(name: str) -> tuple[Any, Any, Any]:
    step, args, _ = traced(name, 2)
    plain = jax.jit(step)
    _, params, opt_state = plain(*args)
    warm = (params, opt_state, args[2], jax.random.fold_in(args[3], 1))
    return step, warm, plain(*warm)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mesh"), [("gpt", (4,)), ("gpt", (2, 2)), ("moe", (4,))])
def test_alpa_plans_apply_and_match_the_unsharded_step(
    name: str, mesh: tuple[int, ...], tmp_path: Path
) -> None:
    step, args, expected = _warm(name)
    analysis = ex.analyze(step, *args, mesh=mesh, platform=PLATFORM, profile=False)
    plan = analysis.baseline("alpa")
    ilp = plan.ilp
    assert ilp is not None and ilp.status == "optimal" and ilp.solve_seconds < 60
    assert plan.source == "alpa" and plan.time > 0 and plan.memory > 0
    assert plan.values is not None and len(plan.values) > len(analysis.graph.inputs)
    loaded = ex.load_plan(plan.save(tmp_path / "alpa.json"))
    assert loaded == plan
    assert_trees_close(expected, ex.apply_plan(loaded, step, donate=False)(*args), RTOL, ATOL)
    print(
        f"\n{name} {mesh}: {ilp.variables} variables, {ilp.constraints} constraints, "
        f"solved in {ilp.solve_seconds:.2f} s; ILP {1e3 * ilp.objective:.4f} ms comm, "
        f"evaluated {1e3 * plan.time:.4f} ms; block heads {plan.strategies}"
    )


def test_time_limit_returns_the_best_solution_found_with_a_warning() -> None:
    _, _, graph = traced("gpt", 2)
    with pytest.warns(AlpaTimeLimitWarning, match="time limit of 0.001 s"):
        solution = solve_alpa(graph, (2, 2), PLATFORM, time_limit=1e-3)
    assert solution.status.startswith("time limit")
    assert math.isfinite(solution.objective)
    layouts = solution.layout_map()
    assert all(v in layouts for v in graph.inputs if graph.values[v].type.rank)


def test_memory_budget_bounds_the_plan_and_an_impossible_one_names_the_least() -> None:
    _, _, graph = traced("gpt", 2)
    free = solve_alpa(graph, (4,), PLATFORM)
    with pytest.raises(AlpaBudgetError, match="memory budget of 1000 bytes") as caught:
        solve_alpa(graph, (4,), PLATFORM, memory_budget=1000)
    found = re.search(r"least peak memory found is (\d+) bytes", str(caught.value))
    assert found is not None, str(caught.value)
    least = int(found.group(1))
    assert 1000 < least < free.memory
    # the least is reachable, and a budget between it and the free plan's peak binds
    assert solve_alpa(graph, (4,), PLATFORM, memory_budget=least).memory <= least
    budget = (least + free.memory) / 2
    bound = solve_alpa(graph, (4,), PLATFORM, memory_budget=budget)
    assert bound.memory <= budget
    assert bound.objective >= free.objective - 1e-12
    assert bound.problem.memory_constraints > 0 and free.problem.memory_constraints == 0


# -- answers kept across runs -------------------------------------------------------------------


def test_a_kept_answer_is_the_answer_again_with_its_warning_or_its_budget_error(
    tmp_path: Path,
) -> None:
    _, _, graph = traced("gpt", 2)
    path = tmp_path / "alpa.sqlite"
    with IlpAnswerStore(path) as store:
        solve = partial(solve_alpa_kept, store=store)
        solved = solve(graph, (2, 2), PLATFORM)
        assert not solved.kept and store.hits == 0
        assert solved.layouts == solve_alpa(graph, (2, 2), PLATFORM).layouts
        assert solve(graph, (2, 2), PLATFORM) == replace(solved, kept=True)
        assert store.hits == 1
        with pytest.warns(AlpaTimeLimitWarning, match="time limit of 0.001 s") as first:
            limited = solve(graph, (2, 2), PLATFORM, time_limit=1e-3)
        assert store.hits == 1 and limited.warning is not None
        with pytest.raises(AlpaBudgetError, match="memory budget of 1000 bytes") as refused:
            solve(graph, (4,), PLATFORM, memory_budget=1000)
    # another store on the same file, as the next run opens it
    with IlpAnswerStore(path) as store:
        solve = partial(solve_alpa_kept, store=store)
        assert solve(graph, (2, 2), PLATFORM) == replace(solved, kept=True)
        with pytest.warns(AlpaTimeLimitWarning) as again:
            assert solve(graph, (2, 2), PLATFORM, time_limit=1e-3) == replace(limited, kept=True)
        assert [str(w.message) for w in again] == [str(w.message) for w in first]
        with pytest.raises(AlpaBudgetError) as kept_refusal:
            solve(graph, (4,), PLATFORM, memory_budget=1000)
        assert str(kept_refusal.value) == str(refused.value)
        assert store.hits == 3
        # another mesh, budget, platform or graph is another problem
        assert not solve(graph, (4,), PLATFORM).kept
        assert not solve(graph, (2, 2), PLATFORM, memory_budget=1e12).kept
        assert not solve(graph, (2, 2), load_platform(PLATFORM).scaled(2)).kept
        assert not solve(traced("gpt", 1)[2], (2, 2), PLATFORM).kept
        assert store.hits == 3
    # a damaged answer is solved again, with a warning, and kept anew
    with sqlite3.connect(path) as db:
        db.execute("UPDATE answers SET fields = '{\"objective\": '")
    with IlpAnswerStore(path) as store:
        solve = partial(solve_alpa_kept, store=store)
        with pytest.warns(UserWarning, match="unreadable row in 'answers'"):
            again_solved = solve(graph, (2, 2), PLATFORM)
        assert not again_solved.kept and again_solved.layouts == solved.layouts
        assert solve(graph, (2, 2), PLATFORM) == replace(again_solved, kept=True)
        assert store.hits == 1


def test_a_baseline_from_a_kept_answer_is_the_same_plan(tmp_path: Path) -> None:
    step, args, _ = _mlp_graph(8, 64, 64)
    analysis = ex.analyze(step, *args, mesh=(4,), platform=PLATFORM, profile=False)
    with IlpAnswerStore(tmp_path / "alpa.sqlite") as store:
        solved = analysis.baseline("alpa", ilp_answers=store)
        kept = analysis.baseline("alpa", ilp_answers=store)
        assert store.hits == 1
    assert kept == solved and kept.ilp is not None and kept.ilp.status == "optimal"


# -- Fig. 9: Alpa's prediction of every configuration ---------------------------------------------


@pytest.mark.slow
def test_symbolic_costs_of_every_configuration_join_the_profiles() -> None:
    step, args, _ = _warm("gpt")
    wanted = {"M@x,M@x,M@x,M@x", "N@x,K@x,N@x,K@x", "K@x,K@x,K@x,K@x", "M@x", "N@x", "-"}
    analysis = ex.analyze(
        step,
        *args,
        mesh=(4,),
        platform=PLATFORM,
        cache=SHARED_CACHE,
        progress=False,
        only=lambda kind, label, config: kind == "reshard" or config in wanted,
    )
    symbolic = symbolic_config_costs(analysis)
    counts = symbolic.groupby("label").size().to_dict()
    # every configuration, not only profiled; the embedding once per strategy of the LM head
    # it shares `wte` with, as it is profiled
    assert counts == {"embed": 3, "layer": 81, "head": 3}
    assert (symbolic["symbolic_cost"] >= 0).all()
    profiles = analysis.profiles
    joined = profiles[profiles["kind"] == "segment"].merge(symbolic, on=["segment", "config"])
    # "-" selects the embedding under each of the 3 head strategies
    assert len(joined) == (profiles["kind"] == "segment").sum() == len(wanted) + 2
    layer = symbolic[symbolic["label"] == "layer"].set_index("config")["symbolic_cost"]
    # Megatron's pairs need one all-reduce each way per pair; all-K one per block
    assert layer["N@x,K@x,N@x,K@x"] < layer["M@x,M@x,M@x,M@x"] < layer["K@x,K@x,K@x,K@x"]


# -- per-value plans: bad data names the field -----------------------------------------------------


@cache
def _mlp_plan_document() -> tuple[Any, Any, Any, dict[str, Any]]:
    step, args, graph = _mlp_graph(6, 64, 64)  # a batch of 6 does not split 4 ways
    plan = ex.analyze(step, *args, mesh=(4,), platform=PLATFORM, profile=False).baseline("alpa")
    return step, args, graph, plan_to_json(plan)


def test_bad_per_value_layouts_are_refused_naming_the_field(tmp_path: Path) -> None:
    step, args, graph, document = _mlp_plan_document()
    ids = {graph.values[v].path: v for v in graph.inputs}
    w1, x = ids["params['w1']"], ids["data['x']"]
    path = tmp_path / "plan.json"
    for field, values, message in (
        ("values", {"99999": [None]}, r"field 'values\.99999': expected the id of a value"),
        ("values", {"w1": [None]}, r"field 'values\.w1': expected the id of a value"),
        ("values", {str(w1): [None]}, rf"field 'values\.{w1}': expected 2 entries"),
        ("values", {str(w1): [["z"], None]}, rf"field 'values\.{w1}'.*mesh axis 'z'"),
        ("values", {str(w1): [["x"], ["x"]]}, rf"field 'values\.{w1}'.*'x' splits .* twice"),
        ("values", {str(x): [["x"], None]}, rf"field 'values\.{x}'.*size 6.*into 4 parts"),
        ("operands", {"0:7": [None]}, r"field 'operands\.0:7'"),
        ("operands", {"op": [None]}, r"field 'operands\.op': expected 'op:position'"),
    ):
        path.write_text(json.dumps({**document, field: {**document[field], **values}}))
        with pytest.raises(PlanError, match=message):
            ex.apply_plan(ex.load_plan(path), step, donate=False)(*args)
    # the unedited plan applies
    path.write_text(json.dumps(document))
    expected = jax.jit(step)(*args)
    assert_trees_close(
        expected, ex.apply_plan(ex.load_plan(path), step, donate=False)(*args), RTOL, ATOL
    )
