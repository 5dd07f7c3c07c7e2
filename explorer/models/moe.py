"""GShard-style mixture of experts: GPT layers whose MLP is replaced by a top-2 MoE every
``moe_interval`` layers, with grouped dispatch/combine einsums and a load-balancing loss."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Self

import jax
import jax.numpy as jnp

from explorer.models import _common as c
from explorer.models.gpt import embed


@dataclass(frozen=True, slots=True)
class MoEConfig(c.BaseConfig):
    PRESETS: ClassVar[tuple[str, ...]] = c.with_bf16("tiny", "small", "moe_7_1b")

    dropout: float = 0.1
    num_experts: int = 8
    capacity_factor: float = 1.0
    # Tokens per routing group (S_g); B*S tokens form B*S/S_g groups.
    expert_group_size: int = 32
    # Layer i is MoE when i % moe_interval == moe_interval - 1 (2: every other layer).
    moe_interval: int = 2
    aux_loss_coef: float = 0.01

    def validate(self) -> None:
        c.BaseConfig.validate(self)
        owner = type(self).__name__
        c._check_float(owner, "dropout", self.dropout, 0.0, 1.0)
        for name in ("num_experts", "expert_group_size", "moe_interval"):
            c._check_positive_int(owner, name, getattr(self, name))
        if self.num_experts < 2:
            raise ValueError(
                f"{owner}.num_experts: expected >= 2 for top-2 gating, found {self.num_experts}"
            )
        c._check_float(owner, "capacity_factor", self.capacity_factor, 1e-9, math.inf)
        c._check_float(owner, "aux_loss_coef", self.aux_loss_coef, 0.0, math.inf)
        tokens = self.batch * self.seq_len
        if tokens % self.expert_group_size != 0:
            raise ValueError(
                f"{owner}.expert_group_size: expected a divisor of batch*seq_len={tokens}, "
                f"found {self.expert_group_size}"
            )

    @property
    def num_groups(self) -> int:
        return self.batch * self.seq_len // self.expert_group_size

    @property
    def expert_capacity(self) -> int:
        """GShard capacity per expert and group for top-2 routing."""
        return math.ceil(self.capacity_factor * 2 * self.expert_group_size / self.num_experts)

    @property
    def layer_period(self) -> int:
        return self.moe_interval

    def is_moe_layer(self, i: int) -> bool:
        return i % self.moe_interval == self.moe_interval - 1

    @classmethod
    def small(cls) -> Self:
        return cls(
            num_layers=4,
            hidden=256,
            heads=8,
            seq_len=128,
            batch=8,
            vocab=1024,
            ffn=1024,
            expert_group_size=128,
        )

    # Alpa benchmark "7.1B" MoE (alpa-projects/alpa benchmark/alpa/suite_manual_moe.py,
    # moe_specs["7.1B"] = S 1024, H 1280, L 16, 16 heads, V 32000, E 32, S_ 2048), with Alpa's
    # FFN width 8*H in dense and expert MLPs and MoE on every other layer; ~7.07e9 params.
    @classmethod
    def moe_7_1b(cls) -> Self:
        return cls(
            num_layers=16,
            hidden=1280,
            heads=16,
            seq_len=1024,
            batch=16,
            vocab=32000,
            ffn=8 * 1280,
            num_experts=32,
            capacity_factor=1.0,
            expert_group_size=2048,
            learning_rate=1e-4,
        )

    @classmethod
    def moe_7_1b_bf16(cls) -> Self:
        return cls.moe_7_1b().replace(dtype=c.BF16)

    def init_params(self, key: jax.Array) -> c.Params:
        return init_params(self, key)


def init_params(cfg: MoEConfig, key: jax.Array) -> c.Params:
    dt = cfg.jnp_dtype
    h, f, e = cfg.hidden, cfg.ffn, cfg.num_experts
    k_wte, k_wpe, k_layers = jax.random.split(key, 3)
    layers = []
    for i in range(cfg.num_layers):
        k_attn, k_ffn, k_gate, k_in, k_out = jax.random.split(jax.random.fold_in(k_layers, i), 5)
        layer: c.Params = {"attn": c.init_attention(k_attn, h, dt, bias=True, norm_bias=True)}
        if cfg.is_moe_layer(i):
            layer["moe"] = {
                "norm": c.init_norm(h, dt),
                "w_gate": c.normal(k_gate, (h, e), dt),
                "w_in": c.normal(k_in, (e, h, f), dt),
                "w_out": c.normal(k_out, (e, f, h), dt),
            }
        else:
            layer["mlp"] = c.init_mlp(k_ffn, h, f, dt)
        layers.append(layer)
    return {
        "embed": {
            "wte": c.normal(k_wte, (cfg.vocab, h), dt),
            "wpe": c.normal(k_wpe, (cfg.seq_len, h), dt),
        },
        "layers": tuple(layers),
        "final_norm": c.init_norm(h, dt),
    }


def top2_gating(logits: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GShard top-2 routing on [G,S,E] logits.

    Returns combine weights and the 0/1 dispatch mask, both [G,S,E,C], and the auxiliary
    load-balancing loss. Slots are assigned in token order with cumsums; tokens past an
    expert's capacity are dropped (their gate is zeroed).
    """
    num_experts = logits.shape[-1]
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)

    mask1 = jax.nn.one_hot(jnp.argmax(probs, axis=-1), num_experts, dtype=jnp.float32)
    # Second choice: best expert once the first one is masked out.
    mask2 = jax.nn.one_hot(
        jnp.argmax(probs * (1.0 - mask1), axis=-1), num_experts, dtype=jnp.float32
    )

    # Load balancing (GShard eq. 4): top-1 fraction times mean gate prob, per group.
    density = jnp.mean(mask1, axis=1)
    density_proxy = jnp.mean(probs, axis=1)
    aux_loss = jnp.mean(density * density_proxy) * float(num_experts * num_experts)

    gate1 = jnp.sum(probs * mask1, axis=-1)
    gate2 = jnp.sum(probs * mask2, axis=-1)
    denom = gate1 + gate2 + jnp.finfo(jnp.float32).eps
    gate1, gate2 = gate1 / denom, gate2 / denom

    # 0-based slot of each token in its expert's buffer; second choices queue after all firsts.
    pos1 = jnp.cumsum(mask1, axis=1) - mask1
    mask1 = mask1 * (pos1 < capacity)
    pos2 = jnp.cumsum(mask2, axis=1) - mask2 + jnp.sum(mask1, axis=1, keepdims=True)
    mask2 = mask2 * (pos2 < capacity)

    slot1 = jax.nn.one_hot(jnp.sum(pos1 * mask1, axis=-1).astype(jnp.int32), capacity)
    slot2 = jax.nn.one_hot(jnp.sum(pos2 * mask2, axis=-1).astype(jnp.int32), capacity)
    route1 = mask1[..., None] * slot1[:, :, None, :]
    route2 = mask2[..., None] * slot2[:, :, None, :]
    combine = gate1[..., None, None] * route1 + gate2[..., None, None] * route2
    dispatch = route1 + route2
    return combine, dispatch, aux_loss


