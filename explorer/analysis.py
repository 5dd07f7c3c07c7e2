"""What `analyze` produces. `SegmentedStep` is the step traced, grouped into blocks with
their strategies on the mesh, and segmented (`analyze(..., profile=False)` stops there);
`Analysis` adds the profiles of every segment configuration, the cost model built from them
and its frontier, and answers for plans: the fastest within a memory budget, under pins, a
chosen selection, or a baseline priced the same way."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from explorer.baselines import baseline_choices, fsdp_parameter_layouts
from explorer.cost import CostModel
from explorer.errors import AnalysisError, InputError, NotProfiledError
from explorer.frontier_store import SolvedFrontier, solve_kept
from explorer.ir import BlockAnalysis, Config, DimAxes, Graph, ParallelBlock, Segmentation
from explorer.mesh import MeshSpec
from explorer.pins import solver_pins
from explorer.plan import Plan, make_plan
from explorer.plan_build import unpriced_segments
from explorer.plan_space import plan_rules
from explorer.plan_types import InstanceChoice, SpaceOptions
from explorer.segments import ProgramCount, program_count
from explorer.solve import Frontier
from explorer.space import config_count, reshard_signatures
from explorer.units import BytesLike, parse_bytes

if TYPE_CHECKING:
    from explorer.alpa import IlpAnswerStore
    from explorer.evaluation_store import EvaluationStore
    from explorer.platforms import Platform
    from explorer.profile.profiles import Profiles


@dataclass(frozen=True, slots=True)
class SegmentedStep:
    """The step traced, its blocks and strategies on `mesh`, and its segments: what
    `analyze(..., profile=False)` returns. Nothing is profiled, so it has no plans."""

    graph: Graph
    block_analysis: BlockAnalysis
    segments: Segmentation
    mesh: MeshSpec
    step: Callable[..., Any]
    args: tuple[Any, ...]
    platform: Platform
    backend: str
    # what `analyze` searched beyond the paper's space, and its cap: recorded by a plan
    # whose names do not tell it (`plan_space.recorded_space`)
    space: SpaceOptions

    @property
    def profiled(self) -> bool:
        """Whether every segment configuration was profiled (an `Analysis`)."""
        return False

    @property
    def blocks(self) -> tuple[ParallelBlock, ...]:
        return self.block_analysis.blocks

    def _boundary_rules(self) -> tuple[str, ...]:
        """The boundary and cut rules that changed how this segmentation's boundaries are
        placed (`space.changed_boundary_rules`, `plan_space.cut_rules`), recorded in its
        plans: computed here, where few plans are made; an `Analysis` computes them once."""
        return plan_rules(
            self.graph, self.block_analysis, self.segments, self.mesh, self.space.config_cap
        )

    @property
    def program_counts(self) -> ProgramCount:
        from explorer.layouts import instance_dependencies

        depends = instance_dependencies(self.graph, self.block_analysis, self.segments, self.mesh)
        reshards = reshard_signatures(self.graph, self.blocks, self.segments, self.mesh)
        return program_count(self.segments, self.block_analysis, depends, reshards)

    @property
    def program_count(self) -> int:
        """Programs to profile: the paper's Eq. 7 (independent of depth)."""
        return self.program_counts.total

    @property
    def config_count(self) -> int:
        """Configurations of the whole step: what profiling without segments would face."""
        return config_count(self.blocks)

    @property
    def platform_name(self) -> str:
        return self.platform.name

    def unplaced_ops(self) -> tuple[int, ...]:
        """Ops outside every block whose dependencies the affine analysis does not know: the
        follow rule cannot place them, so their results stay replicated (whatever the
        configuration) and a split operand is gathered first."""
        from explorer.layouts import place

        zero = Config((0,) * len(self.blocks))
        return place(self.graph, self.blocks, zero, self.mesh, self.segments).unplaced

    def _placement_summary(self) -> str:
        unplaced = self.unplaced_ops()
        if not unplaced:
            return "placement: every value follows a block (no op left to the compiler)"
        kinds = Counter(self.graph.ops[o].primitive for o in unplaced)
        listed = ", ".join(f"{name} x{n}" for name, n in kinds.most_common())
        return (
            f"placement: {len(unplaced)} ops the follow rule cannot place (results "
            f"replicated): {listed}"
        )

    def summary(self) -> str:
        return "\n".join(self._summary_lines())

    def _summary_lines(self) -> list[str]:
        return [
            self.graph.summary(),
            self.graph.role_summary(),
            f"mesh {self.mesh}",
            self.block_analysis.summary(self.graph),
            self.segments.summary(),
            f"whole-step configurations: {self.config_count:.3g}; programs to profile "
            f"(Eq. 7): {self.program_counts.formula()}",
            self._placement_summary(),
        ]

    def baseline(
        self,
        name: str,
        *,
        memory_budget: float | None = None,
        time_limit: float = 60.0,
        evaluations: EvaluationStore | None = None,
        ilp_answers: IlpAnswerStore | None = None,
    ) -> Plan:
        """A baseline plan priced by compiling the whole step under it (`evaluate`): the
        templates `dp`, `megatron` and `fsdp`, or `alpa`, the Alpa-style ILP over per-op
        strategies (explorer.alpa) on this mesh and platform. No profiles are needed; a
        profiled `Analysis` prices `dp` and `megatron` by its cost model instead.

        The ILP's own objective is a communication-volume estimate on another scale than the
        profiles, so its predicted time and memory are the whole step compiled under the plan
        too; the ILP's objective, size and status are kept in the plan's `ilp` field.
        `memory_budget` (bytes per device) and `time_limit` (seconds, the best feasible plan
        when reached) are the ILP's; templates ignore them. `evaluations` keeps the compiled
        whole steps across runs, `ilp_answers` the ILP's answers (without them: computed)."""
        if name == "alpa":
            return self._alpa_plan(memory_budget, time_limit, evaluations, ilp_answers)
        per_block = baseline_choices(name, self.block_analysis, self.segments)
        layouts = fsdp_parameter_layouts(self.graph, self.mesh) if name == "fsdp" else None
        return self._evaluated_plan(name, per_block, layouts, evaluations)

    def _evaluated_plan(
        self,
        name: str,
        per_block: tuple[int, ...],
        layouts: dict[str, DimAxes] | None,
        evaluations: EvaluationStore | None = None,
    ) -> Plan:
        """A block configuration the profiles cannot price (FSDP's parameter layouts, or one
        a restricted run left out), priced by compiling the whole step under it."""
        names = [b.strategies[c].name for b, c in zip(self.blocks, per_block, strict=True)]
        segments = unpriced_segments(self.segments, names)
        rules = self._boundary_rules()

        def plan_with(time: float, memory: int) -> Plan:
            return make_plan(
                source=name,
                graph=self.graph,
                blocks=self.block_analysis,
                segments=segments,
                config=Config(per_block),
                mesh=self.mesh,
                platform=self.platform,
                backend=self.backend,
                time=time,
                memory=memory,
                memory_eq9=memory,
                budget=None,
                parameter_layouts=layouts,
                boundary_rules=rules,
                space=self.space,
                segmentation=self.segments,
            )

        return self._priced_by_evaluation(plan_with, evaluations)

    def _alpa_plan(
        self,
        memory_budget: float | None,
        time_limit: float,
        evaluations: EvaluationStore | None,
        ilp_answers: IlpAnswerStore | None,
    ) -> Plan:
        from explorer.alpa import solve_alpa_kept
        from explorer.plan import make_layout_plan

        solution = solve_alpa_kept(
            self.graph,
            self.mesh,
            self.platform,
            memory_budget=memory_budget,
            time_limit=time_limit,
            store=ilp_answers,
        )

        def plan_with(time: float, memory: int) -> Plan:
            return make_layout_plan(
                source="alpa",
                graph=self.graph,
                blocks=self.block_analysis,
                segmentation=self.segments,
                mesh=self.mesh,
                platform=self.platform,
                backend=self.backend,
                time=time,
                memory=memory,
                budget=None,
                values=solution.layout_map(),
                operands={(o, p): d for o, p, d in solution.operands},
                op_strategies=dict(solution.strategies),
                ilp=solution.report,
            )

        return self._priced_by_evaluation(plan_with, evaluations)

    def _priced_by_evaluation(
        self, plan_with: Callable[[float, int], Plan], evaluations: EvaluationStore | None
    ) -> Plan:
        """A plan whose predictions are its whole step compiled and priced (`evaluate`)."""
        from explorer.plan import evaluate

        truth = evaluate(plan_with(0.0, 0), self.step, *self.args, store=evaluations)
        return plan_with(truth.time, truth.memory)

    if not TYPE_CHECKING:  # hidden from the type checker, so a typo stays a type error

        def __getattr__(self, name: str) -> Any:
            if name in PROFILED_ONLY:
                raise NotProfiledError(
                    f"{name}: this analysis has no profiles: it was made with "
                    "analyze(..., profile=False), which stops after segmentation. Run "
                    "analyze(..., profile=True) (the default) to profile every segment "
                    "configuration."
                )
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


