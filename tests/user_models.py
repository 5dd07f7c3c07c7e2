"""Small training steps written as users write them: Flax linen (a loop, `nn.remat`,
`nn.scan`) and NNX, Equinox, a Flax `TrainState`, a Flax CNN, each with optax AdamW.

Every builder returns a `UserStep`: the step, its example arguments and how many parameter
leaves it has (what the explorer must classify as parameters without hints). Sizes are tiny
(2 layers, width 64, vocab 128, seq 16, batch 8) so tracing takes a second or two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from flax.training import train_state
from scan_models import ScannedDecoder

LAYERS, WIDTH, HEADS, VOCAB, SEQ, BATCH = 2, 64, 4, 128, 16, 8
LEARNING_RATE = 1e-3
OPT = optax.adamw(LEARNING_RATE)


@dataclass(frozen=True)
class UserStep:
    step: Callable[..., Any]
    args: tuple[Any, ...]
    param_leaves: int  # leaves of the model's parameters
    data_path: str  # path of the batch as the explorer prints it
    # the arguments of the next training step, from this step's results and arguments
    carry: Callable[[Any, tuple[Any, ...]], tuple[Any, ...]] = lambda out, args: (
        out[1],
        out[2],
        args[-1],
    )


def _tokens() -> jax.Array:
    return jax.random.randint(jax.random.PRNGKey(1), (BATCH, SEQ), 0, VOCAB)


def _next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


# -- Flax linen -------------------------------------------------------------------------------


class _LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS, deterministic=True)(h, mask=mask)
        h = nn.LayerNorm()(x)
        return x + nn.Dense(WIDTH)(nn.gelu(nn.Dense(4 * WIDTH)(h)))


class LinenDecoder(nn.Module):
    remat: bool = False
    layers: int = LAYERS

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        block = nn.remat(_LinenBlock) if self.remat else _LinenBlock
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        for i in range(self.layers):
            x = block(name=f"layer_{i}")(x)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def _linen_step(model: nn.Module, params: Any, batch: Any, loss_of: Callable[..., Any]) -> UserStep:
    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        loss, grads = jax.value_and_grad(lambda p: loss_of(model.apply(p, batch[0]), batch))(params)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    leaves = len(jax.tree.leaves(params))
    return UserStep(step, (params, OPT.init(params), batch), leaves, "batch[0]")


def linen_decoder(*, remat: bool = False, layers: int = LAYERS) -> UserStep:
    """A Python loop of self-attention (`nn.MultiHeadDotProductAttention`) and `nn.Dense`
    blocks, each `nn.remat`-wrapped if asked."""
    model = LinenDecoder(remat=remat, layers=layers)
    tokens = _tokens()
    params = model.init(jax.random.PRNGKey(0), tokens)
    return _linen_step(model, params, (tokens,), lambda logits, b: _next_token_loss(logits, b[0]))


class _ScannedBlock(nn.Module):
    """Pre-norm residual MLP, `(carry, x) -> (carry, None)` as `nn.scan` wants."""

    @nn.compact
    def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
        h = nn.LayerNorm()(x)
        return x + nn.Dense(WIDTH)(nn.gelu(nn.Dense(4 * WIDTH)(h))), None


def linen_scanned(layers: int = LAYERS) -> UserStep:
    """`nn.scan` over residual MLP layers (`nn.LayerNorm`, `nn.Dense`): the layer stack is
    one loop whose parameters are stacked."""
    model = ScannedDecoder(layers, layer=_ScannedBlock)
    tokens = _tokens()
    params = model.init(jax.random.PRNGKey(0), tokens)
    return _linen_step(model, params, (tokens,), lambda logits, b: _next_token_loss(logits, b[0]))


class _FusedQKVDecoder(nn.Module):
    """One layer with a fused q/k/v projection `[width] -> [3, heads, head_dim]` and
    `jax.nn.dot_product_attention`, as MaxText-style code writes it."""

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, WIDTH)(tokens)
        qkv = nn.DenseGeneral((3, HEADS, WIDTH // HEADS), name="qkv")(nn.LayerNorm()(x))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        attended = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + nn.DenseGeneral(WIDTH, axis=(-2, -1), name="out")(attended)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def linen_fused_qkv() -> UserStep:
    model = _FusedQKVDecoder()
    tokens = _tokens()
    params = model.init(jax.random.PRNGKey(0), tokens)
    return _linen_step(model, params, (tokens,), lambda logits, b: _next_token_loss(logits, b[0]))


class CNN(nn.Module):
    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(16, (3, 3))(images))
        x = nn.relu(nn.Conv(32, (3, 3), strides=2)(x))
        x = nn.relu(nn.Conv(32, (3, 3))(x))
        return nn.Dense(10)(x.mean(axis=(1, 2)))


def linen_cnn() -> UserStep:
    """Three `nn.Conv` and a `nn.Dense` head on 16x16 RGB images, 10 classes."""
    model = CNN()
    images = jax.random.normal(jax.random.PRNGKey(1), (BATCH, 16, 16, 3))
    labels = jax.random.randint(jax.random.PRNGKey(2), (BATCH,), 0, 10)
    params = model.init(jax.random.PRNGKey(0), images)

    def loss_of(logits: jax.Array, batch: Any) -> jax.Array:
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[1]).mean()

    return _linen_step(model, params, (images, labels), loss_of)


def flax_train_state(layers: int = LAYERS) -> UserStep:
    """`step(state, batch)` on a Flax `TrainState`: params, opt_state and the step counter all
    inside one argument."""
    model = LinenDecoder(layers=layers)
    tokens = _tokens()
    params = model.init(jax.random.PRNGKey(0), tokens)
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=OPT)

    def step(state: train_state.TrainState, batch: jax.Array) -> Any:
        def loss(p: Any) -> jax.Array:
            return _next_token_loss(state.apply_fn(p, batch), batch)

        value, grads = jax.value_and_grad(loss)(state.params)
        return state.apply_gradients(grads=grads), value

    return UserStep(
        step,
        (state, tokens),
        len(jax.tree.leaves(params)),
        "batch",
        carry=lambda out, args: (out[0], args[-1]),
    )


# -- Flax NNX ---------------------------------------------------------------------------------


class _NNXBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.norm1 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(HEADS, WIDTH, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.up = nnx.Linear(WIDTH, 4 * WIDTH, rngs=rngs)
        self.down = nnx.Linear(4 * WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        mask = nnx.make_causal_mask(jnp.ones(x.shape[:2]))
        x = x + self.attn(self.norm1(x), mask=mask, deterministic=True)
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class NNXDecoder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, layers: int = LAYERS) -> None:
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.layers = nnx.List([_NNXBlock(rngs) for _ in range(layers)])
        self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def nnx_decoder(layers: int = LAYERS) -> UserStep:
    """`nnx.split` the model into a graph definition and its parameter state; the step
    merges them back, so it takes and returns plain pytrees of arrays."""
    graphdef, params = nnx.split(NNXDecoder(nnx.Rngs(0), layers), nnx.Param)

    def step(params: Any, opt_state: Any, tokens: jax.Array) -> Any:
        def loss(p: Any) -> jax.Array:
            return _next_token_loss(nnx.merge(graphdef, p)(tokens), tokens)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    leaves = len(jax.tree.leaves(params))
    return UserStep(step, (params, OPT.init(params), _tokens()), leaves, "tokens")


# -- Equinox ----------------------------------------------------------------------------------


class _EqxBlock(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.norm1 = eqx.nn.LayerNorm(WIDTH)
        self.attn = eqx.nn.MultiheadAttention(HEADS, WIDTH, key=k1)
        self.norm2 = eqx.nn.LayerNorm(WIDTH)
        self.up = eqx.nn.Linear(WIDTH, 4 * WIDTH, key=k2)
        self.down = eqx.nn.Linear(4 * WIDTH, WIDTH, key=k3)

    def __call__(self, x: jax.Array) -> jax.Array:  # one sequence [seq, width]
        h = jax.vmap(self.norm1)(x)
        mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
        x = x + self.attn(h, h, h, mask=mask)
        h = jax.vmap(self.norm2)(x)
        return x + jax.vmap(lambda t: self.down(jax.nn.gelu(self.up(t))))(h)


class EqxDecoder(eqx.Module):
    embed: eqx.nn.Embedding
    layers: list[_EqxBlock]
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, key: jax.Array, layers: int = LAYERS) -> None:
        keys = jax.random.split(key, layers + 2)
        self.embed = eqx.nn.Embedding(VOCAB, WIDTH, key=keys[0])
        self.layers = [_EqxBlock(k) for k in keys[1:-1]]
        self.norm = eqx.nn.LayerNorm(WIDTH)
        self.head = eqx.nn.Linear(WIDTH, VOCAB, key=keys[-1])

    def __call__(self, tokens: jax.Array) -> jax.Array:  # one sequence [seq]
        x = jax.vmap(self.embed)(tokens)
        for layer in self.layers:
            x = layer(x)
        return jax.vmap(lambda t: self.head(self.norm(t)))(x)


def eqx_decoder(layers: int = LAYERS) -> UserStep:
    """`eqx.partition` keeps the arrays as the step's argument and closes over the rest;
    the loss is taken with `eqx.filter_value_and_grad`."""
    params, static = eqx.partition(EqxDecoder(jax.random.PRNGKey(0), layers), eqx.is_array)

    def step(params: Any, opt_state: Any, tokens: jax.Array) -> Any:
        @eqx.filter_value_and_grad
        def loss(p: Any) -> jax.Array:
            model = eqx.combine(p, static)
            return _next_token_loss(jax.vmap(model)(tokens), tokens)

        value, grads = loss(params)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return value, eqx.apply_updates(params, updates), opt_state

    leaves = len(jax.tree.leaves(params))
    return UserStep(step, (params, OPT.init(params), _tokens()), leaves, "tokens")


BUILDERS: dict[str, Callable[[], UserStep]] = {
    "linen": linen_decoder,
    "linen_remat": lambda: linen_decoder(remat=True),
    "nnx": nnx_decoder,
    "equinox": eqx_decoder,
    "train_state": flax_train_state,
    "cnn": linen_cnn,
    "linen_scan": linen_scanned,
}

# the decoders at any depth (the CNN has no layers to repeat)
DEEP_BUILDERS: dict[str, Callable[[int], UserStep]] = {
    "linen": lambda layers: linen_decoder(layers=layers),
    "linen_remat": lambda layers: linen_decoder(remat=True, layers=layers),
    "nnx": nnx_decoder,
    "equinox": eqx_decoder,
    "train_state": flax_train_state,
    "linen_scan": linen_scanned,
}
