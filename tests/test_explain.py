"""Why this plan: collectives attributed to blocks, counterfactuals, plan diffs.

Tiny GPT is analysed with every configuration profiled (served by the session's shared
profile cache when test_accuracy ran first); the other zoo models with the profiles of their
DP and Megatron configurations only, as test_plan does.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from helpers import SHARED_CACHE
from jax.sharding import NamedSharding, PartitionSpec

import explorer as ex
from explorer.baselines import baseline_choices
from explorer.explain import Target, attribute, counterfactuals, plan_diff, plan_selection
from explorer.mesh import make_mesh, mesh_spec
from explorer.plan import evaluate_each
from explorer.profile.hlo import entry_instructions

ZOO = ("llama", "bert", "moe")  # tiny GPT is tested on every configuration profiled
# Collectives still "unknown" per (zoo model, plan) on mesh 4 with the DP and Megatron
# profiles (every other plan attributes all; a bound may only go down):
# - BERT Megatron (3): the head's layer-norm gradient all-reduces
#   (`transpose(jvp(head))/reduce_sum`): three ops of that name, data flow and partial sums,
#   laid out by two blocks (8, 9);
# - MoE mid budget (4): one all-to-all (4 elements) of a sharding constraint whose upstream
#   names no op of the graph, read by ops of two blocks (6, 10);
# - MoE Megatron (4): all-gathers of the router's `reduce` (an op name the graph does not
#   have), between ops of blocks 6 and 11 and read by ops of blocks 6, 7, 8.
UNKNOWN_BOUND = {("bert", "megatron"): 3, ("moe", "mid"): 4, ("moe", "megatron"): 4}


@cache
def _gpt(mesh: tuple[int, ...]) -> Any:
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    return ex.analyze(
        step, *args, mesh=mesh, platform="a100-pcie-8", cache=SHARED_CACHE, progress=False
    )


@cache
def _quick(name: str, mesh: tuple[int, ...]) -> Any:
    """An analysis profiling only the DP and Megatron configurations (and the boundaries)."""
    fn, config_cls = ex.models.MODELS[name]
    step, args = fn(config_cls.tiny().replace(num_layers=2))
    layout = ex.analyze(step, *args, mesh=mesh, profile=False)
    wanted = set()
    for baseline in ("dp", "megatron"):
        per_block = baseline_choices(baseline, layout.block_analysis, layout.segments)
        for instance in layout.segments.instances:
            names = [layout.blocks[b].strategies[per_block[b]].name for b in instance.blocks]
            wanted.add(",".join(names) or "-")
    return ex.analyze(
        step,
        *args,
        mesh=mesh,
        platform="a100-pcie-8",
        cache=SHARED_CACHE,
        progress=False,
        only=lambda kind, label, config: kind == "reshard" or config in wanted,
    )


def _plans(analysis: Any) -> dict[str, Any]:
    """The plans a user meets: the fastest, one at a memory budget between the frontier's
    ends, the smallest, and the fastest with its first block pinned to another strategy."""
    points = analysis.frontier.points
    fastest = analysis.plan()
    plans = {
        "fastest": fastest,
        "mid": analysis.plan(memory_budget=points[len(points) // 2].memory),
        "smallest": analysis.plan(memory_budget=points[0].memory),
    }
    for block, chosen in enumerate(fastest.strategies):
        for strategy in analysis.blocks[block].strategies:
            if strategy.name == chosen:
                continue
            try:
                plans[f"pinned {block}={strategy.name}"] = analysis.plan(
                    pins={block: strategy.name}
                )
            except ex.ExplorerError:  # a strategy no profiled configuration gives the block
                continue
            return plans
    raise AssertionError("no block can be pinned to another strategy")


def _assert_all_attributed(analysis: Any, found: Any, unknown: int = 0) -> None:
    listed = [f"{c.name}[{c.element}] {c.reason}" for c in found.unknown]
    assert len(found.unknown) <= unknown, listed
    for row in found.unknown:
        assert row.reason and row.block is None
    for row in found.collectives:
        assert row.reason
        if row.target is Target.BLOCK:
            assert analysis.segments.instances[row.segment].label == row.segment_label
            assert row.block in analysis.segments.instances[row.segment].blocks
        if row.target is Target.BOUNDARY:
            assert row.source_block is not None and row.source_block != row.block


def _evaluated(analysis: Any, plans: dict[str, Any]) -> dict[str, Any]:
    """What `evaluate` answers for each of `plans` (compiled together: `evaluate_each`)."""
    platform = analysis.platform
    each = evaluate_each(list(plans.values()), [platform], analysis.step, *analysis.args)
    return {label: e[platform] for label, e in zip(plans, each, strict=True) if e}  # else: raised


def _check_sums(analysis: Any, plan: Any, truth: Any) -> Any:
    """Attribute `plan`: the rows add up to the whole step's collective time as `evaluate`
    prices it (`truth`), one row per element of every collective `evaluate` counts."""
    found = attribute(analysis, plan)
    total = math.fsum(c.time for c in found.collectives)
    assert total == pytest.approx(truth.t_comm, rel=1e-9, abs=1e-15)
    assert len({c.name for c in found.collectives}) == truth.collectives
    by_target = math.fsum(found.time_of(t) for t in Target)
    assert by_target == pytest.approx(total, rel=1e-12)
    blocks = math.fsum(b.time + b.boundary_time for b in found.blocks)
    assert blocks == pytest.approx(
        found.time_of(Target.BLOCK) + found.time_of(Target.BOUNDARY), rel=1e-12, abs=1e-15
    )
    frame = found.frame()
    assert len(frame) == len(found.collectives)
    assert (frame["target"] == "unknown").sum() == len(found.unknown)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(4,), (2, 2)])
def test_every_collective_of_tiny_gpt_is_attributed_and_the_times_add_up(
    mesh: tuple[int, ...],
) -> None:
    analysis = _gpt(mesh)
    plans = {**_plans(analysis), "megatron": analysis.baseline("megatron")}
    assert len({p.strategies for p in plans.values()}) >= 4, "the plans should differ"
    truths = _evaluated(analysis, plans)
    boundaries = 0
    for label, plan in plans.items():
        found = _check_sums(analysis, plan, truths[label])
        print(f"{label}: {found.summary()}")
        _assert_all_attributed(analysis, found)
        boundaries += sum(c.target is Target.BOUNDARY for c in found.collectives)
        # Megatron's K-split blocks all-reduce their forward results: attributed to them
        if plan.source == "megatron":
            k_blocks = {b for b, s in enumerate(plan.strategies) if "K@" in s}
            forward = [
                c
                for c in found.collectives
                if c.kind == "all-reduce" and "transpose(" not in c.op_name and c.block in k_blocks
            ]
            assert forward, "no forward all-reduce attributed to a K-split block"
    # plans mixing strategies reshard between blocks: those moves are boundaries, not unknown
    assert boundaries > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_zoo_models_attribute_every_collective(name: str) -> None:
    analysis = _quick(name, (4,))
    plans = {**_plans(analysis), "megatron": analysis.baseline("megatron")}
    truths = _evaluated(analysis, plans)
    for label, plan in plans.items():
        found = _check_sums(analysis, plan, truths[label])
        print(f"{name} {label}: {found.summary()}")
        _assert_all_attributed(analysis, found, UNKNOWN_BOUND.get((name, label.split()[0]), 0))


@pytest.mark.slow
def test_counterfactuals_are_the_cost_model_prediction_of_the_altered_plan() -> None:
    analysis = _gpt((4,))
    plan = analysis.plan()
    table = counterfactuals(analysis, plan)
    assert table.selection == plan_selection(analysis, plan)
    assert table.time == pytest.approx(plan.time, rel=1e-12)
    strategies = sum(len(b.strategies) - 1 for b in analysis.blocks)
    assert len(table.rows) == strategies
    priced = [r for r in table.rows if r.selection is not None]
    assert priced, "every configuration is profiled: every alternative has a price"
    assert len(priced) == len(table.rows)
    for row in priced:
        altered = analysis.plan_of(row.selection)
        assert row.time_delta == pytest.approx(altered.time - plan.time, rel=1e-9, abs=1e-15)
        assert row.memory_delta == altered.memory - plan.memory
        changed = [
            b
            for b, (x, y) in enumerate(zip(plan.strategies, altered.strategies, strict=True))
            if x != y
        ]
        assert changed == list(row.blocks) == [row.block]
        assert altered.strategies[row.block] == row.strategy
    frame = table.frame()
    assert len(frame) == len(table.rows)
    # the plan is the fastest: no single change makes it faster
    assert min(r.time_delta for r in priced if r.time_delta is not None) >= -1e-15


@pytest.mark.slow
def test_counterfactuals_say_which_alternatives_the_profiles_left_out() -> None:
    analysis = _quick("gpt", (4,))
    table = counterfactuals(analysis, analysis.baseline("dp"))
    missing = [r for r in table.rows if r.selection is None]
    assert missing and all("no profiled configuration" in r.note for r in missing)
    with pytest.raises(ex.ExplorerError, match="not a combination of the profiled"):
        counterfactuals(analysis, analysis.baseline("fsdp"))


@pytest.mark.slow
def test_plan_diff() -> None:
    analysis = _quick("gpt", (4,))
    dp, megatron, fsdp = (analysis.baseline(n) for n in ("dp", "megatron", "fsdp"))
    same = plan_diff(dp, dp)
    assert same.empty and same.frame().empty
    diff = plan_diff(dp, megatron)
    assert not diff.empty
    assert [c.block for c in diff.blocks] == [
        b for b, (x, y) in enumerate(zip(dp.strategies, megatron.strategies, strict=True)) if x != y
    ]
    assert diff.time_delta == megatron.time - dp.time
    assert diff.memory_delta == megatron.memory - dp.memory
    sharded = plan_diff(dp, fsdp)  # the same block strategies, other parameter layouts
    assert sharded.blocks == () and sharded.parameters
    assert len(diff.frame()) == len(diff.blocks) + len(diff.parameters) + len(diff.segments)
    other = _gpt((2, 2)).plan()
    with pytest.raises(ex.ExplorerError, match="field 'mesh'"):
        plan_diff(dp, other)


def test_entry_instructions_read_the_entry_computation() -> None:
    mesh = make_mesh(mesh_spec((4,)))
    row = NamedSharding(mesh, PartitionSpec("x", None))

    def f(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
        return (a @ b).sum(axis=0), a * 2

    x = jnp.ones((8, 16))
    hlo = jax.jit(f, in_shardings=(row, row)).lower(x, jnp.ones((16, 4))).compile().as_text()
    found = entry_instructions(hlo)
    names = {i.name for i in found}
    assert len(names) == len(found)
    parameters = sorted(i.parameter for i in found if i.parameter is not None)
    assert parameters == [0, 1]
    (root,) = [i for i in found if i.root]
    assert root.opcode == "tuple" and len(root.operands) == 2
    assert all(o in names for i in found for o in i.operands)
    reduced = [i for i in found if i.opcode in ("all-reduce", "all-gather", "reduce-scatter")]
    assert reduced and all(i.op_name for i in reduced)
    assert all(i.shapes for i in found if i.opcode != "tuple")


ROLES = {
    "gpt": ["qkv", "attention out", "mlp in", "mlp out"],
    "llama": ["qkv", "attention out", "mlp in", "mlp out"],
    "bert": ["qkv", "attention out", "mlp in", "mlp out"],
}


@pytest.mark.parametrize("name", ["gpt", "llama", "bert", "moe"])
def test_blocks_are_named_by_their_role_from_the_graphs_structure(name: str) -> None:
    from explorer.explain.roles import block_names, block_roles

    fn, config_cls = ex.models.MODELS[name]
    step, args = fn(config_cls.tiny().replace(num_layers=2))
    analysis = ex.analyze(step, *args, mesh=(4,), profile=False)
    names = block_names(analysis)
    by_instance = {i.label: [names[b] for b in i.blocks] for i in analysis.segments.instances}
    print(by_instance)
    for instance in analysis.segments.instances:  # unique within a segment
        found = [names[b] for b in instance.blocks]
        assert len(set(found)) == len(found), (instance.label, found)
    if name in ROLES:
        assert by_instance["layer_0"] == by_instance["layer_1"] == ROLES[name]
    else:  # GShard MoE: a dense layer, then attention and the routed expert MLP
        assert by_instance["layer_0"] == ROLES["gpt"]
        moe = [n for i in analysis.segments.instances if i.label.startswith("layer_1") for n in
               (names[b] for b in i.blocks)]  # fmt: skip
        assert moe == [
            "qkv", "attention out", "router", "dispatch", "experts in", "experts out", "combine"
        ]  # fmt: skip
    # the LM head matches no rule: named by its position
    roles = block_roles(analysis)
    head = analysis.segments.instances[-1]
    assert [names[b] for b in head.blocks] == [f"block {k}" for k in range(len(head.blocks))]
    assert all(roles[b] == "" for b in head.blocks)


def test_role_names_stay_unique_at_48_layers() -> None:
    from explorer.explain.roles import block_names

    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=48))
    analysis = ex.analyze(step, *args, mesh=(4,), profile=False)
    names = block_names(analysis)
    layers = [i for i in analysis.segments.instances if len(i.blocks) == 4]
    assert len(layers) == 48
    assert all([names[b] for b in i.blocks] == ROLES["gpt"] for i in layers)
