"""Model zoo: pure-JAX training steps (forward, backward, AdamW) for the planner to shard.

Each ``model(config=None, *, abstract=False, seed=0)`` returns ``(step, example_args)`` with
``step(params, opt_state, batch, rng) -> (loss, new_params, new_opt_state)``.
"""

from collections.abc import Callable

from explorer.models._common import ARG_ROLES, BaseConfig, ModelOutput
from explorer.models.bert import BertConfig, bert
from explorer.models.flax_decoder import FlaxDecoderConfig, flax_decoder
from explorer.models.gpt import GPTConfig, gpt
from explorer.models.llama import LlamaConfig, llama
from explorer.models.moe import MoEConfig, moe

# name -> (model function, config class), for the CLI.
MODELS: dict[str, tuple[Callable[..., ModelOutput], type[BaseConfig]]] = {
    "gpt": (gpt, GPTConfig),
    "llama": (llama, LlamaConfig),
    "moe": (moe, MoEConfig),
    "bert": (bert, BertConfig),
    # written with Flax linen modules (needs the `bench` or `test` extra)
    "flax_decoder": (flax_decoder, FlaxDecoderConfig),
}

__all__ = [
    "ARG_ROLES",
    "MODELS",
    "BaseConfig",
    "BertConfig",
    "FlaxDecoderConfig",
    "GPTConfig",
    "LlamaConfig",
    "MoEConfig",
    "ModelOutput",
    "bert",
    "flax_decoder",
    "gpt",
    "llama",
    "moe",
]
