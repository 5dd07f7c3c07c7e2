"""Platform files: presets under `assets/platforms/` and JSON documents read, checked and
written. Every error names the file and the field path, what was expected and what was found.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from explorer.errors import PlatformError
from explorer.jsonfile import read_json_file
from explorer.platforms.model import (
    KINDS,
    PEAKS_FIELD,
    DeviceModel,
    LinkLevel,
    LinkModel,
    Platform,
    _unknown_dtype_hint,
)
from explorer.profile.compute import DOT_DTYPES

PRESET_DIR = Path(__file__).resolve().parents[2] / "assets" / "platforms"
# Bounds on a platform file, far above any real one (a preset is ~3 KiB, nested 4 levels).
MAX_PLATFORM_BYTES = 2**20
MAX_PLATFORM_DEPTH = 8
SCHEMA_HINT = "see assets/platforms/a100-pcie-4.json for a complete example"


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
