"""The profiling runner: every configuration of every unique segment, and every boundary.

Jobs are planned first (one per program: segment configurations of each unique segment type,
then resharding pairs between consecutive types), then looked up in the cache. The rest are
built and compiled on a pool of worker threads (XLA releases the GIL while compiling, so the
cores are used in parallel without pickling programs across processes) and, for the
`measured` backend, timed one at a time on the main thread as they arrive, overlapping
measurement with the compilation of the next programs. Each result is committed to the cache
before the next, so a killed run loses nothing already profiled. A program that fails to
build, compile or run is recorded as infeasible with its reason and never stops the run.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
import gc
import hashlib
import itertools
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jax
import pandas as pd

from explorer.errors import ExplorerError, ProfilingCancelled
from explorer.ir import BlockAnalysis, Graph, Segmentation, SegmentInstance
from explorer.layouts import (
    CONTEXT_SEPARATOR,
    configuration_name,
    instance_dependencies,
    loop_twins,
    place,
    twin_config,
)
from explorer.mesh import MeshSpec, make_mesh
from explorer.profile.accounting import (
    MemoryAccounting,
    input_owners,
    memory_accounting,
    settled_values,
)
from explorer.profile.backends import (
    Backend,
    ProgramProfile,
    SlowerThanLimit,
    compile_program,
    compile_to_text,
    compile_workers,
    compute_time,
    measure,
    price_compiled,
)
from explorer.profile.cache import ProfileCache, ProfileRecord, ProgramKey
from explorer.profile.compile_workers import CompileFailed, CompileWorkers
from explorer.profile.hlo import Collective, CollectiveKind
from explorer.realize import StandaloneProgram, reshard_program, segment_program
from explorer.segments import DEFAULT_PROFILING_BUDGET, check_profiling_budget
from explorer.space import (
    boundary_moves,
    changed_moves,
    pair_boundaries,
    reshard_signatures,
    segment_input_layouts,
)

# A measured program slower than this multiple of the best configuration so far is abandoned.
DYNAMIC_LIMIT_FACTOR = 4.0

COLUMNS = [
    "kind", "segment", "label", "config", "choices", "t_comm", "t_comp", "t_total", "memory",
    "persistent_memory", "transient_memory", "saved_memory", "gradient_memory", "status",
    "reason", "collectives", "cached", "seconds", "context", "combined", "program",
]  # fmt: skip

# Every this many programs priced, the run gives back the memory they left (`_release_memory`).
RELEASE_EVERY = 100

# Bump when the way programs are built changes (what is constrained, where), or what their
# profile rows hold (reuse-16: random bits lowered elementwise as accelerators lower them, not
# in the CPU's rolled loop that every device ran at the global shape; reuse-15: a result
# written in place over an operand dying at it is not counted beside it; held-13: saved
# activations and handed-on gradients apart from the whole-step memory, on top of passing-12's
# passed tensors in the working set, tie-11's bf16 cotangent ordering, owners-10's step inputs
# held where they are updated): profiles made the old way are then not reused.
PROGRAM_VERSION = "reuse-16"


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


def profile_all(
    graph: Graph,
    analysis: BlockAnalysis,
    segmentation: Segmentation,
    mesh: MeshSpec,
    *,
    platform: Any,
    backend: Backend | str = Backend.COMPILED,
    cache: ProfileCache | None = None,
    budget: int = DEFAULT_PROFILING_BUDGET,
    workers: int | None = None,
    progress: bool = True,
    only: Callable[[str, str, str], bool] | None = None,
    time_limit_factor: float = DYNAMIC_LIMIT_FACTOR,
    on_program: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
) -> pd.DataFrame:
    """Profile every unique segment configuration and boundary; one row per program.

    `only(kind, label, config)` restricts the run to the programs it accepts (a quick look at
    one segment, or a test); by default everything is profiled. `on_program(n)` is called
    after each program this run compiles and prices (not the cached ones), with the number
    priced so far (a progress or memory probe).

    `cancel` is checked before each program is started: once it is set, the programs
    already compiling are finished and cached, no other starts, and `ProfilingCancelled`
    says how many were done.
    """
    backend = Backend(backend)
    if backend is Backend.MEASURED and jax.device_count() != mesh.size:
        raise ExplorerError(
            f"measured profiling runs on real devices: mesh {mesh} has {mesh.size} devices but "
            f"JAX sees {jax.device_count()} ({jax.default_backend()}). Use a mesh of "
            f"{jax.device_count()} devices, or get more: on CPU set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={mesh.size} before importing JAX, or "
            "join more processes with jax.distributed.initialize()."
        )
    cache = cache if cache is not None else ProfileCache(None)
    jax_mesh = make_mesh(mesh)
    context = _Context(
        graph, analysis, segmentation, mesh, jax_mesh, platform, backend, time_limit_factor
    )
    rows: list[dict[str, Any]] = []
    priced = itertools.count(1)
    tick = None if on_program is None else (lambda: on_program(next(priced)))
    # A selection bounds the work by itself: it picks from the full space, no budget applies.
    if only is None:
        check_profiling_budget(segmentation, analysis, budget)
    first_round = list(context.segment_jobs()) + list(context.reshard_jobs())
    if only is not None:  # a configuration with a context is selected by its own part
        first_round = [j for j in first_round if only(j.kind, j.label, own_config(j.config))]
    rows += _run(first_round, context, cache, workers, progress, tick=tick, cancel=cancel)
    return pd.DataFrame(rows, columns=COLUMNS)


def distinct_programs(table: pd.DataFrame) -> int:
    """How many programs a profile table's rows were priced from: boundaries that move the
    same tensors share one, and a boundary where nothing moves has none."""
    return int(table.loc[table["program"] != "", "program"].nunique())


def own_config(config: str) -> str:
    """A segment configuration's name without the strategies of the blocks it depends on
    (`"- | head:M@x"` -> `"-"`)."""
    return config.split(CONTEXT_SEPARATOR, maxsplit=1)[0]


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

    def __post_init__(self) -> None:
        self.platform_id = _platform_id(self.platform)
        self.first: dict[int, SegmentInstance] = {}
        for instance in self.segmentation.instances:
            self.first.setdefault(instance.unique_id, instance)
        self.dependencies = instance_dependencies(
            self.graph, self.analysis, self.segmentation, self.mesh
        )
        self.twins = loop_twins(self.graph, self.analysis.blocks)
        self.owner = input_owners(self.graph, self.segmentation)
        self.settled = settled_values(self.graph)

    def key(self, segment: str, config: str, extra: str) -> ProgramKey:
        # What the compiler emits does not depend on the target platform: compiled profiles
        # are cached platform-free and priced when read, so switching platforms is instant.
        platform = "*" if self.backend is Backend.COMPILED else self.platform_id
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
            program_hash = f"{_ops_digest(self.graph, instance.ops)}:{PROGRAM_VERSION}"
            for choices, context in itertools.product(space, contexts):
                names = configuration_name(
                    blocks, instance.blocks, tuple(choices), depends, context
                )
                yield _Job(
                    kind="segment",
                    segment=unique.id,
                    label=unique.label,
                    choices=tuple(choices),
                    config=names,
                    key=self.key(unique.fingerprint, names, program_hash),
                    build=self._segment_builder(instance.index, tuple(choices), context),
                    context=context,
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
                self.graph, self.analysis.blocks, self.segmentation, index, choices
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
        signatures = reshard_signatures(self.graph, blocks, self.segmentation)
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
                    key=self.key(f"reshard:{digest}", "moves", PROGRAM_VERSION),
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
                last_choice=last,
                first_choice=first,
            )
            program = reshard_program(self.graph, changed_moves(moves), self.jax_mesh)
            return _Built(program, None, frozenset())

        return build


def _run(
    jobs: list[_Job],
    context: _Context,
    cache: ProfileCache,
    workers: int | None,
    progress: bool,
    *,
    tick: Callable[[], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[dict[str, Any]]:
    rows = [_row(job, _nothing_moves(job), context, was_cached=False) for job in jobs if job.free]
    jobs = [job for job in jobs if not job.free]
    cached = cache.get_many([job.key for job in jobs])
    sharing: dict[ProgramKey, list[_Job]] = collections.defaultdict(list)  # one compile each
    for job in jobs:
        if job.key in cached:
            rows.append(_row(job, cached[job.key], context, was_cached=True))
        else:
            sharing[job.key].append(job)
    todo = [same[0] for same in sharing.values()]
    if not todo:
        return rows
    bar = _progress(len(todo), progress)
    best: dict[Any, float] = {}
    threads = workers or os.cpu_count() or 1
    processes = compile_workers(context.backend, threads)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        # A bounded window of compiles runs ahead of pricing, and each compiled executable is
        # dropped as soon as it is priced: holding them all until the run ends grows the
        # process's memory maps until LLVM cannot allocate code memory (after ~300 programs).
        ahead = 2 * threads
        pending = iter(todo)
        window: collections.deque[tuple[_Job, Future[Any]]] = collections.deque()
        done = 0

        def submit(job: _Job) -> Future[Any]:
            return pool.submit(_compile, job, context.backend, processes)

        def cancelled() -> bool:
            return cancel is not None and cancel.is_set()

        for job in itertools.islice(pending, ahead):
            if not cancelled():
                window.append((job, submit(job)))
        while window:
            job, future = window.popleft()  # in submission order: measurement stays sequential
            if cancelled() and future.cancel():  # not started: drop it
                continue
            record = _finish(job, future, context, best)
            del future
            following = None if cancelled() else next(pending, None)
            if following is not None:
                window.append((following, submit(following)))
            cache.put(record)
            rows.extend(_row(same, record, context, was_cached=False) for same in sharing[job.key])
            if bar is not None:
                bar.update(1)
            if tick is not None:
                tick()  # before a release: a probe sees the most the run holds
            done += 1
            if done % RELEASE_EVERY == 0:
                _release_memory()
    if bar is not None:
        bar.close()
    if cancelled() and done < len(todo):
        raise ProfilingCancelled(done, len(todo))
    return rows


def _release_memory() -> None:
    """Give back what the programs priced so far left behind (measured on the tiny MoE's
    layer, benchmarks/profile_memory_bench.py): JAX's tracing and lowering caches keep ~120
    objects per program (a jaxpr, its shardings) that no later program reuses, and glibc
    keeps the freed compiler memory of every compile thread's arena, so resident memory
    climbed ~200 MiB per 100 programs. Other jitted functions of the process retrace once."""
    jax.clear_caches()
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None  # glibc only


def _compile(
    job: _Job, backend: Backend, workers: CompileWorkers | None
) -> tuple[_Built, Any, float]:
    """Build and lower a job's program here, then compile it: the executable to run for
    the measured backend, what the compiler made of it (`CompiledText`) otherwise."""
    start = time.perf_counter()
    built = job.build()
    lowered = built.program.lower()
    if backend is Backend.MEASURED:
        compiled = compile_program(lowered, backend)
    else:
        compiled = compile_to_text(lowered, workers)
    return built, compiled, time.perf_counter() - start


def _finish(
    job: _Job, future: Future[Any], context: _Context, best: dict[Any, float]
) -> ProfileRecord:
    start = time.perf_counter()
    try:
        built, compiled, compile_seconds = future.result()
        if context.backend is Backend.MEASURED:
            # a segment's configurations compete, so a hopeless one is abandoned; a resharding
            # is forced by its neighbours' choices, so it is always timed to the end
            competing = job.kind == "segment"
            limit = best.get(job.segment) if competing else None
            profile = measure(
                compiled,
                built.program.inputs,
                context.platform,
                context.mesh,
                accounting=built.accounting,
                terminal_outputs=built.terminal_outputs,
                time_limit=None if limit is None else context.time_limit_factor * limit,
            )
            total = profile.t_comm + profile.t_comp
            if competing:
                best[job.segment] = min(best.get(job.segment, total), total)
        else:
            profile = price_compiled(
                compiled,
                context.platform,
                context.mesh,
                built.accounting,
                built.terminal_outputs,
            )
        return _record(job, profile, compile_seconds + time.perf_counter() - start)
    except SlowerThanLimit as err:
        return _infeasible(job, f"abandoned: {err}", time.perf_counter() - start)
    except Exception as err:  # a failing program is a result, not a crash
        # a worker's compile error is named by the error the compiler raised there
        kind = err.kind if isinstance(err, CompileFailed) else type(err).__name__
        reason = f"{kind}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        return _infeasible(job, reason[:500], time.perf_counter() - start)


def _record(job: _Job, profile: ProgramProfile, seconds: float) -> ProfileRecord:
    return ProfileRecord(
        key=job.key,
        status="ok",
        t_comm=profile.t_comm,
        t_comp=profile.t_comp,
        memory=profile.memory,
        persistent_memory=profile.persistent_memory,
        transient_memory=profile.transient_memory,
        saved_memory=profile.saved_memory,
        gradient_memory=profile.gradient_memory,
        collectives=profile.collectives_json(),
        reason="",
        seconds=seconds,
        created=time.time(),
        flops=profile.flops,
        bytes_accessed=profile.bytes_accessed,
        dot_flops=profile.dot_flops_json(),
    )


def _nothing_moves(job: _Job) -> ProfileRecord:
    return ProfileRecord(
        key=job.key,
        status="ok",
        t_comm=0.0,
        t_comp=0.0,
        memory=0,
        persistent_memory=0,
        transient_memory=0,
        saved_memory=0,
        gradient_memory=0,
        collectives="[]",
        reason="",
        seconds=0.0,
        created=time.time(),
    )


def _infeasible(job: _Job, reason: str, seconds: float) -> ProfileRecord:
    return ProfileRecord(
        key=job.key,
        status="infeasible",
        t_comm=math.inf,
        t_comp=math.inf,
        memory=0,
        persistent_memory=0,
        transient_memory=0,
        saved_memory=0,
        gradient_memory=0,
        collectives="[]",
        reason=reason,
        seconds=seconds,
        created=time.time(),
    )


def _row(job: _Job, record: ProfileRecord, context: _Context, was_cached: bool) -> dict[str, Any]:
    t_comm, t_comp = record.t_comm, record.t_comp
    combined: tuple[tuple[str, int, float], ...] = ()
    if record.status == "ok":
        if context.backend is Backend.COMPILED:
            t_comm, t_comp = reprice(record, context.platform, context.mesh)
        saved, combined = combinable_latency(record.collectives, context.platform, context.mesh)
        # combinable all-reduces pay their latency once per combined bucket of the whole
        # step (cost.CostModel), not once per segment
        t_comm = max(t_comm - saved, 0.0)
    return {
        "kind": job.kind,
        "segment": job.segment,
        "label": job.label,
        "config": job.config,
        "choices": job.choices,
        "t_comm": t_comm,
        "t_comp": t_comp,
        "t_total": t_comm + t_comp,
        "memory": record.memory,
        "persistent_memory": record.persistent_memory,
        "transient_memory": record.transient_memory,
        "saved_memory": record.saved_memory,
        "gradient_memory": record.gradient_memory,
        "status": record.status,
        "reason": record.reason,
        "collectives": record.collectives,
        "cached": was_cached,
        "seconds": record.seconds,
        "context": job.context,
        "combined": combined,
        # the compiled program's cache key: boundaries that move the same tensors share one;
        # "" where nothing moves (no program)
        "program": "" if job.free else job.key.digest()[:16],
    }


def _collective(entry: dict[str, Any], nbytes: int | None = None) -> Collective:
    return Collective(
        kind=CollectiveKind(entry["kind"]),
        name="",
        shapes=(),
        nbytes=int(entry["bytes"]) if nbytes is None else nbytes,
        group_size=int(entry["group"]),
        axes=tuple(entry["axes"]),
        op_names=(entry.get("op", ""),),
    )


def reprice(record: ProfileRecord, platform: Any, mesh: MeshSpec) -> tuple[float, float]:
    """(T_C, T_P) of a compiled profile on `platform`, from its collectives and cost."""
    t_comm = sum(platform.price(_collective(c), mesh) for c in json.loads(record.collectives))
    dots = tuple(json.loads(record.dot_flops or "{}").items())
    return t_comm, compute_time(platform, dots, record.flops, record.bytes_accessed)


def combinable_latency(
    collectives: str, platform: Any, mesh: MeshSpec
) -> tuple[float, tuple[tuple[str, int, float], ...]]:
    """The latency a profile's combinable all-reduces paid, and their buckets.

    Returns (seconds of latency to take off the profile, per combining group (kind, axes,
    group size) the number of elements and that group's latency).
    """
    saved = 0.0
    groups: dict[str, tuple[int, float]] = {}
    for entry in json.loads(collectives):
        if not entry.get("combinable"):
            continue
        latency = platform.price(_collective(entry, nbytes=0), mesh)
        saved += latency
        key = f"{entry['kind']}@{'+'.join(entry['axes'])}/{entry['group']}"
        count, _ = groups.get(key, (0, latency))
        groups[key] = (count + int(entry.get("elements", 1)), latency)
    return saved, tuple((k, n, lat) for k, (n, lat) in sorted(groups.items()))


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


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm  # picks a notebook widget inside Jupyter, text in a terminal

    return tqdm(total=total, desc="profiling", unit="program")
