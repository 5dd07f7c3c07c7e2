"""Kernel-side latency of one memory-budget slider step in the notebook explorer.

Tiny GPT at 48 layers on mesh 4, the whole configuration space profiled (106 programs, the
same as at 2 layers: a warm cache makes this cheap after the first run). Two walks of 200
steps each: the slider widget's value set to a random frontier plan, as a drag does (the
observer, the frontier lookup, the plan summary, the graph restyle, the bars' highlight and
the frontier marker), and `Explorer.set_budget` with random budgets between the smallest and
the largest plan, as the report's slider section (`benchmarks/slider.py`) does. Run:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/ui_bench.py [layers]
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from explorer.ui import Explorer

CACHE = os.environ.get("EXPLORER_CACHE", "~/.cache/explorer/profiles.sqlite")
STEPS = 200


def main() -> None:
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    app = Explorer("gpt", "tiny", layers=layers, mesh=(4,), cache=CACHE)
    start = time.perf_counter()
    app.run()
    analysis = app.wait()
    assert analysis is not None and app.choice is not None, app.message
    print(f"analyze (profiles from {CACHE}): {time.perf_counter() - start:.1f} s")
    print(app.progress_label.value)
    frontier = analysis.frontier
    print(
        f"{len(analysis.segments.instances)} segment instances, {len(analysis.blocks)} blocks, "
        f"{len(frontier.points)} frontier plans"
    )
    rng = random.Random(0)
    low, high = app.budget_w.min, app.budget_w.max
    app.timings.clear()
    walls = []
    changed = 0
    for _ in range(STEPS):
        before = app.summary
        start = time.perf_counter()
        app.budget_w.value = rng.randint(low, high)  # a frontier plan, as the slider sends it
        walls.append(time.perf_counter() - start)
        changed += app.summary != before
    slider = list(app.timings)
    app.timings.clear()
    least, most = frontier.min_memory, frontier.points[-1].memory
    for _ in range(STEPS):
        app.set_budget(rng.uniform(least, most))
    for name, samples in (
        ("slider: re-solve and views", slider),
        ("slider: observer", walls),
        ("set_budget: re-solve and views", app.timings),
    ):
        ordered = sorted(samples)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        print(
            f"{name}: {len(ordered)} steps, p50 {1e3 * statistics.median(ordered):.2f} ms, "
            f"p95 {1e3 * p95:.2f} ms, max {1e3 * ordered[-1]:.2f} ms"
        )
    print(f"{changed} of {STEPS} steps changed the plan summary")
    app.set_budget(frontier.points[len(frontier.points) // 2].memory)
    start = time.perf_counter()
    assert app.plan is not None, app.message
    print(f"the last step's Plan document, built on demand: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
