"""The platform model: what a device computes and what a collective costs on one machine.

A `Platform` is a node type (devices per node, one `DeviceModel`) plus two levels of
interconnect: `intra` (within a node: NVLink, PCIe) and `inter` (across nodes: InfiniBand),
each a `LinkLevel` with one latency/bandwidth pair per collective kind. Bandwidths are *bus
bandwidths per device* in the sense nccl-tests reports as "busbw", so the ring formulas below
turn a buffer size into a time without knowing the algorithm NCCL picked.

The device has one peak per dtype its matrix units multiply in (`peak_flops_by_dtype`: an
A100 does 19.5 TFLOP/s in f32, 156 in tf32 and 312 in bf16), keyed by the names
`explorer.profile.compute.dot_flops` groups a program's dot FLOPs under.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from explorer.errors import PlatformError
from explorer.mesh import MeshSpec
from explorer.profile.compute import DOT_DTYPES
from explorer.profile.hlo import Collective, CollectiveKind

KINDS = tuple(CollectiveKind)
PEAKS_FIELD = "device.peak_flops_by_dtype"
# Spellings people write for the HLO dtype names, to suggest the right one in errors.
_DTYPE_ALIASES = {
    "fp64": "f64", "float64": "f64", "fp32": "f32", "float32": "f32", "bfloat16": "bf16",
    "fp16": "f16", "float16": "f16", "half": "f16", "fp8": "f8e4m3fn", "int8": "s8",
    "uint8": "u8", "int32": "s32",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class LinkModel:
    """Cost of one collective kind on one interconnect level: t = latency + factor * bytes / bw."""

    latency_s: float
    bandwidth_Bps: float  # bus bandwidth per device ("busbw" of nccl-tests), bytes/s

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise PlatformError(f"expected latency_s >= 0 seconds, found {self.latency_s!r}")
        if not (math.isfinite(self.bandwidth_Bps) and self.bandwidth_Bps > 0):
            raise PlatformError(f"expected bandwidth_Bps > 0 bytes/s, found {self.bandwidth_Bps!r}")


@dataclass(frozen=True, slots=True)
class LinkLevel:
    """One level of the interconnect ("nvlink", "pcie", "ib") with a model per collective kind.

    `per_kind` is a tuple of (kind, model) pairs in `CollectiveKind` order so that platforms
    stay hashable (usable as cache keys); index the level with `level[kind]`.
    """

    name: str
    per_kind: tuple[tuple[CollectiveKind, LinkModel], ...]

    def __post_init__(self) -> None:
        given = dict(self.per_kind)
        missing = [k.value for k in KINDS if k not in given]
        if missing or len(given) != len(self.per_kind):
            raise PlatformError(
                f"link level {self.name!r}: expected exactly one model for each collective "
                f"kind, missing {missing} (found {[str(k) for k, _ in self.per_kind]})"
            )
        object.__setattr__(self, "per_kind", tuple((k, given[k]) for k in KINDS))

    @classmethod
    def of(
        cls, name: str, per_kind: Mapping[CollectiveKind, LinkModel] | Mapping[str, LinkModel]
    ) -> LinkLevel:
        return cls(name, tuple((CollectiveKind(k), m) for k, m in per_kind.items()))

    def __getitem__(self, kind: CollectiveKind | str) -> LinkModel:
        return dict(self.per_kind)[CollectiveKind(kind)]

    def scaled(self, bandwidth_factor: float) -> LinkLevel:
        return LinkLevel(
            self.name,
            tuple(
                (k, replace(m, bandwidth_Bps=m.bandwidth_Bps * bandwidth_factor))
                for k, m in self.per_kind
            ),
        )


def _unknown_dtype_hint(dtype: str) -> str:
    """Why `dtype` is not a dtype name a peak can be given for, and what to write instead."""
    alias = _DTYPE_ALIASES.get(dtype.lower())
    guess = f"; did you mean {alias!r}?" if alias else ""
    return f"expected a dtype as HLO spells it, one of {list(DOT_DTYPES)}{guess}"


@dataclass(frozen=True, slots=True)
class DeviceModel:
    """One device: dense peak of its matrix units per dtype, memory bandwidth and size.

    `peak_flops_by_dtype` holds (dtype, FLOP/s) pairs sorted by dtype (OP/s for integer
    dtypes); it must give "f32", the rate of elementwise work. Build one from a mapping with
    `DeviceModel.of`.
    """

    name: str
    peak_flops_by_dtype: tuple[tuple[str, float], ...]
    memory_bandwidth_Bps: float
    memory_bytes: int

    def __post_init__(self) -> None:
        peaks = dict(self.peak_flops_by_dtype)
        if len(peaks) != len(self.peak_flops_by_dtype):
            raise PlatformError(
                f"device {self.name!r}: expected one peak per dtype, found "
                f"{[d for d, _ in self.peak_flops_by_dtype]}"
            )
        for dtype, peak in peaks.items():
            if dtype not in DOT_DTYPES:
                raise PlatformError(
                    f"device {self.name!r}: unknown dtype {dtype!r} in peak_flops_by_dtype; "
                    + _unknown_dtype_hint(dtype)
                )
            if not (math.isfinite(peak) and peak > 0):
                raise PlatformError(
                    f"device {self.name!r}: expected the {dtype} peak > 0 FLOP/s, found {peak!r}"
                )
        if "f32" not in peaks:
            raise PlatformError(
                f"device {self.name!r}: peak_flops_by_dtype must give 'f32', the rate of "
                f"elementwise work; found only {sorted(peaks)}"
            )
        for name in ("memory_bandwidth_Bps", "memory_bytes"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise PlatformError(f"device {self.name!r}: expected {name} > 0, found {value!r}")
        object.__setattr__(self, "peak_flops_by_dtype", tuple(sorted(peaks.items())))

    @classmethod
    def of(
        cls, name: str, peaks: Mapping[str, float], memory_bandwidth_Bps: float, memory_bytes: int
    ) -> DeviceModel:
        return cls(name, tuple(peaks.items()), memory_bandwidth_Bps, memory_bytes)

    def peak(self, dtype: str) -> float | None:
        """Dense FLOP/s of `dtype` dots, or None when the device has no figure for it."""
        return dict(self.peak_flops_by_dtype).get(dtype)


def _check_amount(value: float, what: str) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise PlatformError(f"compute_time: expected {what} >= 0, found {value!r}")


def ring_factor(kind: CollectiveKind, n: int) -> float:
    """Bytes each device moves per byte of buffer, for a ring over n devices."""
    if n <= 1:
        return 0.0
    if kind is CollectiveKind.ALL_REDUCE:
        return 2 * (n - 1) / n
    if kind is CollectiveKind.COLLECTIVE_PERMUTE:
        return 1.0
    return (n - 1) / n  # all-gather, reduce-scatter, all-to-all


def _ring_time(level: LinkLevel, kind: CollectiveKind, n: int, nbytes: float) -> float:
    if n <= 1:
        return 0.0
    link = level[kind]
    return link.latency_s + ring_factor(kind, n) * nbytes / link.bandwidth_Bps


@dataclass(frozen=True, slots=True)
class Platform:
    name: str
    description: str
    devices: int
    devices_per_node: int
    device: DeviceModel
    intra: LinkLevel
    inter: LinkLevel | None
    sources: tuple[str, ...]
    # The file this platform was read from, named in errors; None when built in memory. Not
    # part of the platform's identity: a preset and its saved copy are the same platform.
    path: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.devices < 1 or self.devices_per_node < 1:
            raise PlatformError(
                f"platform {self.name!r}: expected devices >= 1 and devices_per_node >= 1, "
                f"found {self.devices} and {self.devices_per_node}"
            )
        if self.devices % self.devices_per_node:
            raise PlatformError(
                f"platform {self.name!r}: devices ({self.devices}) must be a multiple of "
                f"devices_per_node ({self.devices_per_node}); whole nodes only"
            )
        if self.devices > self.devices_per_node and self.inter is None:
            raise PlatformError(
                f"platform {self.name!r}: {self.devices // self.devices_per_node} nodes need "
                "an 'inter' link level, found none; give the network between nodes"
            )

    @property
    def nodes(self) -> int:
        return self.devices // self.devices_per_node

    def collective_time(
        self, kind: CollectiveKind | str, nbytes: float, group: Sequence[int]
    ) -> float:
        """Seconds one collective over the replica group `group` (device ids) takes.

        `nbytes` is the full buffer: all-reduce its buffer, all-gather the gathered result,
        reduce-scatter the input before scattering, all-to-all and permute the buffer. With
        n = len(group), latency a and bus bandwidth B of the level used (ring algorithms):

            all-reduce                  a + 2 (n-1)/n * bytes / B
            all-gather, reduce-scatter  a +   (n-1)/n * bytes / B
            all-to-all                  a +   (n-1)/n * bytes / B
            collective-permute          a +             bytes / B

        A group inside one node (node = id // devices_per_node) uses `intra`. A group over m
        nodes with at most L members per node is hierarchical: all-reduce = reduce-scatter
        on `intra` (L devices) + all-reduce on `inter` (m devices, bytes / L) + all-gather on
        `intra`; all-gather = all-gather on `inter` (bytes / L) then on `intra`;
        reduce-scatter the reverse. All-to-all and permute across nodes are priced on `inter`
        with the full bytes, the network being their bottleneck.
        """
        kind = CollectiveKind(kind)
        n = len(group)
        if n <= 1:
            return 0.0
        outside = [d for d in group if not 0 <= d < self.devices]
        if outside:
            raise PlatformError(
                f"platform {self.name!r} has devices 0..{self.devices - 1}, but the replica "
                f"group {list(group)} names {outside}; use a mesh of at most {self.devices} "
                "devices or a larger platform"
            )
        per_node = Counter(d // self.devices_per_node for d in group)
        if len(per_node) == 1 or self.inter is None:
            return _ring_time(self.intra, kind, n, nbytes)
        m, local = len(per_node), max(per_node.values())
        inter, intra = self.inter, self.intra
        if kind is CollectiveKind.ALL_REDUCE:
            return (
                _ring_time(intra, CollectiveKind.REDUCE_SCATTER, local, nbytes)
                + _ring_time(inter, CollectiveKind.ALL_REDUCE, m, nbytes / local)
                + _ring_time(intra, CollectiveKind.ALL_GATHER, local, nbytes)
            )
        if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER):
            return _ring_time(inter, kind, m, nbytes / local) + _ring_time(
                intra, kind, local, nbytes
            )
        return _ring_time(inter, kind, n, nbytes)

    def group_devices(self, collective_axes: Sequence[str], mesh: MeshSpec) -> list[int]:
        """Device ids of the replica group holding device 0 over `collective_axes`.

        Devices 0..mesh.size-1 are laid out row-major on the mesh, as `make_mesh` does.
        """
        unknown = [a for a in collective_axes if a not in mesh.names]
        if unknown:
            raise PlatformError(
                f"collective axes {list(collective_axes)} name {unknown}, which mesh {mesh} "
                f"does not have; expected axes among {list(mesh.names)}"
            )
        return list(_replica_group(tuple(collective_axes), mesh))

    def price(self, collective: Collective, mesh: MeshSpec) -> float:
        """Seconds for a collective parsed from HLO, on a mesh laid over this platform.

        A group smaller than its spanned axes (a sub-range of an axis) takes the first
        `group_size` devices along them. A permute keeps the whole spanned group: its pairs
        cross a node boundary whenever the spanned devices do. An all-reduce is priced as
        its `Collective.parts`.
        """
        group = self.group_devices(collective.axes, mesh)
        if collective.kind is not CollectiveKind.COLLECTIVE_PERMUTE and (
            1 <= collective.group_size < len(group)
        ):
            group = group[: collective.group_size]
        # an all-reduce a GPU pipeline would issue partly as a reduce-scatter: both parts
        return sum(self.collective_time(kind, nbytes, group) for kind, nbytes in collective.parts())

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s of the device's `dtype` dots; an error names what to add if missing."""
        peak = self.device.peak(dtype)
        if peak is not None:
            return peak
        where = f"platform file {self.path}" if self.path else f"platform {self.name!r}"
        given = [d for d, _ in self.device.peak_flops_by_dtype]
        unit = "OP/s" if dtype[0] in "su" else "FLOP/s"
        raise PlatformError(
            f"{where}: the program multiplies in {dtype}, but '{PEAKS_FIELD}' has no {dtype!r} "
            f"entry (it gives {given}); add the device's dense {dtype} {unit} there (datasheet "
            "or a measurement), or run the model in a dtype the device has"
        )

    def compute_time(
        self,
        dot_flops: Sequence[tuple[str, float]] | Mapping[str, float],
        other_flops: float,
        bytes_accessed: float,
    ) -> float:
        """Seconds of computation of one program on one device, an additive roofline:

            sum over dtypes d of dot_flops[d] / peak[d]
            + other_flops / peak["f32"] + bytes_accessed / memory bandwidth

        Additive on purpose, without overlap: the time of a program is then the sum of the
        times of its pieces, so programs priced apart add up to the step they came from.

        `dot_flops` is what `explorer.profile.compute.dot_flops` returns for the program
        (dtype -> FLOPs of its dots and convolutions, as pairs or a mapping); `other_flops`
        is every other FLOP (the cost analysis's total minus the dots), at the f32 rate.
        A dtype without a peak on this platform is a `PlatformError` saying what to add.

        One rule for f32 dots: they are priced at the f32 peak, not at TF32. JAX's default
        precision *may* compute f32 dots in TF32 on recent GPUs (see "Matmul precision",
        https://docs.jax.dev/en/latest/201/precision.html), but whether it does depends on the
        XLA version and flags, and the f32 peak never predicts a step faster than it can run.
        A program that wants TF32 asks for it (`jax.default_matmul_precision("tensorfloat32")`
        or `precision="high"` on a dot); `dot_flops` then reports those dots as "tf32", priced
        at the tf32 peak.
        """
        pairs = dot_flops.items() if isinstance(dot_flops, Mapping) else dot_flops
        seconds = 0.0
        for dtype, flops in pairs:
            _check_amount(flops, f"{dtype} dot FLOPs")
            if flops:
                seconds += flops / self.peak_flops(dtype)
        _check_amount(other_flops, "other_flops")
        _check_amount(bytes_accessed, "bytes_accessed")
        seconds += other_flops / self.peak_flops("f32")
        return seconds + bytes_accessed / self.device.memory_bandwidth_Bps

    def scaled(self, bandwidth_factor: float) -> Platform:
        """A copy with every link bandwidth multiplied by `bandwidth_factor` (what-if studies)."""
        if not (math.isfinite(bandwidth_factor) and bandwidth_factor > 0):
            raise PlatformError(f"expected a bandwidth factor > 0, found {bandwidth_factor!r}")
        return replace(
            self,
            name=f"{self.name}-bw{bandwidth_factor:g}x",
            intra=self.intra.scaled(bandwidth_factor),
            inter=self.inter.scaled(bandwidth_factor) if self.inter else None,
        )

    def to_json(self) -> dict[str, Any]:
        def level(lv: LinkLevel | None) -> dict[str, Any] | None:
            if lv is None:
                return None
            return {
                "name": lv.name,
                "per_kind": {
                    k.value: {"latency_s": m.latency_s, "bandwidth_Bps": m.bandwidth_Bps}
                    for k, m in lv.per_kind
                },
            }

        d = self.device
        return {
            "name": self.name,
            "description": self.description,
            "devices": self.devices,
            "devices_per_node": self.devices_per_node,
            "device": {
                "name": d.name,
                "peak_flops_by_dtype": dict(d.peak_flops_by_dtype),
                "memory_bandwidth_Bps": d.memory_bandwidth_Bps,
                "memory_bytes": d.memory_bytes,
            },
            "intra": level(self.intra),
            "inter": level(self.inter),
            "sources": list(self.sources),
        }


# What users may pass as a platform: a `Platform`, a preset name or a platform file's path.
PlatformLike: TypeAlias = Platform | str | Path


@functools.lru_cache(maxsize=1024)
def _replica_group(collective_axes: tuple[str, ...], mesh: MeshSpec) -> tuple[int, ...]:
    # Pricing a warm cache asks this for the same few groups tens of thousands of times.
    ids = np.arange(mesh.size).reshape(mesh.shape)
    index = tuple(slice(None) if n in collective_axes else 0 for n in mesh.names)
    return tuple(sorted(int(d) for d in np.ravel(ids[index])))
