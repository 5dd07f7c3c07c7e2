"""Plans: what the solver chose, as versioned JSON that applies back to the step.

A plan carries the mesh, the platform and backend it was priced on, the model's fingerprint,
one configuration per segment instance, one strategy per block with the `PartitionSpec` of
every value the block owns, a `PartitionSpec` per parameter, and the predicted time and memory.
`apply_plan` re-traces the user's step, checks it is the model the plan was made for, and
returns a jitted sharded step with the same signature. `evaluate` compiles the whole step under
the plan and prices it on the plan's platform: the ground truth predictions are judged on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from explorer.blocks import build_blocks
from explorer.errors import ExplorerError
from explorer.ir import BlockAnalysis, Config, DimAxes, Graph, ValueKind
from explorer.mesh import MeshSpec, make_mesh, spec_to_json
from explorer.realize import realize
from explorer.space import build_space, shardings
from explorer.trace import trace

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "assets" / "plan.schema.json"


class PlanError(ExplorerError):
    """A plan file is malformed, of another version, or for another model or mesh."""


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
    def strategies(self) -> tuple[str, ...]:
        return tuple(b["strategy"] for b in self.document["blocks"])

    def save(self, path: str | Path) -> Path:
        target = Path(path).expanduser()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.document, indent=1, sort_keys=True) + "\n")
        return target

    def to_json(self) -> str:
        return json.dumps(self.document, indent=1, sort_keys=True)

    def summary(self) -> str:
        return (
            f"{self.source} plan on mesh {self.mesh} ({self.document['platform']}, "
            f"{self.document['backend']}): {1e3 * self.time:.3f} ms/step, "
            f"{self.memory / 2**30:.3f} GiB/device"
        )


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
    platform: str,
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
            str(layout.value): spec_to_json(values.get(layout.value) or inputs[layout.value])
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
    from explorer import __version__

    document = {
        "schema_version": SCHEMA_VERSION,
        "source": source,
        "mesh": {"axes": list(mesh.names), "shape": list(mesh.shape)},
        "device_count": mesh.size,
        "platform": platform,
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
    }
    _validate(document, "<new plan>")
    if budget is not None and memory > budget:
        raise PlanError(f"plan memory {memory} exceeds its budget {budget}")
    return Plan(document)


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file. Loading parses JSON only: it never executes code."""
    where = str(path)
    try:
        document = json.loads(Path(path).expanduser().read_text())
    except FileNotFoundError:
        raise PlanError(f"{where}: no such plan file") from None
    except json.JSONDecodeError as err:
        raise PlanError(
            f"{where}: expected JSON, found a syntax error at line {err.lineno} column "
            f"{err.colno}: {err.msg}"
        ) from None
    if not isinstance(document, dict):
        raise PlanError(f"{where}: expected a JSON object, found {type(document).__name__}")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise PlanError(
            f"{where}: field 'schema_version' is {version!r}; this explorer reads version "
            f"{SCHEMA_VERSION}. Re-export the plan with this version."
        )
    _validate(document, where)
    return Plan(document)


def _validate(document: dict[str, Any], where: str) -> None:
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        field = ".".join(str(p) for p in first.path) or "<top level>"
        raise PlanError(f"{where}: field '{field}': {first.message}")


# -- applying a plan ----------------------------------------------------------------------------


def _configure(plan: Plan, step: Callable[..., Any], args: Sequence[Any]) -> tuple[Graph, Any]:
    """Trace `step`, check it is the plan's model and mesh, and build its sharding assignment."""
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
    # the plan's parameter layouts stand (they differ from the blocks' for FSDP)
    parameters = {
        path: tuple(tuple(axes) if axes else () for axes in spec)
        for path, spec in plan.document["parameters"].items()
    }
    return graph, shardings(graph, analysis.blocks, Config(tuple(choices)), mesh, parameters)


def apply_plan(plan: Plan, step: Callable[..., Any]) -> Callable[..., Any]:
    """A jitted sharded version of `step`, with the same signature and results."""
    realised: dict[Any, Any] = {}

    def sharded_step(*args: Any) -> Any:
        key = (
            jax.tree_util.tree_structure(args),
            tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(args)),
        )
        if key not in realised:
            graph, assignment = _configure(plan, step, args)
            realised[key] = realize(graph, assignment, make_mesh(plan.mesh))
        return realised[key](*args)

    sharded_step.__name__ = f"sharded_{getattr(step, '__name__', 'step')}"
    return sharded_step


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The whole step compiled under a plan and priced on the plan's platform."""

    time: float
    t_comm: float
    t_comp: float
    memory: int
    collectives: int


def evaluate(plan: Plan, step: Callable[..., Any], *args: Any) -> Evaluation:
    """Ground truth for a plan: compile the whole step and price it with the same backend."""
    from explorer.platforms import load_platform
    from explorer.profile.backends import Backend, compile_program, price_compiled

    graph, assignment = _configure(plan, step, args)
    realised = realize(graph, assignment, make_mesh(plan.mesh))
    abstract = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), args, realised.in_shardings
    )
    compiled = compile_program(realised.lower(*abstract), Backend.COMPILED)
    platform = load_platform(plan.document["platform"])
    priced = price_compiled(compiled, platform, plan.mesh, 0)
    return Evaluation(
        time=priced.t_comm + priced.t_comp,
        t_comm=priced.t_comm,
        t_comp=priced.t_comp,
        memory=priced.memory,
        collectives=len(priced.collectives),
    )