def moe_ffn(p: c.Params, x: jax.Array, cfg: MoEConfig) -> tuple[jax.Array, jax.Array]:
    """Grouped top-2 MoE FFN on [B,S,M]; returns the output and the auxiliary loss."""
    b, s, m = x.shape
    xg = x.reshape(cfg.num_groups, cfg.expert_group_size, m)
    logits = jnp.einsum("gsm,me->gse", xg, p["w_gate"])
    combine, dispatch, aux = top2_gating(logits, cfg.expert_capacity)
    expert_in = jnp.einsum("gsec,gsm->egcm", dispatch.astype(x.dtype), xg)
    h = jax.nn.gelu(jnp.einsum("egcm,emh->egch", expert_in, p["w_in"]))
    expert_out = jnp.einsum("egch,ehm->egcm", h, p["w_out"])
    y = jnp.einsum("gsec,egcm->gsm", combine.astype(x.dtype), expert_out)
    return y.reshape(b, s, m), aux


def loss_fn(cfg: MoEConfig, params: c.Params, batch: c.Batch, rng: jax.Array) -> jax.Array:
    rate = cfg.dropout
    with jax.named_scope("embed"):
        x = embed(params["embed"], batch["tokens"], rate, c.layer_key(rng, cfg.num_layers, rate))

    def moe_layer(lp: c.Params, x: jax.Array, key: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        k_attn, k_moe = jax.random.split(key) if key is not None else (None, None)
        with jax.named_scope("attn"):
            h = c.layer_norm(x, lp["attn"]["norm"])
            x = x + c.attention_block(
                lp["attn"], h, heads=cfg.heads, causal=True, dropout_rate=rate, key=k_attn
            )
        with jax.named_scope("moe"):
            h = c.layer_norm(x, lp["moe"]["norm"])
            y, aux = moe_ffn(lp["moe"], h, cfg)
            return x + c.dropout(y, rate, k_moe), aux

    dense = c.layer_body(partial(c.gpt_layer, heads=cfg.heads, dropout_rate=rate), cfg.remat)
    sparse = c.layer_body(moe_layer, cfg.remat)
    aux_total = jnp.zeros((), jnp.float32)
    for i, lp in enumerate(params["layers"]):
        key = c.layer_key(rng, i, rate)
        with jax.named_scope(f"layer_{i}"):
            if "moe" not in lp:
                x = dense(lp, x, key=key)
                continue
            x, aux = sparse(lp, x, key)
            with jax.named_scope("moe"):
                aux_total = aux_total + aux
    with jax.named_scope("head"):
        x = c.layer_norm(x, params["final_norm"])
        logits = jnp.einsum("bsh,vh->bsv", x, params["embed"]["wte"])
        return c.cross_entropy(logits, batch["targets"]) + cfg.aux_loss_coef * aux_total


def moe(config: MoEConfig | None = None, *, abstract: bool = False, seed: int = 0) -> c.ModelOutput:
    """GShard MoE training step and its example ``(params, opt_state, batch, rng)``."""
    cfg = config if config is not None else MoEConfig.tiny()
    return c.build_model(
        cfg,
        partial(loss_fn, cfg),
        partial(c.lm_batch, batch=cfg.batch, seq_len=cfg.seq_len, vocab=cfg.vocab),
        name="moe",
        abstract=abstract,
        seed=seed,
    )
