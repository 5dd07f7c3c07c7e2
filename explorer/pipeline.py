"""analyze(): the one place that chains the stages.

trace -> blocks -> space -> segments -> profile -> cost -> solve -> plan.
Each stage receives the previous artefact as an argument; this module only sequences them and
keeps what each produced, so nothing computed is lost when a later stage fails.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from explorer.baselines import baseline_choices, fsdp_parameter_layouts
from explorer.blocks import build_blocks
from explorer.cost import CostModel, build_cost_model
from explorer.errors import (
    AnalysisError,
    BackendError,
    InputError,
    MeshFitError,
    MeshFitWarning,
    PinError,
    PlatformError,
)
from explorer.ir import (
    BlockAnalysis,
    Config,
    DimAxes,
    DimRole,
    Graph,
    ParallelBlock,
    Segmentation,
)
from explorer.mesh import MeshLike, MeshSpec, mesh_spec, require_devices
from explorer.plan import Plan, make_plan
from explorer.segments import DEFAULT_PROFILING_BUDGET, ProgramCount, build_segments, program_count
from explorer.solve import Frontier, solve_frontier
from explorer.space import build_space, config_count, reshard_signatures
from explorer.trace import ArgRoles, trace
from explorer.units import BytesLike, parse_bytes

if TYPE_CHECKING:
    from explorer.platforms import Platform, PlatformLike
    from explorer.profile.profiles import Profiles

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
    profiled: Profiles | None = None  # profile_all's typed profiles
    cost_model: CostModel | None = None
    default_frontier: Frontier | None = None

    @property
    def blocks(self) -> tuple[ParallelBlock, ...]:
        return self.block_analysis.blocks

    @property
    def program_counts(self) -> ProgramCount:
        from explorer.layouts import instance_dependencies

        depends = instance_dependencies(self.graph, self.block_analysis, self.segments, self.mesh)
        reshards = reshard_signatures(self.graph, self.blocks, self.segments)
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
    def profiles(self) -> pd.DataFrame:
        return self._require_profiles().frame()

    @property
    def profile_table(self) -> pd.DataFrame | None:
        """The profiles as a table, or None without profiles (`profile=False`)."""
        return None if self.profiled is None else self.profiled.frame()

    def _require_profiles(self) -> Profiles:
        if self.profiled is None:
            raise AnalysisError(
                "this analysis has no profiles: it was made with analyze(..., profile=False), "
                "which stops after segmentation. Run analyze(..., profile=True) (the default) "
                "to profile every segment configuration."
            )
        return self.profiled

    @property
    def frontier(self) -> Frontier:
        """The time/memory Pareto frontier of composed plans (no pins; mixed configurations,
        uniform ones for a step with a scan: see `plan`)."""
        self._require_profiles()
        assert self.default_frontier is not None
        return self.default_frontier

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
        """The time/memory frontier under `pins` and `uniform` (see `plan`); solved once, then
        every budget is a lookup on it."""
        if uniform is not None and not isinstance(uniform, bool):
            raise InputError(
                f"uniform: expected True, False or None (the default for this step), found "
                f"{type(uniform).__name__} {uniform!r}"
            )
        solver_pins = self._solver_pins(pins)  # checked before anything is solved
        has_loops = bool(self.graph.loops)
        uniform = has_loops if uniform is None else uniform
        if not solver_pins and uniform == has_loops:
            return self.frontier
        return solve_frontier(self._model(), solver_pins, uniform)

    def plan_of(self, selection: Sequence[int], source: str = "manual") -> Plan:
        """The plan that takes option `selection[n]` (an index into the profiled
        configurations of instance n, as in `FrontierPoint.selection`) for every instance."""
        model = self._model()
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
        self, name: str, *, memory_budget: float | None = None, time_limit: float = 60.0
    ) -> Plan:
        """A template plan (`dp`, `megatron`, `fsdp`), priced by the same cost model; `fsdp`
        by compiling the whole step (its parameter layouts are not a block configuration), and
        so is a template whose configuration a restricted run (`only=`) did not profile.

        `alpa` solves the Alpa-style ILP over per-op strategies (explorer.alpa) on this mesh
        and platform. Its own objective is a communication-volume estimate on another scale
        than the profiles, so like `fsdp` its predicted time and memory are the whole step
        compiled under the plan (`evaluate`); the ILP's objective, size and status are kept
        in the plan's `ilp` field. `memory_budget` (bytes per device) and `time_limit`
        (seconds, the best feasible plan when reached) are the ILP's; templates ignore them.
        """
        if name == "alpa":
            return self._alpa_plan(memory_budget, time_limit)
        model = self._model()
        per_block = baseline_choices(name, self.block_analysis, self.segments)
        if name == "fsdp":
            return self._evaluated_plan(
                name, per_block, fsdp_parameter_layouts(self.graph, self.mesh)
            )
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
                return self._evaluated_plan(name, per_block, None)
            selection.append(found[0])
        return self._plan(name, tuple(selection), None)

    def _evaluated_plan(
        self, name: str, per_block: tuple[int, ...], layouts: dict[str, DimAxes] | None
    ) -> Plan:
        """A block configuration the profiles cannot price (FSDP's parameter layouts, or one
        a restricted run left out), priced by compiling the whole step under it."""
        documents = [
            {
                "label": i.label,
                "type": i.unique_id,
                "configuration": ",".join(
                    self.blocks[b].strategies[per_block[b]].name for b in i.blocks
                )
                or "none",
                "time": 0.0,
                "persistent_memory": 0,
                "transient_memory": 0,
                "saved_memory": 0,
                "gradient_memory": 0,
            }
            for i in self.segments.instances
        ]

        def plan_with(time: float, memory: int) -> Plan:
            return make_plan(
                source=name,
                graph=self.graph,
                blocks=self.block_analysis,
                segments=documents,
                config=Config(per_block),
                mesh=self.mesh,
                platform=self.platform,
                backend=self.backend,
                time=time,
                memory=memory,
                memory_eq9=memory,
                budget=None,
                parameter_layouts=layouts,
            )

        return self._priced_by_evaluation(plan_with)

    def _alpa_plan(self, memory_budget: float | None, time_limit: float) -> Plan:
        from explorer.alpa import solve_alpa
        from explorer.plan import make_layout_plan

        solution = solve_alpa(
            self.graph, self.mesh, self.platform, memory_budget=memory_budget, time_limit=time_limit
        )
        ilp = {
            "objective": solution.objective,
            "units": solution.units,
            "status": solution.status,
            "solve_seconds": solution.solve_seconds,
            "variables": solution.variables,
            "integer_variables": solution.integer_variables,
            "constraints": solution.constraints,
            "memory": solution.memory,
        }

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
                ilp=ilp,
            )

        return self._priced_by_evaluation(plan_with)

    def _priced_by_evaluation(self, plan_with: Callable[[float, int], Plan]) -> Plan:
        """A plan whose predictions are its whole step compiled and priced (`evaluate`)."""
        from explorer.plan import evaluate

        truth = evaluate(plan_with(0.0, 0), self.step, *self.args)
        return plan_with(truth.time, truth.memory)

    @property
    def platform_name(self) -> str:
        return str(getattr(self.platform, "name", self.platform))

    def _model(self) -> CostModel:
        self._require_profiles()
        assert self.cost_model is not None
        return self.cost_model

    def _solver_pins(self, pins: Mapping[Any, Any] | None) -> dict[int, dict[int, int]]:
        """`pins` as the solver takes them (instance -> block position -> strategy index),
        every entry checked: a `PinError` names the pin, what was expected and what exists."""
        if pins is None:
            return {}
        if not isinstance(pins, Mapping):
            raise PinError(
                f"pins: expected a dict such as {{3: 'N@x'}} (block index -> strategy) or "
                f"{{'layer': {{0: 'N@x'}}}} (segment type -> block position -> strategy), found "
                f"{type(pins).__name__} {pins!r}"
            )
        labels = sorted({u.label for u in self.segments.unique})
        out: dict[int, dict[int, int]] = {}
        for key, value in pins.items():
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise PinError(
                    f"pins: expected keys that are block indices (0..{len(self.blocks) - 1}) or "
                    f"segment type labels ({labels}), found {type(key).__name__} {key!r}"
                )
            if isinstance(key, int):
                if not 0 <= key < len(self.blocks):
                    raise PinError(
                        f"pins[{key!r}]: expected a block index 0..{len(self.blocks) - 1} or a "
                        f"segment type label ({labels}), found no block {key}"
                    )
                wanted = [
                    (n, inst.blocks.index(key), value)
                    for n, inst in enumerate(self.segments.instances)
                    if key in inst.blocks
                ]
            else:
                if key not in labels:
                    raise PinError(
                        f"pins[{key!r}]: expected a segment type label (one of {labels}) or a "
                        f"block index 0..{len(self.blocks) - 1}, found no type {key!r}"
                    )
                if not isinstance(value, Mapping):
                    raise PinError(
                        f"pins[{key!r}]: expected a dict of block position in the segment -> "
                        f"strategy name, such as {{0: 'N@x'}}, found {type(value).__name__} "
                        f"{value!r}"
                    )
                wanted = []
                for n, inst in enumerate(self.segments.instances):
                    if self.segments.unique[inst.unique_id].label != key:
                        continue
                    for pos, name in value.items():
                        if isinstance(pos, bool) or not isinstance(pos, int):
                            raise PinError(
                                f"pins[{key!r}]: expected int block positions, found "
                                f"{type(pos).__name__} {pos!r}"
                            )
                        if not 0 <= pos < len(inst.blocks):
                            raise PinError(
                                f"pins[{key!r}][{pos!r}]: expected a block position 0.."
                                f"{len(inst.blocks) - 1} of segment type {key!r}, found "
                                f"position {pos}"
                            )
                        wanted.append((n, pos, name))
            for n, pos, name in wanted:
                block = self.blocks[self.segments.instances[n].blocks[pos]]
                names = [s.name for s in block.strategies]
                if not isinstance(name, str) or name not in names:
                    raise PinError(
                        f"pins[{key!r}]: block {block.index} ({block.scope}) has no strategy "
                        f"{name!r}: expected one of {names}, found {name!r}"
                    )
                out.setdefault(n, {})[pos] = names.index(name)
        return out

    def _plan(self, source: str, selection: tuple[int, ...], budget: float | None) -> Plan:
        model = self._model()
        choices = [0] * len(self.blocks)
        documents = []
        for n, instance in enumerate(self.segments.instances):
            option = model.options[n][selection[n]]
            for block, choice in zip(instance.blocks, option.choices, strict=True):
                choices[block] = choice
            documents.append(
                {
                    "label": instance.label,
                    "type": instance.unique_id,
                    "configuration": option.name,
                    "time": option.time,
                    "persistent_memory": option.persistent,
                    "transient_memory": option.transient,
                    "saved_memory": option.saved,
                    "gradient_memory": option.gradients,
                }
            )
        return make_plan(
            source=source,
            graph=self.graph,
            blocks=self.block_analysis,
            segments=documents,
            config=Config(tuple(choices)),
            mesh=self.mesh,
            platform=self.platform,
            backend=self.backend,
            time=model.time(selection),
            memory=model.memory(selection),
            memory_eq9=model.memory_eq9(selection),
            budget=budget,
        )

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
        lines = [
            self.graph.summary(),
            self.graph.role_summary(),
            f"mesh {self.mesh}",
            self.block_analysis.summary(self.graph),
            self.segments.summary(),
            f"whole-step configurations: {self.config_count:.3g}; programs to profile "
            f"(Eq. 7): {self.program_counts.formula()}",
            self._placement_summary(),
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
    mesh: MeshLike = (4,),
    platform: PlatformLike = "a100-pcie-8",
    backend: str = "compiled",
    cache: str | Path | None = DEFAULT_CACHE,
    profile: bool = True,
    free_axes: bool = False,
    arg_roles: ArgRoles | None = None,
    budget: int = DEFAULT_PROFILING_BUDGET,
    workers: int | None = None,
    progress: bool = True,
    only: Callable[[str, str, str], bool] | None = None,
    cancel: threading.Event | None = None,
) -> Analysis:
    """Trace `step(*args)`, build ParallelBlocks and their strategies on `mesh`, segment the
    block sequence and (unless `profile=False`) profile every unique segment configuration and
    boundary with `backend` priced on `platform`. `cache=None` keeps nothing on disk.
    `budget` caps the configurations of one unique segment: a type over it is cut at its block
    boundaries into smaller types (a block alone over it is refused, naming the block).
    `only(kind, label, configuration)` restricts profiling (and so the plans) to the programs
    it accepts, for a quick look at part of the space. Setting `cancel` stops profiling:
    what finished stays in the cache and `ProfilingCancelled` says how much.

    Every argument is checked before the step is traced (an `InputError` naming it), and
    the mesh against the blocks before anything is profiled: a `MeshFitError` when no block
    can split over it, a `MeshFitWarning` naming the blocks that stay replicated."""
    spec, target = _checked_arguments(
        step,
        mesh=mesh,
        platform=platform,
        backend=backend,
        cache=cache,
        budget=budget,
        workers=workers,
        profile=profile,
        only=only,
        cancel=cancel,
    )
    graph = trace(step, *args, arg_roles=arg_roles)
    _check_platform_peaks(graph, target)
    blocks = build_space(build_blocks(graph, spec.size), spec, free_axes=free_axes)
    _check_mesh_fit(blocks, spec, free_axes)
    segments = build_segments(graph, blocks, cap=budget)
    analysis = Analysis(graph, blocks, segments, spec, step, tuple(args), target, backend)
    if not profile:
        return analysis
    from explorer.profile.cache import ProfileCache
    from explorer.profile.runner import profile_all

    with ProfileCache(cache) as store:
        profiled = profile_all(
            graph,
            blocks,
            segments,
            spec,
            platform=target,
            backend=backend,
            cache=store,
            config_cap=budget,
            workers=workers,
            progress=progress,
            only=only,
            cancel=cancel,
        )
    from explorer.layouts import instance_dependencies, loop_twins

    dependencies = instance_dependencies(graph, blocks, segments, spec)
    model = build_cost_model(segments, profiled, dependencies, loop_twins(graph, blocks.blocks))
    return Analysis(
        graph,
        blocks,
        segments,
        spec,
        step,
        tuple(args),
        target,
        backend,
        profiled,
        model,
        solve_frontier(model, uniform=bool(graph.loops)),  # see Analysis.plan
    )


def _check_platform_peaks(graph: Graph, platform: Any) -> None:
    """Before any compile: the platform prices every dtype the step multiplies in (its
    error names the file, the field and the dtype)."""
    from explorer.profile.compute import hlo_dtype

    contractions = ("dot_general", "conv_general_dilated")
    dtypes = {t.dtype for op in graph.ops if op.primitive in contractions for t in op.input_types}
    for dtype in sorted(dtypes):
        platform.peak_flops(hlo_dtype(dtype))


def _checked_arguments(
    step: Any,
    *,
    mesh: Any,
    platform: Any,
    backend: Any,
    cache: Any,
    budget: Any,
    workers: Any,
    profile: Any,
    only: Any,
    cancel: Any,
) -> tuple[MeshSpec, Platform]:
    """`analyze`'s arguments checked where they enter, before the step is traced: the mesh
    and platform normalised, every other argument's type and range."""
    from explorer.platforms import Platform, load_platform
    from explorer.profile.backends import Backend

    if not callable(step):
        raise InputError(
            f"analyze: argument 'step': expected the training step function, found "
            f"{type(step).__name__} {step!r}"
        )
    spec = mesh_spec(mesh)
    if backend not in tuple(Backend):
        raise BackendError(
            f"backend: expected one of {[b.value for b in Backend]}, found {backend!r}"
        )
    if isinstance(platform, Platform):
        target = platform
    elif isinstance(platform, (str, Path)):
        target = load_platform(platform)
    else:
        raise PlatformError(
            f"platform: expected a Platform (explorer.platforms.load_platform), a preset name "
            f"or the path of a platform JSON file, found {type(platform).__name__} {platform!r}"
        )
    if cache is not None and not isinstance(cache, (str, Path)):
        raise InputError(
            f"cache: expected the path of the profile cache file or None (keep nothing on "
            f"disk), found {type(cache).__name__} {cache!r}"
        )
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise InputError(
            f"budget: expected the profiling cap, an int >= 1 of configurations one unique "
            f"segment may have (default {DEFAULT_PROFILING_BUDGET}), found "
            f"{type(budget).__name__} {budget!r}; a memory budget in bytes goes to "
            "Analysis.plan(memory_budget=...)"
        )
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise InputError(
            f"workers: expected None (every core) or an int >= 1 of compile threads, found "
            f"{type(workers).__name__} {workers!r}"
        )
    if not isinstance(profile, bool):
        raise InputError(f"profile: expected True or False, found {type(profile).__name__}")
    if only is not None and not callable(only):
        raise InputError(
            f"only: expected None or a function (kind, label, configuration) -> bool, found "
            f"{type(only).__name__} {only!r}"
        )
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise InputError(
            f"cancel: expected None or a threading.Event, found {type(cancel).__name__}"
        )
    if profile:  # placing programs needs the devices; pricing them needs the platform's
        require_devices(spec)
        if spec.size > target.devices:
            raise PlatformError(
                f"mesh {spec}: expected at most the {target.devices} devices of platform "
                f"{target.name!r}, found a mesh of {spec.size}; use a smaller mesh or a "
                "larger platform (a preset, or a calibrated file)"
            )
    return spec, target


