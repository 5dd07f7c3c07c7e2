"""The explorer app: controls, the views, and the one place they are wired together.

Profiling runs on a background thread so the controls stay live; its progress goes to a
progress bar, and every error (from the thread or from any callback) is shown in the message
area, never only in the log. A budget move, a pin or a mesh change re-solves and pushes the
new plan to every view: the summary, the graph (restyled, not re-laid out), the bars (their
highlight) and the frontier (its marker).
"""

from __future__ import annotations

import base64
import functools
import html
import logging
import math
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import ipywidgets as widgets

from explorer import models
from explorer.errors import ExplorerError, ProfilingCancelled
from explorer.pipeline import DEFAULT_CACHE, Analysis, analyze
from explorer.plan import Plan
from explorer.profile.runner import distinct_programs
from explorer.solve import Frontier, NoPlanFitsError
from explorer.ui import style
from explorer.ui.bars import (
    BarsData,
    BarsView,
    Symbolic,
    empty_bars,
    profiled_bars,
    symbolic_costs,
    used_configs,
    with_chosen,
)
from explorer.ui.frontier import FrontierView, frontier_data
from explorer.ui.graph import ROLE_FILTERS, GraphView, LayoutCache
from explorer.ui.inputs import budget_problem, check_arguments, pin_problem, presets
from explorer.ui.state import (
    Choice,
    Session,
    Settings,
    Snapshot,
    choice_from_point,
    counting,
    paired_strategies,
)
from explorer.ui.table import BaselineRow, baseline_rows, table_html

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

AUTO = {"width": "auto", "flex": "0 0 auto"}  # buttons keep their label's width


