"""The profiling runner: every configuration of every unique segment, and every boundary.

Jobs are planned first (one per program: segment configurations of each unique segment type,
then resharding pairs between consecutive types), then looked up in the cache. The rest are
built and compiled on a pool of worker threads (XLA releases the GIL while compiling, so the
cores are used in parallel without pickling programs across processes) and, for the
`measured` backend, timed one at a time on the main thread as they arrive. Nothing is
prepared while a program is timed (`timing_gate`): on one H200, a 2 ms embedding program
timed 1.9 to 146 ms while 16 threads built, lowered and autotuned programs beside it, and
1.67 to 1.74 ms once building and lowering were held back. Each result is committed to the
cache before the next, so a killed run loses nothing already profiled. A program that fails
to build, compile or run is recorded as infeasible with its reason and never stops the run.

The jobs are planned in `profile.jobs`; what they make becomes cache records and typed
profiles (`profile.profiles`) in `profile.records`.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
import gc
import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import pandas as pd

from explorer.errors import ExplorerError, ProfilingCancelled
from explorer.ir import BlockAnalysis, Graph, Segmentation
from explorer.layouts import CONTEXT_SEPARATOR
from explorer.mesh import MeshSpec, make_mesh
from explorer.profile.backends import (
    Backend,
    SlowerThanLimit,
    compile_program,
    compile_to_text,
    compile_workers,
    devices_of,
    launch_time,
    measure,
    price_compiled,
)
from explorer.profile.cache import ProfileCache, ProfileRecord, ProgramKey
from explorer.profile.compile_workers import CompileFailed, CompileOutOfMemory, CompileWorkers
from explorer.profile.jobs import PROGRAM_VERSION, _Built, _Context, _Job, program_version
from explorer.profile.profiles import COLUMNS, Profile, Profiles
from explorer.profile.records import (
    _infeasible,
    _nothing_moves,
    _profile,
    _record,
    combinable_latency,
    reprice,
)
from explorer.profile.timing_gate import TimingGate
from explorer.segments import DEFAULT_CONFIG_CAP, check_config_cap

# A measured program slower than this multiple of the best configuration so far is abandoned.
DYNAMIC_LIMIT_FACTOR = 4.0

# Every this many programs priced, the run gives back the memory they left (`_release_memory`).
RELEASE_EVERY = 100

__all__ = [
    "COLUMNS",
    "DYNAMIC_LIMIT_FACTOR",
    "PROGRAM_VERSION",
    "RELEASE_EVERY",
    "Profiles",
    "combinable_latency",
    "distinct_programs",
    "own_config",
    "profile_all",
    "program_version",
    "programs_to_compile",
    "reprice",
]


def profile_all(
    graph: Graph,
    analysis: BlockAnalysis,
    segmentation: Segmentation,
    mesh: MeshSpec,
    *,
    platform: Any,
    backend: Backend | str = Backend.COMPILED,
    cache: ProfileCache | None = None,
    config_cap: int = DEFAULT_CONFIG_CAP,
    workers: int | None = None,
    progress: bool = True,
    only: Callable[[str, str, str], bool] | None = None,
    time_limit_factor: float = DYNAMIC_LIMIT_FACTOR,
    on_program: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
    dependencies: tuple[tuple[int, ...], ...] | None = None,
) -> Profiles:
    """Profile every unique segment configuration and boundary; one profile per program.

    `config_cap` is the most configurations one unique segment may have (a count, not
    bytes: `segments.check_config_cap`).

    `only(kind, label, config)` restricts the run to the programs it accepts (a quick look at
    one segment, or a test); by default everything is profiled. `on_program(n)` is called
    after each program this run compiles and prices (not the cached ones), with the number
    priced so far (a progress or memory probe).

    `cancel` is checked before each program is started: once it is set, the programs
    already compiling are finished and cached, no other starts, and `ProfilingCancelled`
    says how many were done.

    `dependencies`, the step's `instance_dependencies` where the caller has them, saves
    finding them again.
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
        graph,
        analysis,
        segmentation,
        mesh,
        jax_mesh,
        platform,
        backend,
        time_limit_factor,
        known_dependencies=dependencies,
    )
    priced = itertools.count(1)
    tick = None if on_program is None else (lambda: on_program(next(priced)))
    # A selection bounds the work by itself: it picks from the full space, no cap applies.
    if only is None:
        check_config_cap(segmentation, analysis, config_cap)
    first_round = _every_job(context)
    if only is not None:  # a configuration with a context is selected by its own part
        first_round = [j for j in first_round if only(j.kind, j.label, own_config(j.config))]
    return Profiles(
        tuple(_run(first_round, context, cache, workers, progress, tick=tick, cancel=cancel))
    )


