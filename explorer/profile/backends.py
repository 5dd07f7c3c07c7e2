"""Profiling backends: one interface, two ways to price a standalone program.

`compiled`: compile only (no arrays allocated). Communication is the collectives XLA emitted
(parsed from the optimised HLO) priced by the platform model; computation is the compiler's
cost analysis (FLOPs, bytes accessed) on the platform's roofline; memory is the compiler's
memory analysis. Deterministic, and it plans for hardware you do not have.

`measured`: run the program on the devices JAX sees (virtual CPU devices, GPUs, or several
processes joined with `jax.distributed`): 5 warm-up runs (0.2 s at least in one process),
then 10 timed, median, less the launch (`launch_time`: what a program that does next to
nothing takes on the same devices, a dispatch and a wait that a whole step pays once and its
parts once each). Without a device trace to split it, the total is split using the compiled
collectives priced by the platform (calibrate one with `python -m explorer calibrate`).
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from explorer._jax_compat import CompiledText, compile_request, read_executable
from explorer.errors import ExplorerError
from explorer.mesh import MeshSpec
from explorer.profile.accounting import HeldMemory, MemoryAccounting
from explorer.profile.compile_workers import (
    WORKER_MEMORY_BYTES,
    CompileWorkers,
    available_memory,
    shared_workers,
    usable_cores,
)
from explorer.profile.compute import dot_flops
from explorer.profile.hlo import Collective, parse_collectives

WARMUP_RUNS = 5
# and at least this long: a GPU left idle while the next program compiles drops its clock
# (an idle H200 read 345 MHz, 1980 MHz under load), and five runs of a millisecond may end
# before it is back up
WARMUP_SECONDS = 0.2
TIMED_RUNS = 10
# Bump when what a measured profile holds changes: measured profiles are keyed with it, the
# compiled ones (platform-free, hours of compiling) never are. launch-1: the launch is taken
# off every measured time (an H200 read 64-87 us a program; ten 1-3 ms BERT-large programs
# composed 7-14 % over the step they make up).
MEASURED_VERSION = "launch-1"

# XLA's CPU code generation does not change the optimised HLO, the cost analysis or the
# memory analysis: skipping its expensive LLVM passes makes compile-only profiling ~2x faster.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


# Compile-only pricing on the CPU compiles in recycled worker processes (`compile_workers`):
# what the compiler leaves behind leaves with them. False: compile in this process.
COMPILE_IN_WORKERS = True


class Backend(StrEnum):
    COMPILED = "compiled"
    MEASURED = "measured"


class SlowerThanLimit(ExplorerError):
    """A measured program exceeded the dynamic time limit (a multiple of the best so far)."""


@dataclass(frozen=True, slots=True)
class ProgramProfile:
    t_comm: float  # seconds per run spent in collectives
    t_comp: float  # seconds per run computing
    memory: int  # peak bytes per device
    # what the step holds for the program, by how long (`accounting.HeldMemory`)
    persistent_memory: int  # the whole step: parameters, optimizer state it owns
    transient_memory: int  # only while it runs: the rest of its working set
    saved_memory: int  # from its forward part to its backward part
    gradient_memory: int  # from its backward part to the optimizer
    constant_memory: int  # from its type's first instance on: one per type (`HeldMemory`)
    collectives: tuple[Collective, ...]
    flops: float
    bytes_accessed: float
    dot_flops: tuple[tuple[str, float], ...] = ()  # per dtype, see profile.compute

    def dot_flops_json(self) -> str:
        return json.dumps(dict(self.dot_flops), sort_keys=True)

    def collectives_json(self) -> str:
        return json.dumps(
            [
                {
                    "kind": c.kind.value,
                    "bytes": c.nbytes,
                    "axes": list(c.axes),
                    "group": c.group_size,
                    "op": c.op_names[0] if c.op_names else "",
                    "elements": len(c.shapes),
                    "combinable": c.fully_combinable,
                    "scattered": c.scattered_bytes,
                }
                for c in self.collectives
            ]
        )


def compile_program(lowered: Any, backend: Backend) -> Any:
    """The executable of `lowered`, compiled in this process (to run it, or to read it)."""
    if backend is Backend.COMPILED and jax.default_backend() == "cpu":
        return lowered.compile(compiler_options=FAST_COMPILE)
    return lowered.compile()


def pool_size(threads: int, cores: int | None = None, memory: int | None = None) -> int:
    """Compile worker processes for `threads` compiling threads: one per thread, but no more
    than the cores this process may use (each compile is CPU-bound) nor than the memory
    available holds (`WORKER_MEMORY_BYTES` each: a worker holds a JAX runtime of its own).
    `cores` and `memory` default to this machine's (`usable_cores`, `available_memory`)."""
    cores = usable_cores() if cores is None else cores
    memory = available_memory() if memory is None else memory
    by_memory = threads if memory is None else memory // WORKER_MEMORY_BYTES
    return max(1, min(threads, cores, by_memory))


