"""Shared helpers for tests: small traced models and comparisons."""

from __future__ import annotations

import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import profile_seed

import explorer as ex
from explorer.blocks import build_blocks
from explorer.ir import BlockAnalysis, Graph
from explorer.mesh import MeshSpec, mesh_spec
from explorer.space import build_space

MODEL_NAMES = ("gpt", "llama", "bert", "moe")

# One profile cache for the whole test session: compiled profiles are keyed by program, mesh
# and backend (not platform, not model size), so modules profiling tiny GPT share their work.
# It starts from the committed seed of the tiny models' profiles (tests/profile_seed.py).
SHARED_CACHE = Path(tempfile.gettempdir()) / f"explorer-tests-{os.getpid()}.sqlite"
profile_seed.plant(SHARED_CACHE)


@cache
def traced(name: str, num_layers: int = 2, **changes: Any) -> tuple[Any, Any, Graph]:
    """Tiny zoo model `name` (`changes`: its batch or dtype), built and traced."""
    model = ex.models.build(name, "tiny", layers=num_layers, **changes)
    return model.step, model.args, ex.trace(model.step, *model.args)


@cache
def analysed(name: str, mesh: tuple[int, ...], num_layers: int = 2) -> tuple[Graph, BlockAnalysis]:
    _, _, graph = traced(name, num_layers)
    spec = mesh_spec(mesh)
    return graph, build_space(build_blocks(graph, spec.size), spec)


def layer_of(scope: str) -> str:
    return scope.split("/", maxsplit=1)[0]


def assert_trees_close(expected: Any, found: Any, rtol: float, atol: float) -> None:
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(expected)[0], jax.tree.leaves(found), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(b), np.asarray(a), rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path)
        )


def mesh_of(shape: tuple[int, ...]) -> MeshSpec:
    return mesh_spec(shape)


def mlp_step(params: Any, opt_state: Any, x: jax.Array) -> Any:
    """A training step of a two-layer MLP (`params`: `w_in`, `w_out`), SGD."""

    def loss(p: Any) -> jax.Array:
        return jnp.mean((jax.nn.relu(x @ p["w_in"]) @ p["w_out"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = optax.sgd(0.1).update(grads, opt_state, params)
    return value, optax.apply_updates(params, updates), opt_state
