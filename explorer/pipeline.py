"""analyze(): the one place that chains the stages.

trace -> blocks -> space -> segments -> profile -> cost -> solve -> plan.
Each stage receives the previous artefact as an argument; this module only sequences them and
keeps what each produced, so nothing computed is lost when a later stage fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from explorer.analysis import Analysis, SegmentedStep
from explorer.arguments import check_mesh_fit, check_platform_peaks, checked_arguments
from explorer.cost import build_cost_model
from explorer.errors import InputError
from explorer.frontier_store import frontier_store_path, solve_kept
from explorer.mesh import MeshLike
from explorer.plan_space import cut_cap, plan_rules, space_options
from explorer.segments import DEFAULT_CONFIG_CAP, build_segments
from explorer.space import step_space
from explorer.trace import ArgRoles, trace, traced_again
from explorer.units import BytesLike, parse_bytes

if TYPE_CHECKING:
    from explorer.ir import Graph
    from explorer.platforms import PlatformLike

__all__ = ["DEFAULT_CACHE", "Analysis", "SegmentedStep", "analyze"]

DEFAULT_CACHE = "~/.cache/explorer/profiles.sqlite"


@overload
def analyze(
    step: Callable[..., Any],
    *args: Any,
    mesh: MeshLike = ...,
    platform: PlatformLike = ...,
    backend: str = ...,
    cache: str | Path | None = ...,
    profile: Literal[True] = ...,
    free_axes: bool = ...,
    whole_mesh: bool = ...,
    shard_parameters: bool = ...,
    batch_outer: bool = ...,
    batch_inner: bool = ...,
    contract_last: bool = ...,
    sequence_parallel: bool = ...,
    memory_resolution: BytesLike = ...,
    arg_roles: ArgRoles | None = ...,
    config_cap: int = ...,
    workers: int | None = ...,
    progress: bool = ...,
    only: Callable[[str, str, str], bool] | None = ...,
    cancel: threading.Event | None = ...,
    traced: Graph | None = ...,
) -> Analysis: ...


@overload
def analyze(
    step: Callable[..., Any],
    *args: Any,
    mesh: MeshLike = ...,
    platform: PlatformLike = ...,
    backend: str = ...,
    cache: str | Path | None = ...,
    profile: bool,
    free_axes: bool = ...,
    whole_mesh: bool = ...,
    shard_parameters: bool = ...,
    batch_outer: bool = ...,
    batch_inner: bool = ...,
    contract_last: bool = ...,
    sequence_parallel: bool = ...,
    memory_resolution: BytesLike = ...,
    arg_roles: ArgRoles | None = ...,
    config_cap: int = ...,
    workers: int | None = ...,
    progress: bool = ...,
    only: Callable[[str, str, str], bool] | None = ...,
    cancel: threading.Event | None = ...,
    traced: Graph | None = ...,
) -> SegmentedStep: ...


def analyze(
    step: Callable[..., Any],
    *args: Any,
    mesh: MeshLike = (4,),
    platform: PlatformLike = "a100-pcie-8",
    backend: str = "compiled",
    cache: str | Path | None = DEFAULT_CACHE,
    profile: bool = True,
    free_axes: bool = False,
    whole_mesh: bool = False,
    shard_parameters: bool = False,
    batch_outer: bool = False,
    sequence_parallel: bool = False,
    batch_inner: bool = False,
    contract_last: bool = False,
    memory_resolution: BytesLike = 0,
    arg_roles: ArgRoles | None = None,
    config_cap: int = DEFAULT_CONFIG_CAP,
    workers: int | None = None,
    progress: bool = True,
    only: Callable[[str, str, str], bool] | None = None,
    cancel: threading.Event | None = None,
    traced: Graph | None = None,
) -> SegmentedStep:
    """Trace `step(*args)`, build ParallelBlocks and their strategies on `mesh`, segment the
    block sequence and (unless `profile=False`) profile every unique segment configuration and
    boundary with `backend` priced on `platform`. `cache=None` keeps nothing on disk.
    On a 2-D mesh the batch is pinned to the outer axis (the paper's rule); `whole_mesh`
    also offers every block its 1-D strategies over the flattened mesh (tensor parallelism
    over all the devices, say), `free_axes` every axis-to-role assignment, `batch_outer`
    the batch's own dim on the outer axis where the batch does not split over the whole
    mesh (M' and E', see `DimRole`), beside the paper's strategies; `batch_inner` pins the
    batch to the inner axis instead of the outer one (the paper's rule with the axes
    swapped, its own dim primed there where the batch does not split over every device):
    weights split across the nodes, the batch within each. `contract_last` gives K of a
    contraction with several contracted dims the last that splits evenly, not the first (a
    combine einsum's experts, not its capacity: expert parallelism through the combine).
    `shard_parameters` offers every block that splits its batch a twin keeping its
    parameters (and their optimizer state) sharded over the batch axes between steps, as
    ZeRO-3/FSDP does: the solver then trades their gathers for memory block by block.
    `sequence_parallel` offers every block whose strategy splits K a twin reduce-scattering
    the head's partial sums onto M instead of all-reducing them, so the ops after the head
    work on M-shards, and every block whose strategy splits N (not K) a twin doing the same
    with its input gradient's partial sums in the backward pass (Megatron's sequence
    parallelism where M is the sequence): the same bytes moved, less activation memory, and
    a gather where a block wants them whole.
    `config_cap` caps the configurations of one unique segment: a type over it is cut at its
    block boundaries into smaller types (a block alone over it is refused, naming the block).
    `only(kind, label, configuration)` restricts profiling (and so the plans) to the programs
    it accepts, for a quick look at part of the space. `traced`, the `.graph` of an earlier
    analysis of the same step and arguments, skips tracing it again (another space of one
    step, say); it is checked against `args`. Setting `cancel` stops profiling:
    what finished stays in the cache and `ProfilingCancelled` says how much.
    `memory_resolution` (bytes, or `"64MiB"`) is for a space too wide for the exact frontier
    (`FrontierTooLargeError`): the solver's heavy steps (over `solve.APPROXIMATE_ABOVE`
    candidate partial plans) compare memory in units of it, so the frontier may miss exact
    plans, but holds one no slower within `frontier.memory_slack` more memory of each
    (`solve_frontier`); a space with no heavy step is solved exactly all the same.

    Every argument is checked before the step is traced (an `InputError` naming it), and
    the mesh against the blocks before anything is profiled: a `MeshFitError` when no block
    can split over it, a `MeshFitWarning` naming the blocks that stay replicated."""
    spec, target = checked_arguments(
        step,
        mesh=mesh,
        platform=platform,
        backend=backend,
        cache=cache,
        config_cap=config_cap,
        workers=workers,
        profile=profile,
        only=only,
        cancel=cancel,
        free_axes=free_axes,
        whole_mesh=whole_mesh,
        shard_parameters=shard_parameters,
        batch_outer=batch_outer,
        sequence_parallel=sequence_parallel,
        batch_inner=batch_inner,
        contract_last=contract_last,
    )
    resolution = int(parse_bytes(memory_resolution, "memory_resolution"))
    if traced is None:
        graph = trace(step, *args, arg_roles=arg_roles)
    elif arg_roles is not None:
        raise InputError(
            "arg_roles: the inputs' roles were decided when `traced` was traced; pass "
            "arg_roles to that analysis, not with traced"
        )
    else:
        graph = traced_again(traced, step, *args)
    check_platform_peaks(graph, target)
    blocks = step_space(
        graph,
        spec,
        free_axes=free_axes,
        whole_mesh=whole_mesh,
        shard_parameters=shard_parameters,
        batch_outer=batch_outer,
        sequence_parallel=sequence_parallel,
        batch_inner=batch_inner,
        contract_last=contract_last,
    )
    check_mesh_fit(blocks, spec, free_axes)
    from explorer.layouts import instance_dependencies, loop_twins, split_by_dependencies

    cut = build_segments(graph, blocks, cap=config_cap)
    dependencies = instance_dependencies(graph, blocks, cut, spec)
    segments = split_by_dependencies(cut, dependencies, blocks.blocks)
    space = space_options(
        spec,
        free_axes=free_axes,
        whole_mesh=whole_mesh,
        shard_parameters=shard_parameters,
        config_cap=cut_cap(graph, blocks, cut, config_cap),
        batch_outer=blocks.primed and not batch_inner,
        sequence_parallel=blocks.scattering,
        batch_inner=batch_inner,  # on a 2-D mesh, a space of its own even unprimed
        contract_last=blocks.contracted_last,  # the paper's blocks where no K moved
    )
    if not profile:
        return SegmentedStep(
            graph, blocks, segments, spec, step, tuple(args), target, backend, space
        )
    from explorer.profile.cache import ProfileCache
    from explorer.profile.runner import profile_all

    with ProfileCache(cache) as store:
        profiled = profile_all(
            graph,
            blocks,
            segments,
            spec,
            platform=target,
            backend=backend,
            cache=store,
            config_cap=config_cap,
            workers=workers,
            progress=progress,
            only=only,
            cancel=cancel,
            dependencies=dependencies,
        )
        kept_at = frontier_store_path(store.path if store.in_memory_since is None else None)
    model = build_cost_model(segments, profiled, dependencies, loop_twins(graph, blocks.blocks))
    return Analysis(
        graph,
        blocks,
        segments,
        spec,
        step,
        tuple(args),
        target,
        backend,
        space,
        profiled,
        model,
        # uniform for a step with a scan: see Analysis.plan
        solve_kept(
            model, uniform=bool(graph.loops), store_path=kept_at, memory_resolution=resolution
        ),
        kept_at,
        resolution,
        plan_rules(graph, blocks, segments, spec, space.config_cap),
    )
