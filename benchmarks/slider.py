"""Section 4: kernel-side latency of one memory-budget slider step."""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from benchmarks.cases import Case, Run, analyze_case, brief, build_step


def slider(run: Run) -> None:
    """Kernel-side work of one slider step: the app's own handler when the UI extra is
    installed (frontier lookup, plan, recolouring), else the frontier lookup and plan."""
    app_class: Any = None
    try:
        from explorer.ui import Explorer

        app_class = Explorer
    except ImportError:  # the UI extra is optional
        pass
    rng = random.Random(1)
    for layers in run.settings.slider_layers:
        case = Case("gpt", "tiny", (4,), layers=layers)
        try:
            analysis = analyze_case(run, case, *build_step(case), run.settings.platforms[0])
            low, high = analysis.frontier.min_memory, analysis.frontier.points[-1].memory
            budgets = [rng.uniform(low, high) for _ in range(run.settings.slider_steps)]
            if app_class is not None:
                app = app_class(layers=layers, mesh=(4,), cache=run.cache)
                app.run()
                app.wait(timeout=1800)
                app.timings.clear()
                for budget in budgets:
                    app.set_budget(budget)
                samples, what = list(app.timings), "Explorer.set_budget"
            else:
                samples, what = [], "Analysis.plan"
                for budget in budgets:
                    start = time.perf_counter()
                    analysis.plan(memory_budget=budget)
                    samples.append(time.perf_counter() - start)
            samples.sort()
            run.slider.append(
                {
                    "layers": layers,
                    "instances": len(analysis.segments.instances),
                    "frontier_plans": len(analysis.frontier.points),
                    "measured": what,
                    "steps": len(samples),
                    "p50_ms": 1e3 * statistics.median(samples),
                    "p95_ms": 1e3 * samples[min(len(samples) - 1, int(0.95 * len(samples)))],
                }
            )
            run.log(f"   {layers} layers: {brief(run.slider[-1])}")
        except Exception as err:
            run.failed(f"slider {layers} layers", err)
