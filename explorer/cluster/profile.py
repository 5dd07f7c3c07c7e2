"""Profiling on the global mesh of a cluster; process 0 keeps the rows.

`measured`: every host runs every program.
Each program is an SPMD program over the devices of every process, so every process must
compile and run the same programs in the same order. Three things keep them in step:

- the cache: process 0 reads the rows its cache file already holds for the `measured`
  backend and sends them to every process, which profiles against that copy, so every host
  skips the same programs (a rerun resumes where a failed run stopped);
- no early abandon: a program slower than the best so far is timed to the end (the dynamic
  limit of one process alone would stop one host inside a collective the others still run);
- after each program the processes agree on its outcome before process 0 commits its row,
  so a row is in the file only once every host has finished it.

Every other process keeps its rows in memory only.

`compiled`: no program runs, so the hosts share the work: each compiles every N-th program
of the run (its share, on its own cores), and process 0 gathers every host's rows at the end
and writes them (a host that fails loses its share of this run; the others' rows are kept only
if the gathering is reached). Cold compile-only profiling then scales with the hosts.
"""

from __future__ import annotations

import itertools
import math
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from explorer.cluster.join import Cluster, broadcast, gather_bytes
from explorer.errors import ClusterError
from explorer.mesh import MeshSpec, mesh_spec
from explorer.profile.cache import ProfileCache, ProfileRecord, ProgramKey
from explorer.profile.profiles import Profiles
from explorer.segments import DEFAULT_CONFIG_CAP

BACKEND = "measured"  # the backend whose programs every host runs in step


@dataclass(frozen=True, slots=True)
class ClusterProfile:
    """What a cluster profiling run did, as every process saw it."""

    cluster: Cluster
    mesh: MeshSpec
    backend: str
    programs: int  # profiles (boundaries that move the same tensors share a program)
    profiled: int  # programs this run measured or compiled
    here: int  # of which this process compiled (compiled: its share; measured: all)
    cached: int  # programs found in the cache
    infeasible: int
    cache: Path | None  # the file process 0 wrote (None elsewhere, or without a cache)
    profiles: Profiles = field(compare=False, repr=False)  # profile_all's (`.frame()` shows)

    def summary(self) -> str:
        if self.cache:
            where = f" into {self.cache}"
        elif not self.cluster.leader:
            where = f" (process 0 keeps the rows; this is process {self.cluster.process_id})"
        else:
            where = " (no cache)"
        return (
            f"{self.programs} rows on mesh {self.mesh} over {self.cluster.processes} "
            f"process(es) x {self.cluster.local_devices} device(s): {self.profiled} programs "
            f"{self.backend} ({self.here} by this process){where}, {self.cached} from the "
            f"cache, {self.infeasible} rows infeasible"
        )


class _RunCache(ProfileCache):
    """The cache one process profiles against: in memory, holding the rows process 0's file
    held when the run started (the same on every process), and writing each new row through
    to that file on process 0 once every process has finished the program."""

    def __init__(
        self,
        cluster: Cluster,
        rows: Sequence[ProfileRecord],
        file: ProfileCache | None,
        on_program: Callable[[ProfileRecord], None] | None,
        in_step: bool = True,
    ) -> None:
        super().__init__(None)
        for record in rows:
            super().put(record)
        self.cluster = cluster
        self.file = file
        self.on_program = on_program
        self.in_step = in_step  # False: each host profiles its own share (compiled)
        self.new: list[ProfileRecord] = []

    def put(self, record: ProfileRecord) -> None:
        if not self.in_step:
            super().put(record)
            self.new.append(record)
            if self.on_program is not None:
                self.on_program(record)
            return
        mine = f"{record.key.digest()[:16]}:{record.status}"
        outcomes = [b.decode() for b in gather_bytes(self.cluster, mine.encode())]
        differ = [(p, o) for p, o in enumerate(outcomes) if o != mine]
        if differ:
            raise ClusterError(
                f"the processes disagree on program {record.key.segment} "
                f"{record.key.config!r}: process {self.cluster.process_id} has {mine}, "
                + ", ".join(f"process {p} has {o}" for p, o in differ)
                + "; a program failed on some hosts only (out of memory on one?), so the "
                "others cannot go on in step. The rows before it are kept."
            )
        super().put(record)
        if self.file is not None:
            self.file.put(record)
        if self.on_program is not None:
            self.on_program(record)


