"""analyze(): the one place that chains the stages.

trace -> blocks -> space -> segments (-> profile -> cost -> solve, as those stages land).
Each stage receives the previous artefact as an argument; this module only sequences them and
keeps what each produced, so nothing computed is lost when a later stage fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from explorer.blocks import build_blocks
from explorer.errors import AnalysisError
from explorer.ir import BlockAnalysis, Graph, ParallelBlock, Segmentation
from explorer.mesh import MeshSpec, mesh_spec
from explorer.segments import ProgramCount, build_segments, program_count
from explorer.space import build_space, config_count
from explorer.trace import trace


@dataclass(frozen=True, slots=True)
class Analysis:
    """Everything the pipeline produced for one step, mesh and platform."""

    graph: Graph
    block_analysis: BlockAnalysis
    segments: Segmentation
    mesh: MeshSpec
    step: Callable[..., Any]
    args: tuple[Any, ...]

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
    def profiles(self) -> Any:
        raise AnalysisError(
            "this analysis has no profiles: the profiler stage is not part of this build yet "
            "(analyze(..., profile=False) stops after segmentation)"
        )

    def summary(self) -> str:
        return (
            f"{self.graph.summary()}\nmesh {self.mesh}\n"
            f"{self.block_analysis.summary(self.graph)}\n"
            f"{self.segments.summary()}\n"
            f"whole-step configurations: {self.config_count:.3g}; programs to profile "
            f"(Eq. 7): {self.program_counts.formula()}"
        )


def analyze(
    step: Callable[..., Any],
    *args: Any,
    mesh: Any = (4,),
    free_axes: bool = False,
    arg_roles: Sequence[str] | None = None,
    profile: bool = False,
) -> Analysis:
    """Trace `step(*args)`, build ParallelBlocks, their strategies on `mesh`, and segments."""
    spec = mesh_spec(mesh)
    graph = trace(step, *args, arg_roles=arg_roles)
    blocks = build_space(build_blocks(graph, spec.size), spec, free_axes=free_axes)
    segments = build_segments(graph, blocks)
    analysis = Analysis(graph, blocks, segments, spec, step, tuple(args))
    if profile:
        raise AnalysisError(
            "profile=True: profiling segment configurations is not implemented in this build; "
            "use analyze(..., profile=False) for graph, blocks, strategies and segments"
        )
    return analysis
