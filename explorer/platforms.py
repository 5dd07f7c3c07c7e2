"""Platform model: what a device computes and what a collective costs on a given machine.

A `Platform` is a node type (devices per node, one `DeviceModel`) plus two levels of
interconnect: `intra` (within a node: NVLink, PCIe) and `inter` (across nodes: InfiniBand),
each a `LinkLevel` with one latency/bandwidth pair per collective kind. Bandwidths are *bus
bandwidths per device* in the sense nccl-tests reports as "busbw", so the ring formulas below
turn a buffer size into a time without knowing the algorithm NCCL picked.

The device has one peak per dtype its matrix units multiply in (`peak_flops_by_dtype`: an
A100 does 19.5 TFLOP/s in f32, 156 in tf32 and 312 in bf16), keyed by the names
`explorer.profile.compute.dot_flops` groups a program's dot FLOPs under.

Presets live as JSON under `assets/platforms/` (each with the public sources of its figures);
`calibrate` measures a platform from the devices JAX sees.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from explorer.errors import ExplorerError, PlatformError
from explorer.jsonfile import read_json_file
from explorer.mesh import MeshSpec, mesh_spec
from explorer.profile.compute import DOT_DTYPES
from explorer.profile.hlo import Collective, CollectiveKind

PRESET_DIR = Path(__file__).resolve().parents[1] / "assets" / "platforms"
# Bounds on a platform file, far above any real one (a preset is ~3 KiB, nested 4 levels).
MAX_PLATFORM_BYTES = 2**20
MAX_PLATFORM_DEPTH = 8
SCHEMA_HINT = "see assets/platforms/a100-pcie-4.json for a complete example"
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
        ids = np.arange(mesh.size).reshape(mesh.shape)
        index = tuple(slice(None) if n in collective_axes else 0 for n in mesh.names)
        return sorted(int(d) for d in np.ravel(ids[index]))

    def price(self, collective: Collective, mesh: MeshSpec) -> float:
        """Seconds for a collective parsed from HLO, on a mesh laid over this platform.

        A group smaller than its spanned axes (a sub-range of an axis) takes the first
        `group_size` devices along them. A permute keeps the whole spanned group: its pairs
        cross a node boundary whenever the spanned devices do.
        """
        group = self.group_devices(collective.axes, mesh)
        if collective.kind is not CollectiveKind.COLLECTIVE_PERMUTE and (
            1 <= collective.group_size < len(group)
        ):
            group = group[: collective.group_size]
        return self.collective_time(collective.kind, collective.nbytes, group)

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


# ---------------------------------------------------------------------------------------------
# Loading and validation


class _Reader:
    """Reads one platform document, naming the file and field path in every error."""

    def __init__(self, where: str | None) -> None:
        self.where = where

    def error(self, message: str) -> PlatformError:
        prefix = f"platform file {self.where}" if self.where else "platform document"
        return PlatformError(f"{prefix}: {message}")

    def obj(
        self, value: Any, path: str, fields: Sequence[str], optional: Sequence[str] = ()
    ) -> Mapping[str, Any]:
        """`value` as an object with all of `fields` and any of `optional`, nothing else."""
        if not isinstance(value, Mapping):
            raise self.error(
                f"field '{path}': expected an object with fields {list(fields)}, "
                f"found {type(value).__name__} {value!r}"
            )
        unknown = [k for k in value if k not in fields and k not in optional]
        if unknown:
            prefix = f"{path}." if path else ""
            raise self.error(
                f"unknown field '{prefix}{unknown[0]}': expected only the fields "
                f"{[*fields, *optional]}, found {unknown} ({SCHEMA_HINT})"
            )
        for name in fields:
            if name not in value:
                prefix = f"{path}." if path else ""
                raise self.error(
                    f"missing field '{prefix}{name}': expected it, found none; add it "
                    f"({SCHEMA_HINT})"
                )
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(f"field '{path}': expected a non-empty string, found {value!r}")
        return value

    def number(self, value: Any, path: str, *, positive: bool, unit: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(
                f"field '{path}': expected a number ({unit}), found {type(value).__name__} "
                f"{value!r}"
            )
        number = float(value)
        if not math.isfinite(number) or number < 0 or (positive and number == 0):
            bound = "> 0" if positive else ">= 0"
            raise self.error(
                f"field '{path}': expected a number {bound} ({unit}), found {value!r}; give a "
                "measured or datasheet figure"
            )
        return number

    def integer(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(f"field '{path}': expected a positive integer, found {value!r}")
        return value

    def level(self, value: Any, path: str) -> LinkLevel:
        raw = self.obj(value, path, ("name", "per_kind"))
        per_kind = raw["per_kind"]
        if not isinstance(per_kind, Mapping):
            raise self.error(
                f"field '{path}.per_kind': expected an object keyed by collective kind, found "
                f"{type(per_kind).__name__}"
            )
        known = [k.value for k in KINDS]
        for key in per_kind:
            if key not in known:
                raise self.error(
                    f"unknown collective kind '{path}.per_kind.{key}': expected one of {known}, "
                    f"found {key!r}"
                )
        models = {}
        for kind in KINDS:
            entry_path = f"{path}.per_kind.{kind.value}"
            if kind.value not in per_kind:
                raise self.error(
                    f"missing field '{entry_path}': expected a model for each of {known}, "
                    f"found none for {kind.value!r} ({SCHEMA_HINT})"
                )
            entry = self.obj(per_kind[kind.value], entry_path, ("latency_s", "bandwidth_Bps"))
            models[kind] = LinkModel(
                latency_s=self.number(
                    entry["latency_s"], f"{entry_path}.latency_s", positive=False, unit="seconds"
                ),
                bandwidth_Bps=self.number(
                    entry["bandwidth_Bps"],
                    f"{entry_path}.bandwidth_Bps",
                    positive=True,
                    unit="bytes/s",
                ),
            )
        return LinkLevel.of(self.string(raw["name"], f"{path}.name"), models)

    def platform(self, data: Any) -> Platform:
        top = self.obj(
            data,
            "",
            (
                "name",
                "description",
                "devices",
                "devices_per_node",
                "device",
                "intra",
                "inter",
                "sources",
            ),
        )
        device = self.device(top["device"])
        devices = self.integer(top["devices"], "devices")
        per_node = self.integer(top["devices_per_node"], "devices_per_node")
        if devices % per_node:
            raise self.error(
                f"field 'devices': expected a multiple of 'devices_per_node' ({per_node}), "
                f"found {devices}; describe whole nodes"
            )
        inter = None if top["inter"] is None else self.level(top["inter"], "inter")
        if devices > per_node and inter is None:
            raise self.error(
                f"field 'inter': expected the network between the {devices // per_node} nodes "
                f"that {devices} devices at {per_node} per node span, found null"
            )
        sources = top["sources"]
        if (
            not isinstance(sources, list)
            or not sources
            or not all(isinstance(s, str) and s for s in sources)
        ):
            raise self.error(
                f"field 'sources': expected a non-empty list of strings saying where the "
                f"figures come from, found {sources!r}"
            )
        return Platform(
            name=self.string(top["name"], "name"),
            description=self.string(top["description"], "description"),
            devices=devices,
            devices_per_node=per_node,
            device=device,
            intra=self.level(top["intra"], "intra"),
            inter=inter,
            sources=tuple(sources),
            path=self.where,
        )

    def device(self, value: Any) -> DeviceModel:
        # Files written before per-dtype peaks give `peak_flops` (the bf16/f16 tensor-core
        # figure) and `peak_flops_fp32`; they still load, as a table of those three dtypes.
        legacy = ("peak_flops", "peak_flops_fp32")
        dev = self.obj(
            value,
            "device",
            ("name", "memory_bandwidth_Bps", "memory_bytes"),
            optional=("peak_flops_by_dtype", *legacy),
        )
        given = [k for k in legacy if k in dev]
        if "peak_flops_by_dtype" in dev and given:
            raise self.error(
                f"field '{PEAKS_FIELD}' and the older {given} both give peaks: expected one, "
                f"found both; keep only '{PEAKS_FIELD}' ({SCHEMA_HINT})"
            )
        if "peak_flops_by_dtype" in dev:
            peaks = self.peaks(dev["peak_flops_by_dtype"])
        elif given:
            for name in legacy:
                if name not in dev:
                    raise self.error(
                        f"missing field 'device.{name}': the older form of '{PEAKS_FIELD}' "
                        f"expected both {list(legacy)}, found {given}; better, replace both by "
                        f"'{PEAKS_FIELD}' ({SCHEMA_HINT})"
                    )
            tensor = self.number(
                dev["peak_flops"], "device.peak_flops", positive=True, unit="FLOP/s"
            )
            fp32 = self.number(
                dev["peak_flops_fp32"], "device.peak_flops_fp32", positive=True, unit="FLOP/s"
            )
            peaks = {"f32": fp32, "bf16": tensor, "f16": tensor}
        else:
            raise self.error(
                f"missing field '{PEAKS_FIELD}': expected the device's dense FLOP/s per dtype, "
                f'e.g. {{"f32": 19.5e12, "tf32": 156e12, "bf16": 312e12}}, found none '
                f"({SCHEMA_HINT})"
            )
        return DeviceModel.of(
            name=self.string(dev["name"], "device.name"),
            peaks=peaks,
            memory_bandwidth_Bps=self.number(
                dev["memory_bandwidth_Bps"],
                "device.memory_bandwidth_Bps",
                positive=True,
                unit="bytes/s",
            ),
            memory_bytes=self.integer(dev["memory_bytes"], "device.memory_bytes"),
        )

    def peaks(self, value: Any) -> dict[str, float]:
        if not isinstance(value, Mapping) or not value:
            raise self.error(
                f"field '{PEAKS_FIELD}': expected a non-empty object of dtype -> dense FLOP/s, "
                f'e.g. {{"f32": 19.5e12, "bf16": 312e12}}, found {type(value).__name__} '
                f"{value!r}"
            )
        for dtype in value:
            if dtype not in DOT_DTYPES:
                raise self.error(
                    f"unknown dtype '{PEAKS_FIELD}.{dtype}': {_unknown_dtype_hint(str(dtype))}, "
                    f"found {dtype!r}"
                )
        if "f32" not in value:
            raise self.error(
                f"missing field '{PEAKS_FIELD}.f32': expected the device's f32 FLOP/s, the "
                f"rate of elementwise work, found only {list(value)}"
            )
        return {
            dtype: self.number(
                peak,
                f"{PEAKS_FIELD}.{dtype}",
                positive=True,
                unit="OP/s" if dtype[0] in "su" else "FLOP/s",
            )
            for dtype, peak in value.items()
        }


def platform_from_json(data: Any, where: str | None = None) -> Platform:
    """Validate a platform document (the parsed JSON) and build the Platform.

    `where` names the file the document came from, in errors and as the platform's `path`.
    """
    return _Reader(where).platform(data)


def list_platforms() -> list[str]:
    """Names of the preset platforms shipped under assets/platforms/."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_platform(name_or_path: str | Path) -> Platform:
    """A preset by name (`"a100-pcie-4"`) or a platform JSON file by path."""
    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path).strip():
        raise PlatformError(
            f"platform: expected a Platform, a preset name ({list_platforms()}) or the path of "
            f"a platform JSON file, found {type(name_or_path).__name__} {name_or_path!r}"
        )
    path = Path(name_or_path)
    looks_like_path = (
        isinstance(name_or_path, Path) or path.suffix == ".json" or os.sep in str(name_or_path)
    )
    if not looks_like_path:
        path = PRESET_DIR / f"{name_or_path}.json"
        if not path.is_file():
            raise PlatformError(
                f"platform: expected a preset name (one of {list_platforms()}) or the path of "
                f"a platform JSON file, found {str(name_or_path)!r}, which is neither"
            )
    if not path.expanduser().exists():
        raise PlatformError(
            f"platform file {path}: expected an existing file, found no such file; give a "
            f"preset name ({list_platforms()}) or the path of a JSON file written by "
            "save_platform or `explorer calibrate`"
        )
    data = read_json_file(
        path,
        what="platform file",
        error=PlatformError,
        max_bytes=MAX_PLATFORM_BYTES,
        max_depth=MAX_PLATFORM_DEPTH,
    )
    return platform_from_json(data, str(path))


