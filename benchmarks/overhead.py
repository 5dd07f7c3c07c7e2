"""Section 3: search overhead against depth (trace, blocks, segments, programs profiled,
profiling, solving), the Alpa-style ILP's size and solve time beside it. The stages are
called one by one, not through `analyze`, to time each."""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks.cases import Case, Run, brief, build_step


def overhead(run: Run) -> None:
    from explorer.blocks import build_blocks
    from explorer.cost import build_cost_model
    from explorer.layouts import instance_dependencies
    from explorer.mesh import mesh_spec
    from explorer.platforms import load_platform
    from explorer.profile.cache import ProfileCache
    from explorer.profile.runner import profile_all
    from explorer.segments import build_segments
    from explorer.solve import solve_frontier
    from explorer.space import build_space
    from explorer.trace import trace

    platform = load_platform(run.settings.platforms[0])
    mesh = mesh_spec((4,))
    for layers in run.settings.overhead_layers:
        case = Case("gpt", "tiny", mesh.shape, layers=layers)
        step, args = build_step(case)
        row: dict[str, Any] = {"layers": layers}
        try:
            start = time.perf_counter()
            graph = trace(step, *args)
            row["trace_s"] = time.perf_counter() - start
            start = time.perf_counter()
            blocks = build_space(build_blocks(graph, mesh.size), mesh)
            row["blocks_s"] = time.perf_counter() - start
            start = time.perf_counter()
            segments = build_segments(graph, blocks)
            row["segments_s"] = time.perf_counter() - start
            row["ops"] = len(graph.ops)
            row["blocks"] = len(blocks.blocks)
            row["unique_segments"] = len(segments.unique)
            # cold at every depth (full run), or into the run's cache, which is cold before
            # the first depth; either way the table says how many programs came from a cache
            with tempfile.TemporaryDirectory() as scratch:
                where = (
                    Path(scratch) / "cold.sqlite" if run.settings.cold_every_depth else run.cache
                )
                with ProfileCache(where) as store:
                    start = time.perf_counter()
                    profiles = profile_all(
                        graph, blocks, segments, mesh, platform=platform, backend="compiled",
                        cache=store, progress=False,
                    )  # fmt: skip
                    row["profile_s"] = time.perf_counter() - start
            row["programs"] = profiles.programs
            row["from_cache"] = len({p.program for p in profiles.entries if p.cached})
            start = time.perf_counter()
            dependencies = instance_dependencies(graph, blocks, segments, mesh)
            frontier = solve_frontier(build_cost_model(segments, profiles, dependencies))
            row["solve_s"] = time.perf_counter() - start
            row["frontier_plans"] = len(frontier.points)
        except Exception as err:
            run.failed(f"overhead {layers} layers", err)
        if layers in run.settings.alpa_layers:
            _alpa_size(run, row, locals().get("graph"), mesh, platform)
        run.overhead.append(row)
        run.log(f"   {layers} layers: {brief(row)}")
    for layers in run.settings.alpa_layers:
        if layers not in run.settings.overhead_layers:
            step, args = build_step(Case("gpt", "tiny", mesh.shape, layers=layers))
            row = {"layers": layers}
            _alpa_size(run, row, trace(step, *args), mesh, platform)
            run.overhead.append(row)
            run.log(f"   {layers} layers: {brief(row)}")


def _alpa_size(run: Run, row: dict[str, Any], graph: Any, mesh: Any, platform: Any) -> None:
    if graph is None:
        return
    try:
        from explorer.alpa import solve_alpa

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            solution = solve_alpa(graph, mesh, platform, time_limit=run.settings.alpa_time_limit)
            row["alpa_total_s"] = time.perf_counter() - start
        row["alpa_solve_s"] = solution.solve_seconds
        row["alpa_variables"] = solution.variables
        row["alpa_constraints"] = solution.constraints
        row["alpa_status"] = solution.status
        if caught:
            row["alpa_status"] += " (warned)"
    except Exception as err:
        run.failed(f"alpa ILP {row['layers']} layers", err)
