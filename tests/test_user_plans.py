"""Training steps written with Flax (linen, remat, `nn.scan`, NNX, TrainState) and Equinox,
and a Flax CNN, profiled with the `compiled` backend on 2x2 and (most) on mesh 4: the plan
the explorer chooses applies to the user's own step and computes what the unsharded step computes.

"The same numbers" means what plain data parallelism (`jax.jit` with the batch split by a
`NamedSharding`) reproduces: both are compared on the second AdamW step at rtol = atol =
1e-5. A few parameters have a gradient that is pure rounding noise (attention's key bias:
softmax does not see it), which Adam normalises into an update of the size of the learning
rate whatever its sign; data parallelism does not reproduce them either. Those leaves,
found from the data-parallel run, are compared at the scale of one update, and only
parameters may be among them: the loss and the optimizer state (the gradients' moments)
must match everywhere.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
import pytest
from helpers import SHARED_CACHE
from jax.sharding import NamedSharding, PartitionSpec
from user_models import BUILDERS, LEARNING_RATE, UserStep

import explorer as ex

RTOL = ATOL = 1e-5  # as test_plan's same-numbers tests (second AdamW step)
NOISE_ATOL = 2 * LEARNING_RATE  # two updates of a rounding-noise gradient


@functools.cache
def _second_step(name: str) -> tuple[UserStep, tuple[Any, ...], Any]:
    """The user step, the arguments of its second step and what the unsharded step returns
    on them."""
    user = BUILDERS[name]()
    plain = jax.jit(user.step)
    warm = user.carry(plain(*user.args), user.args)
    return user, warm, plain(*warm)


def _data_parallel(user: UserStep, args: tuple[Any, ...], mesh: tuple[int, ...]) -> Any:
    """The step under plain data parallelism: the batch (every step's last argument) split
    over all devices, everything else replicated."""
    devices = np.array(jax.devices()[: int(np.prod(mesh))]).reshape(mesh)
    names = tuple(f"a{i}" for i in range(len(mesh)))
    jax_mesh = jax.sharding.Mesh(devices, names)
    replicated = NamedSharding(jax_mesh, PartitionSpec())
    split = NamedSharding(jax_mesh, PartitionSpec(names))
    shardings = tuple(jax.tree.map(lambda _: replicated, a) for a in args[:-1])
    batch = jax.tree.map(lambda _: split, args[-1])
    return jax.jit(user.step, in_shardings=(*shardings, batch))(*args)


# Every model on 2x2, where a plan splits over two axes; on mesh 4 all but the linen
# decoder's rematerialised and NNX variants, whose 1-D plans are the linen decoder's plans
# (the same layers, written another way) and whose front ends the 2x2 runs cover: two
# minutes of compiling each on CI's two cores.
_MESHES = {"mesh4": (4,), "mesh2x2": (2, 2)}
_CASES = [
    pytest.param(name, mesh, id=f"{name}-{mesh_id}")
    for mesh_id, mesh in _MESHES.items()
    for name in BUILDERS
    if mesh_id == "mesh2x2" or name not in ("linen_remat", "nnx")
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mesh"), _CASES)
def test_the_chosen_plan_applies_with_the_same_numbers(name: str, mesh: tuple[int, ...]) -> None:
    user, warm, expected = _second_step(name)
    noise = _noise_leaves(expected, _data_parallel(user, warm, mesh))
    analysis = ex.analyze(user.step, *warm, mesh=mesh, cache=SHARED_CACHE, progress=False)
    # the fastest plan (data parallel on these tiny models), the least memory one (which
    # splits the weights) and the Megatron baseline
    plans = {
        "fastest": analysis.plan(),
        "least memory": analysis.plan(memory_budget=analysis.frontier.min_memory),
        "megatron": analysis.baseline("megatron"),
    }
    print(f"\n[{name} {mesh}] {analysis.program_count} programs")
    for kind, plan in plans.items():
        print(f"  {kind}: {','.join(plan.strategies)}")
        found = ex.apply_plan(plan, user.step, donate=False)(*warm)
        _assert_same_numbers(expected, found, noise)


def _noise_leaves(expected: Any, data_parallel: Any) -> frozenset[str]:
    """The leaves data parallelism does not reproduce at RTOL/ATOL: rounding-noise
    parameters (checked to be parameters, and within one update's scale)."""
    noise = set()
    for path, want, got in _leaves(expected, data_parallel):
        if np.allclose(got, want, rtol=RTOL, atol=ATOL):
            continue
        assert want.ndim and ".mu" not in path and ".nu" not in path, path  # a parameter
        np.testing.assert_allclose(got, want, rtol=0, atol=NOISE_ATOL, err_msg=path)
        noise.add(path)
    print(f"\n  rounding-noise leaves: {sorted(noise)}")
    return frozenset(noise)


def _assert_same_numbers(expected: Any, found: Any, noise: frozenset[str]) -> None:
    for path, want, got in _leaves(expected, found):
        tolerance = (
            {"rtol": 0, "atol": NOISE_ATOL} if path in noise else {"rtol": RTOL, "atol": ATOL}
        )
        np.testing.assert_allclose(got, want, err_msg=path, **tolerance)


def _leaves(expected: Any, found: Any) -> list[tuple[str, np.ndarray, np.ndarray]]:
    return [
        (jax.tree_util.keystr(path), np.asarray(want), np.asarray(got))
        for (path, want), got in zip(
            jax.tree_util.tree_flatten_with_path(expected)[0], jax.tree.leaves(found), strict=True
        )
    ]
