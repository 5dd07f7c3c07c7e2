"""What the app accepts where input enters it (the constructor, `pin`, `set_budget`).

Each check returns the reason a value is refused, or "" when it is fine; the app shows the
reason in its message area and keeps everything it computed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from explorer import models
from explorer.analysis import Analysis, SegmentedStep

BACKENDS = ("compiled", "measured")


def presets(model: str) -> list[str]:
    """Presets the model's config class provides."""
    _, config_cls = models.MODELS[model]
    return list(config_cls.PRESETS)


def one_of(what: str, value: Any, valid: Sequence[str]) -> str:
    if value in valid:
        return ""
    return f"unknown {what} {value!r}: expected one of {', '.join(map(repr, valid))}"


@dataclass(frozen=True, slots=True)
class Checked:
    """The constructor's arguments made valid, and why any was refused."""

    model: str
    preset: str
    layers: int | None
    mesh: tuple[int, ...]
    platform: str
    backend: str
    problems: tuple[str, ...]


def check_arguments(
    model: Any,
    preset: Any,
    *,
    layers: Any,
    mesh: Any,
    platform: Any,
    backend: Any,
    devices: int,
    platforms: Sequence[str],
) -> Checked:
    """Each refused value is replaced by the control's first choice, and the reason kept."""
    problems = []
    names = sorted(models.MODELS)
    if reason := one_of("model", model, names):
        problems.append(reason)
        model = "gpt" if "gpt" in names else names[0]
    valid_presets = presets(model)
    if reason := one_of(f"preset for {model}", preset, valid_presets):
        problems.append(reason)
        preset = valid_presets[0]
    if layers is not None and (not isinstance(layers, int) or layers < 0):
        problems.append(f"layers: expected a positive int or None (the preset's), found {layers!r}")
        layers = None
    if reason := one_of("platform", platform, platforms):
        problems.append(reason)
        platform = "a100-pcie-8" if "a100-pcie-8" in platforms else platforms[0]
    if reason := one_of("backend", backend, BACKENDS):
        problems.append(reason)
        backend = BACKENDS[0]
    shape = tuple(mesh) if isinstance(mesh, tuple | list) else None
    if shape is None or not shape or not all(isinstance(n, int) and n > 0 for n in shape):
        problems.append(
            f"mesh: expected a shape tuple of positive ints like (8,) or (2, 4), found {mesh!r}"
        )
        shape = (devices,)
    elif math.prod(shape) > devices:
        problems.append(
            f"mesh {shape} needs {math.prod(shape)} devices but JAX sees {devices}: choose a mesh "
            f"of at most {devices} devices, or set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={math.prod(shape)} before JAX is imported"
        )
        shape = (devices,)
    return Checked(model, preset, layers or None, shape, platform, backend, tuple(problems))


def pin_problem(analysis: SegmentedStep | None, block: Any, strategy: Any) -> str:
    """Why pinning `block` to `strategy` is refused ("" if it names a real choice)."""
    if not isinstance(analysis, Analysis):
        return "no plan to pin: profile and solve first"
    pinnable = [b.index for b in analysis.blocks if b.strategies]
    if not isinstance(block, int) or block not in pinnable:
        return (
            f"no block {block!r} to pin: expected a block index with strategies, "
            f"{pinnable[0]}..{pinnable[-1]} ({len(pinnable)} blocks)"
        )
    names = [s.name for s in analysis.blocks[block].strategies]
    if strategy not in names:
        return (
            f"block {block} ({analysis.blocks[block].scope}) has no strategy {strategy!r}: "
            f"expected one of {', '.join(names)}"
        )
    return ""


def budget_problem(budget: Any) -> str:
    if budget is None:
        return ""
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not budget > 0:
        return (
            "memory budget: expected bytes per device (a positive number) or None (the fastest "
            f"plan), found {budget!r}"
        )
    return ""
