"""Why this plan, in the app: the engine's explanation of the current plan, drawn.

`explorer.explain` computes everything (which collective each block makes the compiler emit,
what changing a block would cost, what two plans choose differently); `explain_tables` turns
its results into tables and graph markers; this module runs it and puts them on the page.

Attribution compiles the whole step, so it runs on request ("Explain this plan") on a thread
of its own: the slider stays live while it runs. Each request has a generation; a new plan
(a slider move, a pin) or Stop starts a new generation, and a result of an older one is
dropped when it arrives, so what is shown is always about the plan shown.
"""

from __future__ import annotations

import functools
import html
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import ipywidgets as widgets

from explorer.analysis import Analysis, SegmentedStep
from explorer.ui import style
from explorer.ui.explain_tables import (
    CounterfactualRow,
    ExplainData,
    block_label,
    collectives_html,
    counterfactual_rows,
    counterfactuals_html,
    diff_html,
    explain_data,
)

if TYPE_CHECKING:
    from explorer.plan import Plan
    from explorer.ui.graph import GraphView
    from explorer.ui.messages import Kind
    from explorer.ui.state import Choice

COMPARE = (
    ("data parallel", "dp"),
    ("Megatron tensor parallel", "megatron"),
    ("FSDP / ZeRO-3", "fsdp"),
    ("this plan without its pins", "unpinned"),
    ("the reference kept", "reference"),
)


# -- the view -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """What an explanation is of: the plan shown when the button was pressed."""

    generation: int
    analysis: Analysis
    choice: Choice
    budget: float | None
    pins: tuple[tuple[int, str], ...]
    uniform: bool


