"""The notebook explorer, driven from Python: widgets are set and buttons clicked as a user
would, and the assertions read the figures' data, the summary and the message area.

Profiles come from the session cache (helpers.SHARED_CACHE), profiled here when this module
runs first: tiny GPT (2 layers) on 8 devices, paired strategies only (32 programs: the
embedding is profiled once per strategy of the LM head it shares `wte` with).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import SHARED_CACHE

pytest.importorskip("ipywidgets", reason="the ui extra is not installed")
pytest.importorskip("plotly", reason="the ui extra is not installed")

import explorer as ex
from explorer.ui import Explorer, mesh_shapes, paired_strategies, presets
from explorer.ui.style import exact_bytes, plan_name

TIMEOUT_S = 600


def _run(app: Explorer) -> None:
    worker = app.run()
    assert worker is not None, app.message
    worker.join(TIMEOUT_S)
    assert not worker.is_alive(), "profiling did not finish in time"


@pytest.fixture(scope="module")
def shared() -> Explorer:
    app = Explorer("gpt", "tiny", mesh=(8,), quick=True, cache=SHARED_CACHE)
    _run(app)
    assert app.message == "", app.message
    return app


@pytest.fixture
def app(shared: Explorer) -> Iterator[Explorer]:
    """The shared app, put back to no pins and no budget after each test."""
    yield shared
    shared.clear_pins()
    shared.set_level("blocks")
    shared.fastest_w.click()


def _text(html_value: str) -> str:
    return re.sub(r"<[^>]+>", "", html_value)


def _node_traces(app: Explorer) -> list[Any]:
    return [app.graph.figure.data[s.trace] for s in app.graph.slices]


def _looks(app: Explorer) -> list[tuple[Any, ...]]:
    return [
        (tuple(t.marker.line.color), tuple(t.text), tuple(t.hovertext)) for t in _node_traces(app)
    ]


def test_a_run_fills_every_view(app: Explorer) -> None:
    analysis = app.analysis
    assert isinstance(analysis, ex.Analysis)  # profiled, not just segmented
    table = analysis.profiles
    assert len(table) == 32 and set(table["status"]) == {"ok"}
    assert app.progress_w.value == app.progress_w.max and app.progress_w.bar_style == "success"
    # block level: one node per block of each band's first instance, bands collapse repeats
    layer = analysis.segments.instances[1]
    nodes = sum(len(t.x) for t in _node_traces(app))
    assert nodes == len(layer.blocks) + len(analysis.segments.instances[-1].blocks)
    bands = app.graph.figure.data[app.graph.band_trace]
    assert list(bands.text) == ["embed", "layer x 2", "head"]
    legend = [t.name for t in _node_traces(app)]
    # blocks named by their role in the layer (explain.roles), by position where none applies
    assert legend == [
        "layer · qkv", "layer · attention out", "layer · mlp in", "layer · mlp out",
        "head · block 0",
    ]  # fmt: skip
    assert len({t.marker.color for t in _node_traces(app)}) == len(legend)
    # the summary is the fastest plan's
    fastest = analysis.frontier.points[-1]
    assert f"{1e3 * fastest.time:.4f} ms/step" in app.summary
    # bars: the largest segment type is selected, 16 configurations sorted by total time
    bars = app.bars.data
    assert bars.label == "layer" and len(bars.configs) == 16
    totals = [a + b for a, b in zip(bars.t_comp_ms, bars.t_comm_ms, strict=True)]
    assert totals == sorted(totals)
    assert sum(bars.chosen) == 2  # both layer instances
    figure = app.bars.figure
    assert list(figure.data[0].x) == list(bars.configs)
    assert [w > 0 for w in figure.data[0].marker.line.width] == [n > 0 for n in bars.chosen]
    assert any("collectives emitted" in h for h in figure.data[1].hovertext)
    # the Alpa-style symbolic costs, when that module provides them, sit on the same configs
    assert (bars.note == "") == all(v is not None for v in bars.symbolic_ms)
    # frontier: every point, the current plan marked
    frontier = app.frontier.figure
    assert len(frontier.data[0].x) == len(analysis.frontier.points)
    assert frontier.data[1].x == (fastest.memory / 2**20,)


def test_the_budget_slider_re_solves_and_updates_every_view(app: Explorer) -> None:
    analysis = app.analysis
    assert analysis is not None
    points = analysis.frontier.points
    assert len(points) >= 2
    traces_before = list(app.graph.figure.data)
    positions = [(tuple(t.x), tuple(t.y)) for t in _node_traces(app)]
    builds = app.layouts.builds
    summary, looks, chosen = app.summary, _looks(app), app.bars.data.chosen

    app.budget_w.value = 0  # as a user drags the slider to its first step: the smallest plan
    expected = analysis.plan(memory_budget=points[0].memory)
    assert app.choice is not None
    assert app.choice.strategies == expected.strategies
    assert app.summary != summary and f"{1e3 * expected.time:.4f} ms/step" in app.summary
    assert _looks(app) != looks  # recoloured...
    assert list(app.graph.figure.data) == traces_before  # ...the same traces, not re-laid out
    assert [(tuple(t.x), tuple(t.y)) for t in _node_traces(app)] == positions
    assert app.layouts.builds == builds
    assert app.bars.data.chosen != chosen
    assert app.frontier.figure.data[1].x == (expected.memory / 2**20,)
    assert app.frontier.figure.layout.shapes[0].x0 == pytest.approx(points[0].memory / 2**20)
    assert app.plan is not None and app.plan == expected

    assert app.session.budget == points[0].memory
    app.set_budget(points[0].memory - 1)  # below every plan (from code: no slider step is)
    assert "no plan fits" in app.message and "No plan" in app.summary
    assert app.export_w.disabled and app.frontier.figure.data[1].x == ()
    app.fastest_w.click()
    assert app.message == "" and not app.export_w.disabled
    assert f"{1e3 * points[-1].time:.4f} ms/step" in app.summary


def test_pins_force_a_strategy_and_re_solve(app: Explorer) -> None:
    analysis = app.analysis
    assert analysis is not None and app.choice is not None
    block = analysis.segments.instances[1].blocks[1]  # attention out-projection of layer 0
    wanted = next(name for name in ("K@x", "M@x") if app.choice.strategies[block] != name)
    app.pin_block_w.value = block
    assert wanted in app.pin_strategy_w.options
    app.pin_strategy_w.value = wanted
    app.pin_w.click()
    assert app.message == ""
    assert app.choice.strategies[block] == wanted
    assert f"block {block}: {wanted}" in _text(app.summary)
    assert analysis.plan(pins={block: wanted}).strategies == app.choice.strategies
    hover = [h for t in _node_traces(app) for h in t.hovertext]
    assert any(f"{wanted} on 1 of 2" in h for h in hover)
    # a strategy the quick look never profiled for this block: the reason, visibly, and the
    # pin is not kept (the plan shown stays)
    shown = app.summary
    assert not app.pin(analysis.segments.instances[1].blocks[0], "K@x")
    assert "pin not kept" in app.message and "no profiled configuration" in app.message
    assert app.summary == shown and app.session.pins == {block: wanted}
    app.unpin_w.click()
    assert app.message == "" and "no pins" in app.pins_label.value


def test_a_click_expands_a_segment_to_its_ops(app: Explorer) -> None:
    from plotly.callbacks import InputDeviceState, Points

    analysis = app.analysis
    assert analysis is not None
    bands = app.graph.figure.data[app.graph.band_trace]
    bands._dispatch_on_click(
        Points(point_inds=[1], trace_index=app.graph.band_trace), InputDeviceState()
    )
    assert app.level_w.value == "ops" and app.graph.level == "ops"
    instance = analysis.segments.instances[1]
    assert app.session.selected == instance.index
    traces = _node_traces(app)
    assert sum(len(t.x) for t in traces) == len(instance.ops)
    outside = next(t for t in traces if t.name == "outside blocks")
    assert outside.marker.color == "#BBBBBB"
    owner = analysis.block_analysis.block_of_op
    assert len(outside.x) == sum(owner[o] is None for o in instance.ops)
    plan = app.plan
    assert plan is not None
    # the hover gives each op its strategy and the PartitionSpec the plan gives its result
    head = analysis.blocks[instance.blocks[0]].head
    hover = next(h for t in traces for h in t.hovertext if h.startswith(f"<b>#{head} "))
    spec = plan.blocks[instance.blocks[0]].layout_of(analysis.graph.ops[head].outputs[0])
    assert spec is not None
    assert f"strategy {plan.strategies[instance.blocks[0]]}" in hover
    assert "PartitionSpec: P(" in hover and ("'x'" in hover) == any(spec)
    # forward/backward filter
    app.roles_w.value = "backward"
    shown = [i for t in _node_traces(app) for i in t.hovertext]
    assert shown and all("[backward]" in h for h in shown)
    assert len(shown) == sum(analysis.graph.ops[o].role == "backward" for o in instance.ops)
    app.roles_w.value = "all"


def test_export_writes_the_plan_and_offers_a_download(app: Explorer, tmp_path: Path) -> None:
    target = tmp_path / "out" / "plan.json"
    app.export_path_w.value = str(target)
    app.export_w.click()
    assert app.message == ""
    assert target.is_file()
    plan = ex.load_plan(target)
    assert app.plan is not None and plan == app.plan
    link = re.search(r"href='data:application/json;base64,([^']+)'", app.download_w.value)
    assert link is not None
    assert json.loads(base64.b64decode(link.group(1))) == json.loads(plan.to_json())


def test_a_callback_error_is_shown_not_lost(app: Explorer, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    app.export_path_w.value = str(blocker / "plan.json")  # a path under a file
    app.export_w.click()
    assert "Export plan failed" in app.message and "Error" in app.message


def few(kind: str, label: str, config: str) -> bool:
    """Data parallel and Megatron layers only (a small profile for the mesh and model tests)."""
    if not paired_strategies(kind, label, config):
        return False
    if kind == "segment" and config.count(",") >= 1 and "," in config:
        roles = [n.split("@")[0].split(",")[-1] for n in config.split(",") if "@" in n]
        return len(set(roles)) == 1 or roles[:2] == ["N", "K"]
    return True


def test_changing_the_model_re_solves_and_lays_out_once_per_model() -> None:
    app = Explorer("gpt", "tiny", mesh=(8,), cache=SHARED_CACHE, analyze_options={"only": few})
    _run(app)
    gpt = app.analysis
    assert gpt is not None and app.layouts.builds == 1
    app.model_w.value = "bert"
    app.layers_w.value = 1
    _run(app)
    bert = app.analysis
    assert bert is not None and bert is not gpt and app.message == ""
    assert app.layouts.builds == 2
    assert list(app.graph.figure.data[app.graph.band_trace].text) == ["embed", "layer", "head"]
    assert app.frontier.data.time_ms == tuple(1e3 * p.time for p in bert.frontier.points)
    assert app.bars.data.label == "layer"
    assert set(app.bars.data.configs) == set(
        bert.profiles.query("kind == 'segment' and label == 'layer'")["config"]
    )
    app.model_w.value = "gpt"
    app.layers_w.value = 0
    _run(app)
    assert app.layouts.builds == 2  # the GPT layout came from the cache
    assert list(app.graph.figure.data[app.graph.band_trace].text) == ["embed", "layer x 2", "head"]


def test_the_mesh_controls_offer_every_factorisation_and_re_solve() -> None:
    assert mesh_shapes(8) == [(8,), (2, 4), (4, 2)]
    assert mesh_shapes(7) == [(7,)]
    app = Explorer("gpt", "tiny", mesh=(8,), cache=SHARED_CACHE, analyze_options={"only": few})
    assert [o[1] for o in app.mesh_w.options] == [(8,), (2, 4), (4, 2)]
    app.mesh_w.value = (2, 4)
    _run(app)
    assert app.analysis is not None and app.analysis.mesh.shape == (2, 4), app.message
    assert "mesh 2x4 (x, y)" in app.summary
    assert app.choice is not None and all("@x" in s for s in app.choice.strategies)
    app.devices_w.value = 4
    assert [o[1] for o in app.mesh_w.options] == [(4,), (2, 2)]


def test_bad_input_is_reported_in_the_message_area() -> None:
    # a mesh that does not divide the model's dims
    app = Explorer("gpt", "tiny", mesh=(6,), cache=SHARED_CACHE)
    _run(app)
    assert "does not divide into 6 parts" in app.message
    # a profile that failed: the measured backend needs as many devices as the mesh
    app = Explorer("gpt", "tiny", mesh=(4,), backend="measured", cache=SHARED_CACHE)
    _run(app)
    assert (
        "profiling failed" in app.message
        and "measured profiling runs on real devices" in app.message
    )
    assert app.progress_w.bar_style == "danger" and not app.run_w.disabled


def test_the_model_and_preset_controls() -> None:
    assert {"tiny", "small", "gpt_2_6b"} <= set(presets("gpt"))
    assert "llama_7b" in presets("llama") and "gpt_2_6b" not in presets("llama")
    app = Explorer("gpt", "tiny", cache=SHARED_CACHE)
    app.model_w.value = "bert"
    assert "bert_large" in app.preset_w.options


def test_paired_strategies_keep_sixteen_of_eighty_one_layer_configurations() -> None:
    import itertools

    names = ("M@x", "N@x", "K@x")
    kept = [
        c
        for c in itertools.product(names, repeat=4)
        if paired_strategies("segment", "layer", ",".join(c))
    ]
    assert len(kept) == 16
    assert ("N@x", "K@x", "N@x", "K@x") in kept and ("M@x",) * 4 in kept
    assert paired_strategies("reshard", "layer->head", "K@x->N@x")
    assert not paired_strategies("reshard", "layer->head", "N@x->N@x")


@pytest.mark.slow
def test_the_baseline_table_predicts_and_evaluates_every_plan(app: Explorer) -> None:
    app.compute_baselines(wait=True)
    rows = {r.name: r for r in app.session.baselines}
    assert list(rows) == ["cfp", "dp", "megatron", "fsdp", "alpa"]
    for row in rows.values():
        # a row is either predicted and evaluated, or carries the reason it is not
        assert (row.evaluated_s is not None and row.evaluated_s > 0) or row.error, row
    assert rows["cfp"].predicted_s == pytest.approx(app.choice.time if app.choice else -1)
    # the views call plans by their readable names
    table = _text(app.baseline_table.value)
    assert all(plan_name(name) in table for name in rows)
    marked = set(app.frontier.figure.data[2].text)
    assert marked == {plan_name(n) for n, r in rows.items() if n != "cfp" and r.memory is not None}


@pytest.mark.slow
def test_checking_the_plan_compiled_shows_the_fastest_whose_step_fits(app: Explorer) -> None:
    analysis = app.analysis
    assert analysis is not None
    points = analysis.frontier.points
    # tiny GPT's predicted memory runs below its compiled steps': at the fastest plan's own
    # prediction the fastest plan's step is over, and the check must step down the frontier
    budget = points[-1].memory
    app.set_budget(budget)
    assert app.choice is not None and app.choice.time == points[-1].time
    app.check_fit(wait=True)  # what the button calls, on a thread
    check = app.session.check
    assert check is not None, app.message or app.fit_label.value
    fit = check.fit
    assert fit.rejected, "the fastest plan's step fits its prediction: choose a tighter budget"
    assert fit.budget == budget and fit.truth.memory <= budget
    # the plan shown is the one that fits, at its frontier position, and is what exports
    assert check.shows(app.choice, analysis)
    assert app.choice is not None and app.choice.time == fit.plan.time > points[-1].time
    assert app.session.budget == fit.plan.memory
    assert app.plan is not None and app.plan.strategies == fit.plan.strategies
    label = _text(app.fit_label.value)
    assert "plans compiled to find one that fits" in label and "is now that one" in label
    assert "compiled:" in app.summary and exact_bytes(fit.truth.memory) in app.summary
    # a slider move shows another plan: the check, of the plan before, is no longer claimed
    app.budget_w.value = 0
    assert app.fit_label.value == "" and "compiled:" not in _text(app.summary)


@pytest.mark.slow
def test_a_check_where_no_plan_fits_keeps_the_plan_shown(app: Explorer) -> None:
    analysis = app.analysis
    assert analysis is not None
    leanest = analysis.frontier.points[0]
    app.set_budget(leanest.memory)
    shown = app.choice
    app.check_fit(wait=True)
    label = _text(app.fit_label.value)
    assert "no plan compiled fits" in label and "no leaner plan is left" in label
    assert app.choice == shown and app.session.budget == leanest.memory
    assert app.message == "" and not app.fit_w.disabled
    assert "compiled:" not in _text(app.summary)


@pytest.mark.slow
def test_a_check_answered_after_the_budget_moved_moves_nothing(app: Explorer) -> None:
    analysis = app.analysis
    assert analysis is not None
    worker = app.check_fit()  # no budget: the device's memory
    app.budget_w.value = 0  # moved while the step compiles
    worker.join(TIMEOUT_S)
    assert "changed since" in _text(app.fit_label.value)
    assert app.choice is not None and app.choice.time == analysis.frontier.points[0].time
    assert app.session.budget == analysis.frontier.points[0].memory


def test_a_check_before_any_plan_is_refused_in_the_message_area() -> None:
    app = Explorer("gpt", "tiny", cache=SHARED_CACHE)
    assert app.fit_w.disabled  # nothing to check until a run has solved
    app.fit_w.click()  # the button is wired to `check_fit`, which refuses
    assert "no plan to check" in app.message
