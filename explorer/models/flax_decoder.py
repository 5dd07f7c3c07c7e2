"""A decoder written the way Flax users write one: `flax.linen` modules (`nn.Embed`,
`nn.MultiHeadDotProductAttention`, `nn.Dense`, `nn.LayerNorm`) in a Python loop.

The zoo's other models name their layers with `jax.named_scope`; this one carries whatever
scopes Flax gives it, so the planner must find its repeated layers from structure. Flax is
an optional dependency (the `bench` and `test` extras), imported only when the model is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp

from explorer.models import _common as c


@dataclass(frozen=True, slots=True)
class FlaxDecoderConfig(c.BaseConfig):
    PRESETS: ClassVar[tuple[str, ...]] = c.with_bf16("tiny", "small")

    @classmethod
    def small(cls) -> Self:
        return cls(num_layers=4, hidden=256, heads=8, seq_len=128, batch=8, vocab=1024, ffn=1024)

    def init_params(self, key: jax.Array) -> c.Params:
        tokens = jnp.zeros((self.batch, self.seq_len), jnp.int32)
        params: c.Params = _module(self).init(key, tokens)
        return params


@cache
def _module(cfg: FlaxDecoderConfig) -> Any:
    """The linen module of `cfg` (built once per config: modules are immutable)."""
    try:
        import flax.linen as nn
    except ImportError as err:  # pragma: no cover - flax is in the bench and test extras
        raise ImportError(
            "the flax_decoder model needs Flax: pip install 'explorer[bench]' (or flax>=0.12)"
        ) from err

    class Layer(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
            h = nn.LayerNorm(dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_dtype)(x)
            x = x + nn.MultiHeadDotProductAttention(
                num_heads=cfg.heads,
                deterministic=True,
                dtype=cfg.jnp_dtype,
                param_dtype=cfg.jnp_dtype,
            )(h, mask=mask)
            h = nn.LayerNorm(dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_dtype)(x)
            h = nn.Dense(cfg.ffn, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_dtype)(h)
            return x + nn.Dense(cfg.hidden, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_dtype)(
                nn.gelu(h)
            )

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens: jax.Array) -> jax.Array:
            x = nn.Embed(cfg.vocab, cfg.hidden, param_dtype=cfg.jnp_dtype)(tokens)
            block = nn.remat(Layer) if cfg.remat else Layer
            for i in range(cfg.num_layers):
                x = block(name=f"layer_{i}")(x)
            x = nn.LayerNorm(dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_dtype)(x)
            return nn.Dense(cfg.vocab, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_dtype)(x)

    return Decoder()


def loss_fn(cfg: FlaxDecoderConfig, params: c.Params, batch: c.Batch, rng: jax.Array) -> jax.Array:
    del rng  # deterministic: no dropout
    logits = _module(cfg).apply(params, batch["tokens"])
    return c.cross_entropy(logits, batch["targets"])


def flax_decoder(
    config: FlaxDecoderConfig | None = None, *, abstract: bool = False, seed: int = 0
) -> c.ModelOutput:
    """Flax linen decoder training step and its example ``(params, opt_state, batch, rng)``."""
    cfg = config if config is not None else FlaxDecoderConfig.tiny()
    return c.build_model(
        cfg,
        partial(loss_fn, cfg),
        partial(c.lm_batch, batch=cfg.batch, seq_len=cfg.seq_len, vocab=cfg.vocab),
        name="flax_decoder",
        abstract=abstract,
        seed=seed,
    )
