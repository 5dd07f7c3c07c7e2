"""Joining the processes of a cluster run through `jax.distributed`, and agreeing on facts.

The vocabulary a user passes in:

- `ClusterSpec`: where the coordinator is (`host:port` of process 0), how many processes
  take part and which one this is, and `timeout`, the seconds after which any failure (a
  coordinator that does not answer, a host that stops sending heartbeats, shutdown) ends the
  run on every host. A field left `None` is read from the environment the way
  `jax.distributed.initialize()` reads it (SLURM, Open MPI, `JAX_COORDINATOR_ADDRESS`...).
- `Cluster`: what joining gave: this process's id, the process count, the devices of each.

`join` checks, before any expensive work, that every process sees the same number of local
devices and runs the same JAX, jaxlib, explorer code and request (`agree`): a host that
differs is named in the same error on every host, so none waits on a collective the others
will never run. What JAX itself ends with a fatal log (a coordinator that never answers, a
host that dies) is turned into a clear error by the supervising parent (`supervise`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from explorer.errors import ClusterError, ExplorerError

# Seconds after which a failure ends the run on every host (see ClusterSpec.timeout).
DEFAULT_TIMEOUT = 300.0
EXIT_CLUSTER = 3  # the exit status of a run that a host could not join, lost a host or hung

# Environment variables by which a launcher says that several processes were started; JAX
# reads the coordinator, count and id from them (`jax.distributed.initialize()` with no
# arguments). A single process in such an environment (one SLURM task) runs alone.
LAUNCHERS: tuple[tuple[str, str, str], ...] = (
    # (launcher, variable holding the process count, variable that must be present)
    ("SLURM", "SLURM_NTASKS", "SLURM_JOB_ID"),
    ("Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_orte_hnp_uri"),
    ("JAX_NUM_PROCESSES", "JAX_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS"),
)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """How to join a cluster run; `None` fields come from the environment (see module)."""

    coordinator: str | None
    processes: int | None
    process_id: int | None
    timeout: float = DEFAULT_TIMEOUT
    launcher: str = "flags"  # who started the processes: "flags", "alone" or a LAUNCHERS name

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ClusterError(f"--timeout: expected seconds > 0, found {self.timeout!r}")
        if self.processes is not None and self.processes < 1:
            raise ClusterError(f"--num-processes: expected >= 1, found {self.processes}")
        if self.process_id is not None and (
            self.process_id < 0
            or (self.processes is not None and self.process_id >= self.processes)
        ):
            raise ClusterError(
                f"--process-id: expected an id in 0..{(self.processes or 1) - 1} (ids are "
                f"0..num_processes-1), found {self.process_id}"
            )
        if self.coordinator is not None:
            host, _, port = self.coordinator.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ClusterError(
                    f"--coordinator: expected HOST:PORT of process 0, such as node001:12345 "
                    f"or 10.0.0.1:12345, found {self.coordinator!r}"
                )

    @property
    def distributed(self) -> bool:
        """Whether this run joins other processes (`False`: one process, no coordinator)."""
        return self.launcher != "alone"

    def describe(self) -> str:
        where = self.coordinator or "the coordinator from the environment"
        count = "?" if self.processes is None else str(self.processes)
        ident = "?" if self.process_id is None else str(self.process_id)
        return f"process {ident} of {count} at {where} (started by {self.launcher})"


def alone() -> ClusterSpec:
    """One process, no `jax.distributed`."""
    return ClusterSpec(None, 1, 0, launcher="alone")


def detect_launcher(environ: Mapping[str, str]) -> str | None:
    """The launcher that started several processes, from the environment; None if none did."""
    for name, count, present in LAUNCHERS:
        if present in environ and environ.get(count, "1").strip() not in ("", "1", "0"):
            return name
    return None


def cluster_spec(
    coordinator: str | None,
    processes: int | None,
    process_id: int | None,
    timeout: float = DEFAULT_TIMEOUT,
    environ: Mapping[str, str] | None = None,
) -> ClusterSpec:
    """The cluster a command runs on: the flags, else what a launcher put in the
    environment, else this process alone."""
    environ = os.environ if environ is None else environ
    given = (coordinator, processes, process_id)
    launcher = detect_launcher(environ)
    if all(v is None for v in given):
        if launcher is None:
            return ClusterSpec(None, 1, 0, timeout, launcher="alone")
        return ClusterSpec(None, None, None, timeout, launcher=launcher)
    if processes == 1 and coordinator is None:
        return ClusterSpec(None, 1, 0, timeout, launcher="alone")
    missing = [f for f, v in zip(FLAGS, given, strict=True) if v is None]
    if missing and launcher is None:
        raise ClusterError(
            f"expected --coordinator, --num-processes and --process-id together, missing "
            f"{', '.join(missing)}; no launcher (SLURM, Open MPI, JAX_COORDINATOR_ADDRESS) "
            "set them in the environment"
        )
    return ClusterSpec(coordinator, processes, process_id, timeout, launcher=launcher or "flags")


FLAGS = ("--coordinator", "--num-processes", "--process-id")


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a command that may run on several processes."""
    group = parser.add_argument_group(
        "cluster",
        "join other processes with jax.distributed (default: from SLURM / Open MPI "
        "environment variables when a launcher started several, else run alone)",
    )
    group.add_argument("--coordinator", default=None, help="HOST:PORT of process 0")
    group.add_argument("--num-processes", type=int, default=None, help="processes in the run")
    group.add_argument("--process-id", type=int, default=None, help="this process, 0..N-1")
    group.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds before a silent or missing host ends the run (default {DEFAULT_TIMEOUT:g})",
    )