def cached_rows(cache: ProfileCache, backend: str) -> list[ProfileRecord]:
    """The rows of `cache` a `backend` run on this JAX can reuse (a superset: the runner
    picks its own by key)."""
    import jax

    return [
        r
        for r in cache.records()
        if r.key.backend == backend and r.key.jax_version == jax.__version__
    ]


def share(
    cluster: Cluster, names: Sequence[tuple[str, str, str]]
) -> Callable[[str, str, str], bool]:
    """The programs this process compiles: every `processes`-th of the run's program names
    (kind, label, configuration) in sorted order, starting at its id."""
    ordered = sorted(set(names))
    mine = frozenset(ordered[cluster.process_id :: cluster.processes])
    return lambda kind, label, config: (kind, label, config) in mine


def segment_labels(segmentation: Any) -> tuple[str, ...]:
    """The labels `only=` accepts: segment types, then boundaries ("layer->head")."""
    from explorer.space import pair_boundaries

    unique = segmentation.unique
    types = tuple(u.label for u in unique)
    pairs = tuple(f"{unique[a].label}->{unique[b].label}" for a, b in pair_boundaries(segmentation))
    return types + pairs


def selection(
    only: Sequence[str], analysis: Any, segmentation: Any
) -> Callable[[str, str, str], bool] | None:
    """The runner's filter for `only` entries: `label` (a segment type or a boundary, every
    configuration) or `type:configuration` (one configuration of a segment type, named by its
    own blocks' strategies, e.g. `layer:M@x+y,M@x+y,M@x+y,M@x+y`). Checked before profiling."""
    from explorer.layouts import configuration_name
    from explorer.profile.runner import own_config

    if not only:
        return None
    known = segment_labels(segmentation)
    first = {i.unique_id: i for i in reversed(segmentation.instances)}
    configs = {}
    for unique in segmentation.unique:
        own = first[unique.id].blocks
        spaces = [range(len(analysis.blocks[b].strategies)) for b in own]
        configs[unique.label] = {
            configuration_name(analysis.blocks, own, choice)
            for choice in itertools.product(*spaces)
        }
    wanted: dict[str, set[str] | None] = {}
    for entry in only:
        label, _, config = entry.partition(":")
        if label not in known:
            raise ClusterError(
                f"--only {entry!r}: no segment type or boundary named {label!r}; this model "
                f"has {list(known)}"
            )
        if not config:
            wanted[label] = None
            continue
        if label not in configs or config not in configs[label]:
            some = sorted(configs.get(label, ()))[:4]
            raise ClusterError(
                f"--only {entry!r}: {label!r} has no configuration {config!r}; expected a "
                f"segment type's own configuration such as {some}"
                if some
                else f"--only {entry!r}: a configuration can only be chosen for a segment type, "
                f"not for the boundary {label!r}"
            )
        chosen = wanted.setdefault(label, set())
        if chosen is not None:
            chosen.add(config)

    def keep(kind: str, label: str, config: str) -> bool:
        if label not in wanted:
            return False
        chosen = wanted[label]
        return chosen is None or own_config(config) in chosen

    return keep


