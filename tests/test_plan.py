"""Plans end to end on tiny GPT: solve, baselines, JSON round trip, apply, evaluate."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from helpers import SHARED_CACHE, assert_trees_close

import explorer as ex
from explorer.errors import NoPlanFitsError
from explorer.plan import PlanError
from explorer.plan_document import plan_to_json
from explorer.platforms import load_platform

RTOL = ATOL = 1e-5  # as in test_realize: compared on the second AdamW step


@cache
def _setup() -> tuple[Any, Any, Any, Any]:
    # two layers, like test_profile's model: the session cache then serves both modules
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    plain = jax.jit(step)
    _, params, opt_state = plain(*args)
    warm = (params, opt_state, args[2], jax.random.fold_in(args[3], 1))
    analysis = ex.analyze(
        step, *warm, mesh=(4,), platform="a100-pcie-8", cache=SHARED_CACHE, progress=False
    )
    return step, warm, analysis, plain(*warm)


@pytest.mark.slow
def test_the_chosen_plan_and_the_baselines_apply_and_match_the_unsharded_step(
    tmp_path: Path,
) -> None:
    step, args, analysis, expected = _setup()
    frontier = analysis.frontier
    budget = (frontier.points[0].memory + frontier.points[-1].memory) / 2
    plans = {
        "fastest": analysis.plan(),
        "budget": analysis.plan(memory_budget=budget),
        "dp": analysis.baseline("dp"),
        "megatron": analysis.baseline("megatron"),
        "fsdp": analysis.baseline("fsdp"),
    }
    assert plans["budget"].memory <= budget
    assert plans["fastest"].time <= plans["budget"].time
    assert plans["fastest"].time <= min(plans["dp"].time, plans["megatron"].time) + 1e-12
    assert set(plans["dp"].strategies) == {"M@x"}
    assert plans["megatron"].strategies[:4] == ("N@x", "K@x", "N@x", "K@x")
    fsdp_parameters = plans["fsdp"].parameter_layouts
    assert fsdp_parameters["params['layers'][0]['attn']['w_qkv']"] == (("x",), ())
    assert set(plans["fsdp"].strategies) == {"M@x"}
    loaded = ex.load_plan(plans["budget"].save(tmp_path / "plan.json"))
    assert loaded == plans["budget"]
    plans["loaded"] = loaded
    for name, plan in plans.items():
        found = ex.apply_plan(plan, step, donate=False)(*args)
        assert_trees_close(expected, found, RTOL, ATOL)
        truth = ex.evaluate(plan, step, *args)
        assert truth.time > 0 and truth.memory > 0, name
        print(
            f"\n{name:9s} predicted {1e3 * plan.time:.4f} ms, evaluated {1e3 * truth.time:.4f} ms"
        )


def test_pins_and_budget_errors() -> None:
    _, _, analysis, _ = _setup()
    pinned = analysis.plan(pins={"layer": {0: "K@x"}})
    assert pinned.strategies[0] == "K@x"
    with pytest.raises(ex.ExplorerError, match="no strategy 'Z@x'"):
        analysis.plan(pins={0: "Z@x"})
    least = analysis.frontier.min_memory
    with pytest.raises(NoPlanFitsError, match=f"smallest plan needs .* \\({least} bytes\\)"):
        analysis.plan(memory_budget=least - 1)


def _saved(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    _, _, analysis, _ = _setup()
    path = analysis.plan().save(tmp_path / "plan.json")
    return path, json.loads(path.read_text())


def test_malformed_and_foreign_plans_are_refused_naming_the_field(tmp_path: Path) -> None:
    step, args, _, _ = _setup()
    path, document = _saved(tmp_path)
    path.write_text("{not json")
    with pytest.raises(PlanError, match="line 1 column 2"):
        ex.load_plan(path)
    for field, value, message in (
        ("schema_version", 2, "field 'schema_version' is 2"),
        ("device_count", "eight", "field 'device_count'"),
    ):
        path.write_text(json.dumps({**document, field: value}))
        with pytest.raises(PlanError, match=message):
            ex.load_plan(path)
    path.write_text(json.dumps({**document, "model_fingerprint": "0123456789abcdef"}))
    with pytest.raises(PlanError, match="field 'model_fingerprint'"):
        ex.apply_plan(ex.load_plan(path), step, donate=False)(*args)
    sixteen = {"mesh": {"axes": ["x"], "shape": [16]}, "device_count": 16}
    path.write_text(json.dumps({**document, **sixteen}))
    with pytest.raises(PlanError, match="field 'mesh': the plan needs 16 devices"):
        ex.apply_plan(ex.load_plan(path), step, donate=False)(*args)


GOLDEN = Path(__file__).parent / "golden" / "gpt_tiny_2layer_mesh4.json"


def test_golden_plan_is_stable_and_valid() -> None:
    """Structure of the fastest plan for a fixed case (timings aside: they follow XLA)."""
    _, _, analysis, _ = _setup()
    document = plan_to_json(analysis.plan())
    # the platform is recorded in full: the preset's figures, not part of the golden structure
    assert document["platform_spec"] == load_platform("a100-pcie-8").to_json()
    unstable = ("predicted", "segments", "versions", "platform_spec")
    stable = {k: v for k, v in document.items() if k not in unstable}
    stable["segments"] = [
        {"label": s["label"], "configuration": s["configuration"]} for s in document["segments"]
    ]
    if os.environ.get("EXPLORER_UPDATE_GOLDEN"):  # regenerate deliberately, then review
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(stable, indent=1, sort_keys=True) + "\n")
    assert GOLDEN.exists(), f"missing {GOLDEN}: run with EXPLORER_UPDATE_GOLDEN=1 to create it"
    assert stable == json.loads(GOLDEN.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "mesh"), [("llama", (2, 2)), ("moe", (4,)), ("bert", (4,)), ("gpt", (2, 2))]
)
def test_plans_apply_on_other_models_and_meshes(name: str, mesh: tuple[int, ...]) -> None:
    """The chosen plan and every baseline reproduce the unsharded step (profiling restricted
    to the baselines' configurations and the boundaries, to keep the test short)."""
    fn, config_cls = ex.models.MODELS[name]
    step, args = fn(config_cls.tiny().replace(num_layers=2))
    plain = jax.jit(step)
    _, params, opt_state = plain(*args)
    warm = (params, opt_state, args[2], jax.random.fold_in(args[3], 1))
    expected = plain(*warm)
    layout = ex.analyze(step, *warm, mesh=mesh, profile=False)
    from explorer.baselines import baseline_choices

    wanted = set()
    for baseline in ("dp", "megatron"):
        per_block = baseline_choices(baseline, layout.block_analysis, layout.segments)
        for instance in layout.segments.instances:
            names = [layout.blocks[b].strategies[per_block[b]].name for b in instance.blocks]
            wanted.add(",".join(names) or "-")
    analysis = ex.analyze(
        step,
        *warm,
        mesh=mesh,
        cache=SHARED_CACHE,
        progress=False,
        only=lambda kind, label, config: kind == "reshard" or config in wanted,
    )
    plans = [analysis.plan()] + [analysis.baseline(b) for b in ("dp", "megatron", "fsdp")]
    for plan in plans:
        assert_trees_close(expected, ex.apply_plan(plan, step, donate=False)(*warm), RTOL, ATOL)


def _second_step_of(config: Any) -> tuple[Any, tuple[Any, ...], Any]:
    """The tiny model of `config` (GPT's, or another zoo model's): its step, the arguments
    of its second step and the unsharded step's results on them."""
    build = next(fn for fn, kind in ex.models.MODELS.values() if type(config) is kind)
    step, args = build(config)
    plain = jax.jit(step)
    _, params, opt_state = plain(*args)
    warm = (params, opt_state, args[2], jax.random.fold_in(args[3], 1))
    return step, warm, plain(*warm)


def _pinned_plan(
    step: Any,
    warm: tuple[Any, ...],
    pick: Callable[[Any], str | None],
    *,
    mesh: tuple[int, ...] = (2, 2),
    **switches: bool,
) -> Any:
    """The plan on `mesh` of the space `analyze`'s `switches` build that pins each block to
    `pick(block)` (its first strategy where that is None), profiled only for the pinned
    configurations and the boundaries."""
    layout = ex.analyze(step, *warm, mesh=mesh, profile=False, **switches)
    pins = {block.index: pick(block) or block.strategies[0].name for block in layout.blocks}
    wanted = {
        ",".join(pins[b] for b in instance.blocks) or "-" for instance in layout.segments.instances
    }
    analysis = ex.analyze(
        step,
        *warm,
        mesh=mesh,
        cache=SHARED_CACHE,
        progress=False,
        only=lambda kind, label, config: kind == "reshard" or config in wanted,
        **switches,
    )
    plan = analysis.plan(pins=pins)
    assert list(plan.strategies) == [pins[b] for b in range(len(pins))]
    return plan


@pytest.mark.slow
def test_a_plan_of_the_freed_2d_space_applies_and_matches_the_unsharded_step() -> None:
    """A plan made with `free_axes=True` may put the batch on the inner axis, which the
    default space does not offer: applying it builds the space that has its strategies
    (profiling restricted to the pinned configurations and the boundaries)."""
    step, warm, expected = _second_step_of(ex.models.GPTConfig.tiny().replace(num_layers=2))
    default = ex.analyze(step, *warm, mesh=(2, 2), profile=False)
    offered = {s.name for block in default.blocks for s in block.strategies}

    def own(block: Any) -> str | None:  # where the freed space has a strategy of its own
        return next((s.name for s in block.strategies if s.name not in offered), None)

    plan = _pinned_plan(step, warm, own, free_axes=True)
    assert any(name not in offered for name in plan.strategies)
    assert_trees_close(expected, ex.apply_plan(plan, step, donate=False)(*warm), RTOL, ATOL)


@pytest.mark.slow
def test_a_batch_inner_plan_with_primed_roles_saves_applies_and_matches_the_unsharded_step(
    tmp_path: Path,
) -> None:
    """Tiny GPT at batch 2 on 2x2: the batch does not split over 4 devices, so the
    batch-inner space primes it for the inner axis (M'@y, E'@y in the attention cores).
    The plan pinning each block to its first primed strategy records its space, survives
    its JSON, and applies with the same numbers as the unsharded step."""
    config = ex.models.GPTConfig.tiny().replace(num_layers=2, batch=2)
    step, warm, expected = _second_step_of(config)

    def primed(block: Any) -> str | None:
        return next((s.name for s in block.strategies if "'@y" in s.name), None)

    plan = _pinned_plan(step, warm, primed, batch_inner=True)
    assert sum("'@y" in name for name in plan.strategies) >= len(plan.strategies) // 2
    assert plan_to_json(plan)["space"] == {"batch_inner": True}
    loaded = ex.load_plan(plan.save(tmp_path / "inner.json"))
    assert loaded == plan
    assert_trees_close(expected, ex.apply_plan(loaded, step, donate=False)(*warm), RTOL, ATOL)


@pytest.mark.slow
def test_an_expert_parallel_plan_of_the_contract_last_space_applies_and_matches(
    tmp_path: Path,
) -> None:
    """Tiny MoE on 4 devices with `contract_last=True`: the plan taking E wherever a block
    offers it (the groups in the gating and dispatch einsums, the experts in the expert
    einsums) and contracting the experts split in the combine einsum (its K, moved there)
    records its space, survives its JSON, and applies with the same numbers as the
    unsharded step."""
    config = ex.models.MoEConfig.tiny().replace(num_layers=2)
    step, warm, expected = _second_step_of(config)

    def expert_parallel(block: Any) -> str | None:
        moved = any("(contract_last)" in note for note in block.role_notes)
        wanted = "K@x" if moved else "E@x"
        return next((s.name for s in block.strategies if s.name == wanted), None)

    plan = _pinned_plan(step, warm, expert_parallel, mesh=(4,), contract_last=True)
    assert plan.strategies.count("K@x") >= 1 and "E@x" in plan.strategies
    assert plan_to_json(plan)["space"] == {"contract_last": True}
    loaded = ex.load_plan(plan.save(tmp_path / "experts.json"))
    assert loaded == plan
    assert_trees_close(expected, ex.apply_plan(loaded, step, donate=False)(*warm), RTOL, ATOL)


@pytest.mark.slow
def test_a_plan_with_zero_twins_saves_applies_and_matches_the_unsharded_step(
    tmp_path: Path,
) -> None:
    """A plan of the space with ZeRO twins (`shard_parameters=True`): its layer blocks keep
    their weights sharded over the batch axis, the plan's JSON says so, and loaded back it
    applies (the space rebuilt with its twins) and computes the unsharded step's numbers.
    Its prediction is checked against the whole step compiled under it."""
    step, warm, _, expected = _setup()
    pins = {"layer": {0: "M@x", 1: "M@x,params@x", 2: "M@x,params@x", 3: "M@x,params@x"}}
    wanted = {"M@x,M@x,params@x,M@x,params@x,M@x,params@x"}
    analysis = ex.analyze(
        step, *warm, mesh=(4,), platform="a100-pcie-8", cache=SHARED_CACHE, progress=False,
        shard_parameters=True, config_cap=256,  # the layer whole: 4 blocks of 4 strategies
        only=lambda kind, label, config: kind == "reshard" or label != "layer" or config in wanted,
    )  # fmt: skip
    plan = analysis.plan(pins=pins)
    stored = {path: dims for path, dims in plan.parameter_layouts.items() if "w_" in path}
    assert stored and all(("x",) in dims for path, dims in stored.items() if "w_qkv" not in path)
    assert all(not any(dims) for path, dims in stored.items() if "w_qkv" in path)
    loaded = ex.load_plan(plan.save(tmp_path / "zero.json"))
    assert loaded.strategies == plan.strategies
    assert_trees_close(expected, ex.apply_plan(loaded, step, donate=False)(*warm), RTOL, ATOL)
    truth = ex.evaluate(loaded, step, *warm)
    assert plan.time == pytest.approx(truth.time, rel=0.1)


@pytest.mark.slow
def test_a_plan_of_the_zero_twin_space_is_placed_with_that_space_s_segments() -> None:
    """On a 2-D mesh the space with ZeRO twins cuts a GPT layer into parts, so a plan of it
    whose strategies are all plain must still be placed with its parts' boundaries, as its
    programs were priced (the default space, which also offers those names, has none there
    and places the step otherwise). Profiling is restricted to the pinned configurations."""
    from explorer.ir import Config
    from explorer.layouts import place
    from explorer.plan import _configure

    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    plain = jax.jit(step)
    _, params, opt_state = plain(*args)
    warm = (params, opt_state, args[2], jax.random.fold_in(args[3], 1))
    shape = ex.analyze(step, *warm, mesh=(2, 2), shard_parameters=True, profile=False)
    assert len(shape.segments.instances) > len(
        ex.analyze(step, *warm, mesh=(2, 2), profile=False).segments.instances
    )
    pins = {block.index: "M@x,N@y" for block in shape.blocks}
    wanted = {",".join("M@x,N@y" for _ in i.blocks) or "-" for i in shape.segments.instances}

    def pinned(kind: str, label: str, config: str) -> bool:
        if kind == "reshard":
            return set(config.split("->")) <= {"M@x,N@y", "none"}
        return config in wanted

    analysis = ex.analyze(
        step, *warm, mesh=(2, 2), shard_parameters=True, cache=SHARED_CACHE, progress=False,
        only=pinned,
    )  # fmt: skip
    plan = analysis.plan(pins=pins)
    assert set(plan.strategies) == {"M@x,N@y"}
    assert all(b.strategies[1].name == "M@x,N@y" for b in analysis.blocks)
    config = Config((1,) * len(analysis.blocks))
    priced = place(analysis.graph, analysis.blocks, config, plan.mesh, analysis.segments)
    _, applied = _configure(plan, step, warm)
    assert applied == priced.assignment
    assert_trees_close(plain(*warm), ex.apply_plan(plan, step, donate=False)(*warm), RTOL, ATOL)


@pytest.mark.slow
def test_a_whole_mesh_plan_on_2x2_runs_as_the_four_device_plan_and_applies(
    tmp_path: Path,
) -> None:
    """The whole-mesh space (`whole_mesh=True`) holds the 1-D plan of the same devices: the
    leanest plan on a mesh of 4, each strategy split over both axes of 2x2, compiles to a
    step within 2 % of its time (the same collectives but one all-reduce's combining; small
    ops laid out for two axes), is predicted within 5 % of it, round-trips JSON and applies
    (its space and segments rebuilt from the names) computing the unsharded step's numbers.
    Profiling is restricted to that plan's configurations."""
    step, warm, flat, expected = _setup()
    one_d = flat.plan(memory_budget=flat.frontier.min_memory)
    assert {name.split("@")[0] for name in one_d.strategies} - {"M"}  # not only the batch
    names = [name.replace("@x", "@x+y") for name in one_d.strategies]
    shape = ex.analyze(step, *warm, mesh=(2, 2), whole_mesh=True, profile=False)
    wanted = {",".join(names[b] for b in i.blocks) or "-" for i in shape.segments.instances}

    def pinned(kind: str, label: str, config: str) -> bool:
        if kind == "reshard":
            return set(config.split("->")) <= {*names, "none"}
        return config in wanted

    analysis = ex.analyze(
        step, *warm, mesh=(2, 2), whole_mesh=True, cache=SHARED_CACHE, progress=False,
        only=pinned,
    )  # fmt: skip
    plan = analysis.plan(pins=dict(enumerate(names)))
    assert list(plan.strategies) == names
    truth, truth_1d = ex.evaluate(plan, step, *warm), ex.evaluate(one_d, step, *warm)
    assert truth.time == pytest.approx(truth_1d.time, rel=0.02)
    assert plan.time == pytest.approx(truth.time, rel=0.05)
    loaded = ex.load_plan(plan.save(tmp_path / "whole.json"))
    assert loaded.strategies == plan.strategies
    assert_trees_close(expected, ex.apply_plan(loaded, step, donate=False)(*warm), RTOL, ATOL)


@pytest.mark.slow
def test_a_baseline_the_profiles_left_out_is_priced_on_the_whole_step() -> None:
    step, args, _, _ = _setup()

    def column_split_layers_only(kind: str, label: str, configuration: str) -> bool:
        return kind != "segment" or label != "layer" or configuration.startswith("N@x")

    analysis = ex.analyze(
        step, *args, mesh=(4,), platform="a100-pcie-8", cache=SHARED_CACHE, progress=False,
        only=column_split_layers_only,
    )  # fmt: skip
    plan = analysis.baseline("dp")  # its layers (all M@x) were not profiled
    assert set(plan.strategies) == {"M@x"}
    truth = ex.evaluate(plan, step, *args)
    assert plan.time == pytest.approx(truth.time) and plan.memory == truth.memory


def test_the_applied_step_donates_parameters_and_optimizer_state_by_default() -> None:
    """As a training loop runs it (`state = step(state, batch)`): the step's inputs are
    consumed, its outputs feed the next step, and `donate=False` keeps the inputs."""
    step, args, analysis, _ = _setup()
    plan = analysis.baseline("dp")
    kept = ex.apply_plan(plan, step, donate=False)
    placed = kept(*args)  # arrays laid out as the plan wants, for the donating step
    donating = ex.apply_plan(plan, step)
    state = (placed[1], placed[2], *args[2:])
    loss, params, opt_state = donating(*state)
    assert jax.tree.leaves(state[0])[0].is_deleted()  # consumed, as the plan's memory assumes
    loss, params, opt_state = donating(params, opt_state, *args[2:])  # the loop goes on
    assert np.isfinite(float(loss))
    assert not jax.tree.leaves(args[0])[0].is_deleted()
