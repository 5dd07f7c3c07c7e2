"""The plan as versioned JSON (assets/plan.schema.json): the one place a `Plan` becomes a
JSON document and back, is written, read and checked.

The document has the fields of `Plan` (explorer.plan_types) under the names of the schema:
the platform is `platform` (its name) and `platform_spec` (in full), the prediction
`predicted`, layouts `PartitionSpec`s as JSON lists (per dim null or the mesh axes splitting
it) keyed by value id, parameter path or "op:position". The file format is what it was
before plans were typed: a file written by an older explorer reads and writes back the same.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import MeshError, PlanError
from explorer.ir import DimAxes
from explorer.jsonfile import read_json_file
from explorer.mesh import MeshSpec, spec_to_json
from explorer.plan_types import (
    PAPER_SPACE,
    BlockChoice,
    IlpReport,
    InstanceChoice,
    Plan,
    Prediction,
    SpaceOptions,
    Versions,
)

if TYPE_CHECKING:
    from explorer.platforms import Platform

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "assets" / "plan.schema.json"
# Bounds on a plan file, far above what the explorer writes (a per-op plan of a 48-layer
# model is a few MiB, nested 6 levels): a file past them is not a plan.
MAX_PLAN_BYTES = 64 * 2**20
MAX_PLAN_DEPTH = 16
# a value id or an operand key as the explorer writes them (no sign, no leading zero)
_ID = re.compile(r"0|[1-9][0-9]*")
_OPERAND = re.compile(r"(0|[1-9][0-9]*):(0|[1-9][0-9]*)")


# -- Plan -> JSON --------------------------------------------------------------------------------


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as its JSON document (not validated: `save_plan` and `plan_json_text` are)."""
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "source": plan.source,
        "mesh": {"axes": list(plan.mesh.names), "shape": list(plan.mesh.shape)},
        "device_count": plan.mesh.size,
        "platform": plan.platform_name,
    }
    if plan.priced_on is not None:
        document["platform_spec"] = plan.priced_on.to_json()
    document |= {
        "backend": plan.backend,
        "model_fingerprint": plan.model_fingerprint,
        "segments": [_fields_set(s) for s in plan.segments],
        "blocks": [
            {
                "index": b.index,
                "scope": b.scope,
                "head": b.head,
                "strategy": b.strategy,
                "values": {str(v): spec_to_json(d) for v, d in b.values},
            }
            for b in plan.blocks
        ],
        "parameters": {path: spec_to_json(d) for path, d in plan.parameters},
        "predicted": {
            "time": plan.predicted.time,
            "memory": plan.predicted.memory,
            "memory_eq9": plan.predicted.memory_eq9,
            "budget": plan.predicted.budget,
        },
        "versions": {"explorer": plan.versions.explorer, "jax": plan.versions.jax},
    }
    if plan.values is not None:
        document["values"] = {str(v): spec_to_json(d) for v, d in plan.values}
    if plan.operands is not None:
        document["operands"] = {f"{o}:{p}": spec_to_json(d) for (o, p), d in plan.operands}
    if plan.ilp is not None:
        document["ilp"] = _fields_set(plan.ilp)
    if plan.boundary_rules:  # absent where none applies: such plans keep their old digest
        document["boundary_rules"] = list(plan.boundary_rules)
    changed = {} if plan.space is None else _fields_changed(plan.space, PAPER_SPACE)
    if changed:  # what differs from the paper's space, alone
        document["space"] = changed
    return document


def _fields_changed(record: SpaceOptions, default: SpaceOptions) -> dict[str, Any]:
    """`record`'s fields by name, those equal to `default`'s left out."""
    return {
        f.name: getattr(record, f.name)
        for f in dataclasses.fields(record)
        if getattr(record, f.name) != getattr(default, f.name)
    }


def _fields_set(record: IlpReport | InstanceChoice) -> dict[str, Any]:
    """`record`'s fields by name, those that are None (optional, not recorded) left out."""
    values = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    return {name: value for name, value in values.items() if value is not None}


