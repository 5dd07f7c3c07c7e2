"""Plans: what the solver chose, as versioned JSON that applies back to the step.

A plan carries the mesh, the platform and backend it was priced on, the model's fingerprint,
one configuration per segment instance, one strategy per block with the `PartitionSpec` of
every value the block owns, a `PartitionSpec` per parameter, and the predicted time and memory.
A per-op plan (the Alpa-style ILP) also carries a `PartitionSpec` for every value (`values`,
by value id) and for what each contraction reads (`operands`, by "op:position"); when
`values` is present it, not the block strategies, is what applies.
`apply_plan` re-traces the user's step, checks it is the model the plan was made for, and
returns a jitted sharded step with the same signature. `evaluate` compiles the whole step under
the plan and prices it on the plan's platform: the ground truth predictions are judged on.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import jax

from explorer import _jax_compat as jc
from explorer.blocks import build_blocks
from explorer.errors import MeshError, PlanError
from explorer.evaluation_store import active_store, layout_digest, platform_key
from explorer.ir import (
    BlockAnalysis,
    Config,
    DimAxes,
    Graph,
    ParallelBlock,
    Segmentation,
    ShardingAssignment,
    TensorType,
    ValueKind,
)
from explorer.jsonfile import read_json_file
from explorer.layouts import place
from explorer.mesh import MeshSpec, make_mesh, spec_to_json
from explorer.realize import realize
from explorer.segments import build_segments
from explorer.space import build_space, shardings
from explorer.trace import trace

if TYPE_CHECKING:
    from explorer.platforms import Platform, PlatformLike

# what `evaluate_on` is given per platform, and keys its answers by
PlatformKey = TypeVar("PlatformKey", bound="Platform | str | Path")

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "assets" / "plan.schema.json"
# Bounds on a plan file, far above what the explorer writes (a per-op plan of a 48-layer
# model is a few MiB, nested 6 levels): a file past them is not a plan.
MAX_PLAN_BYTES = 64 * 2**20
MAX_PLAN_DEPTH = 16


@dataclass(frozen=True, slots=True)
class Plan:
    """A validated plan document (see assets/plan.schema.json)."""

    document: dict[str, Any]

    @property
    def time(self) -> float:
        """Predicted seconds per training step."""
        return float(self.document["predicted"]["time"])

    @property
    def memory(self) -> int:
        """Predicted peak bytes per device."""
        return int(self.document["predicted"]["memory"])

    @property
    def source(self) -> str:
        return str(self.document["source"])

    @property
    def mesh(self) -> MeshSpec:
        mesh = self.document["mesh"]
        return MeshSpec(tuple(zip(mesh["axes"], mesh["shape"], strict=True)))

    @property
    def platform(self) -> Platform:
        """The platform the plan was priced on, as the plan records it (`platform_spec`): a
        scaled or calibrated platform too. A plan written before platforms were recorded in
        full names a preset only; a name that is no preset is an error, never a file read."""
        from explorer.platforms import PlatformError, list_platforms, load_platform
        from explorer.platforms import platform_from_json

        spec = self.document.get("platform_spec")
        if spec is not None:
            try:
                return platform_from_json(spec)
            except PlatformError as err:
                raise PlanError(f"field 'platform_spec': {err}") from None
        name = self.document["platform"]
        if name not in list_platforms():
            raise PlanError(
                f"field 'platform_spec': expected the platform the plan was priced on, found "
                f"it missing and 'platform' {name!r}, which is no preset "
                f"({list_platforms()}); re-export the plan with this explorer"
            )
        return load_platform(name)

    @property
    def strategies(self) -> tuple[str, ...]:
        return tuple(b["strategy"] for b in self.document["blocks"])

    def save(self, path: str | Path) -> Path:
        target = writable_path(path)
        _validate(self.document, "<plan to save>")
        text = json.dumps(self.document, indent=1, sort_keys=True) + "\n"
        try:
            target.write_text(text)
        except OSError as err:  # the disk filled, or the file was locked since the check
            raise PlanError(
                f"plan file {target}: cannot be written ({err.strerror or err})"
            ) from None
        return target

    def to_json(self) -> str:
        _validate(self.document, "<plan to export>")
        return json.dumps(self.document, indent=1, sort_keys=True)

    def summary(self) -> str:
        return (
            f"{self.source} plan on mesh {self.mesh} ({self.document['platform']}, "
            f"{self.document['backend']}): {1e3 * self.time:.3f} ms/step, "
            f"{self.memory / 2**30:.3f} GiB/device"
        )


def writable_path(path: str | Path, field: str = "path") -> Path:
    """`path` checked as a place to write a plan file, before anything is computed for it:
    not a directory, its folder made if missing, and the file opened for writing (a file made
    by the check alone is removed again). A `PlanError` naming `field` otherwise."""
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise PlanError(f"{field}: expected the path of a JSON file to write, found {path!r}")
    target = Path(path).expanduser()
    if target.is_dir():
        raise PlanError(
            f"{field}: expected the path of a file to write the plan to, found the directory "
            f"{target}; give a file name such as {target / 'plan.json'}"
        )
    existed = target.exists()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a"):
            pass
    except OSError as err:
        raise PlanError(
            f"{field}: expected a path where a plan file can be written, found {target}, "
            f"where it cannot ({err.strerror or err}); choose a path in a folder you can "
            "write to"
        ) from None
    if not existed:
        target.unlink(missing_ok=True)
    return target


def model_fingerprint(graph: Graph) -> str:
    """Identity of a traced step: every op, its params and its shapes, in order."""
    hasher = hashlib.sha256()
    for op in graph.ops:
        hasher.update(repr((op.primitive, op.params, [str(t) for t in op.input_types])).encode())
    return hasher.hexdigest()[:16]


def make_plan(
    *,
    source: str,
    graph: Graph,
    blocks: BlockAnalysis,
    segments: Sequence[dict[str, Any]],
    config: Config,
    mesh: MeshSpec,
    platform: PlatformLike,
    backend: str,
    time: float,
    memory: int,
    memory_eq9: int,
    budget: float | None,
    parameter_layouts: dict[str, DimAxes] | None = None,
) -> Plan:
    assignment = shardings(graph, blocks.blocks, config, mesh, parameter_layouts)
    values = dict(assignment.values)
    inputs = dict(zip(graph.inputs, assignment.inputs, strict=True))
    block_docs = []
    for block, choice in zip(blocks.blocks, config.choices, strict=True):
        head = graph.ops[block.head]
        owned = {
            # membership, not truth: a rank-0 value's layout is `()`, falsy but present
            str(layout.value): spec_to_json(
                values[layout.value] if layout.value in values else inputs[layout.value]
            )
            for layout in block.layouts
            if layout.value in values or layout.value in inputs
        }
        block_docs.append(
            {
                "index": block.index,
                "scope": block.scope,
                "head": f"{head.input_types[0]} x {head.input_types[1]}",
                "strategy": block.strategies[choice].name,
                "values": owned,
            }
        )
    parameters = {
        graph.values[vid].path: spec_to_json(dims)
        for vid, dims in inputs.items()
        if graph.values[vid].kind is ValueKind.PARAMETER
    }
    return _finish(
        source=source,
        graph=graph,
        mesh=mesh,
        platform=platform,
        backend=backend,
        segments=segments,
        block_docs=block_docs,
        parameters=parameters,
        time=time,
        memory=memory,
        memory_eq9=memory_eq9,
        budget=budget,
    )


def make_layout_plan(
    *,
    source: str,
    graph: Graph,
    blocks: BlockAnalysis,
    segmentation: Segmentation,
    mesh: MeshSpec,
    platform: PlatformLike,
    backend: str,
    time: float,
    memory: int,
    budget: float | None,
    values: Mapping[int, DimAxes],
    operands: Mapping[tuple[int, int], DimAxes],
    op_strategies: Mapping[int, str],
    ilp: dict[str, Any] | None = None,
) -> Plan:
    """A per-op plan: a layout for every value (step inputs included) and for what each
    contraction reads. Blocks and segments are reported for display only: each block under
    the strategy its head contraction took (prefixed with `source`)."""
    replicated = ((),)

    def layout(vid: int) -> DimAxes:
        return values.get(vid, replicated * graph.values[vid].type.rank)

    block_docs = []
    names = []
    for block in blocks.blocks:
        head = graph.ops[block.head]
        name = f"{source}:{op_strategies.get(block.head, 'R')}"
        names.append(name)
        block_docs.append(
            {
                "index": block.index,
                "scope": block.scope,
                "head": f"{head.input_types[0]} x {head.input_types[1]}",
                "strategy": name,
                "values": {str(v.value): spec_to_json(layout(v.value)) for v in block.layouts},
            }
        )
    segments = [
        {
            "label": instance.label,
            "type": instance.unique_id,
            "configuration": ",".join(names[b] for b in instance.blocks) or "none",
            "time": 0.0,
            "persistent_memory": 0,
            "transient_memory": 0,
            "saved_memory": 0,
            "gradient_memory": 0,
        }
        for instance in segmentation.instances
    ]
    parameters = {
        value.path: spec_to_json(layout(value.id))
        for value in graph.inputs_of_kind(ValueKind.PARAMETER)
    }
    extra: dict[str, Any] = {
        "values": {str(v): spec_to_json(d) for v, d in sorted(values.items())},
        "operands": {f"{o}:{p}": spec_to_json(d) for (o, p), d in sorted(operands.items())},
    }
    if ilp is not None:
        extra["ilp"] = ilp
    return _finish(
        source=source,
        graph=graph,
        mesh=mesh,
        platform=platform,
        backend=backend,
        segments=segments,
        block_docs=block_docs,
        parameters=parameters,
        time=time,
        memory=memory,
        memory_eq9=memory,
        budget=budget,
        extra=extra,
    )


def _finish(
    *,
    source: str,
    graph: Graph,
    mesh: MeshSpec,
    platform: PlatformLike,
    backend: str,
    segments: Sequence[dict[str, Any]],
    block_docs: list[dict[str, Any]],
    parameters: dict[str, Any],
    time: float,
    memory: int,
    memory_eq9: int,
    budget: float | None,
    extra: dict[str, Any] | None = None,
) -> Plan:
    from explorer import __version__
    from explorer.platforms import resolve_platform

    priced_on = resolve_platform(platform)
    document = {
        "schema_version": SCHEMA_VERSION,
        "source": source,
        "mesh": {"axes": list(mesh.names), "shape": list(mesh.shape)},
        "device_count": mesh.size,
        "platform": priced_on.name,
        # in full: a scaled or calibrated platform has no file a name could be resolved to
        "platform_spec": priced_on.to_json(),
        "backend": backend,
        "model_fingerprint": model_fingerprint(graph),
        "segments": list(segments),
        "blocks": block_docs,
        "parameters": parameters,
        "predicted": {
            "time": time,
            "memory": int(memory),
            "memory_eq9": int(memory_eq9),
            "budget": budget,
        },
        "versions": {"explorer": __version__, "jax": jax.__version__},
        **(extra or {}),
    }
    # Not validated here: the solver builds one per slider step, and validating a plan of a
    # 48-layer model takes a second. What leaves the process (save, to_json) and what comes
    # in (load_plan) is validated.
    if budget is not None and memory > budget:
        raise PlanError(f"plan memory {memory} exceeds its budget {budget}")
    return Plan(document)


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file. Loading parses JSON only: it never executes code."""
    if not isinstance(path, (str, Path)):
        raise PlanError(f"load_plan: expected a file path, found {type(path).__name__} {path!r}")
    where = f"plan file {Path(path).expanduser()}"
    document = read_json_file(
        path, what="plan file", error=PlanError, max_bytes=MAX_PLAN_BYTES, max_depth=MAX_PLAN_DEPTH
    )
    if not isinstance(document, dict):
        raise PlanError(f"{where}: expected a JSON object, found {type(document).__name__}")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise PlanError(
            f"{where}: field 'schema_version' is {version!r}: expected {SCHEMA_VERSION}, the "
            f"version this explorer reads, found a plan of version {version!r}. Re-export the "
            "plan with this version."
        )
    _validate(document, where)
    _check_consistent(document, where)
    return Plan(document)


