"""A plan's memory on the platform's own GPU: the whole step compiled by XLA:GPU for that GPU,
on a machine that has none.

Every other figure of the compile-only backend comes from XLA:CPU, whose buffer assignment for
a bf16 training step holds 2.2 to 3.0 times what XLA:GPU's holds (one H200 against this
project's XLA:CPU, `assets/bench/gpu/NOTE.md`). Whether a plan fits a GPU is a fact about
XLA:GPU's program, so it is judged here on that program: the step lowered under the plan for
deviceless GPUs of the platform's kind (`platforms.gpu_targets`, `_jax_compat.deviceless`) and
XLA's memory analysis of what it compiles. Checked against the H200's own figures for the same
steps in `benchmarks/gpu_check.py --phases target` (see that NOTE).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from explorer import _jax_compat as jc
from explorer._jax_compat.deviceless import deviceless_gpus, plugin_versions
from explorer.errors import NoPlanFitsError
from explorer.evaluation import _program_digest, lower_step
from explorer.evaluation_store import EvaluationStore
from explorer.plan_document import _check_plan_and_step
from explorer.plan_types import Plan
from explorer.units import BytesLike, parse_bytes

if TYPE_CHECKING:
    from explorer.pipeline import Analysis
from explorer.platforms import PlatformLike, resolve_platform
from explorer.platforms.gpu_targets import check_compilable, gpu_target, target_config

# Matrix products go to cuBLAS, not to Triton fusions. Without a GPU to autotune on, XLA:GPU
# picks Triton's tiles by heuristics that fail on some sharded shapes ("Couldn't find output
# tile sizes", seen on tiny GPT under Megatron on 4 devices); cuBLAS compiles every shape.
# Against the H200's own analysis the two differ by a few per cent either way (the NOTE).
# LLVM's optimisation of the kernels comes after buffer assignment: skipped, it changes no
# memory figure (GPT-2.6B, 4 layers: the same four numbers) and the compile is shorter.
TARGET_COMPILE_OPTIONS: dict[str, Any] = {
    "xla_gpu_enable_triton_gemm": False,
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}


@dataclass(frozen=True, slots=True)
class TargetMemory:
    """XLA:GPU's memory analysis of the whole step under a plan, bytes per device."""

    gpu: str  # the GPU compiled for
    arguments: int
    outputs: int
    temporaries: int
    aliased: int  # outputs written into donated arguments' buffers
    compile_s: float  # what compiling took when it was done (a kept answer keeps it)

    @property
    def peak(self) -> int:
        """What the step holds at once: its arguments, results and temporaries, a result
        written into a donated argument's buffer counted once."""
        return max(self.arguments + self.outputs + self.temporaries - self.aliased, 0)


def target_memory(
    plan: Plan,
    platform: PlatformLike,
    step: Callable[..., Any],
    *args: Any,
    store: EvaluationStore | None = None,
    compile_missing: bool = True,
) -> TargetMemory:
    """The memory of `step` under `plan` on `platform`'s GPU, compiled by XLA:GPU without
    one. `store` keeps answers across runs, by the plan's program and the GPU's configuration
    (every figure of the platform the compile reads). With `compile_missing=False` only the
    store answers: a LookupError where it holds nothing (a report that shows what was kept
    without compiling)."""
    _check_plan_and_step(plan, step, "target_memory")
    resolved = resolve_platform(platform, "target_memory: platform")
    gpu = gpu_target(resolved)  # an unknown GPU is named before anything is compiled
    cudnn, cuda = plugin_versions()
    config = target_config(resolved, cudnn=cudnn, cuda=cuda)
    # what decides XLA:GPU's program besides the plan's: the GPU and how it is compiled for
    compiled_for = config + json.dumps(TARGET_COMPILE_OPTIONS, sort_keys=True)
    key = (_program_digest(plan), "gpu@" + hashlib.sha256(compiled_for.encode()).hexdigest()[:16])
    if store is not None:
        kept = store.get(key, lambda fields: TargetMemory(**fields))
        if kept is not None:
            return kept
    if not compile_missing:
        raise LookupError(f"no kept XLA:GPU memory of this plan on {gpu.gpu}")
    check_compilable(resolved, cuda)  # before XLA fails deep inside on an old GPU
    per_node = min(resolved.devices_per_node, plan.mesh.size)
    devices = deviceless_gpus(config, math.ceil(plan.mesh.size / per_node), per_node)
    start = time.perf_counter()
    lowered = lower_step(plan, step, args, devices).lowered
    stats = jc.read_executable(lowered.compile(TARGET_COMPILE_OPTIONS)).memory
    if stats is None:  # XLA:GPU always analyses memory; say so plainly if it ever does not
        raise RuntimeError(f"XLA:GPU gave no memory analysis for the step on {gpu.gpu}")
    answer = TargetMemory(gpu.gpu, *stats, compile_s=time.perf_counter() - start)
    if store is not None:
        store.put(key, asdict(answer))
    return answer