def spec_from_arguments(args: argparse.Namespace) -> ClusterSpec:
    return cluster_spec(args.coordinator, args.num_processes, args.process_id, args.timeout)


@dataclass(frozen=True, slots=True)
class Cluster:
    """The processes of a run once joined."""

    process_id: int
    processes: int
    local_devices: int  # devices of each process (the same for all: checked by `join`)
    timeout: float

    @property
    def devices(self) -> int:
        return self.processes * self.local_devices

    @property
    def leader(self) -> bool:
        """Process 0: the one that writes files."""
        return self.process_id == 0


def join(spec: ClusterSpec, request: Mapping[str, Any] | None = None) -> Cluster:
    """Join the processes of `spec` (nothing to join when it runs alone) and check that they
    agree on their devices, their software and `request` (what each was asked to do)."""
    import jax

    if not spec.distributed:
        return Cluster(0, 1, jax.local_device_count(), spec.timeout)
    if jax.distributed.is_initialized():
        raise ClusterError(
            "jax.distributed is already initialized in this process; join a cluster once, "
            "before any other JAX call"
        )
    # collectives between the CPU devices of different processes (GPUs use NCCL)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    seconds = max(1, round(spec.timeout))
    try:
        jax.distributed.initialize(
            coordinator_address=spec.coordinator,
            num_processes=spec.processes,
            process_id=spec.process_id,
            initialization_timeout=seconds,
            heartbeat_timeout_seconds=seconds,
            shutdown_timeout_seconds=seconds,
        )
    except (ValueError, TypeError, RuntimeError) as err:
        raise ClusterError(f"{spec.describe()}: could not join the cluster: {err}") from None
    cluster = Cluster(jax.process_index(), jax.process_count(), 0, spec.timeout)
    counts = Counter(d.process_index for d in jax.devices())
    local = counts[cluster.process_id]
    uneven = {p: n for p, n in sorted(counts.items()) if n != counts[0]}
    if uneven:
        raise ClusterError(
            f"every process must have the same number of devices; process 0 has {counts[0]}, "
            + ", ".join(f"process {p} has {n}" for p, n in uneven.items())
            + " (on CPU give each the same --xla_force_host_platform_device_count; on GPUs "
            "the same number of visible GPUs)"
        )
    cluster = Cluster(cluster.process_id, cluster.processes, local, spec.timeout)
    agree(cluster, {**software(), **(request or {})})
    return cluster


