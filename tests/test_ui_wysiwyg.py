"""The explorer shows what it exports, refuses bad input with a message, and survives a
cancelled run: driven from Python as a user would (widgets set, buttons clicked), asserting on
the figures, the summary, the message area and the exported file.

Profiles come from the session cache (helpers.SHARED_CACHE): tiny GPT on 8 devices with the
data-parallel and Megatron layers only (test_ui's `few`), profiled here when this runs first.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SHARED_CACHE

pytest.importorskip("ipywidgets", reason="the ui extra is not installed")
pytest.importorskip("plotly", reason="the ui extra is not installed")

import explorer as ex
from explorer.ui import Explorer, paired_strategies

TIMEOUT_S = 600


def few(kind: str, label: str, config: str) -> bool:
    """Data-parallel and Megatron layers only (as test_ui's `few`)."""
    if not paired_strategies(kind, label, config):
        return False
    if kind == "segment" and "," in config:
        roles = [n.split("@")[0].split(",")[-1] for n in config.split(",") if "@" in n]
        return len(set(roles)) == 1 or roles[:2] == ["N", "K"]
    return True


def _run(app: Explorer) -> None:
    worker = app.run()
    assert worker is not None, app.message
    worker.join(TIMEOUT_S)
    assert not worker.is_alive(), "profiling did not finish in time"


def _text(value: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", value))


@pytest.fixture(scope="module")
def shared() -> Explorer:
    # LLaMA: within these strategies its frontier trades time for memory over 7 plans (tiny
    # GPT's data-parallel plan is both its fastest and its smallest)
    app = Explorer("llama", "tiny", mesh=(8,), cache=SHARED_CACHE, analyze_options={"only": few})
    _run(app)
    assert app.message == "" and app.choice is not None, app.message
    assert len(app.analysis.frontier.points) >= 3 if app.analysis else False
    return app


@pytest.fixture
def app(shared: Explorer) -> Iterator[Explorer]:
    yield shared
    shared.clear_pins()
    shared.fastest_w.click()


def test_every_slider_step_is_a_frontier_plan_kept_exactly(app: Explorer) -> None:
    assert app.analysis is not None
    points = app.analysis.frontier.points
    assert (app.budget_w.min, app.budget_w.max) == (0, len(points) - 1)
    for index, point in enumerate(points):
        app.budget_w.value = index  # as a user steps the slider
        assert app.session.budget == point.memory
        assert app.choice is not None and app.choice.time == point.time
        assert f"plan {index + 1} of {len(points)}" in app.budget_label.value
        assert f"{1e3 * point.time:.4f} ms/step" in app.summary


def test_a_budget_set_from_code_is_kept_exactly_and_exported(app: Explorer, tmp_path: Path) -> None:
    assert app.analysis is not None
    points = app.analysis.frontier.points
    budget = (points[0].memory + points[1].memory) / 2 + 0.25  # between plans, not a round MiB
    app.set_budget(budget)
    assert app.session.budget == budget  # not rounded to any slider step
    assert app.budget_w.value == 0  # the slider rests on the plan the budget selects
    expected = app.analysis.plan(memory_budget=budget)
    assert app.choice is not None and app.choice.strategies == expected.strategies
    assert f"{1e3 * expected.time:.4f} ms/step" in app.summary
    target = tmp_path / "plan.json"
    written = app.export(target)
    exported = ex.load_plan(written)
    assert exported.strategies == app.choice.strategies
    assert math.isclose(exported.time, app.choice.time, rel_tol=1e-12)
    assert exported.predicted.budget == budget


def test_an_export_error_is_cleared_by_a_successful_export(app: Explorer, tmp_path: Path) -> None:
    app.export_path_w.value = str(tmp_path)  # a directory
    app.export_w.click()
    assert "expected a file path, found a directory" in app.message
    app.export_path_w.value = str(tmp_path / "plan.json")
    app.export_w.click()
    assert app.message == "" and (tmp_path / "plan.json").is_file()
    assert "download plan.json" in app.download_w.value
    app.budget_w.value = 0  # another plan: the link to the old one goes
    assert app.download_w.value == ""


def test_pins_on_missing_blocks_or_strategies_are_refused_and_not_kept(app: Explorer) -> None:
    assert app.analysis is not None and app.choice is not None
    shown = app.summary
    assert not app.pin(999, "N@x")
    assert "no block 999 to pin" in app.message and "expected a block index" in app.message
    block = app.analysis.segments.instances[1].blocks[0]
    assert not app.pin(block, "Q@z")
    names = ", ".join(s.name for s in app.analysis.blocks[block].strategies)
    assert f"has no strategy 'Q@z': expected one of {names}" in _text(app.message)
    assert app.session.pins == {} and app.summary == shown and "no pins" in app.pins_label.value
    # a valid pin is kept and clears the message
    assert app.pin(block, app.choice.strategies[block])
    assert app.message == "" and app.session.pins == {block: app.choice.strategies[block]}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"model": "gpt3"}, "unknown model 'gpt3': expected one of 'bert', 'flax_decoder', 'gpt'"),
        ({"preset": "huge"}, "unknown preset for gpt 'huge': expected one of 'tiny'"),
        ({"platform": "tpu-v9"}, "unknown platform 'tpu-v9': expected one of"),
        ({"backend": "guess"}, "unknown backend 'guess': expected one of 'compiled', 'measured'"),
        ({"mesh": (4, 4)}, "mesh (4, 4) needs 16 devices but JAX sees 8"),
        ({"budget": -1}, "memory budget: expected bytes per device"),
    ],
)
def test_bad_arguments_are_a_message_listing_what_is_accepted(
    arguments: dict[str, object], expected: str
) -> None:
    app = Explorer(cache=None, **arguments)  # type: ignore[arg-type]
    assert expected in _text(app.message), app.message
    assert app.run() is None and "arguments refused" in app.message  # nothing runs unasked
    if "mesh" in arguments:  # shown as valid controls, not silently run
        assert app.mesh_w.value == (8,) and app.analysis is None
    app.preset_w.value = "small"  # a control changed: the app goes on with what it shows
    assert app.message == ""


def test_a_new_mesh_opens_on_its_fastest_plan_and_a_cancel_keeps_what_was_shown(
    app: Explorer,
) -> None:
    assert app.analysis is not None
    points = app.analysis.frontier.points
    app.budget_w.value = 1
    before = (app.analysis, app.session.budget, app.summary)
    app.mesh_w.value = (4, 2)  # nothing profiled on this mesh in the session cache
    worker = app.run()
    assert worker is not None
    app.cancel_w.click()  # before a single program of the new mesh is started
    worker.join(TIMEOUT_S)
    assert "profiling cancelled: 0 of" in app.message and "previous analysis" in app.message
    assert (app.analysis, app.session.budget, app.summary) == before
    assert app.progress_w.bar_style == "warning" and app.progress_label.value.startswith(
        "cancelled"
    )
    assert "profiling..." not in app.summary + app.progress_label.value
    assert not app.run_w.disabled and app.cancel_w.disabled
    assert app.choice is not None and app.choice.time == points[1].time

    # the same mesh again, from the cache: the budget stays; a new mesh opens on its fastest
    app.mesh_w.value = (8,)
    _run(app)
    assert app.session.budget == points[1].memory and app.message == ""
    assert "from the cache" in app.progress_label.value
    app.mesh_w.value = (2, 4)
    _run(app)
    assert app.analysis is not None and app.analysis.mesh.shape == (2, 4), app.message
    assert app.session.budget is None
    assert app.choice is not None and app.choice.time == app.analysis.frontier.points[-1].time
    assert app.budget_w.value == app.budget_w.max
