"""Why this plan, in the app, and the views' legibility at scale: driven from Python as a user
would (buttons clicked, widgets set), asserting that the app draws what the engine computed.

Profiles come from the session cache (helpers.SHARED_CACHE): tiny GPT (2 layers) on 8 devices,
paired strategies only, as test_ui (so one of the two modules profiles, the other reads).
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import SHARED_CACHE

pytest.importorskip("ipywidgets", reason="the ui extra is not installed")
pytest.importorskip("plotly", reason="the ui extra is not installed")

import explorer.explain as explain_module
from explorer.explain import attribute, counterfactuals, plan_diff
from explorer.ui import Explorer
from explorer.ui.explain_tables import COLLECTIVE_ROWS

TIMEOUT_S = 600


def _text(value: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", value))


@pytest.fixture(scope="module")
def shared() -> Explorer:
    app = Explorer("gpt", "tiny", mesh=(8,), quick=True, cache=SHARED_CACHE)
    worker = app.run()
    assert worker is not None, app.message
    worker.join(TIMEOUT_S)
    assert app.message == "" and app.choice is not None, app.message
    return app


@pytest.fixture
def app(shared: Explorer) -> Iterator[Explorer]:
    yield shared
    shared.explain_view.stop()
    shared.clear_pins()
    shared.set_level("blocks")
    shared.collapse(())
    shared.find_ops("")
    shared.filter_bars("")
    shared.fastest_w.click()


def _explain(app: Explorer) -> None:
    app.explain_view.explain_w.click()
    worker = app.explain_view.worker
    assert worker is not None
    worker.join(TIMEOUT_S)
    assert not worker.is_alive()


def _markers(app: Explorer) -> Any:
    assert app.graph.marker_trace is not None
    return app.graph.figure.data[app.graph.marker_trace]


def test_explain_draws_the_engines_attribution_counterfactuals_and_diff(app: Explorer) -> None:
    analysis = app.analysis
    assert analysis is not None
    app.budget_w.value = 0  # the smallest plan: tensor parallel somewhere, so collectives
    assert app.explain_view.status_w.value.startswith("press") or not app.explain_view.data
    _explain(app)
    assert "explained" in app.explain_view.status_w.value, app.message
    plan = app.plan
    assert plan is not None
    # the table lists the engine's collectives, slowest first, with their times
    truth = attribute(analysis, plan)
    data = app.explain_view.data
    assert data is not None
    assert len(data.collectives) + data.more == len(truth.collectives)
    assert len(data.collectives) == min(len(truth.collectives), COLLECTIVE_ROWS)
    times = sorted((1e6 * c.time for c in truth.collectives), reverse=True)
    assert [r.time_us for r in data.collectives] == pytest.approx(times[: len(data.collectives)])
    table = _text(app.explain_view.collectives_w.value)
    assert "source line" in table and "_common.py" in table  # the model's own source lines
    # a marker per block with collectives, sized by time, its hover listing them
    per_block: dict[int, float] = {}
    for c in truth.collectives:
        if c.block is not None:
            per_block[c.block] = per_block.get(c.block, 0.0) + 1e6 * c.time
    assert {m.block for m in data.markers} == set(per_block)
    for marker in data.markers:
        assert marker.time_us == pytest.approx(per_block[marker.block])
    markers = _markers(app)
    assert len(markers.x) >= 1 and all("collective(s)" in h for h in markers.hovertext)
    biggest = max(range(len(markers.x)), key=lambda k: markers.marker.size[k])
    assert "all-reduce" in markers.hovertext[biggest] or "all-gather" in markers.hovertext[biggest]
    # the counterfactual table: one row per other strategy of each block, the engine's deltas
    engine = counterfactuals(analysis, plan)
    rows = app.explain_view.counterfactuals
    assert len(rows) == len(engine.rows)
    for row, truth_row in zip(rows, engine.rows, strict=True):
        assert row.strategy == truth_row.strategy
        if truth_row.time_delta is None:
            assert row.time_delta_ms is None and row.note == truth_row.note
        else:
            assert row.time_delta_ms == pytest.approx(1e3 * truth_row.time_delta)
            assert row.memory_delta_bytes == truth_row.memory_delta
    assert "qkv" in _text(app.explain_view.counterfactuals_w.value)  # blocks by role name
    # the diff against data parallel (the default comparison)
    diff = plan_diff(analysis.baseline("dp"), plan)
    shown = _text(app.explain_view.diff_w.value)
    assert f"{1e3 * diff.time_delta:+.4f} ms/step" in shown
    assert f"{len(diff.blocks)} blocks" in shown


def _hold_the_attribution(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Event, threading.Event]:
    """The real attribution, held at its start: (set once a worker is in it, set to let it go
    on). A test acts on the app only once the worker is compiling, where the race lies."""
    compiling, release = threading.Event(), threading.Event()
    real_attribute = explain_module.attribute

    def held_attribute(*args: Any, **kwargs: Any) -> Any:
        compiling.set()
        assert release.wait(TIMEOUT_S)
        return real_attribute(*args, **kwargs)

    monkeypatch.setattr(explain_module, "attribute", held_attribute)
    return compiling, release


def test_a_new_plan_clears_the_explanation_and_a_late_result_is_dropped(
    app: Explorer, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.budget_w.value = 0
    _explain(app)
    assert app.explain_view.data is not None and len(_markers(app).x)
    app.budget_w.value = app.budget_w.max  # another plan: the explanation was not about it
    assert app.explain_view.data is None and app.explain_view.collectives_w.value == ""
    assert "plan changed" in app.explain_view.status_w.value
    assert len(_markers(app).x) == 0
    # a slider move while an explanation compiles: its result never shows. The real attribution
    # runs, held at its start until the slider has moved, and the slider moves only once the
    # worker is in it (earlier, the worker drops the request before compiling: another race)
    compiling, slider_moved = _hold_the_attribution(monkeypatch)
    app.budget_w.value = 0
    app.explain_view.explain_w.click()
    worker = app.explain_view.worker
    assert worker is not None
    assert compiling.wait(TIMEOUT_S), "the explanation never reached its compile"
    app.budget_w.value = app.budget_w.max  # the slider stays live meanwhile
    assert worker.is_alive() and app.choice is not None
    slider_moved.set()
    worker.join(TIMEOUT_S)
    assert not worker.is_alive()
    assert app.explain_view.data is None and app.explain_view.counterfactuals_w.value == ""
    assert app.graph.marker_trace is None or len(_markers(app).x) == 0


def test_another_comparison_and_stop(app: Explorer, monkeypatch: pytest.MonkeyPatch) -> None:
    analysis = app.analysis
    assert analysis is not None
    app.budget_w.value = 0
    _explain(app)
    app.explain_view.compare_w.value = "megatron"  # the diff follows, the rest stays
    worker = app.explain_view.diff_worker
    assert worker is not None
    worker.join(TIMEOUT_S)
    diff = plan_diff(analysis.baseline("megatron"), app.plan)  # type: ignore[arg-type]
    shown = _text(app.explain_view.diff_w.value)
    assert "Against Megatron tensor parallel" in shown
    assert f"{1e3 * diff.time_delta:+.4f} ms/step" in shown
    assert app.explain_view.data is not None
    app.explain_view.compare_w.value = "dp"
    # Stop while the whole step compiles: nothing of that explanation shows (the real
    # attribution, held at its start until Stop was pressed)
    compiling, stopped = _hold_the_attribution(monkeypatch)
    app.explain_view.explain_w.click()
    explaining = app.explain_view.worker
    assert explaining is not None
    assert compiling.wait(TIMEOUT_S), "the explanation never reached its compile"
    app.explain_view.stop_w.click()
    assert explaining.is_alive()
    stopped.set()
    explaining.join(TIMEOUT_S)
    assert not explaining.is_alive()
    assert app.explain_view.status_w.value == "stopped"
    assert app.explain_view.data is None and app.explain_view.collectives_w.value == ""


def test_a_pinned_variant_is_compared_with_the_reference_kept(app: Explorer) -> None:
    analysis = app.analysis
    assert analysis is not None and app.choice is not None
    app.explain_view.keep_w.click()
    assert app.explain_view.compare_w.value == "reference"
    reference = app.explain_view.reference
    assert reference is not None
    block = analysis.segments.instances[1].blocks[1]
    other = next(n for n in ("K@x", "M@x") if n != app.choice.strategies[block])
    assert app.pin(block, other), app.message
    _explain(app)
    diff = plan_diff(reference, app.plan)  # type: ignore[arg-type]
    shown = _text(app.explain_view.diff_w.value)
    assert "Against the reference kept" in shown
    assert f"(#{block})" in shown and other in shown  # the block by its role name
    assert f"{1e3 * diff.time_delta:+.4f} ms/step" in shown
    # the pinned block is marked on the graph (text and hover, not colour only)
    texts = [t for s in app.graph.slices for t in app.graph.figure.data[s.trace].text]
    assert any("(pinned)" in t for t in texts)


def test_bars_filter_keeps_the_plans_configurations(app: Explorer) -> None:
    assert app.choice is not None
    app.filter_bars("K@x")
    drawn = list(app.bars.figure.data[0].x)
    chosen = {c for c, n in zip(app.bars.data.configs, app.bars.data.chosen, strict=True) if n}
    assert chosen <= set(drawn)
    assert all("K@x" in c or c in chosen for c in drawn)
    assert "matching “K@x”" in app.bars.figure.layout.title.text
    app.filter_bars("no such configuration")
    assert set(app.bars.figure.data[0].x) == chosen  # the plan's, whatever the filter


def test_the_ops_view_searches_and_collapses_scopes(app: Explorer) -> None:
    analysis = app.analysis
    assert analysis is not None
    app.select_segment_and_expand(1)
    instance = analysis.segments.instances[1]
    nodes = app.graph.nodes
    assert nodes is not None and len(nodes.members) == len(instance.ops)
    # layers: x is the op's depth; no two ops of a layer share a row
    rows = set(zip(nodes.x, nodes.y, strict=True))
    assert len(rows) == len(nodes.x)
    app.search_w.value = "dot_general"
    dots = [o for o in instance.ops if analysis.graph.ops[o].primitive == "dot_general"]
    assert sum(app.graph.nodes.found) == len(dots)  # type: ignore[union-attr]
    assert f"{len(dots)} match" in app.graph.figure.layout.title.text
    faded = [
        o for s in app.graph.slices for o in (app.graph.figure.data[s.trace].marker.opacity or ())
    ]
    assert 0.15 in faded and 1.0 in faded
    scope = analysis.graph.ops[analysis.blocks[instance.blocks[0]].head].scope
    assert scope in app.collapse_w.options
    app.collapse_w.value = (scope,)
    collapsed = app.graph.nodes
    assert collapsed is not None
    inside = sum(analysis.graph.ops[o].scope == scope for o in instance.ops)
    assert len(collapsed.members) == len(instance.ops) - inside + 1
    (node,) = [n for n, label in enumerate(collapsed.labels) if label == scope]
    assert len(collapsed.members[node]) == inside
    trace = next(app.graph.figure.data[s.trace] for s in app.graph.slices if node in s.nodes)
    assert f"{inside} ops collapsed" in " ".join(trace.hovertext)


def test_explain_without_a_plan_says_why() -> None:
    app = Explorer("gpt", "tiny", mesh=(8,), cache=SHARED_CACHE)
    assert app.explain_view.explain_w.disabled
    assert app.explain() is None
    assert "no plan to explain" in app.message
