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
from explorer.errors import ExplorerError
from explorer.pipeline import DEFAULT_CACHE, Analysis, analyze
from explorer.plan import Plan
from explorer.profile.runner import distinct_programs
from explorer.solve import Frontier
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
from explorer.ui.state import (
    Choice,
    Session,
    Settings,
    choice_from_point,
    counting,
    paired_strategies,
)
from explorer.ui.table import BaselineRow, baseline_rows, table_html

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

PRESET_NAMES = (
    "tiny", "small", "gpt_2_6b", "gpt_6_7b", "llama_7b", "moe_7_1b", "bert_large",
)  # fmt: skip
SLIDER_STEPS = 100
AUTO = {"width": "auto", "flex": "0 0 auto"}  # buttons keep their label's width


def presets(model: str) -> list[str]:
    """Presets the model's config class provides."""
    _, config_cls = models.MODELS[model]
    found = []
    for name in PRESET_NAMES:
        maker = getattr(config_cls, name, None)
        if maker is None:
            continue
        try:
            maker()
        except NotImplementedError:
            continue
        found.append(name)
    return found


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
    """The plan explorer for one model zoo step; `display(Explorer())` in a notebook."""

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
        self._bars_base: dict[int, BarsData] = {}  # per segment type, for the current analysis
        self._syncing = False  # set while the app itself moves a control
        self._notes: list[str] = []  # warnings about the current run, shown until the next
        self._last: tuple[str, str] = ("", "error")
        self.timings: list[float] = []  # seconds of kernel-side work per re-solve

        from explorer.platforms import list_platforms

        max_devices = jax.device_count()
        style = {"description_width": "initial"}
        self.model_w = widgets.Dropdown(
            options=sorted(models.MODELS), value=model, description="model"
        )
        self.preset_w = widgets.Dropdown(options=presets(model), value=preset, description="preset")
        self.layers_w = widgets.BoundedIntText(
            value=layers or 0, min=0, max=512, description="layers (0: preset)", style=style,
            layout={"width": "170px"},
        )  # fmt: skip
        self.devices_w = widgets.Dropdown(
            options=list(range(1, max_devices + 1)),
            value=min(math.prod(mesh), max_devices),
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
        self.progress_w = widgets.IntProgress(value=0, min=0, max=1, description="profiling")
        self.progress_label = widgets.Label("")
        self.message_w = widgets.HTML("", layout={"width": "100%"})
        self.message_w.add_class("explorer-message")
        self.summary_w = widgets.HTML("<i>Press “Profile and solve”.</i>")
        self.summary_w.add_class("explorer-summary")
        self.budget_w = widgets.FloatSlider(
            value=0.0, min=0.0, max=1.0, step=0.01, description="memory budget (MiB)",
            continuous_update=True, readout_format=".4g", style=style, disabled=True,
            layout={"width": "640px"},
        )  # fmt: skip
        self.budget_w.add_class("explorer-budget")
        self.fastest_w = widgets.Button(
            description="no budget (fastest)", disabled=True, layout=AUTO
        )
        self.uniform_w = widgets.Checkbox(
            value=False, description="one configuration per segment type", indent=False
        )
        self.segment_w = widgets.Dropdown(description="segment", options=[])
        self.level_w = widgets.ToggleButtons(options=["blocks", "ops"], value="blocks")
        self.roles_w = widgets.ToggleButtons(options=list(ROLE_FILTERS), value="all")
        self.pin_block_w = widgets.Dropdown(description="pin block", options=[], style=style)
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
                widgets.HBox([self.quick_w, self.run_w, self.progress_w, self.progress_label]),
            ]
        )
        super().__init__(
            [
                controls,
                self.message_w,
                self.summary_w,
                widgets.HBox([self.budget_w, self.fastest_w, self.uniform_w]),
                widgets.HBox([self.segment_w, self.level_w, self.roles_w]),
                self.graph.figure,
                widgets.HBox([self.bars.figure, self.frontier.figure]),
                widgets.HBox([self.pin_block_w, self.pin_strategy_w, self.pin_w, self.unpin_w]),
                self.pins_label,
                widgets.HBox([self.baselines_w]),
                self.baseline_table,
                widgets.HBox([self.export_path_w, self.export_w, self.download_w]),
            ]
        )
        self.add_class("explorer-app")

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
            self._say("a run is already in progress; wait for it to finish", "info")
            return None
        try:
            settings = self._settings()
        except Exception as err:
            self._error("settings", err)
            return None
        self._notes = []
        self._say("")
        self.run_w.disabled = True
        self.progress_w.value, self.progress_w.max, self.progress_w.bar_style = 0, 1, "info"
        self.progress_label.value = "tracing..."
        worker = threading.Thread(target=self._profile, args=(settings,), daemon=True)
        self._worker = worker
        worker.start()
        return worker

    def wait(self, timeout: float | None = None) -> Analysis | None:
        """Block until the current run is done; its error, if any, is in `message`."""
        if self._worker is not None:
            self._worker.join(timeout)
        return self.session.analysis

    def set_budget(self, budget: float | None) -> None:
        """Budget in bytes per device (None: the fastest plan); moves the slider."""
        with self._lock:
            self.session.budget = budget
            if budget is not None and not self.budget_w.disabled:
                self._syncing = True
                try:
                    self.budget_w.value = budget / 2**20
                finally:
                    self._syncing = False
            self._resolve()

    def pin(self, block: int, strategy: str) -> None:
        with self._lock:
            self.session.pins[block] = strategy
            self._resolve()

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
        target = Path(path if path is not None else self.export_path_w.value).expanduser()
        written = plan.save(target)
        payload = base64.b64encode(plan.to_json().encode()).decode()
        self.download_w.value = (
            f"wrote <code>{html.escape(str(written))}</code> &nbsp; "
            f"<a class='explorer-download' download='{html.escape(written.name)}' "
            f"href='data:application/json;base64,{payload}'>"
            f"download {html.escape(written.name)}</a>"
        )
        self.session.exported = str(written)
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
            self.baseline_table.value = table_html(tuple(rows)) + "<i>...</i>"

        def work() -> None:
            try:
                result = baseline_rows(analysis, plan, done=show)
                with self._lock:
                    self.session.baselines = result
                    self.baseline_table.value = table_html(result)
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
                    step, *args, cache=self.cache, progress=False, only=only, **common, **options
                )
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
        except Exception as err:
            self.progress_w.bar_style = "danger"
            self.progress_label.value = "failed"
            self._error("profiling", err)
        finally:
            self.run_w.disabled = False

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
        """A new analysis (shape only, or profiled): reset what depends on it, redraw."""
        s = self.session
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
        self._syncing = True
        try:
            self.segment_w.options = [
                (f"{i.index}: {i.label} ({analysis.segments.unique[i.unique_id].label})", i.index)
                for i in analysis.segments.instances
            ]
            self.segment_w.value = s.selected
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
            if profiled:
                self._slider_range(analysis)
        finally:
            self._syncing = False
        self.pins_label.value = "no pins"
        if analysis.profile_table is None:
            self.summary_w.value = html.escape(
                f"{len(analysis.blocks)} ParallelBlocks in {len(analysis.segments.instances)} "
                f"segments on mesh {analysis.mesh}; profiling..."
            )
            self._show_graph()
            self.bars.show(empty_bars("profiling..."))
            self.frontier.show(frontier_data(None, None, None))
            return
        self._resolve(redraw=True)

    def _slider_range(self, analysis: Analysis) -> None:
        points = analysis.frontier.points
        low, high = points[0].memory / 2**20, points[-1].memory / 2**20
        span = max(high - low, high * 0.02, 1e-6)
        lo, hi = max(low - 0.1 * span, 0.0), high + 0.05 * span
        self.budget_w.min, self.budget_w.max = 0.0, hi  # widen first: min <= max always
        self.budget_w.min = lo
        self.budget_w.step = (hi - lo) / SLIDER_STEPS
        budget = self.session.budget
        self.budget_w.value = hi if budget is None else min(max(budget / 2**20, lo), hi)

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
        s.choice = s.plan = None
        try:
            frontier = self._current_frontier()
            point = frontier.points[-1] if s.budget is None else frontier.query(s.budget)
            s.choice = replace(
                choice_from_point(analysis, point, s.budget),
                pins=tuple(sorted(s.pins.items())),
                uniform=s.uniform,
            )
            if s.level == "ops":
                self.plan  # noqa: B018 -- builds the document the op hover reads
        except ExplorerError as err:
            s.choice = s.plan = None
            self._say(html.escape(str(err)), "error")
        else:
            self._say("")
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

    def _show_summary(self) -> None:
        s = self.session
        choice, analysis = s.choice, s.analysis
        pins = ", ".join(f"block {b}: {n}" for b, n in sorted(s.pins.items()))
        self.pins_label.value = f"pins: {html.escape(pins)}" if pins else "no pins"
        budget = "none (fastest plan)" if s.budget is None else f"{s.budget / 2**20:.4g} MiB"
        if choice is None or analysis is None:
            self.summary_w.value = f"<b>No plan</b> for budget {budget}: see the message above."
            return
        platform = analysis.platform_name
        self.summary_w.value = (
            f"<b>cfp plan on mesh {html.escape(str(analysis.mesh))} ({html.escape(platform)}, "
            f"{analysis.backend}): {1e3 * choice.time:.4f} ms/step, "
            f"{choice.memory / 2**20:.4f} MiB/device</b><br>budget {budget}; "
            f"{len(choice.configs)} segments, {len(set(choice.configs))} distinct configurations"
            + (f"; pins: {html.escape(pins)}" if pins else "")
            + ("; one configuration per segment type" if s.uniform else "")
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
            base = profiled_bars(analysis, instance.unique_id, self._symbolic)
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
            (r.name, r.memory, r.predicted_s)
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
        self.frontier.show(frontier_data(frontier, current, s.budget, others, note))

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
        on(self.budget_w, lambda v: self.set_budget(v * 2**20))
        on(self.uniform_w, self._set_uniform)
        on(self.segment_w, self._segment_chosen)
        on(self.level_w, self.set_level)
        on(self.roles_w, self.set_roles)
        on(self.pin_block_w, lambda _: self._pin_strategies())
        click(self.run_w, self.run)
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
            self._syncing = True
            try:
                self.budget_w.value = self.budget_w.max
            finally:
                self._syncing = False
            self._resolve()

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

    def _error(self, where: str, err: BaseException) -> None:
        log.warning("explorer %s failed", where, exc_info=err)
        if isinstance(err, ExplorerError | ValueError):
            text = f"{type(err).__name__}: {err}"
            detail = ""
        else:
            text = f"{type(err).__name__}: {err}"
            detail = "".join(traceback.format_exception(err)[-6:])
        body = f"<b>{html.escape(where)} failed.</b> {html.escape(text)}"
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
