"""A fresh process that takes `--fast-compile` the way the command line does, then compiles an
embedding's gradient here and in a compile worker, and prints what XLA's cost analysis says of
it each time and the version its programs are kept under (lines "here B", "worker B",
"version V"), against the compile options alone ("options B")."""

from explorer.cli import _use_fast_compile

_use_fast_compile()  # before JAX starts, as `main` does

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from explorer._jax_compat import compile_request, read_executable  # noqa: E402
from explorer.mesh import mesh_spec  # noqa: E402
from explorer.profile.backends import FAST_COMPILE  # noqa: E402
from explorer.profile.compile_workers import CompileWorkers  # noqa: E402
from explorer.profile.runner import program_version  # noqa: E402


def loss(table: jax.Array, ids: jax.Array) -> jax.Array:
    return jnp.sum(jnp.tanh(table[ids]))


lowered = jax.jit(jax.grad(loss)).lower(
    jax.ShapeDtypeStruct((1000, 64), jnp.float32), jax.ShapeDtypeStruct((4, 128), jnp.int32)
)


def accessed(cost: dict[str, float] | None) -> float:
    assert cost is not None
    return cost["bytes accessed"]


here = read_executable(lowered.compile(compiler_options=dict(FAST_COMPILE)))
loop = read_executable(
    lowered.compile(compiler_options=dict(FAST_COMPILE, xla_cpu_use_fusion_emitters=False))
)
request = compile_request(lowered, FAST_COMPILE)
assert request is not None
workers = CompileWorkers(processes=1, device_count=jax.device_count())
try:
    there = workers.compile(request)
finally:
    workers.close()
print(f"here {accessed(here.cost)}")
print(f"worker {accessed(there.cost)}")
print(f"options {accessed(loop.cost)}")
print(f"version {program_version(mesh_spec((2,)))}")