@dataclass(frozen=True, slots=True)
class Analysis(SegmentedStep):
    """A segmented step with every segment configuration and boundary profiled on the
    platform, the cost model composed from the profiles, and its time/memory frontier."""

    profile_records: Profiles  # every profiled program, typed: what the cost model read
    cost_model: CostModel
    # the frontier with no pins, and what solving it cost (kept from an earlier run or not)
    default_solve: SolvedFrontier
    # where frontiers under pins are kept too (`frontier_store`); None: nowhere
    frontier_store: Path | None = None
    # bytes: every frontier's, where the space is too wide to solve exactly (`analyze`)
    memory_resolution: int = 0
    # `space.changed_boundary_rules` and `plan_space.cut_rules` of the segmentation, recorded
    # in every plan made here
    boundary_rules: tuple[str, ...] = ()

    def _boundary_rules(self) -> tuple[str, ...]:
        return self.boundary_rules

    @property
    def profiled(self) -> bool:
        return True

    @property
    def profiles(self) -> pd.DataFrame:
        """Every profiled program, a row each: a view for display."""
        return self.profile_records.frame()

    @property
    def frontier(self) -> Frontier:
        """The time/memory Pareto frontier of composed plans (no pins; mixed configurations,
        uniform ones for a step with a scan: see `plan`)."""
        return self.default_solve.frontier

    @property
    def solve_seconds(self) -> float:
        """What solving the default frontier took, in the run that solved it (an earlier
        one's where the frontier store kept it: `frontier_kept`)."""
        return self.default_solve.seconds

    @property
    def frontier_kept(self) -> bool:
        """Whether the default frontier was read from the frontier store, not solved."""
        return self.default_solve.kept

    def plan(
        self,
        memory_budget: BytesLike | None = None,
        pins: Mapping[Any, Any] | None = None,
        uniform: bool | None = None,
    ) -> Plan:
        """The fastest plan whose predicted memory fits `memory_budget` bytes per device
        (an int, or a string with a unit: `"12GiB"`, `"512 MB"`; see `explorer.units`).

        `pins` force strategies: `{block_index: "N@x"}` for one block, or
        `{"layer": {0: "N@x"}}` for the first block of every instance of a segment type.
        `uniform=True` gives every instance of a segment type the same configuration. It is
        the default (`None`) for a step with a `scan` (`Graph.loops`): the applied step keeps
        the scan, whose iterations share one configuration; `False` elsewhere.
        """
        budget = None if memory_budget is None else parse_bytes(memory_budget, "memory_budget")
        frontier = self.frontier_for(pins, uniform)
        point = frontier.points[-1] if budget is None else frontier.query(budget)
        return self._plan("cfp", point.selection, budget)

    def frontier_for(
        self, pins: Mapping[Any, Any] | None = None, uniform: bool | None = None
    ) -> Frontier:
        """The time/memory frontier under `pins` and `uniform` (see `plan`); solved once (and
        kept beside the profile cache, like the default frontier), then every budget is a
        lookup on it."""
        if uniform is not None and not isinstance(uniform, bool):
            raise InputError(
                f"uniform: expected True, False or None (the default for this step), found "
                f"{type(uniform).__name__} {uniform!r}"
            )
        pinned = solver_pins(pins, self.block_analysis, self.segments)  # checked before solving
        has_loops = bool(self.graph.loops)
        uniform = has_loops if uniform is None else uniform
        if not pinned and uniform == has_loops:
            return self.frontier
        return solve_kept(
            self.cost_model,
            pinned,
            uniform,
            store_path=self.frontier_store,
            memory_resolution=self.memory_resolution,
        ).frontier

    def plan_of(self, selection: Sequence[int], source: str = "manual") -> Plan:
        """The plan that takes option `selection[n]` (an index into the profiled
        configurations of instance n, as in `FrontierPoint.selection`) for every instance."""
        model = self.cost_model
        if len(selection) != len(model.options):
            raise AnalysisError(
                f"plan_of: expected one option index per segment instance "
                f"({len(model.options)}), found {len(selection)}"
            )
        for n, index in enumerate(selection):
            if not 0 <= index < len(model.options[n]):
                raise AnalysisError(
                    f"plan_of: instance {n} ({model.labels[n]}) has options "
                    f"0..{len(model.options[n]) - 1}, found {index}"
                )
        reason = model.inconsistency(selection)
        if reason is not None:
            raise AnalysisError(
                f"plan_of: this selection is not one program: {reason}. Pick the option of "
                "that instance profiled under the strategies chosen (see Option.context)."
            )
        return self._plan(source, tuple(int(i) for i in selection), None)

    def baseline(
        self,
        name: str,
        *,
        memory_budget: float | None = None,
        time_limit: float = 60.0,
        evaluations: EvaluationStore | None = None,
        ilp_answers: IlpAnswerStore | None = None,
    ) -> Plan:
        """A template plan (`dp`, `megatron`, `fsdp`) priced by the same cost model where the
        profiles hold it; `fsdp` (its parameter layouts are not a block configuration) and a
        template a restricted run (`only=`) did not profile by compiling the whole step.
        `alpa` and the stores are as for a `SegmentedStep`."""
        if name in ("alpa", "fsdp"):
            return SegmentedStep.baseline(
                self,
                name,
                memory_budget=memory_budget,
                time_limit=time_limit,
                evaluations=evaluations,
                ilp_answers=ilp_answers,
            )
        model = self.cost_model
        per_block = baseline_choices(name, self.block_analysis, self.segments)
        selection = []
        for n, instance in enumerate(self.segments.instances):
            wanted = tuple(per_block[b] for b in instance.blocks)
            context = tuple(per_block[b] for b in model.dependencies[n])
            found = [
                i
                for i, o in enumerate(model.options[n])
                if o.choices == wanted and o.context == context
            ]
            if not found:
                # a restricted run (`only=`) may not hold the template: price it on the whole step
                return SegmentedStep.baseline(self, name, evaluations=evaluations)
            selection.append(found[0])
        return self._plan(name, tuple(selection), None)

    def _plan(self, source: str, selection: tuple[int, ...], budget: float | None) -> Plan:
        model = self.cost_model
        choices = [0] * len(self.blocks)
        segments = []
        for n, instance in enumerate(self.segments.instances):
            option = model.options[n][selection[n]]
            for block, choice in zip(instance.blocks, option.choices, strict=True):
                choices[block] = choice
            segments.append(
                InstanceChoice(
                    label=instance.label,
                    type=instance.unique_id,
                    configuration=option.name,
                    time=option.time,
                    persistent_memory=option.persistent,
                    transient_memory=option.transient,
                    saved_memory=option.saved,
                    gradient_memory=option.gradients,
                )
            )
        return make_plan(
            source=source,
            graph=self.graph,
            blocks=self.block_analysis,
            segments=segments,
            config=Config(tuple(choices)),
            mesh=self.mesh,
            platform=self.platform,
            backend=self.backend,
            time=model.time(selection),
            memory=model.memory(selection),
            memory_eq9=model.memory_eq9(selection),
            budget=budget,
            boundary_rules=self.boundary_rules,
            space=self.space,
            segmentation=self.segments,
        )

    def _summary_lines(self) -> list[str]:
        lines = SegmentedStep._summary_lines(self)
        records = self.profile_records.entries
        ok = sum(1 for r in records if r.ok)
        lines.append(
            f"profiled {len(records)} programs on {self.platform.name} "
            f"({self.backend}): {ok} ok, {len(records) - ok} infeasible, "
            f"{sum(1 for r in records if r.cached)} from the cache"
        )
        return lines


# what only a profiled analysis has: asked of a `SegmentedStep`, each is a `NotProfiledError`
PROFILED_ONLY = frozenset(
    name for name in dir(Analysis) if not name.startswith("_") and not hasattr(SegmentedStep, name)
)