def compile_workers(backend: Backend, threads: int) -> CompileWorkers | None:
    """Worker processes for compile-only pricing on the CPU of one process, `pool_size`
    of them compiling at once; None where programs compile here (a measured program runs
    where it was compiled; a GPU worker would hold device memory of its own)."""
    if (
        not COMPILE_IN_WORKERS
        or backend is not Backend.COMPILED
        or jax.default_backend() != "cpu"
        or jax.process_count() != 1
    ):
        return None
    return shared_workers(pool_size(threads), jax.device_count())


def compile_to_text(lowered: Any, workers: CompileWorkers | None = None) -> CompiledText:
    """What compile-only pricing reads of `lowered`'s executable: compiled by `workers` when
    given (and the program can leave this process), in this process otherwise."""
    if workers is not None:
        request = compile_request(lowered, FAST_COMPILE)
        if request is not None:
            return workers.compile_once(request)
    return read_executable(compile_program(lowered, Backend.COMPILED))


def price_compiled(
    compiled: CompiledText,
    platform: Any,
    mesh: MeshSpec,
    accounting: MemoryAccounting | None = None,
    terminal_outputs: frozenset[int] | None = None,
) -> ProgramProfile:
    """Price a compiled program: its collectives, its compute and its memory.

    Without `accounting` (a whole step) the peak is all transient. `terminal_outputs` marks
    the combinable all-reduces (see `hlo.parse_collectives`).
    """
    hlo = compiled.hlo
    collectives = parse_collectives(hlo, mesh, terminal_outputs)
    t_comm = sum(platform.price(c, mesh) for c in collectives)
    flops, accessed = _cost(compiled)
    dots = dot_flops(hlo)
    t_comp = compute_time(platform, dots, flops, accessed)
    peak = _memory(compiled)
    if accounting is None:
        held = HeldMemory(persistent=0, saved=0, gradients=0, transient=peak, constants=0)
    else:
        # what the program keeps for the step and alive at once, from its schedule: its own
        # memory analysis packs temporaries into result buffers the step does not have
        # (there the results are the donated inputs' buffers)
        combined = frozenset(c.name for c in collectives if any(c.combinable))
        held = accounting.held(hlo, combined)
    return ProgramProfile(
        t_comm=t_comm,
        t_comp=t_comp,
        memory=peak,
        persistent_memory=held.persistent,
        transient_memory=held.transient,
        saved_memory=held.saved,
        gradient_memory=held.gradients,
        constant_memory=held.constants,
        collectives=collectives,
        flops=flops,
        bytes_accessed=accessed,
        dot_flops=dots,
    )


def compute_time(
    platform: Any, dots: Sequence[tuple[str, float]], flops: float, bytes_accessed: float
) -> float:
    """Compute seconds: dots and convolutions at their dtype's peak, the other FLOPs (the
    compiler's total minus the dots) at the f32 peak, and the bytes at memory bandwidth."""
    other = max(flops - sum(f for _, f in dots), 0.0)
    return float(platform.compute_time(dots, other, bytes_accessed))


def measure(
    compiled: Any,
    inputs: tuple[Any, ...],
    platform: Any,
    mesh: MeshSpec,
    *,
    accounting: MemoryAccounting | None = None,
    terminal_outputs: frozenset[int] | None = None,
    time_limit: float | None = None,
    donated: tuple[int, ...] = (),
) -> ProgramProfile:
    """Run `compiled` on real devices: warm-up (`WARMUP_RUNS`, and `WARMUP_SECONDS` at
    least), then the median of the timed runs.

    `time_limit` (seconds, a run as it takes it: launch included) is the dynamic limit: a
    program whose first timed run already exceeds it is abandoned, as the paper's profiler
    does with hopeless configurations.
    Inputs at `donated` positions are consumed by each run: fresh ones are made before every
    run, outside the timed region.
    """
    priced = price_compiled(read_executable(compiled), platform, mesh, accounting, terminal_outputs)
    launch = launch_time(devices_of(inputs))
    total = max(_timed_median(compiled, inputs, donated, time_limit) - launch, 0.0)
    t_comm = min(total, priced.t_comm)
    # the run's time, split by the priced collectives; memory and counts from the compiler
    return replace(priced, t_comm=t_comm, t_comp=total - t_comm)


