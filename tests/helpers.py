"""Shared helpers for tests: small traced models and comparisons."""

from __future__ import annotations

import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jax
import numpy as np

import explorer as ex
from explorer.blocks import build_blocks
from explorer.ir import BlockAnalysis, Graph
from explorer.mesh import MeshSpec, mesh_spec
from explorer.space import build_space

MODEL_NAMES = ("gpt", "llama", "bert", "moe")

# One profile cache for the whole test session: compiled profiles are keyed by program, mesh
# and backend (not platform, not model size), so modules profiling tiny GPT share their work.
SHARED_CACHE = Path(tempfile.gettempdir()) / f"explorer-tests-{os.getpid()}.sqlite"


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
