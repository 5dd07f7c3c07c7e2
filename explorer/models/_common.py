"""Shared building blocks of the model zoo: configs, layers, loss and the training step.

Everything is plain ``jax.numpy``/``jax.lax`` so that the jaxpr of a step stays a flat list of
matmuls, elementwise ops and reductions (no control flow), which the planner analyses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
import optax
from jax import lax

Array = jax.Array
Params = dict[str, Any]
Batch = dict[str, Any]
StepFn = Callable[[Any, Any, Any, Any], tuple[Any, Any, Any]]
ModelOutput = tuple[StepFn, tuple[Any, Any, Any, Any]]

ARG_ROLES: tuple[str, str, str, str] = ("params", "opt_state", "data", "rng")
INIT_STD = 0.02
LN_EPS = 1e-5
# The dtype of the `*_bf16` presets: parameters, optimizer state and activations in bfloat16;
# the layers keep softmax, norm statistics and the loss in float32 (see layer_norm, rms_norm,
# attention_core, cross_entropy), as mixed-precision training does.
BF16 = "bfloat16"


# --------------------------------------------------------------------------------------------
# Configs


def with_bf16(*names: str) -> tuple[str, ...]:
    """Preset names, each followed by its bfloat16 variant ``<name>_bf16``."""
    return tuple(n for name in names for n in (name, f"{name}_bf16"))


def _check_positive_int(owner: str, name: str, value: object) -> None:
    # bool is an int subclass; a flag passed as a size is always a mistake.
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{owner}.{name}: expected a positive int, found {value!r}")


def _check_divisible(owner: str, name: str, value: int, by_name: str, by: int) -> None:
    if value % by != 0:
        raise ValueError(
            f"{owner}.{name}: expected a multiple of {by_name}={by}, found {value} "
            f"({value} % {by} = {value % by})"
        )


def _check_float(owner: str, name: str, value: object, lo: float, hi: float) -> None:
    # [lo, hi) interval; covers learning rates (lo>0 via tiny epsilon) and probabilities.
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value < hi:
        raise ValueError(f"{owner}.{name}: expected a float in [{lo}, {hi}), found {value!r}")


@dataclass(frozen=True, slots=True)
class BaseConfig:
    """Fields every model shares. Defaults are the ``tiny`` preset.

    Presets are classmethods named in ``PRESETS``; each ``<name>_bf16`` is ``<name>`` with
    ``dtype="bfloat16"`` (see ``BF16``).
    """

    # Names of the preset classmethods this config provides, smallest first.
    PRESETS: ClassVar[tuple[str, ...]] = with_bf16("tiny")

    num_layers: int = 2
    hidden: int = 64
    heads: int = 8
    seq_len: int = 32
    batch: int = 8
    vocab: int = 256
    ffn: int = 256
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    dtype: str = "float32"
    # rematerialise every layer in the backward pass (`jax.checkpoint`): a layer keeps only its
    # input for the backward pass and runs its forward again there, as training at large
    # batches does to fit activations in device memory
    remat: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field, the expectation and the value found."""
        owner = type(self).__name__
        for name in ("num_layers", "hidden", "heads", "seq_len", "batch", "vocab", "ffn"):
            _check_positive_int(owner, name, getattr(self, name))
        _check_divisible(owner, "hidden", self.hidden, "heads", self.heads)
        _check_float(owner, "learning_rate", self.learning_rate, 1e-12, math.inf)
        _check_float(owner, "weight_decay", self.weight_decay, 0.0, math.inf)
        if not isinstance(self.remat, bool):
            raise ValueError(f"{owner}.remat: expected a bool, found {self.remat!r}")
        try:
            dt = jnp.dtype(self.dtype)
        except TypeError as err:
            raise ValueError(f"{owner}.dtype: expected a dtype name, found {self.dtype!r}") from err
        if not jnp.issubdtype(dt, jnp.floating):
            raise ValueError(f"{owner}.dtype: expected a floating dtype, found {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_period(self) -> int:
        """Layers in the stack's repeating pattern (1: every layer is alike)."""
        return 1

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @classmethod
    def tiny(cls) -> Self:
        return cls()

    @classmethod
    def tiny_bf16(cls) -> Self:
        return cls.tiny().replace(dtype=BF16)

    @classmethod
    def small(cls) -> Self:
        raise NotImplementedError

    @classmethod
    def small_bf16(cls) -> Self:
        return cls.small().replace(dtype=BF16)

    def replace(self, **changes: Any) -> Self:
        """Copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def init_params(self, key: Array) -> Params:
        raise NotImplementedError

    def abstract_params(self) -> Params:
        """Parameter shapes/dtypes without allocating anything."""
        return jax.eval_shape(self.init_params, jax.random.PRNGKey(0))

    def num_params(self) -> int:
        return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(self.abstract_params()))


# --------------------------------------------------------------------------------------------
# Initialisers


def normal(key: Array, shape: tuple[int, ...], dtype: Any, std: float = INIT_STD) -> Array:
    return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def zeros(shape: tuple[int, ...], dtype: Any) -> Array:
    return jnp.zeros(shape, dtype)


def init_norm(hidden: int, dtype: Any, *, bias: bool = True) -> Params:
    p = {"scale": jnp.ones((hidden,), dtype)}
    if bias:
        p["bias"] = zeros((hidden,), dtype)
    return p


def init_attention(key: Array, hidden: int, dtype: Any, *, bias: bool, norm_bias: bool) -> Params:
    k_qkv, k_o = jax.random.split(key)
    p: Params = {
        "norm": init_norm(hidden, dtype, bias=norm_bias),
        "w_qkv": normal(k_qkv, (hidden, 3 * hidden), dtype),
        "w_o": normal(k_o, (hidden, hidden), dtype),
    }
    if bias:
        p["b_qkv"] = zeros((3 * hidden,), dtype)
        p["b_o"] = zeros((hidden,), dtype)
    return p


def init_mlp(key: Array, hidden: int, ffn: int, dtype: Any) -> Params:
    k_in, k_out = jax.random.split(key)
    return {
        "norm": init_norm(hidden, dtype),
        "w_in": normal(k_in, (hidden, ffn), dtype),
        "b_in": zeros((ffn,), dtype),
        "w_out": normal(k_out, (ffn, hidden), dtype),
        "b_out": zeros((hidden,), dtype),
    }


# --------------------------------------------------------------------------------------------
# Layers


def layer_norm(x: Array, p: Mapping[str, Array], eps: float = LN_EPS) -> Array:
    # Statistics in f32 so bf16 configs stay stable; a no-op convert for f32.
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = ((xf - mean) * lax.rsqrt(var + eps)).astype(x.dtype)
    return y * p["scale"] + p["bias"]


def rms_norm(x: Array, p: Mapping[str, Array], eps: float = 1e-6) -> Array:
    xf = x.astype(jnp.float32)
    ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
    return (xf * lax.rsqrt(ms + eps)).astype(x.dtype) * p["scale"]


def dropout(x: Array, rate: float, key: Array | None) -> Array:
    """Inverted dropout; a static no-op when the rate is 0."""
    if rate == 0.0 or key is None:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def split_qkv(qkv: Array, heads: int) -> tuple[Array, Array, Array]:
    """[B,S,3*hidden] -> q,k,v [B,S,heads,head_dim].

    Heads come before the 3 (Megatron layout), so splitting the fused matmul's columns into
    contiguous blocks is a split over heads and needs no communication.
    """
    b, s, three_h = qkv.shape
    head_dim = three_h // (3 * heads)
    qkv = qkv.reshape(b, s, heads, 3, head_dim)
    q, k, v = (lax.index_in_dim(qkv, i, axis=3, keepdims=False) for i in range(3))
    return q, k, v


def causal_mask(seq_len: int) -> Array:
    """bool [S,S], True where query position >= key position (built from iota)."""
    q_pos = lax.broadcasted_iota(jnp.int32, (seq_len, seq_len), 0)
    k_pos = lax.broadcasted_iota(jnp.int32, (seq_len, seq_len), 1)
    return q_pos >= k_pos


def attention_core(
    q: Array,
    k: Array,
    v: Array,
    *,
    causal: bool,
    dropout_rate: float = 0.0,
    key: Array | None = None,
) -> Array:
    """Scaled dot-product attention on [B,S,heads,head_dim] tensors; returns the same layout."""
    head_dim = q.shape[-1]
    q = q * jnp.asarray(1.0 / math.sqrt(head_dim), q.dtype)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    if causal:
        mask = causal_mask(q.shape[1])
        scores = jnp.where(mask, scores, jnp.asarray(jnp.finfo(scores.dtype).min, scores.dtype))
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
    probs = dropout(probs, dropout_rate, key)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def attention_block(
    p: Params,
    x: Array,
    *,
    heads: int,
    causal: bool,
    dropout_rate: float,
    key: Array | None,
) -> Array:
    """Fused-QKV attention with biases, output projection and output dropout (no residual)."""
    b, s, hidden = x.shape
    k_probs, k_out = jax.random.split(key) if key is not None else (None, None)
    qkv = x @ p["w_qkv"] + p["b_qkv"]
    q, k, v = split_qkv(qkv, heads)
    ctx = attention_core(q, k, v, causal=causal, dropout_rate=dropout_rate, key=k_probs)
    out = ctx.reshape(b, s, hidden) @ p["w_o"] + p["b_o"]
    return dropout(out, dropout_rate, k_out)


def mlp_block(p: Params, x: Array, *, dropout_rate: float, key: Array | None) -> Array:
    """Dense GELU MLP with biases and output dropout (no norm, no residual)."""
    h = jax.nn.gelu(x @ p["w_in"] + p["b_in"])
    return dropout(h @ p["w_out"] + p["b_out"], dropout_rate, key)


def gpt_layer(p: Params, x: Array, *, heads: int, dropout_rate: float, key: Array | None) -> Array:
    """Pre-LN GPT-2 block: x + attn(ln(x)), then x + mlp(ln(x))."""
    k_attn, k_mlp = jax.random.split(key) if key is not None else (None, None)
    with jax.named_scope("attn"):
        h = layer_norm(x, p["attn"]["norm"])
        x = x + attention_block(
            p["attn"], h, heads=heads, causal=True, dropout_rate=dropout_rate, key=k_attn
        )
    with jax.named_scope("mlp"):
        h = layer_norm(x, p["mlp"]["norm"])
        x = x + mlp_block(p["mlp"], h, dropout_rate=dropout_rate, key=k_mlp)
    return x


def layer_body(body: Callable[..., Any], remat: bool) -> Callable[..., Any]:
    """`body` (one layer), rematerialised in the backward pass when `remat`."""
    return jax.checkpoint(body) if remat else body


def layer_key(rng: Array, i: int, rate: float) -> Array | None:
    """Per-layer dropout key; None when dropout is off so no RNG ops are traced."""
    return jax.random.fold_in(rng, i) if rate > 0.0 else None


# --------------------------------------------------------------------------------------------
# Loss


def cross_entropy(logits: Array, targets: Array, weights: Array | None = None) -> Array:
    """Mean softmax cross-entropy; with ``weights`` the mean is over weighted positions.

    The target log-prob is picked with a one-hot product instead of a gather so the vocab
    dimension can be sharded like any other reduction.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    onehot = jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32)
    nll = -jnp.sum(onehot * logp, axis=-1)
    if weights is None:
        return jnp.mean(nll)
    w = weights.astype(jnp.float32)
    return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)


