"""The zoo by name: `build("gpt", "tiny", layers=2)` is the one way the command line, the app,
the benchmark and the tests make a zoo model's training step.

Every input is checked here, before anything is built: an unknown model or preset names the
valid ones, a depth or batch that is not a positive int says so. The preset names come from
each config class's ``PRESETS`` (the only list of them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from explorer.errors import InputError
from explorer.models._common import BaseConfig, ModelOutput, StepFn
from explorer.models.bert import BertConfig, bert
from explorer.models.flax_decoder import FlaxDecoderConfig, flax_decoder
from explorer.models.gpt import GPTConfig, gpt
from explorer.models.llama import LlamaConfig, llama
from explorer.models.moe import MoEConfig, moe

# name -> (model function, config class)
MODELS: dict[str, tuple[Callable[..., ModelOutput], type[BaseConfig]]] = {
    "gpt": (gpt, GPTConfig),
    "llama": (llama, LlamaConfig),
    "moe": (moe, MoEConfig),
    "bert": (bert, BertConfig),
    # written with Flax linen modules (needs the `bench` or `test` extra)
    "flax_decoder": (flax_decoder, FlaxDecoderConfig),
}


@dataclass(frozen=True, slots=True)
class BuiltModel:
    """A zoo model's training step and its example ``(params, opt_state, batch, rng)``:
    arrays, or ``jax.ShapeDtypeStruct``s when built abstract."""

    name: str
    preset: str
    config: BaseConfig
    step: StepFn
    args: tuple[Any, Any, Any, Any]


def presets(name: str) -> tuple[str, ...]:
    """The presets model `name` offers, smallest first."""
    return _entry(name)[1].PRESETS


def model_config(
    name: str,
    preset: str,
    *,
    layers: int | None = None,
    batch: int | None = None,
    dtype: str | None = None,
    remat: bool | None = None,
) -> BaseConfig:
    """The configuration `build` would use, checked, without building anything (for callers
    that must not touch a device yet, such as a cluster run before it joins)."""
    config_cls = _entry(name)[1]
    if preset not in config_cls.PRESETS:
        raise InputError(
            f"preset: {name} has no preset {preset!r}; expected one of "
            + ", ".join(config_cls.PRESETS)
        )
    changes: dict[str, Any] = {}
    for field, value in (("layers", layers), ("batch", batch)):
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(
                f"{field}: expected a positive int or None (the preset's), found {value!r}"
            )
        changes["num_layers" if field == "layers" else field] = value
    if dtype is not None:
        changes["dtype"] = dtype
    if remat is not None:
        if not isinstance(remat, bool):
            raise InputError(f"remat: expected a bool or None (the preset's), found {remat!r}")
        changes["remat"] = remat
    config: BaseConfig = getattr(config_cls, preset)()
    try:
        return config.replace(**changes)
    except (ValueError, TypeError) as err:  # the config's own checks (divisibility, dtype)
        raise InputError(f"{name} {preset} with {changes}: {err}") from err


def build(
    name: str,
    preset: str,
    *,
    layers: int | None = None,
    batch: int | None = None,
    dtype: str | None = None,
    remat: bool | None = None,
    abstract: bool = False,
) -> BuiltModel:
    """Zoo model `name` at `preset`, with its depth, batch or dtype changed where given, its
    layers rematerialised in the backward pass with ``remat=True``; ``abstract=True`` gives
    shapes instead of arrays (no memory, no time: paper-scale models are traced that way)."""
    config = model_config(name, preset, layers=layers, batch=batch, dtype=dtype, remat=remat)
    model_fn = _entry(name)[0]
    step, (params, opt_state, data, rng) = model_fn(config, abstract=abstract)
    return BuiltModel(name, preset, config, step, (params, opt_state, data, rng))


def _entry(name: str) -> tuple[Callable[..., ModelOutput], type[BaseConfig]]:
    if not isinstance(name, str) or name not in MODELS:
        raise InputError(f"model: expected one of {', '.join(MODELS)}, found {name!r}")
    return MODELS[name]
