"""BERT encoder (post-LN) trained with a masked-language-model loss."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Self

import jax
import jax.numpy as jnp

from explorer.models import _common as c


@dataclass(frozen=True, slots=True)
class BertConfig(c.BaseConfig):
    PRESETS: ClassVar[tuple[str, ...]] = c.with_bf16("tiny", "small", "bert_large")

    dropout: float = 0.1
    mask_prob: float = 0.15  # fraction of positions masked in the synthetic batch

    def validate(self) -> None:
        c.BaseConfig.validate(self)
        owner = type(self).__name__
        c._check_float(owner, "dropout", self.dropout, 0.0, 1.0)
        c._check_float(owner, "mask_prob", self.mask_prob, 1e-9, 1.0)

    @property
    def mask_token(self) -> int:
        # Any fixed id works for synthetic data; the last one plays [MASK].
        return self.vocab - 1

    @classmethod
    def small(cls) -> Self:
        return cls(num_layers=4, hidden=256, heads=8, seq_len=128, batch=8, vocab=1024, ffn=1024)

    # BERT-Large (Devlin et al. 2019): 24 layers, d=1024, 16 heads, FFN 4096, vocab 30522,
    # seq 512; ~335M params.
    @classmethod
    def bert_large(cls) -> Self:
        return cls(
            num_layers=24,
            hidden=1024,
            heads=16,
            seq_len=512,
            batch=32,
            vocab=30522,
            ffn=4096,
            learning_rate=1e-4,
        )

    @classmethod
    def bert_large_bf16(cls) -> Self:
        return cls.bert_large().replace(dtype=c.BF16)

    def init_params(self, key: jax.Array) -> c.Params:
        return init_params(self, key)


def init_params(cfg: BertConfig, key: jax.Array) -> c.Params:
    dt = cfg.jnp_dtype
    h = cfg.hidden
    k_wte, k_wpe, k_dense, k_layers = jax.random.split(key, 4)
    layers = []
    for i in range(cfg.num_layers):
        k_attn, k_mlp = jax.random.split(jax.random.fold_in(k_layers, i))
        # In post-LN the "norm" of each sub-block is applied after its residual add.
        layers.append(
            {
                "attn": c.init_attention(k_attn, h, dt, bias=True, norm_bias=True),
                "mlp": c.init_mlp(k_mlp, h, cfg.ffn, dt),
            }
        )
    return {
        "embed": {
            "wte": c.normal(k_wte, (cfg.vocab, h), dt),
            "wpe": c.normal(k_wpe, (cfg.seq_len, h), dt),
            "norm": c.init_norm(h, dt),
        },
        "layers": tuple(layers),
        "head": {
            "w_dense": c.normal(k_dense, (h, h), dt),
            "b_dense": c.zeros((h,), dt),
            "norm": c.init_norm(h, dt),
            # Output projection is tied to wte (as in BERT); only the bias is separate.
            "b_vocab": c.zeros((cfg.vocab,), dt),
        },
    }


def mlm_batch(key: jax.Array, cfg: BertConfig) -> c.Batch:
    """Random sequence; a ``mask_prob`` share of positions replaced by the mask token."""
    k_tok, k_mask = jax.random.split(key)
    targets = jax.random.randint(
        k_tok, (cfg.batch, cfg.seq_len), 0, cfg.mask_token, dtype=jnp.int32
    )
    mask = jax.random.bernoulli(k_mask, cfg.mask_prob, (cfg.batch, cfg.seq_len))
    tokens = jnp.where(mask, jnp.int32(cfg.mask_token), targets)
    return {"tokens": tokens, "targets": targets, "mask": mask.astype(jnp.int32)}


def loss_fn(cfg: BertConfig, params: c.Params, batch: c.Batch, rng: jax.Array) -> jax.Array:
    rate = cfg.dropout
    tokens = batch["tokens"]
    with jax.named_scope("embed"):
        p = params["embed"]
        x = jnp.take(p["wte"], tokens, axis=0) + p["wpe"][None, : tokens.shape[1], :]
        x = c.dropout(c.layer_norm(x, p["norm"]), rate, c.layer_key(rng, cfg.num_layers, rate))

    def layer(
        lp: c.Params, x: jax.Array, k_attn: jax.Array | None, k_mlp: jax.Array | None
    ) -> jax.Array:
        with jax.named_scope("attn"):
            a = c.attention_block(
                lp["attn"], x, heads=cfg.heads, causal=False, dropout_rate=rate, key=k_attn
            )
            x = c.layer_norm(x + a, lp["attn"]["norm"])
        with jax.named_scope("mlp"):
            m = c.mlp_block(lp["mlp"], x, dropout_rate=rate, key=k_mlp)
            return c.layer_norm(x + m, lp["mlp"]["norm"])

    body = c.layer_body(layer, cfg.remat)
    for i, lp in enumerate(params["layers"]):
        key = c.layer_key(rng, i, rate)
        k_attn, k_mlp = jax.random.split(key) if key is not None else (None, None)
        with jax.named_scope(f"layer_{i}"):
            x = body(lp, x, k_attn, k_mlp)
    with jax.named_scope("head"):
        hp = params["head"]
        h = jax.nn.gelu(x @ hp["w_dense"] + hp["b_dense"])
        h = c.layer_norm(h, hp["norm"])
        logits = jnp.einsum("bsh,vh->bsv", h, params["embed"]["wte"]) + hp["b_vocab"]
        return c.cross_entropy(logits, batch["targets"], batch["mask"])


def bert(
    config: BertConfig | None = None, *, abstract: bool = False, seed: int = 0
) -> c.ModelOutput:
    """BERT MLM training step and its example ``(params, opt_state, batch, rng)``."""
    cfg = config if config is not None else BertConfig.tiny()
    return c.build_model(
        cfg,
        partial(loss_fn, cfg),
        partial(mlm_batch, cfg=cfg),
        name="bert",
        abstract=abstract,
        seed=seed,
    )