def _check_consistent(document: dict[str, Any], where: str) -> None:
    """What the schema cannot say: the mesh is one (as many names as sizes, ASCII identifier
    names), `device_count` is its size, and every layout names only its axes."""
    mesh = document["mesh"]
    axes, shape = mesh["axes"], mesh["shape"]
    if len(axes) != len(shape):
        raise PlanError(
            f"{where}: field 'mesh': expected as many axis names as sizes, found axes {axes} "
            f"and shape {shape}"
        )
    try:
        spec = MeshSpec(tuple(zip(axes, shape, strict=True)))
    except MeshError as err:
        raise PlanError(f"{where}: field 'mesh': {err}") from None
    if document["device_count"] != spec.size:
        raise PlanError(
            f"{where}: field 'device_count': expected {spec.size}, the size of mesh {spec}, "
            f"found {document['device_count']}; the file was edited or damaged, re-export "
            "the plan"
        )
    if "platform_spec" in document:
        try:
            recorded = Plan(document).platform
        except PlanError as err:  # named the field; the file is named here
            raise PlanError(f"{where}: {err}") from None
        if recorded.name != document["platform"]:
            raise PlanError(
                f"{where}: field 'platform': expected {recorded.name!r}, the name of the "
                f"platform in 'platform_spec', found {document['platform']!r}"
            )
    layouts = [(f"parameters.{k}", v) for k, v in document["parameters"].items()]
    for block in document["blocks"]:
        layouts += [(f"blocks.{block['index']}.values.{k}", v) for k, v in block["values"].items()]
    for section in ("values", "operands"):
        layouts += [(f"{section}.{k}", v) for k, v in document.get(section, {}).items()]
    for field, spec_json in layouts:
        for axes_of_dim in spec_json:
            for name in axes_of_dim or ():
                if name not in spec.names:
                    raise PlanError(
                        f"{where}: field '{field}': expected axes of the plan's mesh {spec} "
                        f"({list(spec.names)}), found mesh axis {name!r}"
                    )