def resolve_platform(platform: Any, field: str = "platform") -> Platform:
    """`platform` as a `Platform`: one given stands, a preset name or a file is loaded."""
    if isinstance(platform, Platform):
        return platform
    if isinstance(platform, (str, Path)):
        return load_platform(platform)
    raise PlatformError(
        f"{field}: expected a Platform (explorer.platforms.load_platform), a preset name or the "
        f"path of a platform JSON file, found {type(platform).__name__} {platform!r}"
    )


def save_platform(platform: Platform, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(platform.to_json(), indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# Calibration on the devices JAX sees

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


def format_platform(platform: Platform) -> str:
    """A small table of a platform's figures, for the command line."""
    d = platform.device
    peaks = ", ".join(f"{dtype} {peak / 1e12:.3g}" for dtype, peak in d.peak_flops_by_dtype)
    lines = [
        f"{platform.name}: {platform.devices} devices, {platform.devices_per_node} per node",
        f"  device {d.name}: {d.memory_bandwidth_Bps / 1e9:.3g} GB/s memory, "
        f"{d.memory_bytes / 2**30:.3g} GiB",
        f"  peak TFLOP/s: {peaks}",
        f"  {'level':<28} {'kind':<20} {'latency (us)':>13} {'busbw (GB/s)':>13}",
    ]
    for label, level in (("intra", platform.intra), ("inter", platform.inter)):
        if level is None:
            continue
        for kind, model in level.per_kind:
            lines.append(
                f"  {label + ':' + level.name:<28} {kind.value:<20} "
                f"{model.latency_s * 1e6:>13.2f} {model.bandwidth_Bps / 1e9:>13.3f}"
            )
    return "\n".join(lines)


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
