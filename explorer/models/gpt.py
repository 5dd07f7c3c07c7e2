"""GPT-2 style decoder: learned positions, pre-LN blocks, fused QKV, GELU MLP, dropout."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Self

import jax
import jax.numpy as jnp

from explorer.models import _common as c


@dataclass(frozen=True, slots=True)
class GPTConfig(c.BaseConfig):
    PRESETS: ClassVar[tuple[str, ...]] = c.with_bf16("tiny", "small", "gpt_2_6b", "gpt_6_7b")

    dropout: float = 0.1
    tie_embeddings: bool = True

    def validate(self) -> None:
        c.BaseConfig.validate(self)
        c._check_float(type(self).__name__, "dropout", self.dropout, 0.0, 1.0)

    @classmethod
    def small(cls) -> Self:
        return cls(num_layers=4, hidden=256, heads=8, seq_len=128, batch=8, vocab=1024, ffn=1024)

    # Megatron-LM / Alpa GPT-3 family sizes (vocab 51200, seq 1024, tied embeddings).
    # batch is the per-step batch without micro-batching.
    @classmethod
    def gpt_2_6b(cls) -> Self:
        return cls(
            num_layers=32,
            hidden=2560,
            heads=32,
            seq_len=1024,
            batch=32,
            vocab=51200,
            ffn=4 * 2560,
            learning_rate=1e-4,
        )

    @classmethod
    def gpt_6_7b(cls) -> Self:
        return cls(
            num_layers=32,
            hidden=4096,
            heads=32,
            seq_len=1024,
            batch=32,
            vocab=51200,
            ffn=4 * 4096,
            learning_rate=1e-4,
        )

    @classmethod
    def gpt_2_6b_bf16(cls) -> Self:
        return cls.gpt_2_6b().replace(dtype=c.BF16)

    @classmethod
    def gpt_6_7b_bf16(cls) -> Self:
        return cls.gpt_6_7b().replace(dtype=c.BF16)

    def init_params(self, key: jax.Array) -> c.Params:
        return init_params(self, key)


def init_params(cfg: GPTConfig, key: jax.Array) -> c.Params:
    dt = cfg.jnp_dtype
    k_wte, k_wpe, k_head, k_layers = jax.random.split(key, 4)
    layers = []
    for i in range(cfg.num_layers):
        k_attn, k_mlp = jax.random.split(jax.random.fold_in(k_layers, i))
        layers.append(
            {
                "attn": c.init_attention(k_attn, cfg.hidden, dt, bias=True, norm_bias=True),
                "mlp": c.init_mlp(k_mlp, cfg.hidden, cfg.ffn, dt),
            }
        )
    params: c.Params = {
        "embed": {
            "wte": c.normal(k_wte, (cfg.vocab, cfg.hidden), dt),
            "wpe": c.normal(k_wpe, (cfg.seq_len, cfg.hidden), dt),
        },
        "layers": tuple(layers),
        "final_norm": c.init_norm(cfg.hidden, dt),
    }
    if not cfg.tie_embeddings:
        params["head"] = {"w_head": c.normal(k_head, (cfg.hidden, cfg.vocab), dt)}
    return params


def embed(p: c.Params, tokens: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Token + learned position embedding (positions are the full trained length)."""
    x = jnp.take(p["wte"], tokens, axis=0) + p["wpe"][None, : tokens.shape[1], :]
    return c.dropout(x, rate, key)


def lm_head(params: c.Params, x: jax.Array, tie: bool) -> jax.Array:
    x = c.layer_norm(x, params["final_norm"])
    if tie:
        return jnp.einsum("bsh,vh->bsv", x, params["embed"]["wte"])
    return x @ params["head"]["w_head"]


def loss_fn(cfg: GPTConfig, params: c.Params, batch: c.Batch, rng: jax.Array) -> jax.Array:
    rate = cfg.dropout
    with jax.named_scope("embed"):
        x = embed(params["embed"], batch["tokens"], rate, c.layer_key(rng, cfg.num_layers, rate))
    layer = c.layer_body(partial(c.gpt_layer, heads=cfg.heads, dropout_rate=rate), cfg.remat)
    for i, lp in enumerate(params["layers"]):
        with jax.named_scope(f"layer_{i}"):
            x = layer(lp, x, key=c.layer_key(rng, i, rate))
    with jax.named_scope("head"):
        logits = lm_head(params, x, cfg.tie_embeddings)
        return c.cross_entropy(logits, batch["targets"])


def gpt(config: GPTConfig | None = None, *, abstract: bool = False, seed: int = 0) -> c.ModelOutput:
    """GPT training step and its example ``(params, opt_state, batch, rng)``."""
    cfg = config if config is not None else GPTConfig.tiny()
    return c.build_model(
        cfg,
        partial(loss_fn, cfg),
        partial(c.lm_batch, batch=cfg.batch, seq_len=cfg.seq_len, vocab=cfg.vocab),
        name="gpt",
        abstract=abstract,
        seed=seed,
    )