@dataclass(frozen=True, slots=True)
class GpuFit:
    """The fastest frontier plan that fits the GPU, and what finding it compiled."""

    plan: Plan
    memory: TargetMemory
    budget: int
    # (predicted seconds, predicted bytes, XLA:GPU's bytes) of every frontier plan compiled
    compiled: tuple[tuple[float, int, int], ...]


def fastest_plan_on_gpu(
    analysis: Analysis,
    step: Callable[..., Any],
    *args: Any,
    memory_budget: BytesLike | None = None,
    store: EvaluationStore | None = None,
    compile_missing: bool = True,
) -> GpuFit:
    """The fastest plan of `analysis.frontier` whose memory on the platform's GPU
    (`target_memory`) fits `memory_budget` (default: the device's memory).

    The frontier is ordered by predicted memory, which XLA:CPU's programs give, 2-3 times
    XLA:GPU's; the plans it trades away for memory may fit the GPU after all. The fastest
    plan is compiled first. Where it does not fit, the frontier is bisected for the fastest
    plan that does, on the assumption that XLA:GPU's memory grows with the predicted memory
    along it (the plan returned was compiled and fits; a faster one that the assumption
    skipped could fit too). A few compiles: at most 2 + log2 of the frontier's points.
    `store` and `compile_missing` as for `target_memory`."""
    budget = int(
        analysis.platform.device.memory_bytes
        if memory_budget is None
        else parse_bytes(memory_budget, "memory_budget")
    )
    points = analysis.frontier.points  # by increasing memory and decreasing time
    compiled: list[tuple[float, int, int]] = []
    found: dict[int, tuple[Plan, TargetMemory]] = {}

    def fits(index: int) -> bool:
        plan = analysis.plan_of(points[index].selection, source="cfp")
        memory = target_memory(
            plan, analysis.platform, step, *args, store=store, compile_missing=compile_missing
        )
        compiled.append((plan.time, plan.memory, memory.peak))
        found[index] = (plan, memory)
        return memory.peak <= budget

    fitting, too_big = 0, len(points) - 1
    if fits(too_big):
        fitting = too_big
    elif too_big == 0 or not fits(fitting):
        least = found[fitting][1]
        raise NoPlanFitsError(
            f"no plan fits {budget / 2**30:.1f} GiB on {least.gpu}: the plan of least "
            f"predicted memory needs {least.peak / 2**30:.1f} GiB there (XLA:GPU). Raise "
            "the budget, use more devices, or add a mesh axis."
        )
    while too_big - fitting > 1:  # points[fitting] fits, points[too_big] does not
        middle = (fitting + too_big) // 2
        if fits(middle):
            fitting = middle
        else:
            too_big = middle
    plan, memory = found[fitting]
    return GpuFit(plan, memory, budget, tuple(compiled))
