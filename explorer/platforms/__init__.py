"""Platforms: what a device computes and what a collective costs on a given machine.

`model` holds the platform model and its pricing (ring and hierarchical collective formulas,
the additive compute roofline); `files` reads, checks and writes platform JSON (presets live
under `assets/platforms/`, each with the public sources of its figures); `calibration`
measures a platform from the devices JAX sees. The names below are the package's surface,
imported from here as they were from the single module it replaces.
"""

from explorer.errors import PlatformError
from explorer.platforms.calibration import DEFAULT_SIZES, calibrate, calibrate_main
from explorer.platforms.files import (
    MAX_PLATFORM_BYTES,
    MAX_PLATFORM_DEPTH,
    PRESET_DIR,
    SCHEMA_HINT,
    format_platform,
    list_platforms,
    load_platform,
    platform_from_json,
    resolve_platform,
    save_platform,
)
from explorer.platforms.model import (
    KINDS,
    PEAKS_FIELD,
    DeviceModel,
    LinkLevel,
    LinkModel,
    Platform,
    PlatformLike,
    ring_factor,
)

__all__ = [
    "DEFAULT_SIZES",
    "KINDS",
    "MAX_PLATFORM_BYTES",
    "MAX_PLATFORM_DEPTH",
    "PEAKS_FIELD",
    "PRESET_DIR",
    "SCHEMA_HINT",
    "DeviceModel",
    "LinkLevel",
    "LinkModel",
    "Platform",
    "PlatformError",
    "PlatformLike",
    "calibrate",
    "calibrate_main",
    "format_platform",
    "list_platforms",
    "load_platform",
    "platform_from_json",
    "resolve_platform",
    "ring_factor",
    "save_platform",
]