def _timed_median(
    compiled: Any, inputs: tuple[Any, ...], donated: tuple[int, ...], time_limit: float | None
) -> float:
    """Seconds from dispatch to results ready: the median of `TIMED_RUNS` after the warm-up."""
    arrays = [_materialise(struct) for struct in inputs]

    def refill() -> None:
        for position in donated:
            arrays[position] = _materialise(inputs[position])
        jax.block_until_ready(arrays)

    # across processes every process must run a program as many times (its collectives pair
    # up): a warm-up by the clock, which each process reads alone, would leave one waiting
    floor = WARMUP_SECONDS if jax.process_count() == 1 else 0.0
    warmup_start, warmups = time.perf_counter(), 0
    while warmups < WARMUP_RUNS or time.perf_counter() - warmup_start < floor:
        refill()
        jax.block_until_ready(compiled(*arrays))
        warmups += 1
    times = []
    for run in range(TIMED_RUNS):
        refill()
        start = time.perf_counter()
        jax.block_until_ready(compiled(*arrays))
        times.append(time.perf_counter() - start)
        if run == 0 and time_limit is not None and times[0] > time_limit:
            raise SlowerThanLimit(
                f"took {times[0]:.4g} s, over the dynamic limit of {time_limit:.4g} s"
            )
    return statistics.median(times)


def devices_of(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The devices a program's inputs are placed on, in id order."""
    found = {
        d for struct in inputs if struct.sharding is not None for d in struct.sharding.device_set
    }
    return tuple(sorted(found, key=lambda device: device.id))


@functools.cache
def launch_time(devices: tuple[Any, ...]) -> float:
    """What `measure` reads for a program that does next to nothing on `devices` (one
    element, plus one, on each): a dispatch and a wait for the devices, paid by every program
    run alone and once by a whole step, so it is taken off every measured time. Measured
    once per process and device set; every process of a multi-process mesh measures it at
    the same point (its first measured program), as it runs the program on every device."""
    if not devices:
        return 0.0
    mesh = Mesh(np.array(devices), ("launch",))
    one = jax.ShapeDtypeStruct(
        (len(devices),), np.float32, sharding=NamedSharding(mesh, P("launch"))
    )
    nothing = jax.jit(lambda x: x + 1).lower(one).compile()
    return _timed_median(nothing, (one,), (), None)


def _materialise(struct: jax.ShapeDtypeStruct) -> Any:
    """A device array of zeros for an abstract input (PRNG keys wrapped from zero words)."""
    sharding = struct.sharding
    if jax.dtypes.issubdtype(struct.dtype, jax.dtypes.prng_key):
        data = jax.numpy.zeros((*struct.shape, 2), jax.numpy.uint32)
        return jax.device_put(jax.random.wrap_key_data(data), sharding)
    host = np.zeros(struct.shape, struct.dtype)
    return jax.make_array_from_callback(struct.shape, sharding, lambda index: host[index])


def _cost(compiled: CompiledText) -> tuple[float, float]:
    cost = compiled.cost
    if cost is None:
        raise ExplorerError(
            "the compiler gave no cost analysis for this program, so its compute cannot be "
            "priced (it is never counted as 0). The backend "
            f"{jax.default_backend()!r} may not support cost_analysis(); use the CPU or GPU "
            "backend to profile."
        )
    # XLA's cost analysis leaves out properties that are zero (a program that only moves
    # its arguments has no "flops" entry): an absent entry in a present analysis is a 0
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def _memory(compiled: CompiledText) -> int:
    """Peak bytes per device from the compiler's memory analysis."""
    if compiled.memory is None:
        raise ExplorerError(
            "the compiler gave no memory analysis for this program, so its memory cannot be "
            "priced (it is never counted as 0). The backend "
            f"{jax.default_backend()!r} may not support memory_analysis(); use the CPU or "
            "GPU backend to profile."
        )
    arguments, outputs, temporaries, aliased = compiled.memory
    return max(arguments + outputs + temporaries - aliased, 0)
