"""LLaMA style decoder: RMSNorm, RoPE, fused bias-free QKV, fused SwiGLU, untied head."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Self

import jax
import jax.numpy as jnp
from jax import lax

from explorer.models import _common as c


@dataclass(frozen=True, slots=True)
class LlamaConfig(c.BaseConfig):
    PRESETS: ClassVar[tuple[str, ...]] = c.with_bf16("tiny", "small", "llama_7b")

    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def validate(self) -> None:
        c.BaseConfig.validate(self)
        owner = type(self).__name__
        # RoPE rotates pairs of channels, so each head needs an even width.
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"{owner}.hidden: expected hidden/heads to be even for RoPE, "
                f"found {self.hidden}/{self.heads}={self.head_dim}"
            )
        c._check_float(owner, "rope_theta", self.rope_theta, 1.0, float("inf"))
        c._check_float(owner, "norm_eps", self.norm_eps, 0.0, 1.0)

    @classmethod
    def small(cls) -> Self:
        return cls(num_layers=4, hidden=256, heads=8, seq_len=128, batch=8, vocab=1024, ffn=704)

    # LLaMA-7B (Touvron et al. 2023): 32 layers, d=4096, 32 heads, SwiGLU 11008, vocab 32000.
    @classmethod
    def llama_7b(cls) -> Self:
        return cls(
            num_layers=32,
            hidden=4096,
            heads=32,
            seq_len=2048,
            batch=8,
            vocab=32000,
            ffn=11008,
            learning_rate=3e-4,
            weight_decay=0.1,
        )

    @classmethod
    def llama_7b_bf16(cls) -> Self:
        return cls.llama_7b().replace(dtype=c.BF16)

    def init_params(self, key: jax.Array) -> c.Params:
        return init_params(self, key)


def init_params(cfg: LlamaConfig, key: jax.Array) -> c.Params:
    dt = cfg.jnp_dtype
    h, f = cfg.hidden, cfg.ffn
    k_emb, k_head, k_layers = jax.random.split(key, 3)
    layers = []
    for i in range(cfg.num_layers):
        k_qkv, k_o, k_gu, k_down = jax.random.split(jax.random.fold_in(k_layers, i), 4)
        layers.append(
            {
                "attn": {
                    "norm": c.init_norm(h, dt, bias=False),
                    "w_qkv": c.normal(k_qkv, (h, 3 * h), dt),
                    "w_o": c.normal(k_o, (h, h), dt),
                },
                "mlp": {
                    "norm": c.init_norm(h, dt, bias=False),
                    "w_gate_up": c.normal(k_gu, (h, 2 * f), dt),
                    "w_down": c.normal(k_down, (f, h), dt),
                },
            }
        )
    return {
        "embed": {"wte": c.normal(k_emb, (cfg.vocab, h), dt)},
        "layers": tuple(layers),
        "final_norm": c.init_norm(h, dt, bias=False),
        "head": {"w_head": c.normal(k_head, (h, cfg.vocab), dt)},
    }


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos/sin [S, head_dim/2] from iota so no constant arrays end up in the jaxpr."""
    half = head_dim // 2
    inv_freq = jnp.exp(lax.iota(jnp.float32, half) * (-2.0 * math.log(theta) / head_dim))
    pos = lax.iota(jnp.float32, seq_len)
    angles = pos[:, None] * inv_freq[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE on [B,S,heads,head_dim]; the two halves are static slices."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos_b = cos[None, :, None, :].astype(x.dtype)
    sin_b = sin[None, :, None, :].astype(x.dtype)
    return jnp.concatenate([x1 * cos_b - x2 * sin_b, x2 * cos_b + x1 * sin_b], axis=-1)


def attention(p: c.Params, x: jax.Array, cos: jax.Array, sin: jax.Array, heads: int) -> jax.Array:
    b, s, hidden = x.shape
    q, k, v = c.split_qkv(x @ p["w_qkv"], heads)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    ctx = c.attention_core(q, k, v, causal=True)
    return ctx.reshape(b, s, hidden) @ p["w_o"]


def swiglu(p: c.Params, x: jax.Array) -> jax.Array:
    b, s, _ = x.shape
    # [.., ffn, 2]: ffn before the pair so a column split of w_gate_up keeps gate/up together.
    gu = (x @ p["w_gate_up"]).reshape(b, s, -1, 2)
    gate = lax.index_in_dim(gu, 0, axis=3, keepdims=False)
    up = lax.index_in_dim(gu, 1, axis=3, keepdims=False)
    return (jax.nn.silu(gate) * up) @ p["w_down"]


def loss_fn(cfg: LlamaConfig, params: c.Params, batch: c.Batch, rng: jax.Array) -> jax.Array:
    del rng  # no dropout in LLaMA
    eps = cfg.norm_eps
    with jax.named_scope("embed"):
        x = jnp.take(params["embed"]["wte"], batch["tokens"], axis=0)
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)

    def layer(lp: c.Params, x: jax.Array) -> jax.Array:
        with jax.named_scope("attn"):
            h = c.rms_norm(x, lp["attn"]["norm"], eps)
            x = x + attention(lp["attn"], h, cos, sin, cfg.heads)
        with jax.named_scope("mlp"):
            h = c.rms_norm(x, lp["mlp"]["norm"], eps)
            return x + swiglu(lp["mlp"], h)

    body = c.layer_body(layer, cfg.remat)
    for i, lp in enumerate(params["layers"]):
        with jax.named_scope(f"layer_{i}"):
            x = body(lp, x)
    with jax.named_scope("head"):
        x = c.rms_norm(x, params["final_norm"], eps)
        logits = x @ params["head"]["w_head"]
        return c.cross_entropy(logits, batch["targets"])


def llama(
    config: LlamaConfig | None = None, *, abstract: bool = False, seed: int = 0
) -> c.ModelOutput:
    """LLaMA training step and its example ``(params, opt_state, batch, rng)``."""
    cfg = config if config is not None else LlamaConfig.tiny()
    return c.build_model(
        cfg,
        partial(loss_fn, cfg),
        partial(c.lm_batch, batch=cfg.batch, seq_len=cfg.seq_len, vocab=cfg.vocab),
        name="llama",
        abstract=abstract,
        seed=seed,
    )
