"""Training steps whose layers are stacked with a loop: a Flax linen decoder over `nn.scan`
and a plain `jax.lax.scan` MLP stack, each with optax AdamW.

Sizes are tiny (width 64, 4 heads, vocab 128, seq 16, batch 8), so tracing takes seconds.
Every builder returns a `ScanStep`: the step, its example arguments and the layer count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

WIDTH, HEADS, VOCAB, SEQ, BATCH = 64, 4, 128, 16, 8
OPT = optax.adamw(1e-3)


@dataclass(frozen=True)
class ScanStep:
    step: Callable[..., Any]
    args: tuple[Any, ...]  # (params, opt_state, batch)
    layers: int


class _Layer(nn.Module):
    """Pre-norm attention + MLP; `(carry, x) -> (carry, None)` as `nn.scan` wants.

    Attention has no biases: the key bias's gradient is zero in exact arithmetic (softmax
    ignores a constant added to a row), so AdamW's first update of it is the sign of rounding
    noise, which no two compilations of the step share.
    """

    @nn.compact
    def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(
            num_heads=HEADS, deterministic=True, use_bias=False
        )(h, mask=mask)
        h = nn.LayerNorm()(x)
        return x + nn.Dense(WIDTH)(nn.gelu(nn.Dense(4 * WIDTH)(h))), None


class ScannedDecoder(nn.Module):
    """Embedding, `nn.scan` over `layers` copies of `layer`, final LayerNorm and head."""

    layers: int = 2
    layer: type[nn.Module] = _Layer

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        stack = nn.scan(
            self.layer,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=self.layers,
        )
        x, _ = stack(name="layers")(x, None)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def _tokens() -> jax.Array:
    return jax.random.randint(jax.random.PRNGKey(1), (BATCH, SEQ), 0, VOCAB)


def _next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def scanned_decoder(layers: int = 2) -> ScanStep:
    """Embedding, `nn.scan` over `layers` attention + MLP layers, final LayerNorm + head."""
    model = ScannedDecoder(layers)
    tokens = _tokens()
    params = model.init(jax.random.PRNGKey(0), tokens)

    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        def loss_of(p: Any) -> jax.Array:
            return _next_token_loss(model.apply(p, batch), batch)

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return ScanStep(step, (params, OPT.init(params), tokens), layers)


def scanned_mlp(layers: int = 2, *, reverse: bool = False) -> ScanStep:
    """`jax.lax.scan` over stacked `(w1, b1, w2)` of residual MLP layers; `batch = (x, y)`."""
    keys = jax.random.split(jax.random.PRNGKey(2), 3)
    params = {
        "w1": jax.random.normal(keys[0], (layers, WIDTH, 4 * WIDTH)) / WIDTH**0.5,
        "b1": jnp.zeros((layers, 4 * WIDTH)),
        "w2": jax.random.normal(keys[1], (layers, 4 * WIDTH, WIDTH)) / (4 * WIDTH) ** 0.5,
    }
    x = jax.random.normal(keys[2], (BATCH * SEQ, WIDTH))
    batch = (x, jnp.roll(x, 1, axis=0))

    def forward(params: Any, x: jax.Array) -> jax.Array:
        def layer(h: jax.Array, w: Any) -> tuple[jax.Array, jax.Array]:
            out = h + jnp.tanh(h @ w["w1"] + w["b1"]) @ w["w2"]
            return out, jnp.mean(out**2)

        h, norms = jax.lax.scan(layer, x, params, reverse=reverse)
        return h + norms.sum()

    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        def loss_of(p: Any) -> jax.Array:
            return jnp.mean((forward(p, batch[0]) - batch[1]) ** 2)

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return ScanStep(step, (params, OPT.init(params), batch), layers)
