"""The explorer app: its layout, its wiring, and the verbs its buttons call.

The app is built in layers, one idea per module: `controls` (the widgets), `messages` (the
message area), `present` (a re-solve drawn on every view), `runner` (the background run),
`explain_view` (why this plan). `Explorer` puts them on the page and wires each control to
the verb it calls; a notebook or a test can call the same verbs.
"""

from __future__ import annotations

import base64
import html
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from explorer.errors import ExplorerError, NoPlanFitsError
from explorer.pipeline import DEFAULT_CACHE, Analysis, SegmentedStep
from explorer.ui import style
from explorer.ui.bars import BarsData, BarsView, Symbolic
from explorer.ui.explain_view import ExplainView, Request
from explorer.ui.frontier import FrontierView
from explorer.ui.graph import GraphView, LayoutCache
from explorer.ui.inputs import budget_problem, check_arguments, pin_problem, presets
from explorer.ui.runner import Runner
from explorer.ui.state import Choice, FitCheck, Session, Settings
from explorer.ui.table import BaselineRow, baseline_rows, table_html

ROW = {"flex_flow": "row wrap", "width": "100%"}  # rows wrap on a narrow page


class Explorer(Runner, widgets.VBox):
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
        # refused arguments block `run` until a control is changed (see `_invalid`)
        self._invalid = "; ".join(checked.problems)
        if reason := budget_problem(budget):
            self._invalid = "; ".join(filter(None, [self._invalid, reason]))
            budget = None
        settings = Settings(
            checked.model, checked.preset, checked.layers, tuple(checked.mesh), checked.platform,
            checked.backend, quick,
        )  # fmt: skip
        self.session = Session(settings)
        self.session.budget = budget
        self.cache = cache
        self.analyze_options = dict(analyze_options or {})
        self.layouts = LayoutCache()
        self._lock = threading.RLock()
        self._worker: threading.Thread | None = None
        self._symbolic = Symbolic({}, "")
        self._unit = style.MIB  # the memory unit of the current analysis (see _present)
        self._bars_base: dict[int, BarsData] = {}  # per segment type, for the current analysis
        self._syncing = False  # set while the app itself moves a control
        self._cancel = threading.Event()
        self.timings: list[float] = []  # seconds of kernel-side work per re-solve

        self._build_messages()
        self._build_controls(settings, max_devices, export_path)
        self.graph = GraphView(
            self.layouts, self._guard(self.select_segment_and_expand, "expanding a segment")
        )
        self.bars = BarsView()
        self.frontier = FrontierView()
        self.explain_view = ExplainView(
            self.graph, self._request, self._say, lambda: self._unit, self._lock
        )
        self._wire()
        super().__init__(self._page())
        self.add_class("explorer-app")
        if self._invalid:
            self._say(self._refused(), "error")

    def _page(self) -> list[Any]:
        controls = widgets.VBox(
            [
                widgets.HBox([self.model_w, self.preset_w, self.layers_w], layout=ROW),
                widgets.HBox(
                    [self.devices_w, self.mesh_w, self.platform_w, self.backend_w], layout=ROW
                ),
                widgets.HBox(
                    [self.quick_w, self.run_w, self.cancel_w, self.progress_w, self.progress_label],
                    layout=ROW,
                ),
            ]
        )
        return [
            controls,
            self.message_w,
            self.summary_w,
            widgets.HBox(
                [self.budget_w, self.budget_label, self.fastest_w, self.uniform_w], layout=ROW
            ),
            widgets.HBox([self.fit_w, self.fit_label], layout=ROW),
            widgets.HBox([self.segment_w, self.level_w, self.roles_w], layout=ROW),
            widgets.HBox([self.search_w, self.collapse_w], layout=ROW),
            self.graph.figure,
            widgets.HBox([self.bars_filter_w], layout=ROW),
            # each figure a full-width row of its own, as the graph: plotly sizes a figure to
            # its container when it is drawn, and a flex row that settles later (or wraps)
            # left the frontier wider than its half, clipped at the page's right edge
            self.bars.figure,
            self.frontier.figure,
            widgets.HBox(
                [self.pin_block_w, self.pin_strategy_w, self.pin_w, self.unpin_w], layout=ROW
            ),
            self.pins_label,
            self.explain_view.box,
            widgets.HBox([self.baselines_w]),
            self.baseline_table,
            widgets.HBox([self.export_path_w, self.export_w, self.download_w], layout=ROW),
            widgets.HTML(f"<small>{style.GLOSSARY}</small>"),
        ]

    # -- public verbs (the buttons call these; so can a notebook or a test) -------------------

    @property
    def analysis(self) -> SegmentedStep | None:
        """The step's analysis: a `SegmentedStep` while profiling, an `Analysis` after."""
        return self.session.analysis

    @property
    def choice(self) -> Choice | None:
        """What the solver picked for the current budget and pins (cheap; what views draw)."""
        return self.session.choice

    @property
    def summary(self) -> str:
        return str(self.summary_w.value)

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
            self._collapse_options()
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
            self._collapse_options()
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

    def find_ops(self, text: str) -> None:
        """Highlight the ops whose id, primitive or scope contains `text` (ops view)."""
        with self._lock:
            self.graph.search = text.strip()
            if self.session.level == "ops":
                self._show_graph()

    def collapse(self, scopes: tuple[str, ...]) -> None:
        """Draw each scope in `scopes` as one node (ops view)."""
        with self._lock:
            self.graph.collapsed = frozenset(scopes)
            if self.session.level == "ops":
                self._show_graph()

    def filter_bars(self, text: str) -> None:
        """Show the configurations whose name contains `text` (the plan's always)."""
        with self._lock:
            self.bars_filter_w.value = text
            self._show_bars()

    def explain(self, wait: bool = False) -> threading.Thread | None:
        """Why this plan: attribute the compiled step's collectives, price each single-block
        change, and compare with the chosen baseline (on a thread; `wait` joins it)."""
        return self.explain_view.explain(wait=wait)

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
        if not isinstance(analysis, Analysis):
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

        return _in_background(work, wait)

    def check_fit(self, wait: bool = False) -> threading.Thread:
        """Compile the whole step under the plan shown; where it needs more memory than the
        budget (the device's memory where there is none), find the fastest frontier plan whose
        compiled step fits (`explorer.fastest_plan_that_fits`, a few compiles) and show it
        (on a thread; `wait` joins it). Where none compiled fits, the plan shown stays and the
        label says what each plan compiled needed."""
        from explorer.compiled_fit import fastest_plan_that_fits

        with self._lock:
            s = self.session
            analysis = s.analysis
            if not isinstance(analysis, Analysis) or s.choice is None:
                raise ExplorerError(
                    "no plan to check: profile and solve first, or raise the budget"
                )
            pins, uniform, budget = tuple(sorted(s.pins.items())), s.uniform, s.budget
        self.fit_w.disabled = True
        self.fit_label.value = "<i>compiling the whole step under the plan shown...</i>"

        def work() -> None:
            try:
                fit = fastest_plan_that_fits(
                    analysis, analysis.step, *analysis.args, memory_budget=budget,
                    pins=dict(pins) or None, uniform=uniform or None,
                )  # fmt: skip
            except NoPlanFitsError as err:
                self.fit_label.value = f"<span style='color:#B00020'>{html.escape(str(err))}</span>"
            except Exception as err:
                self.fit_label.value = ""
                self._error("checking the plan compiled", err)
            else:
                with self._lock:
                    self._show_fit(FitCheck(analysis, pins, uniform, budget, fit))
            finally:
                self.fit_w.disabled = False

        return _in_background(work, wait)

    # -- wiring -------------------------------------------------------------------------------

    def _wire(self) -> None:
        def on(widget: Any, handler: Callable[[Any], object]) -> None:
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
        on(self.search_w, self.find_ops)
        on(self.collapse_w, self.collapse)
        on(self.bars_filter_w, lambda _: self._show_bars())
        on(self.pin_block_w, lambda _: self._pin_strategies())
        on(self.explain_view.compare_w, lambda _: self.explain_view.compare())
        click(self.run_w, self.run)
        click(self.cancel_w, self.cancel)
        for control in self._setting_controls():
            control.observe(self._settings_changed, names="value")
        click(self.fastest_w, self._fastest)
        click(self.pin_w, self._pin_clicked)
        click(self.unpin_w, self.clear_pins)
        click(self.baselines_w, self.compute_baselines)
        click(self.fit_w, self.check_fit)
        click(self.export_w, self.export)
        click(self.explain_view.explain_w, self.explain)
        click(self.explain_view.stop_w, self.explain_view.stop)
        click(self.explain_view.keep_w, self.explain_view.keep_reference)

    def _request(self) -> Request | None:
        """The plan shown, as an explanation request (None: no plan)."""
        with self._lock:
            s = self.session
            if not isinstance(s.analysis, Analysis) or s.choice is None:
                return None
            return Request(
                0, s.analysis, s.choice, s.budget, tuple(sorted(s.pins.items())), s.uniform
            )

    def _show_fit(self, check: FitCheck) -> None:
        """A check's answer: where the app still shows what was checked, the plan that fits
        becomes the plan shown (the budget moves to its predicted memory, a frontier
        position); where the budget, pins or model changed meanwhile, nothing moves."""
        s = self.session
        fit = check.fit
        said = html.escape(fit.summary())
        if not check.asked_as(s):
            self.fit_label.value = (
                f"{said} <i>(for the settings when it was asked; they have changed since, so "
                "the plan shown was not moved)</i>"
            )
            return
        s.check = check
        moved = not check.shows(s.choice, s.analysis)
        if moved:
            s.budget = fit.plan.memory
            self._resolve()
        if not check.shows(s.choice, s.analysis):  # the frontier gives another plan there
            s.check = None
            self.fit_label.value = (
                f"{said} <span style='color:#B00020'>(the budget at its predicted memory "
                "shows another plan: not moved)</span>"
            )
            return
        self.fit_label.value = f"&#10003; {said}" + (
            "; <b>the plan shown is now that one</b>" if moved else ""
        )
        self._show_summary()

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
            if not isinstance(self.session.analysis, Analysis):
                return
            points = self._current_frontier().points
            self.session.budget = points[min(max(int(index), 0), len(points) - 1)].memory
            self._resolve()

    def _settings_changed(self, change: dict[str, Any]) -> None:
        if self._invalid and not self._syncing:
            self._invalid = ""
            self._say("")

    def _pin_clicked(self) -> None:
        block, strategy = self.pin_block_w.value, self.pin_strategy_w.value
        if block is None or strategy is None:
            raise ExplorerError("choose a block and a strategy to pin")
        self.pin(int(block), str(strategy))


def _in_background(work: Callable[[], None], wait: bool) -> threading.Thread:
    """`work` on a daemon thread (a button's compile must not block the page); `wait` joins."""
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    if wait:
        worker.join()
    return worker