def profile_on_cluster(
    step: Callable[..., Any],
    *args: Any,
    cluster: Cluster,
    mesh: Any,
    platform: Any,
    cache: str | Path | None,
    only: Sequence[str] = (),
    backend: str = BACKEND,
    free_axes: bool = False,
    whole_mesh: bool = False,
    shard_parameters: bool = False,
    batch_outer: bool = False,
    sequence_parallel: bool = False,
    batch_inner: bool = False,
    contract_last: bool = False,
    config_cap: int = DEFAULT_CONFIG_CAP,
    workers: int | None = 1,
    progress: bool = True,
    on_program: Callable[[ProfileRecord], None] | None = None,
) -> ClusterProfile:
    """Profile `step(*args)` with `backend` ("measured" or "compiled", see the module) on
    `mesh`, laid over the devices of every process of `cluster` (process-major: the outer
    axis runs across processes).

    Every process of the cluster must call this with the same arguments (`join` checked the
    software; the request is the caller's to check, as the command line does). Process 0
    writes the rows to `cache`; `only` restricts the run to some segment types, boundaries
    or configurations (see `selection`); `free_axes`, `whole_mesh`, `shard_parameters`,
    `batch_outer`, `batch_inner`, `contract_last` and `sequence_parallel` build the space
    as `analyze` does.
    `on_program(record)` is called after each program (measured: once every process has
    finished it), a progress beat. `workers` is the compiling threads of each process
    (compiled on one CPU process: worker processes).
    """
    import jax

    from explorer.platforms import Platform, load_platform
    from explorer.profile.runner import profile_all
    from explorer.segments import build_segments
    from explorer.space import step_space
    from explorer.trace import trace

    spec = mesh_spec(mesh)
    if backend not in ("measured", "compiled"):
        raise ClusterError(f"backend: expected 'measured' or 'compiled', found {backend!r}")
    if spec.size != cluster.devices:
        raise ClusterError(
            f"mesh {spec} has {spec.size} devices, but the {cluster.processes} process(es) of "
            f"this run have {cluster.local_devices} each ({cluster.devices}); give a mesh of "
            f"{cluster.devices} devices, such as {cluster.processes}x{cluster.local_devices} "
            "(the outer axis across processes)"
        )
    if jax.device_count() != cluster.devices:
        raise ClusterError(
            f"JAX sees {jax.device_count()} devices but the cluster was joined with "
            f"{cluster.devices}; call join() before any other JAX call"
        )
    target = platform if isinstance(platform, Platform) else load_platform(platform)
    if target.devices < spec.size:
        raise ClusterError(
            f"platform {target.name!r} has {target.devices} devices, fewer than mesh {spec} "
            "(it splits each measured time into communication and computation by pricing the "
            "program's collectives on it); give a platform of at least that many devices, "
            "such as one written by `python -m explorer calibrate` on this cluster"
        )
    graph = trace(step, *args)
    analysis = step_space(
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
    segmentation = build_segments(graph, analysis, cap=config_cap)
    keep = selection(only, analysis, segmentation)
    file = ProfileCache(cache) if cluster.leader and cache is not None else None
    in_step = backend == BACKEND

    def run(store: ProfileCache, only: Callable[[str, str, str], bool] | None) -> Profiles:
        return profile_all(
            graph,
            analysis,
            segmentation,
            spec,
            platform=target,
            backend=backend,
            cache=store,
            config_cap=config_cap,
            workers=workers,
            progress=progress and cluster.leader,
            only=only,
            time_limit_factor=math.inf,  # see the module: no host stops a program alone
        )

    try:
        rows = broadcast(cluster, cached_rows(file, backend) if file is not None else [])
        store = _RunCache(cluster, rows, file, on_program, in_step=in_step)
        new: set[ProgramKey] | None = None  # compiled: what the hosts compiled together
        if in_step:
            profiles = run(store, keep)
        else:
            names: list[tuple[str, str, str]] = []

            def listed(kind: str, label: str, config: str) -> bool:
                if keep is None or keep(kind, label, config):
                    names.append((kind, label, config))
                return False  # nothing is profiled: the run only names its programs

            run(store, listed)
            run(store, share(cluster, names))  # this host's share
            everyone = [pickle.loads(b) for b in gather_bytes(cluster, pickle.dumps(store.new))]
            new = set()
            for record in (r for part in everyone for r in part):
                new.add(record.key)
                ProfileCache.put(store, record)
                if file is not None:
                    file.put(record)
            profiles = run(store, keep)  # every row, from what every host compiled
    finally:
        if file is not None:
            file.close()
    priced = [p for p in profiles.entries if p.program]
    if new is None:
        profiled = here = len({p.program for p in priced if not p.cached})
        cached = len({p.program for p in priced if p.cached})
    else:
        profiled, here = len(new), len({r.key for r in store.new})
        cached = profiles.programs - profiled
    return ClusterProfile(
        cluster=cluster,
        mesh=spec,
        backend=backend,
        programs=len(profiles),
        profiled=profiled,
        here=here,
        cached=cached,
        infeasible=sum(not p.ok for p in profiles.entries),
        cache=None if file is None else file.path,
        profiles=profiles,
    )