# --------------------------------------------------------------------------------------------
# Synthetic data


def lm_batch(key: Array, batch: int, seq_len: int, vocab: int) -> Batch:
    """Random tokens with next-token targets (the last target wraps around)."""
    tokens = jax.random.randint(key, (batch, seq_len), 0, vocab, dtype=jnp.int32)
    return {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}


# --------------------------------------------------------------------------------------------
# Training step


def build_model(
    config: BaseConfig,
    loss_fn: Callable[[Params, Batch, Array], Array],
    make_batch: Callable[[Array], Batch],
    *,
    name: str,
    abstract: bool,
    seed: int,
) -> ModelOutput:
    """Wrap a loss into a full AdamW training step and build its example arguments.

    With ``abstract=True`` the arguments come from ``jax.eval_shape`` so paper-scale models cost
    no memory and no time.
    """
    optimizer = optax.adamw(config.learning_rate, weight_decay=config.weight_decay)

    def step(params: Params, opt_state: Any, batch: Batch, rng: Array) -> tuple[Array, Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, rng)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        return loss, new_params, new_opt_state

    step.__name__ = step.__qualname__ = f"{name}_train_step"
    step.explorer_arg_roles = ARG_ROLES  # type: ignore[attr-defined]

    def make_args() -> tuple[Params, Any, Batch, Array]:
        k_params, k_batch, k_rng = jax.random.split(jax.random.PRNGKey(seed), 3)
        params = config.init_params(k_params)
        return params, optimizer.init(params), make_batch(k_batch), k_rng

    spec = jax.eval_shape(make_args)
    # Lets explorer.trace name the exact leaf when a user passes mismatching arguments.
    step.explorer_arg_spec = spec  # type: ignore[attr-defined]
    args = spec if abstract else make_args()
    return step, args
