"""Profiling backends: one interface, two ways to price a standalone program.

`compiled`: compile only (no arrays allocated). Communication is the collectives XLA emitted
(parsed from the optimised HLO) priced by the platform model; computation is the compiler's
cost analysis (FLOPs, bytes accessed) on the platform's roofline; memory is the compiler's
memory analysis. Deterministic, and it plans for hardware you do not have.

`measured`: run the program on the devices JAX sees (virtual CPU devices, GPUs, or several
processes joined with `jax.distributed`): 5 warm-up runs, then 10 timed, median. Without a
device trace to split it, the total is split using the compiled collectives priced by the
platform (calibrate one with `python -m explorer calibrate`).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import jax
import numpy as np

from explorer.errors import ExplorerError
from explorer.mesh import MeshSpec
from explorer.profile.hlo import Collective, parse_collectives

WARMUP_RUNS = 5
TIMED_RUNS = 10

# XLA's CPU code generation does not change the optimised HLO, the cost analysis or the
# memory analysis: skipping its expensive LLVM passes makes compile-only profiling ~2x faster.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


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
    persistent_memory: int  # parameters, optimizer state, activations kept for backward
    transient_memory: int  # the rest of the peak
    collectives: tuple[Collective, ...]
    flops: float
    bytes_accessed: float

    def collectives_json(self) -> str:
        return json.dumps(
            [
                {
                    "kind": c.kind.value,
                    "bytes": c.nbytes,
                    "axes": list(c.axes),
                    "group": c.group_size,
                    "op": c.op_names[0] if c.op_names else "",
                }
                for c in self.collectives
            ]
        )


def compile_program(lowered: Any, backend: Backend) -> Any:
    if backend is Backend.COMPILED and jax.default_backend() == "cpu":
        return lowered.compile(compiler_options=FAST_COMPILE)
    return lowered.compile()


def price_compiled(
    compiled: Any, platform: Any, mesh: MeshSpec, persistent_bytes: int
) -> ProgramProfile:
    collectives = parse_collectives(compiled.as_text(), mesh)
    t_comm = sum(platform.price(c, mesh) for c in collectives)
    flops, accessed = _cost(compiled)
    t_comp = platform.compute_time(flops, accessed)
    peak = _peak_memory(compiled)
    persistent = min(persistent_bytes, peak)
    return ProgramProfile(
        t_comm=t_comm,
        t_comp=t_comp,
        memory=peak,
        persistent_memory=persistent,
        transient_memory=peak - persistent,
        collectives=collectives,
        flops=flops,
        bytes_accessed=accessed,
    )


def measure(
    compiled: Any,
    inputs: tuple[Any, ...],
    platform: Any,
    mesh: MeshSpec,
    persistent_bytes: int,
    *,
    time_limit: float | None = None,
) -> ProgramProfile:
    """Run `compiled` on real devices: warm-up, then the median of the timed runs.

    `time_limit` (seconds) is the dynamic limit: a program whose first timed run already
    exceeds it is abandoned, as the paper's profiler does with hopeless configurations.
    """
    priced = price_compiled(compiled, platform, mesh, persistent_bytes)
    arrays = [_materialise(struct) for struct in inputs]
    for _ in range(WARMUP_RUNS):
        jax.block_until_ready(compiled(*arrays))
    times = []
    for run in range(TIMED_RUNS):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*arrays))
        times.append(time.perf_counter() - start)
        if run == 0 and time_limit is not None and times[0] > time_limit:
            raise SlowerThanLimit(
                f"took {times[0]:.4g} s, over the dynamic limit of {time_limit:.4g} s"
            )
    total = statistics.median(times)
    t_comm = min(total, priced.t_comm)
    return ProgramProfile(
        t_comm=t_comm,
        t_comp=total - t_comm,
        memory=priced.memory,
        persistent_memory=priced.persistent_memory,
        transient_memory=priced.transient_memory,
        collectives=priced.collectives,
        flops=priced.flops,
        bytes_accessed=priced.bytes_accessed,
    )


def _materialise(struct: jax.ShapeDtypeStruct) -> Any:
    """A device array of zeros for an abstract input (PRNG keys wrapped from zero words)."""
    sharding = struct.sharding
    if jax.dtypes.issubdtype(struct.dtype, jax.dtypes.prng_key):
        data = jax.numpy.zeros((*struct.shape, 2), jax.numpy.uint32)
        return jax.device_put(jax.random.wrap_key_data(data), sharding)
    host = np.zeros(struct.shape, struct.dtype)
    return jax.make_array_from_callback(struct.shape, sharding, lambda index: host[index])


def _cost(compiled: Any) -> tuple[float, float]:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    cost = cost or {}
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def _peak_memory(compiled: Any) -> int:
    stats = compiled.memory_analysis()
    if stats is None:
        return 0
    total = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )
    return int(max(total, 0))
