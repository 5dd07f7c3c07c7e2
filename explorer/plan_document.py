"""The plan document: what the solver chose, as versioned JSON (assets/plan.schema.json).

A plan carries the mesh, the platform it was priced on (its name, and in full as
`platform_spec`) and the backend, the model's fingerprint, one configuration per segment
instance, one strategy per block with the `PartitionSpec` of every value the block owns, a
`PartitionSpec` per parameter, and the predicted time and memory. A per-op plan (the
Alpa-style ILP) also carries a `PartitionSpec` for every value (`values`, by value id) and for
what each contraction reads (`operands`, by "op:position"); when `values` is present it, not
the block strategies, is what applies. Here plans are built, written, read and checked.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from explorer.errors import MeshError, PlanError
from explorer.ir import (
    BlockAnalysis,
    Config,
    DimAxes,
    Graph,
    Segmentation,
    ValueKind,
)
from explorer.jsonfile import read_json_file
from explorer.mesh import MeshSpec, spec_to_json
from explorer.space import shardings

if TYPE_CHECKING:
    from explorer.platforms import Platform, PlatformLike


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
        from explorer.platforms import (
            PlatformError,
            list_platforms,
            load_platform,
            platform_from_json,
        )

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
