"""Calibration: a platform measured on the devices JAX sees (collective latency and bus
bandwidth per kind and interconnect level, device peaks and memory bandwidth), and the
`explorer calibrate` command that writes it as a platform file.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from explorer.errors import ExplorerError, PlatformError
from explorer.mesh import MeshSpec, mesh_spec
from explorer.platforms.files import format_platform, save_platform
from explorer.platforms.model import KINDS, DeviceModel, LinkLevel, LinkModel, Platform, ring_factor
from explorer.profile.hlo import CollectiveKind

DEFAULT_SIZES = tuple(4**k for k in range(6, 13))  # 4 KiB .. 16 MiB


@dataclass(frozen=True, slots=True)
class _Sample:
    kind: CollectiveKind
    level: str
    group: int
    nbytes: int
    seconds: float


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: compile and first-touch allocations are not what we measure
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _collective_body(kind: CollectiveKind, axis: str, n: int) -> Callable[[Any], Any]:
    import jax

    if kind is CollectiveKind.ALL_REDUCE:
        return lambda x: jax.lax.psum(x, axis)
    if kind is CollectiveKind.ALL_GATHER:
        return lambda x: jax.lax.all_gather(x, axis, tiled=True)
    if kind is CollectiveKind.REDUCE_SCATTER:
        return lambda x: jax.lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)
    if kind is CollectiveKind.ALL_TO_ALL:
        return lambda x: jax.lax.all_to_all(x, axis, 0, 0, tiled=True)
    perm = [(i, (i + 1) % n) for i in range(n)]
    return lambda x: jax.lax.ppermute(x, axis, perm)


def _time_collective(
    mesh: Any, axis: str, kind: CollectiveKind, nbytes: int, repeats: int
) -> float:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    n = mesh.shape[axis]
    all_axes = tuple(mesh.axis_names)
    # Per-device input so that the *full buffer* (see collective_time) is `nbytes` float32s,
    # rounded to a multiple of n so scatters and all-to-alls split evenly.
    elems = max(n, (nbytes // 4) // n * n)
    local = elems // n if kind is CollectiveKind.ALL_GATHER else elems
    spec = PartitionSpec(all_axes)
    body = _collective_body(kind, axis, n)
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
    # built shard by shard: the devices of other processes are not this process's to fill
    host = np.ones((local * mesh.size,), np.float32)
    x = jax.make_array_from_callback(host.shape, NamedSharding(mesh, spec), lambda i: host[i])
    return _median_time(lambda: fn(x).block_until_ready(), repeats)


def _fit(samples: Sequence[_Sample]) -> LinkModel:
    """Least squares on t = a + x / B with x = ring_factor * bytes; both clamped positive.

    Residuals are relative (each row divided by its time): sizes span four orders of
    magnitude, and plain residuals would let the largest size alone decide the latency.
    """
    xs = np.array([ring_factor(s.kind, s.group) * s.nbytes for s in samples], dtype=float)
    ts = np.array([s.seconds for s in samples], dtype=float)
    design = np.stack([np.ones_like(xs), xs], axis=1) / ts[:, None]
    (a, slope), *_ = np.linalg.lstsq(design, np.ones_like(ts), rcond=None)
    if slope <= 0:  # noise swamped the size dependence: fall back to the largest size's rate
        big = int(np.argmax(xs))
        slope = ts[big] / xs[big]
        a = float(np.min(ts))
    if a <= 0:  # refit through a tiny floor rather than report a negative latency
        a = max(float(np.min(ts)) * 1e-3, 1e-9)
        slope = max(float(np.dot(xs, ts - a) / np.dot(xs, xs)), 1e-15)
    return LinkModel(latency_s=float(a), bandwidth_Bps=float(1.0 / slope))


# What calibration times, as (dtype name of the peak, input dtype, JAX matmul precision): f32
# at full precision (the default may be TF32 on GPUs), tf32 as JAX's "tensorfloat32" asks.
_MEASURED_DTYPES = (
    ("f32", "float32", "highest"),
    ("tf32", "float32", "high"),
    ("bf16", "bfloat16", "default"),
)


def _run_matmul(matmul: Callable[[Any, Any], Any], a: Any) -> Any:
    return matmul(a, a).block_until_ready()


def _measure_device(repeats: int) -> DeviceModel:
    import jax
    import jax.numpy as jnp

    dev = jax.local_devices()[0]  # this process's own: each process measures its devices
    size = 1024
    peaks = {}
    for name, dtype, precision in _MEASURED_DTYPES:
        matmul = jax.jit(partial(jnp.matmul, precision=precision))
        a = jax.device_put(jnp.ones((size, size), dtype), dev)
        seconds = _median_time(partial(_run_matmul, matmul, a), repeats)
        peaks[name] = 2 * size**3 / seconds
    elems = 16 * 2**20  # 64 MiB of float32: well past the caches of a CPU
    buf = jax.device_put(jnp.ones((elems,), jnp.float32), dev)
    scale = jax.jit(lambda v: v * 2.0)
    seconds = _median_time(lambda: scale(buf).block_until_ready(), repeats)
    stats = None
    try:
        stats = dev.memory_stats()
    except Exception:  # backends without memory stats raise instead of returning None
        stats = None
    if stats and stats.get("bytes_limit"):
        memory = int(stats["bytes_limit"])
    else:  # CPU devices share host memory
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        memory //= max(1, jax.local_device_count())
    return DeviceModel.of(
        name=f"{dev.platform}:{getattr(dev, 'device_kind', 'device')}",
        peaks=peaks,
        memory_bandwidth_Bps=2 * 4 * elems / seconds,  # read + write
        memory_bytes=memory,
    )


def calibrate(
    mesh: MeshSpec | None = None,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 5,
    devices_per_node: int | None = None,
    on_step: Callable[[str], None] | None = None,
) -> Platform:
    """Measure a Platform from the devices JAX sees.

    Uses the first `mesh.size` devices (all by default). Devices are grouped into nodes of
    `devices_per_node` (default: the devices of one process, `jax.local_device_count()`) on a
    (node, local) mesh; each collective kind is timed over `local` (giving `intra`) and, with
    more than one node, over `node` with every local group running at once (giving `inter`,
    so the per-device share of a shared NIC is what gets measured). Each size is the full
    buffer in bytes (see `Platform.collective_time`); latency and bus bandwidth come from a
    least-squares fit of the ring formula.

    Under `jax.distributed` every process must call it alike (the collectives span them);
    each process measures its own device. `on_step(what)` is called before each measured
    kind and level (a progress beat).
    """
    import jax
    from jax.sharding import Mesh

    devices = jax.devices()
    count = mesh.size if mesh is not None else len(devices)
    if count > len(devices):
        raise PlatformError(
            f"calibration over mesh {mesh} needs {count} devices, but JAX sees {len(devices)}"
        )
    if count < 2:
        raise PlatformError(
            f"calibration needs at least 2 devices, but JAX sees {count} "
            f"({devices[0].platform}); on CPU set XLA_FLAGS="
            "--xla_force_host_platform_device_count=8 before starting Python, or join "
            "processes with jax.distributed"
        )
    per_node = devices_per_node or min(jax.local_device_count(), count)
    if per_node < 1 or count % per_node:
        raise PlatformError(
            f"calibration: {count} devices do not split into nodes of {per_node}; pass a "
            "devices_per_node that divides the device count"
        )
    if not sizes or any(int(s) < 4 for s in sizes) or repeats < 1:
        raise PlatformError(
            f"calibration: expected sizes of at least 4 bytes and repeats >= 1, found "
            f"sizes={list(sizes)} repeats={repeats}"
        )
    nodes = count // per_node
    # Order devices by process so that each row of the grid is one node.
    chosen = sorted(devices[:count], key=lambda d: (d.process_index, d.id))
    grid = Mesh(np.array(chosen, dtype=object).reshape(nodes, per_node), ("node", "local"))
    levels: dict[str, LinkLevel] = {}
    for axis, level_name in (("local", "intra"), ("node", "inter")):
        n = grid.shape[axis]
        if n < 2:
            continue
        fitted = {}
        for kind in KINDS:
            if on_step is not None:
                on_step(f"{kind.value} over {axis} ({n} devices)")
            samples = [
                _Sample(kind, level_name, n, int(s), _time_collective(grid, axis, kind, s, repeats))
                for s in sizes
            ]
            fitted[kind] = _fit(samples)
        levels[level_name] = LinkLevel.of(f"measured-{level_name}", fitted)
    intra = levels.get("intra") or levels["inter"]  # one device per node: intra is never used
    platform_name = devices[0].platform
    if on_step is not None:
        on_step("the device's matmul and memory throughput")
    processes = len({d.process_index for d in chosen})
    today = datetime.date.today().isoformat()
    return Platform(
        name=f"calibrated-{platform_name}-{count}",
        description=(
            f"Measured on {count} {platform_name} devices ({nodes} node(s) x {per_node}, "
            f"{processes} process(es)) with "
            f"sizes {min(sizes)}..{max(sizes)} bytes, median of {repeats} runs. Device "
            "figures are rough: one 1024^3 matmul per dtype measured ("
            f"{', '.join(n for n, _, _ in _MEASURED_DTYPES)}; other dtypes have no peak) and "
            "one 64 MiB elementwise pass."
        ),
        devices=count,
        devices_per_node=per_node,
        device=_measure_device(repeats),
        intra=intra,
        inter=levels.get("inter"),
        sources=(f"measured by explorer calibrate on {today}",),
    )


def _parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated byte counts such as 4096,65536, found {text!r}"
        ) from None
    if not sizes or min(sizes) < 4:
        raise argparse.ArgumentTypeError(f"expected sizes of at least 4 bytes, found {text!r}")
    return sizes


def calibrate_main(argv: Sequence[str] | None = None) -> int:
    """`explorer calibrate --out PATH`: measure this machine, or every process of a cluster
    run (`--coordinator`..., or a launcher's environment), and write a platform file (on
    process 0 of a cluster run)."""
    from explorer.cluster.join import add_cluster_arguments, run_joined, spec_from_arguments
    from explorer.cluster.supervise import die_with_parent, in_child, report, supervise

    parser = argparse.ArgumentParser(
        prog="explorer calibrate",
        description="Measure collective latency/bandwidth and device throughput with JAX. On "
        "several processes, the axis within a process gives the 'intra' level and the axis "
        "across processes the 'inter' level of the platform file.",
    )
    parser.add_argument("--out", required=True, type=Path, help="platform JSON file to write")
    parser.add_argument(
        "--sizes",
        type=_parse_sizes,
        default=DEFAULT_SIZES,
        help="comma-separated buffer sizes in bytes (default 4 KiB..16 MiB by powers of 4)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per size (median)")
    parser.add_argument("--devices", type=int, default=None, help="use the first N devices")
    parser.add_argument(
        "--devices-per-node",
        type=int,
        default=None,
        help="devices of one 'intra' group (default: the devices of one process; give the "
        "devices of one host when a host runs several processes, e.g. one per GPU)",
    )
    add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    try:
        spec = spec_from_arguments(args)
    except ExplorerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if spec.distributed and not in_child():
        return supervise(["calibrate", *(sys.argv[2:] if argv is None else argv)], spec)
    if in_child():
        die_with_parent()
    request = {
        "command": "calibrate",
        "sizes": list(args.sizes),
        "repeats": args.repeats,
        "devices": args.devices,
        "devices per node": args.devices_per_node,
    }

    def body(cluster: Any) -> int:
        platform = calibrate(
            mesh=mesh_spec(args.devices) if args.devices else None,
            sizes=args.sizes,
            repeats=args.repeats,
            devices_per_node=args.devices_per_node,
            on_step=lambda what: report("calibrating", what),
        )
        if cluster.leader:
            save_platform(platform, args.out)
            print(format_platform(platform))
            print(f"wrote {args.out}")
        else:
            print(
                f"process {cluster.process_id} of {cluster.processes}: calibrated (process 0 "
                f"writes {args.out})"
            )
        return 0

    return run_joined(
        spec,
        request,
        body,
        on_joined=lambda c: report("joined", f"{c.processes} processes x {c.local_devices}"),
    )
