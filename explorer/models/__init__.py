"""Model zoo: pure-JAX training steps (forward, backward, AdamW) for the planner to shard.

Each ``model(config=None, *, abstract=False, seed=0)`` returns ``(step, example_args)`` with
``step(params, opt_state, batch, rng) -> (loss, new_params, new_opt_state)``. By name:
``build("gpt", "tiny", layers=2)`` (checked inputs, a `BuiltModel`).
"""

from explorer.models._common import ARG_ROLES, BaseConfig, ModelOutput
from explorer.models.bert import BertConfig, bert
from explorer.models.flax_decoder import FlaxDecoderConfig, flax_decoder
from explorer.models.gpt import GPTConfig, gpt
from explorer.models.llama import LlamaConfig, llama
from explorer.models.moe import MoEConfig, moe
from explorer.models.zoo import MODELS, BuiltModel, build, model_config, presets

__all__ = [
    "ARG_ROLES",
    "MODELS",
    "BaseConfig",
    "BertConfig",
    "BuiltModel",
    "FlaxDecoderConfig",
    "GPTConfig",
    "LlamaConfig",
    "MoEConfig",
    "ModelOutput",
    "bert",
    "build",
    "flax_decoder",
    "gpt",
    "llama",
    "model_config",
    "moe",
    "presets",
]
