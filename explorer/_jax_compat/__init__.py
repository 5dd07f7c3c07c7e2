"""The only package that touches jaxpr internals.

JAX's public API gives us `jax.make_jaxpr`, but reading the equations (primitives, params,
variables, name stacks, source lines) needs `jax._src` objects whose names move between
releases. Everything version-dependent is funnelled through here, and the rest of the package
sees plain Python data: `FlatProgram` of `FlatEqn`s over integer value ids.

Modules: `program` (the flat program), `plain` (params, scopes and source lines as plain
data), `flatten` (inlining and unrolling), `evaluate` (re-execution), `compile` (compiling in
another process), `lowering` (accelerator lowering rules on the CPU).
"""

from explorer._jax_compat.compile import (
    CompiledText,
    CompileRequest,
    backends_started,
    compile_from_request,
    compile_request,
    read_executable,
)
from explorer._jax_compat.evaluate import evaluate
from explorer._jax_compat.flatten import (
    JAX_VERSION,
    MAX_UNROLLED_EQNS,
    SCAN_EMPTY_HINT,
    SCAN_TOO_LARGE_HINT,
    flatten,
    make_jaxpr,
)
from explorer._jax_compat.lowering import random_bits_as_accelerators_lower
from explorer._jax_compat.plain import (
    dtype_name,
    is_linearized,
    is_rematerialised,
    is_transposed,
    plain_params,
    scope_of,
    user_location,
)
from explorer._jax_compat.program import FlatEqn, FlatProgram, LoopIteration, LoopRegion

__all__ = [
    "JAX_VERSION",
    "MAX_UNROLLED_EQNS",
    "SCAN_EMPTY_HINT",
    "SCAN_TOO_LARGE_HINT",
    "CompileRequest",
    "CompiledText",
    "FlatEqn",
    "FlatProgram",
    "LoopIteration",
    "LoopRegion",
    "backends_started",
    "compile_from_request",
    "compile_request",
    "dtype_name",
    "evaluate",
    "flatten",
    "is_linearized",
    "is_rematerialised",
    "is_transposed",
    "make_jaxpr",
    "plain_params",
    "random_bits_as_accelerators_lower",
    "read_executable",
    "scope_of",
    "user_location",
]
