"""The grid's training steps, each built and traced once in a process.

The grid runs each step (a model at one batch and precision) on several meshes, and tracing a
7B model takes seconds. The trace does not depend on the mesh, so a process that runs or counts
several cases of one step keeps that step and its graph for the next (`StepTraces`), and
`analyze(..., traced=graph)` checks it against the arguments before using it. What tracing
took is kept beside it, so that every case reports its search cost as if it had traced the
step itself.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # explorer is imported where a case runs, once XLA's device flags are set
    from benchmarks.paper_grid import PaperCase
    from explorer.ir.graph import Graph


@dataclass(frozen=True, slots=True)
class TracedStep:
    """One step of the grid, its abstract arguments and its traced graph."""

    step: Callable[..., Any]
    args: tuple[Any, ...]
    graph: Graph
    trace_s: float  # what building and tracing it took, once


class StepTraces:
    """The steps of the last `keep` step keys (`PaperCase.step_key`) this process used: a
    graph of a 7B model holds some hundred MB, so only a few stay (a worker is given the
    cases of the step it holds first; a case of another step between two of one keeps it)."""

    def __init__(self, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep: expected at least one step, found {keep}")
        self._keep = keep
        self._steps: OrderedDict[tuple[Any, ...], TracedStep] = OrderedDict()
        self.traced = 0  # steps traced so far (the rest of the cases reused one)

    def of(self, case: PaperCase) -> TracedStep:
        """`case`'s step, traced here or by an earlier case of the same step."""
        key = case.step_key
        if key in self._steps:
            self._steps.move_to_end(key)
            return self._steps[key]
        from explorer.trace import trace

        start = time.perf_counter()
        step, args = case.build_step()
        graph = trace(step, *args)
        traced = TracedStep(step, tuple(args), graph, time.perf_counter() - start)
        self.traced += 1
        self._steps[key] = traced
        while len(self._steps) > self._keep:
            self._steps.popitem(last=False)
        return traced