def programs_to_compile(
    graph: Graph,
    analysis: BlockAnalysis,
    segmentation: Segmentation,
    mesh: MeshSpec,
    *,
    platform: Any,
    cache: ProfileCache | None = None,
    backend: Backend | str = Backend.COMPILED,
    config_cap: int = DEFAULT_CONFIG_CAP,
    dependencies: tuple[tuple[int, ...], ...] | None = None,
) -> int:
    """How many programs `profile_all` would compile for this space with `cache`: the
    distinct programs the cache lacks (every one, where `cache` is None). Nothing is built
    or compiled: what a run would cost, asked before it runs."""
    backend = Backend(backend)
    check_config_cap(segmentation, analysis, config_cap)
    context = _Context(
        graph, analysis, segmentation, mesh, make_mesh(mesh), platform, backend,
        DYNAMIC_LIMIT_FACTOR, known_dependencies=dependencies,
    )  # fmt: skip
    paid = [job for job in _every_job(context) if not job.free]
    _, todo = _split_by_cache(paid, cache if cache is not None else ProfileCache(None))
    return len(todo)


def _every_job(context: _Context) -> list[_Job]:
    """One job per program of the space: each segment configuration, then each boundary."""
    return list(context.segment_jobs()) + list(context.reshard_jobs())


def _split_by_cache(
    jobs: list[_Job], cache: ProfileCache
) -> tuple[list[tuple[_Job, ProfileRecord]], dict[ProgramKey, list[_Job]]]:
    """The jobs the cache answers, with their records, and the rest by program: jobs that
    share a program are compiled once."""
    cached = cache.get_many([job.key for job in jobs])
    answered = [(job, cached[job.key]) for job in jobs if job.key in cached]
    sharing: dict[ProgramKey, list[_Job]] = collections.defaultdict(list)
    for job in jobs:
        if job.key not in cached:
            sharing[job.key].append(job)
    return answered, sharing


def distinct_programs(table: pd.DataFrame) -> int:
    """How many programs a profile table's rows were priced from: boundaries that move the
    same tensors share one, and a boundary where nothing moves has none (`Profiles.programs`
    for the typed profiles; this counts a view, e.g. a filtered `Analysis.profiles`)."""
    return int(table.loc[table["program"] != "", "program"].nunique())


def own_config(config: str) -> str:
    """A segment configuration's name without the strategies of the blocks it depends on
    (`"- | head:M@x"` -> `"-"`)."""
    return config.split(CONTEXT_SEPARATOR, maxsplit=1)[0]


