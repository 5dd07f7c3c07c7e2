"""The GPU a platform's device is, as XLA:GPU's compiler needs to know it: enough to compile
for that GPU on a machine that has none (deviceless compilation, `target_memory`).

Why: the compile-only backend profiles on XLA:CPU, whose memory for a bf16 training step is
2.2 to 3.0 times what XLA:GPU's buffer assignment gives for the same step (measured on an H200,
`assets/bench/gpu/NOTE.md`). A plan's fit on a GPU is a fact about XLA:GPU's program, so it is
judged on that program, compiled for the platform's GPU without one.

The figures are the public hardware specifications of each GPU, keyed by the device name the
platform presets use (a new platform's device name that is not here gets an error that says
how to add it):

- per compute capability (threads, shared memory, registers): NVIDIA CUDA C++ Programming
  Guide, "Technical Specifications per Compute Capability" (7.0: 96 KB shared memory per SM,
  all of it per block opted in; 8.0: 164 KB per SM, 163 KB per block; 9.0: 228 KB per SM,
  227 KB per block; every one: 2048 threads and 64 K 32-bit registers per SM, 1024 threads
  and 64 K registers per block, 48 KB shared memory per block without opting in);
- per GPU (SMs, FP32 cores per SM, boost clock, L2): the NVIDIA Tesla V100 whitepaper (80 SMs,
  64 FP32 cores/SM, 1530 MHz, 6 MB L2), the NVIDIA A100 whitepaper (108 SMs, 64 FP32
  cores/SM, 1410 MHz, 40 MB L2), the NVIDIA H100 whitepaper (H100 SXM5: 132 SMs, 128 FP32
  cores/SM, 50 MB L2; 1980 MHz boost); the H200 is the H100 SXM's chip with 141 GB of HBM3e.

Memory size and bandwidth come from the platform itself, so a rescaled platform compiles for
what it says.
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.errors import PlatformError, TargetCompilerError
from explorer.platforms.model import Platform


@dataclass(frozen=True, slots=True)
class ComputeCapability:
    """What the CUDA programming guide gives per compute capability."""

    major: int
    minor: int
    shared_memory_per_sm: int  # bytes
    shared_memory_per_block_optin: int  # bytes a block may take when it opts in
    threads_per_sm: int = 2048
    registers_per_sm: int = 65536
    registers_per_block: int = 65536
    threads_per_block: int = 1024
    shared_memory_per_block: int = 49152  # without opting in


VOLTA = ComputeCapability(7, 0, shared_memory_per_sm=98304, shared_memory_per_block_optin=98304)
AMPERE = ComputeCapability(8, 0, shared_memory_per_sm=167936, shared_memory_per_block_optin=166912)
HOPPER = ComputeCapability(9, 0, shared_memory_per_sm=233472, shared_memory_per_block_optin=232448)


@dataclass(frozen=True, slots=True)
class GpuTarget:
    """One GPU model, as XLA:GPU compiles for it."""

    gpu: str  # the device name the platform presets use
    capability: ComputeCapability
    multiprocessors: int
    fp32_cores_per_sm: int
    clock_ghz: float  # boost clock
    l2_cache_bytes: int


GPU_TARGETS: dict[str, GpuTarget] = {
    target.gpu: target
    for target in (
        GpuTarget("V100-SXM2-16GB", VOLTA, 80, 64, 1.53, 6 * 2**20),
        GpuTarget("A100-PCIe-40GB", AMPERE, 108, 64, 1.41, 40 * 2**20),
        GpuTarget("A100-SXM4-40GB", AMPERE, 108, 64, 1.41, 40 * 2**20),
        GpuTarget("H100-SXM5-80GB", HOPPER, 132, 128, 1.98, 50 * 2**20),
        GpuTarget("H200-SXM-141GB", HOPPER, 132, 128, 1.98, 50 * 2**20),
    )
}


def gpu_target(platform: Platform) -> GpuTarget:
    """The GPU `platform`'s device is; a clear error where it is not one this module knows."""
    target = GPU_TARGETS.get(platform.device.name)
    if target is None:
        raise PlatformError(
            f"platform {platform.name!r}: its device {platform.device.name!r} is not a GPU "
            f"this explorer can compile for without one; known: {sorted(GPU_TARGETS)}. Name "
            "one of these as the platform's device.name, or add the GPU's public "
            "specifications to explorer.platforms.gpu_targets.GPU_TARGETS"
        )
    return target


# The oldest compute capability each CUDA major release still compiles for: CUDA 13.0 dropped
# Maxwell, Pascal and Volta (sm_50 to sm_72; the CUDA 13.0 release notes).
OLDEST_CAPABILITY = {13: (7, 5)}


def check_compilable(platform: Platform, cuda: tuple[int, int]) -> None:
    """A clear error where the CUDA that the installed plugin was built against cannot
    compile for `platform`'s GPU (before XLA fails deep inside with "ptxas too old")."""
    target = gpu_target(platform)
    cc = target.capability
    oldest = OLDEST_CAPABILITY.get(cuda[0])
    if oldest is not None and (cc.major, cc.minor) < oldest:
        raise TargetCompilerError(
            f"platform {platform.name!r}: {target.gpu} (compute capability "
            f"{cc.major}.{cc.minor}) cannot be compiled for by JAX's CUDA plugin installed "
            f"here, built against CUDA {cuda[0]}.{cuda[1]}: CUDA {cuda[0]} compiles for "
            f"compute capability {oldest[0]}.{oldest[1]} and newer. Judge this GPU's memory "
            "with jax-cuda12-plugin installed instead (the same version as jax)"
        )


def target_config(platform: Platform, *, cudnn: tuple[int, int], cuda: tuple[int, int]) -> str:
    """XLA's `GpuTargetConfigProto`, as protobuf text, for `platform`'s GPU with its memory
    size and bandwidth; `cudnn` and `cuda` are the (major, minor) versions compiled for."""
    target = gpu_target(platform)
    cc = target.capability
    device = platform.device
    return f"""gpu_device_info {{
  threads_per_block_limit: {cc.threads_per_block}
  threads_per_warp: 32
  shared_memory_per_block: {cc.shared_memory_per_block}
  shared_memory_per_core: {cc.shared_memory_per_sm}
  threads_per_core_limit: {cc.threads_per_sm}
  core_count: {target.multiprocessors}
  fpus_per_core: {target.fp32_cores_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(device.memory_bandwidth_Bps)}
  l2_cache_size: {target.l2_cache_bytes}
  clock_rate_ghz: {target.clock_ghz}
  device_memory_size: {device.memory_bytes}
  shared_memory_per_block_optin: {cc.shared_memory_per_block_optin}
  cuda_compute_capability {{
    major: {cc.major}
    minor: {cc.minor}
  }}
  registers_per_core_limit: {cc.registers_per_sm}
  registers_per_block_limit: {cc.registers_per_block}
}}
platform_name: "CUDA"
dnn_version_info {{
  major: {cudnn[0]}
  minor: {cudnn[1]}
}}
runtime_version {{
  major: {cuda[0]}
  minor: {cuda[1]}
}}
device_description_str: "NVIDIA {target.gpu}"
"""