def mesh_shapes(devices: int) -> list[tuple[int, ...]]:
    """Every 1-D and 2-D factorisation of `devices` (axes of size 1 left out)."""
    shapes: list[tuple[int, ...]] = [(devices,)]
    shapes += [(a, devices // a) for a in range(2, devices) if devices % a == 0]
    return shapes


def excluded_notes(analysis: Analysis) -> list[str]:
    """Why strategies were left out (a mesh axis that does not divide a dim), per block."""
    notes = []
    for block in analysis.blocks:
        if block.excluded:
            reasons = "; ".join(sorted({e.reason for e in block.excluded}))
            notes.append(
                f"block {block.index} ({html.escape(block.scope)}): "
                f"{len(block.excluded)} strategies excluded on mesh {analysis.mesh}: "
                f"{html.escape(reasons)}"
            )
    if len(notes) > 6:
        notes = [*notes[:6], f"... and {len(notes) - 6} more blocks"]
    if notes:
        notes.insert(0, "<b>The mesh does not divide some of the model's dims.</b>")
    return ["<br>".join(notes)] if notes else []


class Explorer(widgets.VBox):
    """The plan explorer for one model zoo step; `display(Explorer())` in a notebook.

    Arguments the app cannot use (an unknown model, preset, platform or backend; a mesh with
    more devices than JAX sees) are reported in its message area, listing what it accepts;
    the controls then show valid choices and `run` waits until one of them is changed.
    """

    def __init__(
        self,
        model: str = "gpt",
        preset: str = "tiny",
        *,
        layers: int | None = None,
        mesh: tuple[int, ...] = (8,),
        platform: str = "a100-pcie-8",
        backend: str = "compiled",
        quick: bool = False,
        cache: str | Path | None = DEFAULT_CACHE,
        budget: float | None = None,
        export_path: str | Path = "plan.json",
        analyze_options: dict[str, Any] | None = None,
    ) -> None:
        import jax

        from explorer.platforms import list_platforms

        max_devices = jax.device_count()
        checked = check_arguments(
            model, preset, layers=layers, mesh=mesh, platform=platform, backend=backend,
            devices=max_devices, platforms=list_platforms(),
        )  # fmt: skip
        model, preset, layers = checked.model, checked.preset, checked.layers
        mesh, platform, backend = checked.mesh, checked.platform, checked.backend
        # refused arguments block `run` until a control is changed (see `_invalid`)
        self._invalid = "; ".join(checked.problems)
        if reason := budget_problem(budget):
            self._invalid = "; ".join(filter(None, [self._invalid, reason]))
            budget = None
        self.session = Session(
            Settings(model, preset, layers, tuple(mesh), platform, backend, quick)
        )
        self.session.budget = budget
        self.cache = cache
        self.analyze_options = dict(analyze_options or {})
        self.layouts = LayoutCache()
        self._lock = threading.RLock()
        self._worker: threading.Thread | None = None
        self._symbolic: Symbolic = Symbolic({}, "")
        self._unit = style.MIB  # the memory unit of the current analysis (see _present)
        self._bars_base: dict[int, BarsData] = {}  # per segment type, for the current analysis
        self._syncing = False  # set while the app itself moves a control
        self._notes: list[str] = []  # warnings about the current run, shown until the next
        self._last: tuple[str, str] = ("", "error")
        self._cancel = threading.Event()
        self.timings: list[float] = []  # seconds of kernel-side work per re-solve

        wide = {"description_width": "initial"}
        self.model_w = widgets.Dropdown(
            options=sorted(models.MODELS), value=model, description="model"
        )
        self.preset_w = widgets.Dropdown(options=presets(model), value=preset, description="preset")
        self.layers_w = widgets.BoundedIntText(
            value=layers or 0, min=0, max=512, description="layers (0: preset)", style=wide,
            layout={"width": "170px"},
        )  # fmt: skip
        self.devices_w = widgets.Dropdown(
            options=list(range(1, max_devices + 1)),
            value=math.prod(mesh),
            description="devices",
            layout={"width": "150px"},
        )
        self.mesh_w = widgets.Dropdown(description="mesh", layout={"width": "170px"})
        self._mesh_options(self.devices_w.value, tuple(mesh))
        self.platform_w = widgets.Dropdown(
            options=list_platforms(), value=platform, description="platform"
        )
        self.backend_w = widgets.Dropdown(
            options=["compiled", "measured"], value=backend, description="backend",
            layout={"width": "200px"},
        )  # fmt: skip
        self.quick_w = widgets.Checkbox(
            value=quick, description="quick look (paired strategies only)", indent=False
        )
        self.run_w = widgets.Button(
            description="Profile and solve", button_style="primary", icon="play", layout=AUTO
        )
        self.cancel_w = widgets.Button(
            description="Cancel", icon="stop", disabled=True, layout=AUTO,
            tooltip="stop profiling; the programs already profiled stay in the cache",
        )  # fmt: skip
        self.cancel_w.add_class("explorer-cancel")
        self.progress_w = widgets.IntProgress(value=0, min=0, max=1, description="profiling")
        self.progress_label = widgets.Label("")
        self.message_w = widgets.HTML("", layout={"width": "100%"})
        self.message_w.add_class("explorer-message")
        self.summary_w = widgets.HTML("<i>Press “Profile and solve”.</i>")
        self.summary_w.add_class("explorer-summary")
        # one slider step per frontier plan: every position is a plan, none is rounded
        self.budget_w = widgets.IntSlider(
            value=0, min=0, max=0, step=1, description="memory budget", readout=False,
            continuous_update=True, style=wide, disabled=True, layout={"width": "420px"},
        )  # fmt: skip
        self.budget_w.add_class("explorer-budget")
        self.budget_label = widgets.HTML("", layout={"min_width": "300px"})
        self.budget_label.add_class("explorer-budget-label")
        self.fastest_w = widgets.Button(
            description="no budget (fastest)", disabled=True, layout=AUTO
        )
        self.uniform_w = widgets.Checkbox(
            value=False, description="one configuration per segment type", indent=False
        )
        self.segment_w = widgets.Dropdown(description="segment", options=[])
        self.level_w = widgets.ToggleButtons(options=["blocks", "ops"], value="blocks")
        self.roles_w = widgets.ToggleButtons(options=list(ROLE_FILTERS), value="all")
        self.pin_block_w = widgets.Dropdown(description="pin block", options=[], style=wide)
        self.pin_strategy_w = widgets.Dropdown(description="strategy", options=[])
        self.pin_w = widgets.Button(description="Pin and re-solve", icon="thumb-tack", layout=AUTO)
        self.unpin_w = widgets.Button(description="Clear pins")
        self.pins_label = widgets.HTML("no pins")
        self.baselines_w = widgets.Button(
            description="Compute baselines", icon="table", layout=AUTO
        )
        self.baseline_table = widgets.HTML("")
        self.export_path_w = widgets.Text(value=str(export_path), description="export to")
        self.export_w = widgets.Button(
            description="Export plan", icon="download", disabled=True, layout=AUTO
        )
        self.export_w.add_class("explorer-export")
        self.download_w = widgets.HTML("")

        self.graph = GraphView(
            self.layouts, self._guard(self.select_segment_and_expand, "expanding a segment")
        )
        self.bars = BarsView()
        self.frontier = FrontierView()

        self._wire()
        controls = widgets.VBox(
            [
                widgets.HBox([self.model_w, self.preset_w, self.layers_w]),
                widgets.HBox([self.devices_w, self.mesh_w, self.platform_w, self.backend_w]),
                widgets.HBox(
                    [self.quick_w, self.run_w, self.cancel_w, self.progress_w, self.progress_label]
                ),
            ]
        )
        super().__init__(
            [
                controls,
                self.message_w,
                self.summary_w,
                widgets.HBox([self.budget_w, self.budget_label, self.fastest_w, self.uniform_w]),
                widgets.HBox([self.segment_w, self.level_w, self.roles_w]),
                self.graph.figure,
                # each figure autosizes to its box: the row shares the width, nothing clipped
                widgets.HBox(
                    [
                        widgets.Box([self.bars.figure], layout={"width": "58%"}),
                        widgets.Box([self.frontier.figure], layout={"width": "42%"}),
                    ],
                    layout={"width": "100%"},
                ),
                widgets.HBox([self.pin_block_w, self.pin_strategy_w, self.pin_w, self.unpin_w]),
                self.pins_label,
                widgets.HBox([self.baselines_w]),
                self.baseline_table,
                widgets.HBox([self.export_path_w, self.export_w, self.download_w]),
                widgets.HTML(f"<small>{style.GLOSSARY}</small>"),
            ]
        )
        self.add_class("explorer-app")
        if self._invalid:
            self._say(self._refused(), "error")

    # -- public verbs (the buttons call these; so can a notebook or a test) -------------------

    @property
    def analysis(self) -> Analysis | None:
        return self.session.analysis

    @property
    def choice(self) -> Choice | None:
        """What the solver picked for the current budget and pins (cheap; what views draw)."""
        return self.session.choice

    @property
    def plan(self) -> Plan | None:
        """The current plan as a full `Plan` document (built on first use, then kept)."""
        with self._lock:
            s = self.session
            if s.plan is None and s.choice is not None and s.analysis is not None:
                s.plan = s.analysis.plan(
                    memory_budget=s.budget, pins=dict(s.pins) or None, uniform=s.uniform or None
                )
            return s.plan

    @property
    def message(self) -> str:
        return str(self.message_w.value)

    @property
    def summary(self) -> str:
        return str(self.summary_w.value)

    def run(self) -> threading.Thread | None:
        """Profile and solve with the controls' settings on a background thread."""
        if self._worker is not None and self._worker.is_alive():
            self._say("a run is already in progress; wait for it, or press Cancel", "info")
            return None
        if self._invalid:
            self._say(self._refused(), "error")
            return None
        try:
            settings = self._settings()
        except Exception as err:
            self._error("settings", err)
            return None
        self._notes = []
        self._say("")
        self._cancel = threading.Event()
        self.run_w.disabled = True
        self.cancel_w.disabled = False
        self.progress_w.value, self.progress_w.max, self.progress_w.bar_style = 0, 1, "info"
        self.progress_label.value = "tracing..."
        worker = threading.Thread(target=self._profile, args=(settings,), daemon=True)
        self._worker = worker
        worker.start()
        return worker

    def cancel(self) -> None:
        """Stop the current run: the programs being compiled finish and are cached, no other
        starts; the app goes back to what it showed before the run."""
        if self._worker is None or not self._worker.is_alive():
            return
        self._cancel.set()
        self.cancel_w.disabled = True
        self.progress_label.value = "cancelling: finishing the programs being compiled..."

    def wait(self, timeout: float | None = None) -> Analysis | None:
        """Block until the current run is done; its error, if any, is in `message`."""
        if self._worker is not None:
            self._worker.join(timeout)
        return self.session.analysis

    def set_budget(self, budget: float | None) -> None:
        """Budget in bytes per device (None: the fastest plan), kept exactly as given; the
        slider moves to the plan it selects."""
        if reason := budget_problem(budget):
            self._say(html.escape(reason), "error")
            return
        with self._lock:
            self.session.budget = budget
            self._resolve()

    def pin(self, block: int, strategy: str) -> bool:
        """Force `block` onto `strategy` and re-solve. A pin on a missing block or strategy,
        or one that leaves no plan, is not kept: the message area says why."""
        with self._lock:
            s = self.session
            if reason := pin_problem(s.analysis, block, strategy):
                self._say(html.escape(reason), "error")
                return False
            previous = s.pins.get(block)
            s.pins[block] = strategy
            try:
                self._current_frontier()
            except ExplorerError as err:
                if previous is None:
                    del s.pins[block]
                else:
                    s.pins[block] = previous
                self._say(
                    f"<b>pin not kept</b>: block {block} on {html.escape(strategy)} leaves no "
                    f"plan: {html.escape(str(err))}",
                    "error",
                )
                return False
            self._resolve()
            return True

    def clear_pins(self) -> None:
        with self._lock:
            self.session.pins.clear()
            self._resolve()

    def select_segment(self, instance: int) -> None:
        with self._lock:
            self.session.selected = instance
            self._syncing = True
            try:
                self.segment_w.value = instance
            finally:
                self._syncing = False
            self._show_bars()
            if self.session.level == "ops":
                self._show_graph()

    def select_segment_and_expand(self, instance: int) -> None:
        """A click on a segment: select it and show its ops."""
        with self._lock:
            self.session.selected = instance
            self.session.level = "ops"
            self._syncing = True
            try:
                self.segment_w.value = instance
                self.level_w.value = "ops"
            finally:
                self._syncing = False
            self._show_graph()
            self._show_bars()

    def set_level(self, level: str) -> None:
        with self._lock:
            self.session.level = level
            self._show_graph()

    def set_roles(self, roles: str) -> None:
        with self._lock:
            self.graph.role_filter = roles
            if self.session.level == "ops":
                self._show_graph()

    def export(self, path: str | Path | None = None) -> Path:
        """Write the current plan's JSON and offer it as a download link."""
        plan = self.plan
        if plan is None:
            raise ExplorerError("no plan to export: profile and solve first, or raise the budget")
        shown = self.session.choice
        if (
            shown is None
            or plan.strategies != shown.strategies
            or not math.isclose(plan.time, shown.time, rel_tol=1e-9)
        ):
            raise ExplorerError(
                "the plan to export differs from the plan shown; move the budget or re-solve"
            )
        target = Path(path if path is not None else self.export_path_w.value).expanduser()
        if target.is_dir():
            raise ExplorerError(
                f"export to {target}: expected a file path, found a directory; "
                f"try {target / 'plan.json'}"
            )
        written = plan.save(target)
        payload = base64.b64encode(plan.to_json().encode()).decode()
        self.download_w.value = (
            f"wrote <code>{html.escape(str(written))}</code> &nbsp; "
            f"<a class='explorer-download' download='{html.escape(written.name)}' "
            f"href='data:application/json;base64,{payload}'>"
            f"download {html.escape(written.name)}</a>"
        )
        self.session.exported = str(written)
        self._say("")  # an earlier export error is superseded
        return written

    def compute_baselines(self, wait: bool = False) -> threading.Thread:
        """Predict and evaluate the CFP plan and every baseline (compiles the whole step)."""
        analysis, plan = self.session.analysis, self.plan
        if analysis is None or analysis.profile_table is None:
            raise ExplorerError("no analysis yet: profile and solve first")
        self.baselines_w.disabled = True
        self.baseline_table.value = "<i>compiling the whole step under each plan...</i>"
        rows: list[BaselineRow] = []

        def show(row: BaselineRow) -> None:
            rows.append(row)
            self.baseline_table.value = table_html(tuple(rows), self._unit) + "<i>...</i>"

        def work() -> None:
            try:
                result = baseline_rows(analysis, plan, done=show)
                with self._lock:
                    self.session.baselines = result
                    self.baseline_table.value = table_html(result, self._unit)
                    self._show_frontier()
            except Exception as err:
                self._error("baselines", err)
            finally:
                self.baselines_w.disabled = False

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        if wait:
            worker.join()
        return worker

    # -- the background run ---------------------------------------------------------------------

    def _profile(self, settings: Settings) -> None:
        with self._lock:
            before = self._snapshot()
        try:
            model_fn, config_cls = models.MODELS[settings.model]
            config = getattr(config_cls, settings.preset)()
            if settings.layers:
                config = config.replace(num_layers=settings.layers)
            step, args = model_fn(config, abstract=settings.backend == "compiled")
            options = dict(self.analyze_options)
            only = options.pop("only", paired_strategies if settings.quick else None)
            common: dict[str, Any] = {
                "mesh": settings.mesh,
                "platform": settings.platform,
                "backend": settings.backend,
            }
            shape = analyze(step, *args, profile=False, **common, **options)
            total = shape.program_count
            accepted: list[int] = []
            if only is not None:
                only, accepted = counting(only)
            with self._lock:
                self._note(excluded_notes(shape))
                self._adopt(shape, settings)
            self.progress_label.value = f"profiling up to {total} programs..."
            stop = threading.Event()
            poller = threading.Thread(target=self._poll, args=(stop, accepted, total), daemon=True)
            poller.start()
            start = time.perf_counter()
            try:
                result = analyze(
                    step, *args, cache=self.cache, progress=False, only=only,
                    cancel=self._cancel, **common, **options,
                )  # fmt: skip
            finally:
                stop.set()
                poller.join()
            table = result.profiles
            self.progress_w.max = max(len(table), 1)
            self.progress_w.value = self.progress_w.max
            self.progress_w.bar_style = "success"
            self.progress_label.value = (
                f"{len(table)} profiles from {distinct_programs(table)} programs in "
                f"{time.perf_counter() - start:.1f} s "
                f"({int(table['cached'].sum())} from the cache, "
                f"{int((table['status'] != 'ok').sum())} infeasible)"
            )
            with self._lock:
                self._symbolic = symbolic_costs(result)
                self._adopt(result, settings)
        except ProfilingCancelled as err:
            with self._lock:
                self._restore(before)
            self.progress_w.bar_style = "warning"
            self.progress_label.value = (
                f"cancelled: {err.finished} new programs profiled and cached"
            )
            self._say(f"{html.escape(str(err))}.{self._restored_note(before)}", "info")
        except Exception as err:
            with self._lock:
                self._restore(before)
            self.progress_w.bar_style = "danger"
            self.progress_label.value = "failed: see the message above"
            self._error("profiling", err, self._restored_note(before))
        finally:
            self.run_w.disabled = False
            self.cancel_w.disabled = True

    def _snapshot(self) -> Snapshot:
        s = self.session
        return Snapshot(
            s.settings, s.analysis, s.budget, tuple(sorted(s.pins.items())), s.uniform,
            s.selected, s.analysis_key, s.level, s.baselines, self._symbolic, tuple(self._notes),
        )  # fmt: skip

    def _restore(self, before: Snapshot) -> None:
        """Back to what the app showed before a run that did not finish: nothing computed is
        lost, and nothing of the unfinished run (its progress, its "profiling...") stays."""
        s = self.session
        s.settings, s.analysis, s.budget = before.settings, before.analysis, before.budget
        s.pins = dict(before.pins)
        s.uniform, s.selected, s.analysis_key = before.uniform, before.selected, before.analysis_key
        s.level, s.baselines, self._symbolic = before.level, before.baselines, before.symbolic
        s.choice = s.plan = None
        self._notes = list(before.notes)
        self._bars_base = {}
        if s.analysis is None:
            self.graph.clear("no analysis: press “Profile and solve”")
            self.bars.show(empty_bars("not profiled"))
            self.frontier.show(frontier_data(None, None, None))
            self.summary_w.value = "<b>No plan</b>: the run did not finish (see the message above)."
            self.export_w.disabled = self.budget_w.disabled = self.fastest_w.disabled = True
            return
        self._present(s.analysis)

    @staticmethod
    def _restored_note(before: Snapshot) -> str:
        if before.analysis is None:
            return ""
        settings = before.settings
        return (
            f" Showing the previous analysis ({html.escape(settings.model)} "
            f"{html.escape(settings.preset)} on mesh {settings.mesh_text})."
        )

    def _poll(self, stop: threading.Event, accepted: list[int], total: int) -> None:
        """Progress from the profile cache: each finished program is committed there."""
        if self.cache is None:
            while not stop.wait(0.5):
                self.progress_label.value = "profiling (no cache file: no progress count)..."
            return
        from explorer.profile.cache import ProfileCache

        try:
            with ProfileCache(self.cache) as store:
                before = len(store)
                while not stop.wait(0.5):
                    expected = accepted[0] if accepted else total
                    done = len(store) - before
                    self.progress_w.max = max(expected, 1)
                    self.progress_w.value = min(done, expected)
                    self.progress_label.value = (
                        f"profiled {done} new programs of at most {expected} "
                        "(the rest come from the cache)"
                    )
        except Exception as err:  # progress is best effort; the run itself reports its errors
            self.progress_label.value = f"no progress count: {err}"

    # -- state changes ------------------------------------------------------------------------

    def _adopt(self, analysis: Analysis, settings: Settings) -> None:
        """A new analysis (shape only, or profiled): reset what depends on it, redraw.

        A new model or mesh opens on its fastest plan: the budget does not carry over (a
        re-run of the same model and mesh, on another platform or backend, keeps it)."""
        s = self.session
        same = ("model", "preset", "layers", "mesh")
        if any(getattr(s.settings, k) != getattr(settings, k) for k in same):
            s.budget = None
        s.settings = settings
        s.analysis = analysis
        s.pins.clear()
        s.choice = s.plan = None
        s.baselines = ()
        self._bars_base = {}
        if s.analysis_key != (settings.model, settings.preset, settings.layers):
            # a new model: start on the first instance of its largest segment type
            s.analysis_key = (settings.model, settings.preset, settings.layers)
            s.selected = max(
                analysis.segments.instances, key=lambda i: (len(i.blocks), -i.index)
            ).index
        s.selected = min(s.selected, len(analysis.segments.instances) - 1)
        self.baseline_table.value = ""
        self.download_w.value = ""
        self._present(analysis)

    def _present(self, analysis: Analysis) -> None:
        """Fill the controls that list the analysis's segments and blocks, and draw it."""
        s = self.session
        self._unit = style.memory_unit(
            analysis.frontier.points[-1].memory if analysis.profile_table is not None else 0
        )
        self.baseline_table.value = table_html(s.baselines, self._unit) if s.baselines else ""
        self._syncing = True
        try:
            self.segment_w.options = [
                (f"{i.index}: {i.label} ({analysis.segments.unique[i.unique_id].label})", i.index)
                for i in analysis.segments.instances
            ]
            self.segment_w.value = s.selected
            self.level_w.value = s.level
            self.uniform_w.value = s.uniform
            self.pin_block_w.options = [
                (f"{b.index}: {b.scope}", b.index) for b in analysis.blocks if b.strategies
            ]
            selected = analysis.segments.instances[s.selected].blocks
            pinnable = [b.index for b in analysis.blocks if b.strategies]
            if pinnable:
                self.pin_block_w.value = selected[0] if selected else pinnable[0]
            self._pin_strategies()
            profiled = analysis.profile_table is not None
            self.budget_w.disabled = not profiled
            self.fastest_w.disabled = not profiled
        finally:
            self._syncing = False
        self._show_pins()
        if analysis.profile_table is None:
            self.summary_w.value = html.escape(
                f"{len(analysis.blocks)} ParallelBlocks in {len(analysis.segments.instances)} "
                f"segments on mesh {analysis.mesh}; profiling..."
            )
            self.budget_label.value = ""
            self._show_graph()
            self.bars.show(empty_bars("profiling..."))
            self.frontier.show(frontier_data(None, None, None))
            return
        self._resolve(redraw=True)

    def _show_slider(self, frontier: Frontier, index: int | None) -> None:
        """One slider position per frontier plan; `index` is the plan shown (None: none fits
        the budget, the slider rests on the smallest plan)."""
        points = frontier.points
        self._syncing = True
        try:
            if self.budget_w.max != len(points) - 1:
                self.budget_w.value = 0
                self.budget_w.max = len(points) - 1
            self.budget_w.value = 0 if index is None else index
        finally:
            self._syncing = False
        budget = self.session.budget
        unit = self._unit
        limit = (
            "none (fastest plan)"
            if budget is None
            else f"<span title='{style.exact_bytes(budget)}'>{unit.text(budget)}</span>"
        )
        where = "no plan fits" if index is None else f"plan {index + 1} of {len(points)}"
        self.budget_label.value = f"{limit} per device &middot; {where}"

    def _resolve(self, redraw: bool = False) -> None:
        """Re-solve for the session's budget and pins; push the choice to every view.

        Without pins this is a frontier lookup; pins (or uniform mode) re-solve the frontier
        through `Analysis.plan`. The `Plan` document is only built here when the graph shows
        ops (their PartitionSpecs come from it).
        """
        analysis = self.session.analysis
        if analysis is None or analysis.profile_table is None:
            return
        start = time.perf_counter()
        s = self.session
        previous = s.choice
        s.choice = s.plan = None
        index: int | None = None
        frontier: Frontier | None = None
        try:
            frontier = self._current_frontier()
            points = frontier.points
            if s.budget is None:
                index = len(points) - 1
            else:
                point = frontier.query(s.budget)
                index = next(i for i in range(len(points) - 1, -1, -1) if points[i] is point)
            s.choice = replace(
                choice_from_point(analysis, points[index], s.budget),
                pins=tuple(sorted(s.pins.items())),
                uniform=s.uniform,
            )
            if s.level == "ops":
                self.plan  # noqa: B018 -- builds the document the op hover reads
        except NoPlanFitsError:
            assert frontier is not None and s.budget is not None
            least = frontier.points[0].memory
            s.choice = s.plan = None
            self._say(
                f"no plan fits a memory budget of {self._unit.text(s.budget)} "
                f"({style.exact_bytes(s.budget)}) per device: the smallest plan needs "
                f"{self._unit.text(least)} ({style.exact_bytes(least)}). Raise the budget "
                "(the slider's first position is the smallest plan), use more devices, or add "
                "a mesh axis.",
                "error",
            )
        except ExplorerError as err:
            s.choice = s.plan = None
            self._say(html.escape(str(err)), "error")
        else:
            self._say("")
        if frontier is not None:
            self._show_slider(frontier, index)
        if previous is None or s.choice is None or previous.strategies != s.choice.strategies:
            self.download_w.value = ""  # the link was for another plan
        self.export_w.disabled = s.choice is None
        self._show_summary()
        if redraw:
            self._show_graph()
        else:
            self.graph.restyle(s.choice, s.plan)
        self._show_bars()
        self._show_frontier()
        self.timings.append(time.perf_counter() - start)

    def _current_frontier(self) -> Frontier:
        """The frontier for the session's pins and uniform mode: re-solved when they change,
        so that a slider move under pins is a lookup too."""
        s = self.session
        assert s.analysis is not None
        if not s.pins and not s.uniform:
            return s.analysis.frontier
        key = (tuple(sorted(s.pins.items())), s.uniform)
        if s.pinned is None or s.pinned[0] is not s.analysis or s.pinned[1:3] != key:
            # unticked means the engine's default: uniform anyway for a step with a scan,
            # whose applied loop shares one configuration across its iterations
            solved = s.analysis.frontier_for(dict(s.pins), s.uniform or None)
            s.pinned = (s.analysis, *key, solved)
        frontier: Frontier = s.pinned[3]
        return frontier

    def _show_pins(self) -> None:
        pins = ", ".join(f"block {b}: {n}" for b, n in sorted(self.session.pins.items()))
        self.pins_label.value = f"pins: {html.escape(pins)}" if pins else "no pins"

    def _show_summary(self) -> None:
        s = self.session
        choice, analysis = s.choice, s.analysis
        pins = ", ".join(f"block {b}: {n}" for b, n in sorted(s.pins.items()))
        self._show_pins()
        unit = self._unit
        budget = "none (fastest plan)" if s.budget is None else unit.text(s.budget)
        if choice is None or analysis is None:
            self.summary_w.value = f"<b>No plan</b> for budget {budget}: see the message above."
            return
        platform = analysis.platform_name
        self.summary_w.value = (
            f"<b>Plan on mesh {html.escape(str(analysis.mesh))} ({html.escape(platform)}, "
            f"{analysis.backend} backend): {1e3 * choice.time:.4f} ms/step, "
            f"<span title='{style.exact_bytes(choice.memory)}'>{unit.text(choice.memory)}"
            f"</span> per device</b><br>budget {budget}; "
            f"{len(choice.configs)} segments, {len(set(choice.configs))} distinct configurations"
            + (f"; pins: {html.escape(pins)}" if pins else "")
            + ("; one configuration per segment type" if s.uniform else "")
            + "<details class='explorer-strategies'><summary>strategy per block</summary>"
            + ", ".join(f"{b}: {name}" for b, name in enumerate(choice.strategies) if name)
            + "</details>"
        )

    def _show_graph(self) -> None:
        s = self.session
        if s.analysis is None:
            return
        if s.level == "ops":
            self.graph.show_ops(s.analysis, s.selected, s.choice, self.plan)
        else:
            self.graph.show_blocks(s.analysis, s.choice)

    def _show_bars(self) -> None:
        s = self.session
        analysis = s.analysis
        if analysis is None or analysis.profile_table is None:
            return
        instance = analysis.segments.instances[s.selected]
        same = [i.index for i in analysis.segments.instances if i.unique_id == instance.unique_id]
        base = self._bars_base.get(instance.unique_id)
        if base is None:
            base = profiled_bars(analysis, instance.unique_id, self._symbolic, self._unit)
            self._bars_base[instance.unique_id] = base
        used = used_configs(s.choice.configs if s.choice else (), same)
        self.bars.show(with_chosen(base, used))

    def _show_frontier(self) -> None:
        s = self.session
        analysis = s.analysis
        if analysis is None or analysis.profile_table is None:
            return
        current = None if s.choice is None else (s.choice.memory, s.choice.time)
        others = tuple(
            (style.plan_name(r.name), r.memory, r.predicted_s)
            for r in s.baselines
            if r.name != "cfp" and r.memory is not None and r.predicted_s is not None
        )
        note = ", ".join(
            name
            for name, on in (("pinned", s.pins), ("one configuration per type", s.uniform))
            if on
        )
        try:
            frontier = self._current_frontier()
        except ExplorerError:  # the message area already says why
            frontier = analysis.frontier
            note = "unpinned: the pins leave no plan"
        self.frontier.show(
            frontier_data(frontier, current, s.budget, others, note, unit=self._unit)
        )

    # -- controls -----------------------------------------------------------------------------

    def _settings(self) -> Settings:
        mesh = self.mesh_w.value
        if mesh is None:
            raise ExplorerError("choose a mesh shape")
        return Settings(
            model=self.model_w.value,
            preset=self.preset_w.value,
            layers=self.layers_w.value or None,
            mesh=tuple(mesh),
            platform=self.platform_w.value,
            backend=self.backend_w.value,
            quick=self.quick_w.value,
        )

    def _mesh_options(self, devices: int, wanted: tuple[int, ...] | None = None) -> None:
        shapes = mesh_shapes(devices)
        self.mesh_w.options = [("x".join(map(str, m)), m) for m in shapes]
        self.mesh_w.value = wanted if wanted in shapes else shapes[0]

    def _pin_strategies(self) -> None:
        analysis = self.session.analysis
        block = self.pin_block_w.value
        if analysis is None or block is None:
            self.pin_strategy_w.options = []
            return
        names = [s.name for s in analysis.blocks[block].strategies]
        self.pin_strategy_w.options = names
        if names:
            self.pin_strategy_w.value = names[0]

    def _wire(self) -> None:
        def on(widget: Any, handler: Callable[[Any], None]) -> None:
            def observer(change: dict[str, Any]) -> None:
                if not self._syncing:
                    handler(change["new"])

            where = f"{(widget.description or type(widget).__name__).split(' (')[0]} change"
            widget.observe(self._guard(observer, where), names="value")

        def click(button: Any, handler: Callable[[], Any]) -> None:
            button.on_click(self._guard(lambda _: handler(), button.description))

        on(self.model_w, lambda m: setattr(self.preset_w, "options", presets(m)))
        on(self.devices_w, self._mesh_options)
        on(self.budget_w, self._slider_moved)
        on(self.uniform_w, self._set_uniform)
        on(self.segment_w, self._segment_chosen)
        on(self.level_w, self.set_level)
        on(self.roles_w, self.set_roles)
        on(self.pin_block_w, lambda _: self._pin_strategies())
        click(self.run_w, self.run)
        click(self.cancel_w, self.cancel)
        for control in (
            self.model_w, self.preset_w, self.layers_w, self.devices_w, self.mesh_w,
            self.platform_w, self.backend_w,
        ):  # fmt: skip
            control.observe(self._settings_changed, names="value")
        click(self.fastest_w, self._fastest)
        click(self.pin_w, self._pin_clicked)
        click(self.unpin_w, self.clear_pins)
        click(self.baselines_w, self.compute_baselines)
        click(self.export_w, self.export)

    def _segment_chosen(self, instance: int | None) -> None:
        if instance is not None:
            self.select_segment(instance)

    def _set_uniform(self, value: bool) -> None:
        with self._lock:
            self.session.uniform = bool(value)
            self._resolve()

    def _fastest(self) -> None:
        with self._lock:
            self.session.budget = None
            self._resolve()

    def _slider_moved(self, index: int) -> None:
        """A slider step is a frontier plan: the budget becomes exactly that plan's memory."""
        with self._lock:
            if self.session.analysis is None or self.session.analysis.profile_table is None:
                return
            points = self._current_frontier().points
            self.session.budget = points[min(max(int(index), 0), len(points) - 1)].memory
            self._resolve()

    def _settings_changed(self, change: dict[str, Any]) -> None:
        if self._invalid and not self._syncing:
            self._invalid = ""
            self._say("")

    def _refused(self) -> str:
        return (
            f"<b>Explorer arguments refused.</b> {html.escape(self._invalid)}. The controls show "
            "valid choices instead: change one of them (or create the app again) to profile."
        )

    def _pin_clicked(self) -> None:
        block, strategy = self.pin_block_w.value, self.pin_strategy_w.value
        if block is None or strategy is None:
            raise ExplorerError("choose a block and a strategy to pin")
        self.pin(int(block), str(strategy))

    # -- messages -----------------------------------------------------------------------------

    def _guard(self, fn: Callable[P, R], where: str) -> Callable[P, R | None]:
        """Run a callback; show its error in the message area instead of losing it."""

        @functools.wraps(fn)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
            try:
                return fn(*args, **kwargs)
            except Exception as err:
                self._error(where, err)
                return None

        return guarded

    def _error(self, where: str, err: BaseException, after: str = "") -> None:
        log.warning("explorer %s failed", where, exc_info=err)
        if isinstance(err, ExplorerError | ValueError):
            text = f"{type(err).__name__}: {err}"
            detail = ""
        else:
            text = f"{type(err).__name__}: {err}"
            detail = "".join(traceback.format_exception(err)[-6:])
        body = f"<b>{html.escape(where)} failed.</b> {html.escape(text)}{after}"
        if detail:
            body += (
                f"<details><summary>traceback</summary><pre>{html.escape(detail)}</pre></details>"
            )
        self._say(body, "error")

    def _say(self, body: str, kind: str = "error") -> None:
        """Show `body` (HTML) in the message area, after the run's standing notes."""
        self._last = (body, kind)
        colours = {"error": "#B00020", "info": "#0B5394", "warning": "#8A5A00"}
        parts = [(note, "warning") for note in self._notes] + ([(body, kind)] if body else [])
        self.message_w.value = "".join(
            f"<div class='explorer-{k}' style='border-left:4px solid {colours[k]};"
            f"padding:4px 8px;margin:2px 0;color:{colours[k]}'>{b}</div>"
            for b, k in parts
        )

    def _note(self, notes: list[str]) -> None:
        """Standing notes about the current run (kept above later messages)."""
        self._notes = notes
        self._say(*self._last)