def software() -> dict[str, str]:
    """What must be the same on every host for their programs to be the same programs."""
    import jax
    import jaxlib

    import explorer

    digest = hashlib.sha256()
    for path in sorted(Path(explorer.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return {
        "python": ".".join(map(str, sys.version_info[:2])),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "explorer code": digest.hexdigest()[:16],
        "platform": jax.default_backend(),
    }


def agree(cluster: Cluster, facts: Mapping[str, Any]) -> None:
    """Raise the same `ClusterError` on every process unless all hold the same `facts`."""
    mine = json.dumps(dict(facts), sort_keys=True, default=str).encode()
    everyone = [json.loads(b) for b in gather_bytes(cluster, mine)]
    differ = []
    for process, theirs in enumerate(everyone):
        for name in sorted(set(everyone[0]) | set(theirs)):
            if theirs.get(name) != everyone[0].get(name):
                differ.append(
                    f"{name}: process 0 has {everyone[0].get(name)!r}, process {process} has "
                    f"{theirs.get(name)!r}"
                )
    if differ:
        raise ClusterError(
            "the processes of this run disagree, so their programs would not be the same "
            "programs; start every host with the same software and the same arguments. "
            + "; ".join(differ[:8])
            + (f" (and {len(differ) - 8} more)" if len(differ) > 8 else "")
        )


def gather_bytes(cluster: Cluster, payload: bytes) -> list[bytes]:
    """Every process's `payload`, in process order (a collective: all must call it)."""
    if cluster.processes == 1:
        return [payload]
    from jax.experimental import multihost_utils

    lengths = np.asarray(
        multihost_utils.process_allgather(np.array([len(payload)], np.int64))
    ).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: len(payload)] = np.frombuffer(payload, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(cluster.processes, -1)
    return [rows[p, : int(n)].tobytes() for p, n in enumerate(lengths)]


def broadcast(cluster: Cluster, value: Any) -> Any:
    """Process 0's `value` on every process (pickled: our own processes, never a user's
    file). A collective: all must call it; the others' `value` is ignored."""
    if cluster.processes == 1:
        return value
    from jax.experimental import multihost_utils

    payload = pickle.dumps(value) if cluster.leader else b""
    size = int(
        np.asarray(multihost_utils.broadcast_one_to_all(np.array([len(payload)], np.int64)))[0]
    )
    data = np.zeros(max(size, 1), np.uint8)
    if cluster.leader:
        data[:size] = np.frombuffer(payload, np.uint8)
    received = np.asarray(multihost_utils.broadcast_one_to_all(data))
    return pickle.loads(received[:size].tobytes())  # process 0 of this run sent it


def finish(cluster: Cluster, status: int) -> int:
    """The highest exit status of any process, on every process; then leave the cluster.
    A collective: every process must reach it (one that died is reported by `supervise`)."""
    if cluster.processes == 1:
        return status
    import jax

    statuses = [int(b.decode()) for b in gather_bytes(cluster, str(status).encode())]
    jax.distributed.shutdown()
    return max(statuses)


def run_joined(
    spec: ClusterSpec,
    request: Mapping[str, Any],
    body: Callable[[Cluster], int],
    on_joined: Callable[[Cluster], None] | None = None,
) -> int:
    """Join `spec`, run `body(cluster)` on this process, and return the exit status every
    process agrees on (the highest). An `ExplorerError` is printed as `error: ...`: status 2,
    `EXIT_CLUSTER` for a `ClusterError`; every process of a run raises those alike (the
    arguments and software were checked to be the same), so all leave together."""
    import jax

    cluster: Cluster | None = None
    try:
        cluster = join(spec, request)
        if on_joined is not None:
            on_joined(cluster)
        status = body(cluster)
    except ExplorerError as err:
        print(f"error: {err}", file=sys.stderr)
        if jax.distributed.is_initialized():
            jax.distributed.shutdown()
        return EXIT_CLUSTER if isinstance(err, ClusterError) else 2
    return finish(cluster, status)