@functools.cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def _validate(document: dict[str, Any], where: str) -> None:
    errors = sorted(_validator().iter_errors(document), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        path = [str(p) for p in first.path]
        if first.validator == "required":  # name the missing field, not its parent
            missing = [f for f in first.validator_value if f not in first.instance]
            field = ".".join([*path, missing[0]])
            raise PlanError(f"{where}: field '{field}': expected it, found it missing")
        field = ".".join(path) or "<top level>"
        found = json.dumps(first.instance)
        found = found if len(found) <= 80 else f"{found[:77]}..."
        raise PlanError(
            f"{where}: field '{field}': expected {first.validator} {first.validator_value!r}, "
            f"found {found} ({first.message})"
        )


# -- applying a plan ----------------------------------------------------------------------------


def _configure(
    plan: Plan, step: Callable[..., Any], args: Sequence[Any], *, keep_loops: bool = False
) -> tuple[Graph, Any]:
    """Trace `step`, check it is the plan's model and mesh, and build its sharding assignment.

    With `keep_loops` (the step will run its scans as scans) every iteration of a scan must
    take the same strategies (`_check_loops_uniform`)."""
    mesh = plan.mesh
    if jax.device_count() < mesh.size:
        raise PlanError(
            f"field 'mesh': the plan needs {mesh.size} devices ({mesh}), JAX sees "
            f"{jax.device_count()}. On CPU set XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{mesh.size} before importing JAX, or join more processes."
        )
    graph = trace(step, *args)
    found = model_fingerprint(graph)
    if found != plan.document["model_fingerprint"]:
        raise PlanError(
            f"field 'model_fingerprint': the plan was made for model "
            f"{plan.document['model_fingerprint']}, this step traces to {found} (another "
            "architecture, size or batch). Plan this step again."
        )
    if "values" in plan.document:  # a per-op plan: its layouts stand as they are
        return graph, _layout_assignment(plan, graph)
    analysis = build_space(build_blocks(graph, mesh.size), mesh)
    wanted = plan.strategies
    if len(wanted) != len(analysis.blocks):
        raise PlanError(
            f"field 'blocks': the plan has {len(wanted)} blocks, the step has "
            f"{len(analysis.blocks)}"
        )
    choices = []
    for block, name in zip(analysis.blocks, wanted, strict=True):
        names = [s.name for s in block.strategies]
        if name not in names:
            raise PlanError(
                f"field 'blocks.{block.index}.strategy': {name!r} is not a strategy of block "
                f"{block.index} ({block.scope}) on mesh {mesh}; expected one of {names}"
            )
        choices.append(names.index(name))
    if keep_loops:
        _check_loops_uniform(graph, analysis.blocks, wanted)
    # the plan's parameter layouts stand (they differ from the blocks' for FSDP)
    parameters = {
        path: tuple(tuple(axes) if axes else () for axes in spec)
        for path, spec in plan.document["parameters"].items()
    }
    segmentation = build_segments(graph, analysis)
    config = Config(tuple(choices))
    placement = place(
        graph, analysis.blocks, config, mesh, segmentation, parameter_layouts=parameters
    )
    return graph, placement.assignment


def _check_loops_uniform(
    graph: Graph, blocks: Sequence[ParallelBlock], strategies: Sequence[str]
) -> None:
    """Each block of a scan's later iterations takes the strategy of the same block of its
    first iteration: the scan that runs has one body, laid out as the first iteration."""
    by_head = {block.head: block for block in blocks}
    for loop in graph.loops:
        first = loop.iterations[0]
        for position, iteration in enumerate(loop.iterations[1:], start=1):
            for block in blocks:
                if not iteration.start <= block.head < iteration.stop:
                    continue
                same = by_head.get(first.start + block.head - iteration.start)
                if same is None or strategies[same.index] != strategies[block.index]:
                    found = "no block" if same is None else repr(strategies[same.index])
                    raise PlanError(
                        f"field 'blocks.{block.index}.strategy': the plan gives block "
                        f"{block.index} ({block.scope}), in iteration {position} of the scan at "
                        f"{loop.source_line}, strategy {strategies[block.index]!r}; the same "
                        f"block of iteration 0 has {found}. apply_plan keeps the scan, whose "
                        "iterations share one configuration: plan with "
                        "Analysis.plan(uniform=True) (the default for a step with a scan)."
                    )


def _layout_assignment(plan: Plan, graph: Graph) -> ShardingAssignment:
    """The assignment of a per-op plan, each layout checked against the traced step."""
    from explorer.layouts import layout_assignment

    mesh = plan.mesh
    values: dict[int, DimAxes] = {}
    for key, spec in plan.document["values"].items():
        where = f"values.{key}"
        if not key.isdigit() or int(key) >= len(graph.values):
            raise PlanError(
                f"field '{where}': expected the id of a value of this step (0 to "
                f"{len(graph.values) - 1}), found {key!r}"
            )
        value = graph.values[int(key)]
        if value.kind is ValueKind.CONSTANT:
            raise PlanError(
                f"field '{where}': value {key} is a constant of the step; only step inputs and "
                "op results take a layout"
            )
        values[value.id] = _checked_spec(spec, value.type, mesh, where, f"value {key}")
    operands: dict[tuple[int, int], DimAxes] = {}
    for key, spec in plan.document.get("operands", {}).items():
        where = f"operands.{key}"
        op_text, _, position_text = key.partition(":")
        if not (op_text.isdigit() and position_text.isdigit()) or int(op_text) >= len(graph.ops):
            raise PlanError(
                f"field '{where}': expected 'op:position' naming an op of this step (op 0 to "
                f"{len(graph.ops) - 1}), found {key!r}"
            )
        op = graph.ops[int(op_text)]
        position = int(position_text)
        if position >= len(op.inputs):
            raise PlanError(
                f"field '{where}': op {op.id} ({op.primitive}) has {len(op.inputs)} operands, "
                f"found position {position}"
            )
        operands[(op.id, position)] = _checked_spec(
            spec, op.input_types[position], mesh, where, f"operand {position} of op {op.id}"
        )
    return layout_assignment(graph, mesh, values, operands)


def _checked_spec(
    spec: list[list[str] | None], tt: TensorType, mesh: MeshSpec, where: str, what: str
) -> DimAxes:
    if len(spec) != tt.rank:
        raise PlanError(
            f"field '{where}': expected {tt.rank} entries, one per dim of {what} {tt}, found "
            f"{len(spec)}"
        )
    seen: set[str] = set()
    dims = []
    for dim, axes in enumerate(spec):
        names = tuple(axes or ())
        for name in names:
            if name not in mesh.names:
                raise PlanError(
                    f"field '{where}': dim {dim} of {what} names mesh axis {name!r}; mesh "
                    f"{mesh} has axes {list(mesh.names)}"
                )
            if name in seen:
                raise PlanError(f"field '{where}': mesh axis {name!r} splits {what} twice")
            seen.add(name)
        parts = mesh.axes_size(names)
        if tt.shape[dim] % parts:
            raise PlanError(
                f"field '{where}': dim {dim} of {what} {tt} has size {tt.shape[dim]}, which does "
                f"not split evenly into {parts} parts over mesh axes {'+'.join(names)}"
            )
        dims.append(names)
    return tuple(dims)


def apply_plan(plan: Plan, step: Callable[..., Any], *, donate: bool = True) -> Callable[..., Any]:
    """A jitted sharded version of `step`, with the same signature and results.

    With `donate` (the default, as training loops run: `state = step(state, batch)`), the
    parameters and optimizer state passed in are donated to the updated ones returned: arrays
    already laid out as the plan wants are consumed by the call. `donate=False` keeps them.

    A `scan` of the step stays a scan (a while loop in the compiled program, not unrolled):
    its body runs under the layouts the plan gives the scan's first iteration, so a block
    plan must give every iteration the same strategies (PlanError otherwise); a per-op plan
    applies its first iteration's layouts to all.
    """
    _check_plan_and_step(plan, step, "apply_plan")
    realised: dict[Any, Any] = {}

    def sharded_step(*args: Any) -> Any:
        key = (
            jax.tree_util.tree_structure(args),
            tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(args)),
        )
        if key not in realised:
            graph, assignment = _configure(plan, step, args, keep_loops=True)
            realised[key] = realize(
                graph, assignment, make_mesh(plan.mesh), donate=donate, keep_loops=True
            )
        return realised[key](*args)

    def lower(*args: Any) -> Any:
        """Lower the sharded step for `args` (as `jax.jit(...).lower` does)."""
        graph, assignment = _configure(plan, step, args, keep_loops=True)
        mesh = make_mesh(plan.mesh)
        return realize(graph, assignment, mesh, donate=donate, keep_loops=True).lower(*args)

    sharded_step.__name__ = f"sharded_{getattr(step, '__name__', 'step')}"
    sharded_step.lower = lower  # type: ignore[attr-defined]
    return sharded_step


