"""The jobs of a profiling run: one per program, a segment configuration of a unique type or
a resharding between consecutive types, each with its cache key and how to build it."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax

from explorer.errors import AnalysisError
from explorer.ir import BlockAnalysis, Graph, Segmentation, SegmentInstance
from explorer.layouts import (
    configuration_name,
    instance_dependencies,
    loop_twins,
    place,
    twin_config,
)
from explorer.mesh import MeshSpec
from explorer.profile.accounting import (
    MemoryAccounting,
    input_owners,
    memory_accounting,
    settled_values,
)
from explorer.profile.backends import MEASURED_VERSION, Backend
from explorer.profile.cache import ProgramKey
from explorer.profile.compile_flags import flags_mark, measured_flags_mark
from explorer.profile.hlo import Collective
from explorer.realize import StandaloneProgram, reshard_program, segment_program
from explorer.space import (
    ANCESTOR_BOUNDARIES,
    OWNED_BOUNDARIES,
    TRACED_BOUNDARIES,
    ancestors_changes,
    boundary_moves,
    changed_moves,
    owned_first_changes,
    pair_boundaries,
    reshard_signatures,
    scattering_marks,
    segment_input_layouts,
    tracing_changes,
)

# Bump when the way programs are built changes (what is constrained, where), or what their
# profile rows hold (scattered-19: an all-reduce read only as each device's own slice is
# priced as the reduce-scatter a GPU pipeline makes of it, `hlo.Collective.parts`; rows keep
# its scattered bytes; transposed-18: a square weight's gradient, made transposed by its dot, is
# no longer given the weight's layout by its shape alone; constants-17: values made from
# constants alone that the backward part reads held once per type, not saved by every
# instance; reuse-16: random bits lowered elementwise as accelerators lower them, not in the
# CPU's rolled loop that every device ran at the global shape; reuse-15: a result written in
# place over an operand dying at it is not counted beside it; held-13: saved activations and
# handed-on gradients apart from the whole-step memory, on top of passing-12's passed tensors
# in the working set, tie-11's bf16 cotangent ordering, owners-10's step inputs held where
# they are updated): profiles made the old way are then not reused.
PROGRAM_VERSION = "scattered-19"
# Bump instead when a change can only alter programs on meshes of several axes: the 1-D
# programs are then the same, and their profiles (often hours of compiling) stay valid.
# leader-19: an op outside blocks follows the operand split over the most devices, so a 2-D
# weight-gradient dot follows the saved activation (split on both axes), not the cotangent.
MULTI_AXIS_VERSION = "leader-19"


def program_version(mesh: MeshSpec) -> str:
    """The version of the programs built on `mesh` (a key part of profiles and evaluations),
    with the XLA flags they are compiled under where any can change them (`compile_flags`)."""
    version = PROGRAM_VERSION if len(mesh.axes) == 1 else f"{PROGRAM_VERSION}+{MULTI_AXIS_VERSION}"
    mark = flags_mark()
    return f"{version}+{mark}" if mark else version


@dataclass(frozen=True, slots=True)
class _Built:
    """A program ready to compile, with what pricing it needs besides the compiler."""

    program: StandaloneProgram
    accounting: MemoryAccounting | None  # None: a resharding program (no memory of its own)
    terminal_outputs: frozenset[int]  # result positions that are results of the whole step


@dataclass(frozen=True)
class _Job:
    kind: str  # "segment" or "reshard"
    segment: int | tuple[int, int]  # unique type id, or (type before, type after)
    label: str
    choices: tuple[int, ...]
    config: str
    key: ProgramKey
    build: Callable[[], _Built]
    # strategies of the blocks of other instances this program depends on (see
    # `layouts.external_blocks`), in the order of the type's first instance's dependencies
    context: tuple[int, ...] = ()
    free: bool = False  # a resharding where nothing moves: costs nothing, nothing to compile


@dataclass
class _Context:
    """What every job of one profiling run shares."""

    graph: Graph
    analysis: BlockAnalysis
    segmentation: Segmentation
    mesh: MeshSpec
    jax_mesh: Any
    platform: Any
    backend: Backend
    time_limit_factor: float
    # `instance_dependencies` of the step where the caller has them already (`analyze`):
    # placing the whole step to find them takes seconds at full depth
    known_dependencies: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        self.platform_id = _platform_id(self.platform)
        self.first: dict[int, SegmentInstance] = {}
        for instance in self.segmentation.instances:
            self.first.setdefault(instance.unique_id, instance)
        known, instances = self.known_dependencies, len(self.segmentation.instances)
        if known is not None and len(known) != instances:
            raise AnalysisError(
                f"profiling: expected the dependencies of {instances} segment instances, "
                f"found {len(known)}; pass those of this segmentation, or none"
            )
        self.dependencies = (
            known
            if known is not None
            else instance_dependencies(self.graph, self.analysis, self.segmentation, self.mesh)
        )
        self.twins = loop_twins(self.graph, self.analysis.blocks)
        self.prices: dict[Collective, float] = {}  # see `records.reprice`
        self.owner = input_owners(self.graph, self.segmentation)
        self.settled = settled_values(self.graph)

    def key(self, segment: str, config: str, extra: str) -> ProgramKey:
        # What the compiler emits does not depend on the target platform: compiled profiles
        # are cached platform-free and priced when read, so switching platforms is instant.
        platform = "*" if self.backend is Backend.COMPILED else self.platform_id
        if self.backend is Backend.MEASURED:
            # compiled without the options that override these flags: they change the time
            mark = measured_flags_mark()
            extra = f"{extra}+{mark}:{MEASURED_VERSION}" if mark else f"{extra}:{MEASURED_VERSION}"
        return ProgramKey(
            segment=segment,
            config=config,
            mesh=f"{'x'.join(map(str, self.mesh.shape))}({','.join(self.mesh.names)})",
            platform=platform,
            backend=self.backend.value,
            jax_version=jax.__version__,
            extra=extra,
        )

    def segment_jobs(self) -> Iterator[_Job]:
        blocks = self.analysis.blocks
        for unique in self.segmentation.unique:
            instance = self.first[unique.id]
            space = tuple(
                itertools.product(*(range(len(blocks[b].strategies)) for b in instance.blocks))
            )
            depends = self.dependencies[instance.index]
            contexts = tuple(
                itertools.product(*(range(len(blocks[b].strategies)) for b in depends))
            )
            program_hash = f"{_ops_digest(self.graph, instance.ops)}:{program_version(self.mesh)}"
            if self._traced_boundaries(instance.index):
                program_hash += f":{TRACED_BOUNDARIES}"
            if self._owned_boundaries(instance.index):
                program_hash += f":{OWNED_BOUNDARIES}"
            if self._either_boundary(instance.index, ancestors_changes):
                program_hash += f":{ANCESTOR_BOUNDARIES}"
            for choices, context in itertools.product(space, contexts):
                names = configuration_name(
                    blocks, instance.blocks, tuple(choices), depends, context
                )
                chosen = zip(instance.blocks + depends, (*choices, *context), strict=True)
                marks = scattering_marks(blocks[b].strategies[c] for b, c in chosen)
                yield _Job(
                    kind="segment",
                    segment=unique.id,
                    label=unique.label,
                    choices=tuple(choices),
                    config=names,
                    key=self.key(unique.fingerprint, names, ":".join((program_hash, *marks))),
                    build=self._segment_builder(instance.index, tuple(choices), context),
                    context=context,
                )

    def _traced_boundaries(self, index: int) -> bool:
        """Whether tracing lays out a value crossing either boundary of instance `index`
        otherwise than the rule before it (`space.tracing_changes`): such a type's programs
        differ from those profiled before tracing, under keys that would be the same."""
        return self._either_boundary(index, tracing_changes)

    def _owned_boundaries(self, index: int) -> bool:
        """Whether a value crossing either boundary of instance `index` is laid out otherwise
        now that owned values come first (`space.owned_first_changes`)."""
        return self._either_boundary(index, owned_first_changes)

    def _either_boundary(self, index: int, changes: Callable[..., bool]) -> bool:
        """Whether `changes` holds at the boundary before or after instance `index`."""
        return any(
            changes(self.graph, self.analysis.blocks, self.segmentation, b, self.mesh)
            for b in (index - 1, index)
            if 0 <= b < len(self.segmentation.boundaries)
        )

    def _segment_builder(
        self, index: int, choices: tuple[int, ...], context: tuple[int, ...]
    ) -> Callable[[], _Built]:
        def build() -> _Built:
            instance = self.segmentation.instances[index]
            # the twins of these blocks (the same blocks of a scan's other iterations) take
            # their strategies: the stacked parameters are placed as a uniform plan places them
            config = twin_config(
                self.twins,
                (*instance.blocks, *self.dependencies[index]),
                (*choices, *context),
            )
            assignment = place(
                self.graph, self.analysis.blocks, config, self.mesh, self.segmentation
            ).assignment
            layouts = segment_input_layouts(
                self.graph, self.analysis.blocks, self.segmentation, index, choices, mesh=self.mesh
            )
            crossing = self.segmentation.boundaries
            after = (
                (crossing[index].backward, crossing[index].forward)
                if index < len(crossing)
                else ((), ())
            )
            program = segment_program(
                self.graph, instance.ops, assignment, self.jax_mesh, layouts, after=after
            )
            terminal = frozenset(
                i for i, v in enumerate(program.output_values) if v in self.settled
            )
            accounting = memory_accounting(
                self.graph,
                index,
                ops=instance.ops,
                program=program,
                assignment=assignment,
                mesh=self.mesh,
                owners=self.owner,
            )
            return _Built(program, accounting, terminal)

        return build

    def reshard_jobs(self) -> Iterator[_Job]:
        """One job per strategy pair of each pair of consecutive types. Jobs that move the
        same tensors the same way share a program key (one compile, `_run`); where nothing
        moves, the job is free."""
        blocks = self.analysis.blocks
        instances, unique = self.segmentation.instances, self.segmentation.unique
        first_boundary = pair_boundaries(self.segmentation)
        signatures = reshard_signatures(self.graph, blocks, self.segmentation, self.mesh)
        for pair, table in signatures.items():
            boundary = first_boundary[pair]
            before, after = instances[boundary], instances[boundary + 1]
            label = f"{unique[pair[0]].label}->{unique[pair[1]].label}"
            for (last, first), signature in table.items():
                name_last = (
                    blocks[before.blocks[-1]].strategies[last].name if before.blocks else "none"
                )
                name_first = (
                    blocks[after.blocks[0]].strategies[first].name if after.blocks else "none"
                )
                digest = hashlib.sha256(repr(signature).encode()).hexdigest()[:16]
                yield _Job(
                    kind="reshard",
                    segment=pair,
                    label=label,
                    choices=(last, first),
                    config=f"{name_last}->{name_first}",
                    key=self.key(f"reshard:{digest}", "moves", program_version(self.mesh)),
                    build=self._reshard_builder(boundary, last, first),
                    free=not signature,
                )

    def _reshard_builder(self, boundary: int, last: int, first: int) -> Callable[[], _Built]:
        def build() -> _Built:
            moves = boundary_moves(
                self.graph,
                self.analysis.blocks,
                self.segmentation,
                boundary,
                self.mesh,
                last_choice=last,
                first_choice=first,
            )
            program = reshard_program(self.graph, changed_moves(self.graph, moves), self.jax_mesh)
            return _Built(program, None, frozenset())

        return build


def _ops_digest(graph: Graph, ops: tuple[int, ...]) -> str:
    """Identity of a segment's program: every op with its params and shapes, in order."""
    hasher = hashlib.sha256()
    for op_id in ops:
        op = graph.ops[op_id]
        hasher.update(
            repr(
                (op.primitive, op.params, [str(t) for t in op.input_types], op.role.value)
            ).encode()
        )
    return hasher.hexdigest()[:16]


def _platform_id(platform: Any) -> str:
    content = json.dumps(platform.to_json(), sort_keys=True, default=str)
    return f"{platform.name}:{hashlib.sha256(content.encode()).hexdigest()[:12]}"
