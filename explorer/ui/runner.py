"""The background run: profile and solve on a thread, with progress, Cancel and recovery.

Profiling runs on a background thread so the controls stay live; its progress comes from the
profile cache (each finished program is committed there). A run that fails or is cancelled
puts back what the app showed before it (`Snapshot`): nothing computed is lost, and nothing
of the unfinished run (its progress bar, its "profiling...") stays.
"""

from __future__ import annotations

import html
import threading
import time
from pathlib import Path
from typing import Any

from explorer import models
from explorer.errors import ProfilingCancelled
from explorer.pipeline import SegmentedStep, analyze
from explorer.profile.runner import distinct_programs
from explorer.ui.bars import empty_bars, symbolic_costs
from explorer.ui.frontier import frontier_data
from explorer.ui.present import Presenter
from explorer.ui.state import Settings, Snapshot, counting, paired_strategies


def excluded_notes(analysis: SegmentedStep) -> list[str]:
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


class Runner(Presenter):
    """`run`, `cancel` and `wait`, and what a finished, failed or cancelled run leaves."""

    cache: str | Path | None
    analyze_options: dict[str, Any]
    _invalid: str
    _worker: threading.Thread | None
    _cancel: threading.Event

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

    def wait(self, timeout: float | None = None) -> SegmentedStep | None:
        """Block until the current run is done; its error, if any, is in `message`."""
        if self._worker is not None:
            self._worker.join(timeout)
        return self.session.analysis

    def _refused(self) -> str:
        return (
            f"<b>Explorer arguments refused.</b> {html.escape(self._invalid)}. The controls show "
            "valid choices instead: change one of them (or create the app again) to profile."
        )

    def _profile(self, settings: Settings) -> None:
        with self._lock:
            before = self._snapshot()
        try:
            model = models.build(
                settings.model,
                settings.preset,
                layers=settings.layers or None,
                abstract=settings.backend == "compiled",
            )
            step, args = model.step, model.args
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
        """Back to what the app showed before a run that did not finish (module doc)."""
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
            self.explain_view.clear(None)
            self.summary_w.value = "<b>No plan</b>: the run did not finish (see the message above)."
            self.export_w.disabled = self.budget_w.disabled = self.fastest_w.disabled = True
            self.fit_w.disabled = True
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

    def _adopt(self, analysis: SegmentedStep, settings: Settings) -> None:
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
        s.check = None
        self.fit_label.value = ""
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
