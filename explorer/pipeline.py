"""analyze(): the one place that chains the stages.

trace -> blocks -> space -> segments -> profile (-> cost -> solve, as those stages land).
Each stage receives the previous artefact as an argument; this module only sequences them and
keeps what each produced, so nothing computed is lost when a later stage fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from explorer.blocks import build_blocks
from explorer.errors import AnalysisError
from explorer.ir import BlockAnalysis, Graph, ParallelBlock, Segmentation
from explorer.mesh import MeshSpec, mesh_spec
from explorer.segments import DEFAULT_PROFILING_BUDGET, ProgramCount, build_segments, program_count
from explorer.space import build_space, config_count
from explorer.trace import trace

DEFAULT_CACHE = "~/.cache/explorer/profiles.sqlite"


@dataclass(frozen=True, slots=True)
class Analysis:
    """Everything the pipeline produced for one step, mesh and platform."""

    graph: Graph
    block_analysis: BlockAnalysis
    segments: Segmentation
    mesh: MeshSpec
    step: Callable[..., Any]
    args: tuple[Any, ...]
    platform: Any = None
    backend: str = "compiled"
    profile_table: pd.DataFrame | None = None

    @property
    def blocks(self) -> tuple[ParallelBlock, ...]:
        return self.block_analysis.blocks

    @property
    def program_counts(self) -> ProgramCount:
        return program_count(self.segments, self.block_analysis)

    @property
    def program_count(self) -> int:
        """Programs to profile: the paper's Eq. 7 (independent of depth)."""
        return self.program_counts.total

    @property
    def config_count(self) -> int:
        """Configurations of the whole step: what profiling without segments would face."""
        return config_count(self.blocks)

    @property
    def profiles(self) -> pd.DataFrame:
        if self.profile_table is None:
            raise AnalysisError(
                "this analysis has no profiles: it was made with analyze(..., profile=False), "
                "which stops after segmentation. Run analyze(..., profile=True) (the default) "
                "to profile every segment configuration."
            )
        return self.profile_table

    def summary(self) -> str:
        lines = [
            self.graph.summary(),
            f"mesh {self.mesh}",
            self.block_analysis.summary(self.graph),
            self.segments.summary(),
            f"whole-step configurations: {self.config_count:.3g}; programs to profile "
            f"(Eq. 7): {self.program_counts.formula()}",
        ]
        if self.profile_table is not None:
            table = self.profile_table
            ok = int((table["status"] == "ok").sum())
            lines.append(
                f"profiled {len(table)} programs on {getattr(self.platform, 'name', '?')} "
                f"({self.backend}): {ok} ok, {len(table) - ok} infeasible, "
                f"{int(table['cached'].sum())} from the cache"
            )
        return "\n".join(lines)


def analyze(
    step: Callable[..., Any],
    *args: Any,
    mesh: Any = (4,),
    platform: Any = "a100-pcie-8",
    backend: str = "compiled",
    cache: str | Path | None = DEFAULT_CACHE,
    profile: bool = True,
    free_axes: bool = False,
    arg_roles: Sequence[str] | None = None,
    budget: int = DEFAULT_PROFILING_BUDGET,
    prune: bool = False,
    workers: int | None = None,
    progress: bool = True,
) -> Analysis:
    """Trace `step(*args)`, build ParallelBlocks and their strategies on `mesh`, segment the
    block sequence and (unless `profile=False`) profile every unique segment configuration and
    boundary with `backend` priced on `platform`. `cache=None` keeps nothing on disk."""
    from explorer.platforms import Platform, load_platform

    spec = mesh_spec(mesh)
    target = platform if isinstance(platform, Platform) else load_platform(platform)
    graph = trace(step, *args, arg_roles=arg_roles)
    blocks = build_space(build_blocks(graph, spec.size), spec, free_axes=free_axes)
    segments = build_segments(graph, blocks)
    analysis = Analysis(graph, blocks, segments, spec, step, tuple(args), target, backend)
    if not profile:
        return analysis
    from explorer.profile.cache import ProfileCache
    from explorer.profile.runner import profile_all

    with ProfileCache(cache) as store:
        table = profile_all(
            graph,
            blocks,
            segments,
            spec,
            platform=target,
            backend=backend,
            cache=store,
            budget=budget,
            prune=prune,
            workers=workers,
            progress=progress,
        )
    return Analysis(graph, blocks, segments, spec, step, tuple(args), target, backend, table)