def plan_json_text(plan: Plan, where: str = "<plan to export>") -> str:
    """The plan as validated JSON text, as plan files hold it (without the final newline)."""
    document = plan_to_json(plan)
    _validate(document, where)
    return json.dumps(document, indent=1, sort_keys=True)


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write `plan` to `path` as a validated plan file; returns the path written."""
    target = writable_path(path)
    text = plan_json_text(plan, "<plan to save>") + "\n"
    try:
        target.write_text(text)
    except OSError as err:  # the disk filled, or the file was locked since the check
        raise PlanError(f"plan file {target}: cannot be written ({err.strerror or err})") from None
    return target


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


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file. Loading parses JSON only: it never executes code."""
    if not isinstance(path, (str, Path)):
        raise PlanError(f"load_plan: expected a file path, found {type(path).__name__} {path!r}")
    where = f"plan file {Path(path).expanduser()}"
    document = read_json_file(
        path, what="plan file", error=PlanError, max_bytes=MAX_PLAN_BYTES, max_depth=MAX_PLAN_DEPTH
    )
    return plan_from_json(document, where)


def plan_from_json(document: Any, where: str = "<plan document>") -> Plan:
    """The plan a JSON document describes, validated against the schema and checked for what
    the schema cannot say; a `PlanError` naming `where` and the field otherwise."""
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
    mesh, priced_on = _check_consistent(document, where)
    predicted = document["predicted"]
    versions = document["versions"]
    ilp = document.get("ilp")
    return Plan(
        source=document["source"],
        mesh=mesh,
        platform_name=document["platform"],
        priced_on=priced_on,
        backend=document["backend"],
        model_fingerprint=document["model_fingerprint"],
        segments=tuple(InstanceChoice(**s) for s in document["segments"]),
        blocks=tuple(
            BlockChoice(
                index=b["index"],
                scope=b["scope"],
                head=b["head"],
                strategy=b["strategy"],
                values=_by_id(b["values"], f"{where}: field 'blocks.{n}.values"),
            )
            for n, b in enumerate(document["blocks"])
        ),
        parameters=tuple(sorted((k, _dims(v)) for k, v in document["parameters"].items())),
        predicted=Prediction(
            predicted["time"], predicted["memory"], predicted["memory_eq9"], predicted["budget"]
        ),
        versions=Versions(explorer=versions["explorer"], jax=versions["jax"]),
        values=_by_id(document["values"], f"{where}: field 'values")
        if "values" in document
        else None,
        operands=_by_operand(document["operands"], f"{where}: field 'operands")
        if "operands" in document
        else None,
        ilp=None if ilp is None else IlpReport(**ilp),
        boundary_rules=tuple(document.get("boundary_rules", ())),
        space=SpaceOptions(**document["space"]) if "space" in document else None,
    )


def _dims(spec: list[list[str] | None]) -> DimAxes:
    return tuple(tuple(axes) if axes else () for axes in spec)


def _by_id(specs: dict[str, Any], field: str) -> tuple[tuple[int, DimAxes], ...]:
    """Layouts keyed by value id, `field` naming where (without its closing quote)."""
    for key in specs:
        if not _ID.fullmatch(key):
            raise PlanError(
                f"{field}.{key}': expected the id of a value (a non-negative integer), "
                f"found {key!r}"
            )
    return tuple(sorted((int(k), _dims(v)) for k, v in specs.items()))


def _by_operand(specs: dict[str, Any], field: str) -> tuple[tuple[tuple[int, int], DimAxes], ...]:
    """Layouts keyed by "op:position", `field` naming where (without its closing quote)."""
    pairs = []
    for key, spec in specs.items():
        match = _OPERAND.fullmatch(key)
        if match is None:
            raise PlanError(
                f"{field}.{key}': expected 'op:position' naming an op and one of its "
                f"operands by number, found {key!r}"
            )
        pairs.append(((int(match[1]), int(match[2])), _dims(spec)))
    return tuple(sorted(pairs))


def _check_consistent(document: dict[str, Any], where: str) -> tuple[MeshSpec, Platform | None]:
    """What the schema cannot say: the mesh is one (as many names as sizes, ASCII identifier
    names), `device_count` is its size, `platform_spec` is a platform named `platform`, and
    every layout names only its axes. Returns the mesh and the platform recorded in full."""
    from explorer.platforms import PlatformError, platform_from_json

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
    recorded = None
    if "platform_spec" in document:
        try:
            recorded = platform_from_json(document["platform_spec"])
        except PlatformError as err:
            raise PlanError(f"{where}: field 'platform_spec': {err}") from None
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
    return spec, recorded


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
