"""`analyze`'s arguments checked where they enter, before anything expensive: the mesh and
platform normalised, every other argument's type and range; then, once the blocks exist and
before anything compiles, the mesh against the blocks and the platform against the dtypes."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import BackendError, InputError, MeshFitError, MeshFitWarning, PlatformError
from explorer.ir import BlockAnalysis, DimRole, Graph, ParallelBlock
from explorer.mesh import MeshSpec, mesh_spec, require_devices
from explorer.segments import DEFAULT_CONFIG_CAP

if TYPE_CHECKING:
    from explorer.platforms import Platform


def check_platform_peaks(graph: Graph, platform: Any) -> None:
    """Before any compile: the platform prices every dtype the step multiplies in (its
    error names the file, the field and the dtype)."""
    from explorer.profile.compute import hlo_dtype

    contractions = ("dot_general", "conv_general_dilated")
    dtypes = {t.dtype for op in graph.ops if op.primitive in contractions for t in op.input_types}
    for dtype in sorted(dtypes):
        platform.peak_flops(hlo_dtype(dtype))


def checked_arguments(
    step: Any,
    *,
    mesh: Any,
    platform: Any,
    backend: Any,
    cache: Any,
    config_cap: Any,
    workers: Any,
    profile: Any,
    only: Any,
    cancel: Any,
    free_axes: Any = False,
    whole_mesh: Any = False,
    shard_parameters: Any = False,
    batch_outer: Any = False,
    sequence_parallel: Any = False,
    batch_inner: Any = False,
    contract_last: Any = False,
) -> tuple[MeshSpec, Platform]:
    """`analyze`'s arguments checked where they enter, before the step is traced: the mesh
    and platform normalised, every other argument's type and range."""
    from explorer.platforms import Platform, load_platform
    from explorer.profile.backends import Backend

    if not callable(step):
        raise InputError(
            f"analyze: argument 'step': expected the training step function, found "
            f"{type(step).__name__} {step!r}"
        )
    spec = mesh_spec(mesh)
    if backend not in tuple(Backend):
        raise BackendError(
            f"backend: expected one of {[b.value for b in Backend]}, found {backend!r}"
        )
    if isinstance(platform, Platform):
        target = platform
    elif isinstance(platform, (str, Path)):
        target = load_platform(platform)
    else:
        raise PlatformError(
            f"platform: expected a Platform (explorer.platforms.load_platform), a preset name "
            f"or the path of a platform JSON file, found {type(platform).__name__} {platform!r}"
        )
    if cache is not None and not isinstance(cache, (str, Path)):
        raise InputError(
            f"cache: expected the path of the profile cache file or None (keep nothing on "
            f"disk), found {type(cache).__name__} {cache!r}"
        )
    if isinstance(config_cap, bool) or not isinstance(config_cap, int) or config_cap < 1:
        raise InputError(
            f"config_cap: expected the profiling cap, an int >= 1 of configurations one "
            f"unique segment may have (default {DEFAULT_CONFIG_CAP}), found "
            f"{type(config_cap).__name__} {config_cap!r}; a memory budget in bytes goes to "
            "Analysis.plan(memory_budget=...)"
        )
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise InputError(
            f"workers: expected None (every core) or an int >= 1 of compile threads, found "
            f"{type(workers).__name__} {workers!r}"
        )
    switches = {
        "profile": profile,
        "free_axes": free_axes,
        "whole_mesh": whole_mesh,
        "shard_parameters": shard_parameters,
        "batch_outer": batch_outer,
        "sequence_parallel": sequence_parallel,
        "batch_inner": batch_inner,
        "contract_last": contract_last,
    }
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise InputError(
                f"{name}: expected True or False, found {type(value).__name__} {value!r}"
            )
    if batch_outer and batch_inner:
        raise InputError(
            "batch_outer, batch_inner: expected the batch pinned to one mesh axis (the outer "
            "one, or the inner one), found both True; analyse each space on its own"
        )
    if only is not None and not callable(only):
        raise InputError(
            f"only: expected None or a function (kind, label, configuration) -> bool, found "
            f"{type(only).__name__} {only!r}"
        )
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise InputError(
            f"cancel: expected None or a threading.Event, found {type(cancel).__name__}"
        )
    if profile:  # placing programs needs the devices; pricing them needs the platform's
        require_devices(spec)
        if spec.size > target.devices:
            raise PlatformError(
                f"mesh {spec}: expected at most the {target.devices} devices of platform "
                f"{target.name!r}, found a mesh of {spec.size}; use a smaller mesh or a "
                "larger platform (a preset, or a calibrated file)"
            )
    return spec, target


def check_mesh_fit(blocks: BlockAnalysis, mesh: MeshSpec, free_axes: bool) -> None:
    """Before anything is profiled: a block whose head dims no mesh axis divides keeps only
    the replicated strategy. When every block does, no plan can use the mesh (an error, with
    the dims to fit); when some do, they compute on every device (a warning naming them)."""
    if not blocks.blocks:
        return  # a step without contractions has nothing to split: any mesh replicates it
    stuck = [b for b in blocks.blocks if all(not s.assignment for s in b.strategies)]
    if not stuck:
        return
    hint = ""
    if len(mesh.axes) > 1 and not free_axes:
        hint = (
            " On a 2-D mesh the batch is pinned to the outer axis by default; "
            "free_axes=True (--free-axes) lets each axis take any dim."
        )

    def dims(block: ParallelBlock) -> str:
        return ", ".join(f"{role.value}={size}" for role, size in block.role_sizes)

    listed = "; ".join(f"block {b.index} ({b.scope}: {dims(b)})" for b in stuck[:8])
    if len(stuck) > 8:
        listed += f"; ... and {len(stuck) - 8} more"
    # sizes that split the batch (M) of every such block: data parallelism, at least, fits
    batches = [n for b in stuck for role, n in b.role_sizes if role is DimRole.M]
    fitting = [p for p in range(2, 65) if batches and all(n % p == 0 for n in batches)]
    sizes = f" (axis sizes {fitting[:6]} divide their batch dim M)" if fitting else ""
    if len(stuck) == len(blocks.blocks):
        raise MeshFitError(
            f"mesh {mesh}: expected axis sizes that divide some dim of a block's head "
            f"contraction, found none that does, so every plan would run the whole step on "
            f"every device: {listed}. Use a mesh whose sizes divide these dims{sizes}.{hint}"
        )
    contractions = sum(len(b.ops) for b in stuck)
    warnings.warn(
        f"mesh {mesh}: {len(stuck)} of {len(blocks.blocks)} blocks, holding {contractions} of "
        f"the blocks' {sum(len(b.ops) for b in blocks.blocks)} ops, can split over no axis (no "
        f"axis size divides a dim of their head) and stay replicated on every device: "
        f"{listed}. A mesh whose sizes divide these dims lets them split{sizes}.{hint}",
        MeshFitWarning,
        stacklevel=3,
    )