def _check_plan_and_step(plan: Any, step: Any, caller: str) -> None:
    """The arguments of `apply_plan` and `evaluate`, checked before anything is traced."""
    if not isinstance(plan, Plan):
        hint = (
            " (a plan file: load it first with explorer.load_plan)"
            if isinstance(plan, (str, Path))
            else ""
        )
        raise PlanError(
            f"{caller}: argument 'plan': expected a Plan from Analysis.plan, Analysis.baseline "
            f"or load_plan, found {type(plan).__name__}{hint}"
        )
    if not callable(step):
        raise PlanError(
            f"{caller}: argument 'step': expected the training step function the plan was made "
            f"for, found {type(step).__name__} {step!r}"
        )


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The whole step compiled under a plan and priced on the plan's platform."""

    time: float
    t_comm: float
    t_comp: float
    memory: int
    collectives: int
    # (kind, bytes, mesh axes, group size) of every collective the compiled step emits
    emitted: tuple[tuple[str, int, tuple[str, ...], int], ...] = ()


def evaluate(plan: Plan, step: Callable[..., Any], *args: Any) -> Evaluation:
    """Ground truth for a plan: compile the whole step and price it with the same backend,
    on the platform the plan records (never a platform looked up again by its name)."""
    _check_plan_and_step(plan, step, "evaluate")
    platform = plan.platform
    return evaluate_on(plan, [platform], step, *args)[platform]