class ExplainView:
    """The "Why this plan" panel; the app calls `stale` when the plan changes."""

    def __init__(
        self,
        graph: GraphView,
        current: Callable[[], Request | None],
        say: Callable[[str, Kind], None],
        unit: Callable[[], style.MemoryUnit],
        lock: threading.RLock,
    ) -> None:
        self.graph = graph
        self._current = current
        self._say = say
        self._unit = unit
        # the app's lock: results are drawn while no re-solve is drawing (one lock, one order)
        self._lock = lock
        self.generation = 0
        self.request: Request | None = None  # what is shown (or being computed)
        self.plan: Plan | None = None
        self.data: ExplainData | None = None
        self.counterfactuals: tuple[CounterfactualRow, ...] = ()
        self.reference: Plan | None = None
        self._baselines: dict[str, Plan] = {}
        self._baselines_of: Analysis | None = None
        self.worker: threading.Thread | None = None
        self.diff_worker: threading.Thread | None = None

        self.explain_w = widgets.Button(
            description="Explain this plan", icon="search", disabled=True,
            layout={"width": "auto", "flex": "0 0 auto"},
            tooltip="compile the whole step under the plan and attribute every collective",
        )  # fmt: skip
        self.explain_w.add_class("explorer-explain")
        self.stop_w = widgets.Button(
            description="Stop", icon="stop", disabled=True,
            layout={"width": "auto", "flex": "0 0 auto"},
        )  # fmt: skip
        self.compare_w = widgets.Dropdown(
            options=list(COMPARE), value="dp", description="compare with",
            style={"description_width": "initial"},
        )  # fmt: skip
        self.compare_w.add_class("explorer-compare")
        self.keep_w = widgets.Button(
            description="Keep as reference", icon="bookmark", disabled=True,
            layout={"width": "auto", "flex": "0 0 auto"},
            tooltip="keep the current plan to compare later plans with",
        )  # fmt: skip
        self.status_w = widgets.HTML("")
        self.status_w.add_class("explorer-explain-status")
        self.diff_w = widgets.HTML("")
        self.collectives_w = widgets.HTML("")
        self.counterfactuals_w = widgets.HTML("")
        self.box = widgets.VBox(
            [
                widgets.HTML("<b>Why this plan</b>"),
                widgets.HBox([self.explain_w, self.stop_w, self.status_w]),
                widgets.HBox([self.compare_w, self.keep_w]),
                self.diff_w,
                self.collectives_w,
                self.counterfactuals_w,
            ],
            layout={"width": "100%"},
        )
        self.box.add_class("explorer-why")

    # -- what the app calls -------------------------------------------------------------------

    def clear(self, analysis: SegmentedStep | None) -> None:
        """A new analysis (or none): nothing explained, no reference kept of another step."""
        with self._lock:
            self.generation += 1
            if self.reference is not None and (
                analysis is None or self.reference.mesh != analysis.mesh
            ):
                self.reference = None
            self._drop("" if analysis is None else "press “Explain this plan”")
            self.explain_w.disabled = not isinstance(analysis, Analysis)
            self.keep_w.disabled = self.explain_w.disabled

    def stale(self, choice: Choice | None) -> None:
        """The plan shown changed: an explanation of the previous one is dropped."""
        with self._lock:
            if self.request is None and not self.collectives_w.value and not self.diff_w.value:
                self.explain_w.disabled = self.keep_w.disabled = choice is None
                return
            self.generation += 1
            self._drop("the plan changed: press “Explain this plan” again")
            self.explain_w.disabled = self.keep_w.disabled = choice is None

    def redraw_markers(self) -> None:
        """The graph was redrawn: put the current explanation's markers back on it."""
        data = self.data
        self.graph.show_markers(() if data is None else data.markers)

    def explain(self, wait: bool = False) -> threading.Thread | None:
        """Explain the plan shown: counterfactuals, the diff, then the compiled attribution."""
        with self._lock:
            self.generation += 1
            request = self._current()
            if request is None:
                self._say(
                    "no plan to explain: profile and solve first, or raise the budget", "error"
                )
                return None
            request = replace(request, generation=self.generation)
            self.request = request
            self._drop("building the plan and its counterfactuals...", keep_request=True)
            self.stop_w.disabled = False
        worker = threading.Thread(target=self._work, args=(request,), daemon=True)
        self.worker = worker
        worker.start()
        if wait:
            worker.join()
        return worker

    def stop(self) -> None:
        """Drop the explanation being computed (a compile in progress ends unseen)."""
        with self._lock:
            self.generation += 1
            self._drop("stopped")

    def keep_reference(self) -> None:
        request = self._current()
        if request is None:
            self._say("no plan to keep: profile and solve first", "error")
            return
        self.reference = _plan_of(request)
        self.compare_w.value = "reference"
        self.status_w.value = (
            f"kept as the reference: {1e3 * self.reference.time:.4f} ms/step "
            "(move the budget or pin a block, then explain to compare)"
        )

    def compare(self) -> threading.Thread | None:
        """The comparison changed: recompute the diff for the plan explained (if any), on a
        thread (a baseline may compile the whole step)."""
        request = self.request
        if request is None or self.plan is None:
            return None
        worker = threading.Thread(target=self._diff_only, args=(request, self.plan), daemon=True)
        self.diff_worker = worker
        worker.start()
        return worker

    # -- the worker -----------------------------------------------------------------------------

    def _work(self, request: Request) -> None:
        from explorer.explain import attribute, counterfactuals

        try:
            plan = _plan_of(request)
            if not self._still(request):
                return
            self.plan = plan
            unit = self._unit()
            names = self.graph.names(request.analysis)
            try:
                table = counterfactuals(request.analysis, plan)
            except Exception as err:  # a plan the profiles cannot vary: say why, go on
                shown = f"<i>no counterfactuals: {html.escape(str(err))}</i>"
            else:
                rows = counterfactual_rows(request.analysis, table, names, unit)
                shown = counterfactuals_html(rows, unit)
                self.counterfactuals = rows
            if not self._show(request, counterfactuals_w=shown):
                return
            self._diff_only(request, plan)
            self._show(request, status_w="compiling the whole step under the plan...")
            attribution = attribute(request.analysis, plan)
            data = explain_data(request.analysis, attribution, names)
            with self._lock:
                if request.generation != self.generation:
                    return
                self.data = data
                self.collectives_w.value = collectives_html(data)
                self.status_w.value = (
                    f"explained: {1e3 * plan.time:.4f} ms/step, {len(attribution.collectives)} "
                    f"collectives ({len(attribution.unknown)} not attributed)"
                )
                self.stop_w.disabled = True
                self.graph.show_markers(data.markers)
        except Exception as err:
            with self._lock:
                if request.generation != self.generation:
                    return
                self.stop_w.disabled = True
                self.status_w.value = "failed: see the message above"
            self._say(
                f"<b>Explain this plan failed.</b> {html.escape(type(err).__name__)}: "
                f"{html.escape(str(err))}",
                "error",
            )

    def _diff_only(self, request: Request, plan: Plan) -> None:
        from explorer.explain import plan_diff

        against = str(self.compare_w.value)
        label = dict((v, k) for k, v in COMPARE)[against]
        try:
            other = self._other(request, against)
            shown = (
                f"<i>nothing to compare with: {html.escape(label)} has not been kept yet</i>"
                if other is None
                else diff_html(
                    plan_diff(other, plan),
                    label,
                    self._unit(),
                    functools.partial(
                        block_label, request.analysis, self.graph.names(request.analysis)
                    ),
                )
            )
        except Exception as err:
            shown = f"<i>no comparison with {html.escape(label)}: {html.escape(str(err))}</i>"
        self._show(request, diff_w=shown)

    def _other(self, request: Request, against: str) -> Plan | None:
        analysis = request.analysis
        if against == "reference":
            return self.reference
        if against == "unpinned":
            return analysis.plan(memory_budget=request.budget, uniform=request.uniform or None)
        if self._baselines_of is not analysis:
            self._baselines, self._baselines_of = {}, analysis
        if against not in self._baselines:
            self._baselines[against] = analysis.baseline(against)
        return self._baselines[against]

    def _still(self, request: Request) -> bool:
        return request.generation == self.generation

    def _show(self, request: Request, **values: str) -> bool:
        """Set widgets if the request is still current; False when it is not."""
        with self._lock:
            if request.generation != self.generation:
                return False
            for name, value in values.items():
                getattr(self, name).value = value
            return True

    def _drop(self, status: str, keep_request: bool = False) -> None:
        if not keep_request:
            self.request = None
        self.plan = self.data = None
        self.counterfactuals = ()
        self.collectives_w.value = self.counterfactuals_w.value = self.diff_w.value = ""
        self.status_w.value = status
        self.stop_w.disabled = True
        self.graph.show_markers(())


def _plan_of(request: Request) -> Plan:
    """The plan document of the request, checked to be the plan that was shown."""
    from explorer.errors import ExplorerError

    plan = request.analysis.plan(
        memory_budget=request.budget,
        pins=dict(request.pins) or None,
        uniform=request.uniform or None,
    )
    if plan.strategies != request.choice.strategies:
        raise ExplorerError("the plan to explain differs from the plan shown; re-solve and retry")
    return plan