def _run(
    jobs: list[_Job],
    context: _Context,
    cache: ProfileCache,
    workers: int | None,
    progress: bool,
    *,
    tick: Callable[[], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[Profile]:
    free = [
        _profile(job, _nothing_moves(job), context, was_cached=False) for job in jobs if job.free
    ]
    answered, sharing = _split_by_cache([job for job in jobs if not job.free], cache)
    # the free jobs first, then every other in the jobs' order, however many of them the
    # cache answered: what a warm run returns, so a run that compiled some asks the cost
    # model (and the frontier store, which keys it) the same question as the next warm one
    position = {id(job): i for i, job in enumerate(jobs)}
    found = [
        (position[id(job)], _profile(job, record, context, was_cached=True))
        for job, record in answered
    ]

    def in_order() -> list[Profile]:
        return free + [profile for _, profile in sorted(found, key=lambda item: item[0])]

    todo = [same[0] for same in sharing.values()]
    if not todo:
        return in_order()
    bar = _progress(len(todo), progress)
    best: dict[Any, float] = {}
    threads = workers or os.cpu_count() or 1
    processes = compile_workers(context.backend, threads)
    gate = TimingGate()  # only the measured backend times: otherwise it never waits
    with ThreadPoolExecutor(max_workers=threads) as pool:
        # A bounded window of compiles runs ahead of pricing, and each compiled executable is
        # dropped as soon as it is priced: holding them all until the run ends grows the
        # process's memory maps until LLVM cannot allocate code memory (after ~300 programs).
        ahead = 2 * threads
        pending = iter(todo)
        window: collections.deque[tuple[_Job, Future[Any]]] = collections.deque()
        done = 0

        def submit(job: _Job) -> Future[Any]:
            return pool.submit(_compile, job, context.backend, processes, gate)

        def cancelled() -> bool:
            return cancel is not None and cancel.is_set()

        for job in itertools.islice(pending, ahead):
            if not cancelled():
                window.append((job, submit(job)))
        while window:
            job, future = window.popleft()  # in submission order: measurement stays sequential
            if cancelled() and future.cancel():  # not started: drop it
                continue
            record = _finish(job, future, context, best, gate)
            # a compile stopped at this machine's memory limit says nothing of the program:
            # infeasible for this run, not kept (a machine with more memory profiles it)
            machine_bound = isinstance(future.exception(), CompileOutOfMemory)
            del future
            following = None if cancelled() else next(pending, None)
            if following is not None:
                window.append((following, submit(following)))
            if not machine_bound:
                cache.put(record)
            found.extend(
                (position[id(same)], _profile(same, record, context, was_cached=False))
                for same in sharing[job.key]
            )
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
    return in_order()


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
    job: _Job, backend: Backend, workers: CompileWorkers | None, gate: TimingGate
) -> tuple[_Built, Any, float]:
    """Build, lower and compile a job's program here (through `gate`): the
    executable to run for the measured backend, what the compiler made of it
    (`CompiledText`) otherwise."""
    start = time.perf_counter()
    with gate.preparing():
        built = job.build()
        lowered = built.program.lower()
        if backend is Backend.MEASURED:
            compiled = compile_program(lowered, backend)
        else:
            compiled = compile_to_text(lowered, workers)
    return built, compiled, time.perf_counter() - start


def _finish(
    job: _Job,
    future: Future[Any],
    context: _Context,
    best: dict[Any, float],
    gate: TimingGate,
) -> ProfileRecord:
    start = time.perf_counter()
    try:
        built, compiled, compile_seconds = future.result()
        if context.backend is Backend.MEASURED:
            # a segment's configurations compete, so a hopeless one is abandoned; a resharding
            # is forced by its neighbours' choices, so it is always timed to the end
            competing = job.kind == "segment"
            best_so_far = best.get(job.segment) if competing else None
            with gate.timing():
                # a multiple of the best time as a run takes it, launch included: a multiple
                # of a launch-free time near 0 would cut every other configuration
                launch = launch_time(devices_of(built.program.inputs))
                limit = (
                    None
                    if best_so_far is None
                    else context.time_limit_factor * (best_so_far + launch)
                )
                profile = measure(
                    compiled,
                    built.program.inputs,
                    context.platform,
                    context.mesh,
                    accounting=built.accounting,
                    terminal_outputs=built.terminal_outputs,
                    time_limit=limit,
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


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm  # picks a notebook widget inside Jupyter, text in a terminal

    return tqdm(total=total, desc="profiling", unit="program")