@dataclass(frozen=True)
class LoweredStep:
    """The training step lowered under a plan, as `evaluate_on` compiles it."""

    graph: Graph
    assignment: ShardingAssignment
    realised: Any
    leaves: tuple[Any, ...]  # flat abstract inputs, so `measure` builds one array per leaf
    lowered: Any


def lower_step(plan: Plan, step: Callable[..., Any], args: tuple[Any, ...]) -> LoweredStep:
    """`step` configured by `plan`, realised and lowered from abstract inputs."""
    graph, assignment = _configure(plan, step, args)
    # unrolled (realize's default): XLA's cost analysis counts a while loop's body once,
    # not once per trip, so only the unrolled step prices as the scan runs.
    # donated as a training loop donates: the step holds its parameters and optimizer state
    # once, which is what the composed memory predicts
    realised = realize(graph, assignment, make_mesh(plan.mesh), donate=True)
    abstract = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), args, realised.in_shardings
    )
    leaves = tuple(jax.tree_util.tree_leaves(abstract))
    with jc.random_bits_as_accelerators_lower():  # as the platform priced lowers them
        lowered = realised.flat_fn.lower(*leaves)
    return LoweredStep(graph, assignment, realised, leaves, lowered)


def evaluate_on(
    plan: Plan,
    platforms: Sequence[PlatformKey],
    step: Callable[..., Any],
    *args: Any,
    backend: str = "compiled",
) -> dict[PlatformKey, Evaluation]:
    """`evaluate` priced on each of `platforms` (`Platform` objects, preset names or files),
    from one compilation: the compiled program does not depend on the platform, only its
    pricing does. The answer is keyed by what was given. With `backend="measured"` the step
    runs on the devices JAX sees and is timed instead (the platform then only splits the time
    into communication and computation)."""
    from explorer.platforms import resolve_platform
    from explorer.profile.backends import (
        Backend,
        ProgramProfile,
        compile_program,
        compile_to_text,
        compile_workers,
        measure,
        price_compiled,
    )

    kind = Backend(backend)
    targets = {given: resolve_platform(given, "evaluate_on: platforms") for given in platforms}
    kept = _kept_evaluations(plan, targets) if kind is Backend.COMPILED else None
    if kept is not None:  # every platform's evaluation of this program is in the store
        return kept
    step_under = lower_step(plan, step, args)
    realised, leaves, lowered = step_under.realised, step_under.leaves, step_under.lowered
    price: Callable[[Any], ProgramProfile]
    if kind is Backend.MEASURED:
        executable = compile_program(lowered, kind)

        def price(platform: Any) -> ProgramProfile:
            return measure(executable, tuple(leaves), platform, plan.mesh, donated=realised.donated)
    else:
        text = compile_to_text(lowered, compile_workers(kind, 1))

        def price(platform: Any) -> ProgramProfile:
            return price_compiled(text, platform, plan.mesh)

    out = {}
    for given, platform in targets.items():
        priced = price(platform)
        out[given] = Evaluation(
            time=priced.t_comm + priced.t_comp,
            t_comm=priced.t_comm,
            t_comp=priced.t_comp,
            memory=priced.memory,
            collectives=len(priced.collectives),
            emitted=tuple(
                (c.kind.value, c.nbytes, c.axes, c.group_size) for c in priced.collectives
            ),
        )
    store = active_store()
    if store is not None and kind is Backend.COMPILED:
        for given, evaluation in out.items():
            store.put(_program_digest(plan), platform_key(targets[given].to_json()), evaluation)
    return out


def _program_digest(plan: Plan) -> str:
    """What decides the compiled step: the plan's layouts, how programs are built, JAX."""
    from explorer.profile.runner import PROGRAM_VERSION

    return f"{layout_digest(plan.document)}:{PROGRAM_VERSION}:jax-{jax.__version__}"


def _kept_evaluations(
    plan: Plan, targets: Mapping[PlatformKey, Platform]
) -> dict[PlatformKey, Evaluation] | None:
    """The store's evaluations of `plan` on every one of `targets`, or None (compile)."""
    store = active_store()
    if store is None:
        return None
    found = {}
    for given, platform in targets.items():
        fields = store.get(_program_digest(plan), platform_key(platform.to_json()))
        if fields is None:
            return None
        try:
            fields["emitted"] = tuple(
                (kind, int(nbytes), tuple(axes), int(group))
                for kind, nbytes, axes, group in fields["emitted"]
            )
            found[given] = Evaluation(**fields)
        except (KeyError, TypeError, ValueError):  # a row of another shape: compile again
            return None
    return found