def _check_mesh_fit(blocks: BlockAnalysis, mesh: MeshSpec, free_axes: bool) -> None:
    """Before anything is profiled: a block whose head dims no mesh axis divides keeps only
    the replicated strategy. When every block does, no plan can use the mesh (an error, with
    the dims to fit); when some do, they compute on every device (a warning naming them)."""
    if not blocks.blocks:
        return  # a step without contractions has nothing to split: any mesh replicates it
    stuck = [b for b in blocks.blocks if all(not s.assignment for s in b.strategies)]
    if not stuck:
        return
    hint = ""
    if len(mesh.axes) > 1 and not free_axes:
        hint = (
            " On a 2-D mesh the batch is pinned to the outer axis by default; "
            "free_axes=True (--free-axes) lets each axis take any dim."
        )

    def dims(block: ParallelBlock) -> str:
        return ", ".join(f"{role.value}={size}" for role, size in block.role_sizes)

    listed = "; ".join(f"block {b.index} ({b.scope}: {dims(b)})" for b in stuck[:8])
    if len(stuck) > 8:
        listed += f"; ... and {len(stuck) - 8} more"
    # sizes that split the batch (M) of every such block: data parallelism, at least, fits
    batches = [n for b in stuck for role, n in b.role_sizes if role is DimRole.M]
    fitting = [p for p in range(2, 65) if batches and all(n % p == 0 for n in batches)]
    sizes = f" (axis sizes {fitting[:6]} divide their batch dim M)" if fitting else ""
    if len(stuck) == len(blocks.blocks):
        raise MeshFitError(
            f"mesh {mesh}: expected axis sizes that divide some dim of a block's head "
            f"contraction, found none that does, so every plan would run the whole step on "
            f"every device: {listed}. Use a mesh whose sizes divide these dims{sizes}.{hint}"
        )
    contractions = sum(len(b.ops) for b in stuck)
    warnings.warn(
        f"mesh {mesh}: {len(stuck)} of {len(blocks.blocks)} blocks, holding {contractions} of "
        f"the blocks' {sum(len(b.ops) for b in blocks.blocks)} ops, can split over no axis (no "
        f"axis size divides a dim of their head) and stay replicated on every device: "
        f"{listed}. A mesh whose sizes divide these dims lets them split{sizes}.{hint}",
        MeshFitWarning,
        stacklevel=3,
    )
