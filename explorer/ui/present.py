"""Drawing the session: a re-solve for the budget and pins, and every view told what to show.

A budget move, a pin or a mesh change re-solves and pushes the new plan to every view: the
summary, the graph (restyled, not re-laid out), the bars (their highlight) and the frontier
(its marker). A slider step must stay well under a frame (16 ms) at 48 layers, so each view
re-sends only what changed.
"""

from __future__ import annotations

import html
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from explorer.analysis import Analysis, SegmentedStep
from explorer.errors import ExplorerError, NoPlanFitsError
from explorer.solve import Frontier
from explorer.ui import style
from explorer.ui.bars import BarsData, BarsView, Symbolic, empty_bars, profiled_bars, with_chosen
from explorer.ui.controls import Controls
from explorer.ui.frontier import FrontierView, frontier_data
from explorer.ui.graph import GraphView
from explorer.ui.messages import Messages
from explorer.ui.state import choice_from_point
from explorer.units import format_bytes

if TYPE_CHECKING:
    from explorer.plan import Plan
    from explorer.ui.explain_view import ExplainView


class Presenter(Controls, Messages):
    """Turns the session into what the views show (see the module doc)."""

    graph: GraphView
    bars: BarsView
    frontier: FrontierView
    explain_view: ExplainView
    timings: list[float]
    _lock: threading.RLock
    _unit: style.MemoryUnit
    _bars_base: dict[int, BarsData]
    _symbolic: Symbolic
    _syncing: bool

    @property
    def plan(self) -> Plan | None:
        """The current plan as a full `Plan` document (built on first use, then kept)."""
        with self._lock:
            s = self.session
            if s.plan is None and s.choice is not None and isinstance(s.analysis, Analysis):
                s.plan = s.analysis.plan(
                    memory_budget=s.budget, pins=dict(s.pins) or None, uniform=s.uniform or None
                )
            return s.plan

    def _present(self, analysis: SegmentedStep) -> None:
        """Fill the controls that list the analysis's segments and blocks, and draw it."""
        from explorer.ui.table import table_html

        s = self.session
        self._unit = style.memory_unit(
            analysis.frontier.points[-1].memory if isinstance(analysis, Analysis) else 0
        )
        self.baseline_table.value = table_html(s.baselines, self._unit) if s.baselines else ""
        names = self.graph.names(analysis)
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
                (f"{b.index}: {names[b.index]} ({b.scope})", b.index)
                for b in analysis.blocks
                if b.strategies
            ]
            selected = analysis.segments.instances[s.selected].blocks
            pinnable = [b.index for b in analysis.blocks if b.strategies]
            if pinnable:
                self.pin_block_w.value = selected[0] if selected else pinnable[0]
            self._pin_strategies()
            self._collapse_options()
            profiled = isinstance(analysis, Analysis)
            self.budget_w.disabled = not profiled
            self.fastest_w.disabled = not profiled
            self.fit_w.disabled = not profiled
        finally:
            self._syncing = False
        self._show_pins()
        self.explain_view.clear(analysis)
        if not isinstance(analysis, Analysis):
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

    def _collapse_options(self) -> None:
        """The scopes of the selected segment's ops, for the op view's collapse list."""
        analysis = self.session.analysis
        if analysis is None:
            self.collapse_w.options = []
            return
        ops = analysis.segments.instances[self.session.selected].ops
        scopes = sorted({analysis.graph.ops[o].scope or "<root>" for o in ops})
        self.collapse_w.options = scopes
        self.collapse_w.value = tuple(v for v in self.graph.collapsed if v in scopes)

    def _show_slider(self, frontier: Frontier, index: int | None) -> None:
        """One slider position per frontier plan; `index` is the plan shown (None: none fits
        the budget, the slider rests on the smallest plan)."""
        points = frontier.points
        self._syncing = True
        try:
            if self.budget_w.max != len(points) - 1:
                self.budget_w.value = 0
                self.budget_w.max = len(points) - 1
            wanted = 0 if index is None else index
            if self.budget_w.value != wanted:
                self.budget_w.value = wanted
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
        if not isinstance(analysis, Analysis):
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
            if self._last[0]:
                self._say("")
        if frontier is not None:
            self._show_slider(frontier, index)
        same = (
            previous is not None
            and s.choice is not None
            and previous.strategies == s.choice.strategies
            and previous.configs == s.choice.configs
            and previous.pins == s.choice.pins
        )
        if not same:
            self.download_w.value = ""  # the link was for another plan
            self.explain_view.stale(s.choice)  # an explanation was for another plan
            if s.check is not None and not s.check.shows(s.choice, analysis):
                self.fit_label.value = ""  # the check was of another plan
        self.export_w.disabled = s.choice is None
        self._show_summary()
        if redraw:
            self._show_graph()
        elif not same:
            self.graph.restyle(s.choice, s.plan, s.pins)
        self._show_bars()
        self._show_frontier()
        self.timings.append(time.perf_counter() - start)

    def _current_frontier(self) -> Frontier:
        """The frontier for the session's pins and uniform mode: re-solved when they change,
        so that a slider move under pins is a lookup too."""
        s = self.session
        analysis = s.analysis
        assert isinstance(analysis, Analysis)  # a plan is solved only once profiled
        if not s.pins and not s.uniform:
            return analysis.frontier
        key = (tuple(sorted(s.pins.items())), s.uniform)
        if s.pinned is None or s.pinned[0] is not analysis or s.pinned[1:3] != key:
            # unticked means the engine's default: uniform anyway for a step with a scan,
            # whose applied loop shares one configuration across its iterations
            solved = analysis.frontier_for(dict(s.pins), s.uniform or None)
            s.pinned = (analysis, *key, solved)
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
            + self._checked_note()
            + "<details class='explorer-strategies'><summary>strategy per block</summary>"
            + ", ".join(f"{b}: {name}" for b, name in enumerate(choice.strategies) if name)
            + "</details>"
        )

    def _checked_note(self) -> str:
        """What the summary says of a plan shown whose compiled step was checked to fit."""
        s = self.session
        if s.check is None or not s.check.shows(s.choice, s.analysis):
            return ""
        fit, unit = s.check.fit, self._unit
        return (
            f"; <span class='explorer-checked'>compiled: "
            f"<span title='{style.exact_bytes(fit.truth.memory)}'>{unit.text(fit.truth.memory)}"
            f"</span> per device, within {format_bytes(fit.budget, digits=4)}</span>"
        )

    def _show_graph(self) -> None:
        s = self.session
        if s.analysis is None:
            return
        if s.level == "ops":
            self.graph.show_ops(s.analysis, s.selected, s.choice, self.plan, s.pins)
        else:
            self.graph.show_blocks(s.analysis, s.choice, s.pins)
        self.explain_view.redraw_markers()

    def _show_bars(self) -> None:
        s = self.session
        analysis = s.analysis
        if not isinstance(analysis, Analysis):
            return
        instance = analysis.segments.instances[s.selected]
        base = self._bars_base.get(instance.unique_id)
        if base is None:
            base = profiled_bars(analysis, instance.unique_id, self._symbolic, self._unit)
            self._bars_base[instance.unique_id] = base
        same = [i.index for i in analysis.segments.instances if i.unique_id == instance.unique_id]
        used = s.choice.configs if s.choice else ()
        self.bars.show(with_chosen(base, used, same, str(self.bars_filter_w.value)))

    def _show_frontier(self) -> None:
        s = self.session
        analysis = s.analysis
        if not isinstance(analysis, Analysis):
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
