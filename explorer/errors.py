"""Every error the explorer raises on purpose.

Messages follow one rule: say what was expected, what was found, where (op, tensor, shape,
mesh axis), and how to fix it when we know. Long message templates live here as constants so
that the stage modules stay readable.
"""

from __future__ import annotations


class ExplorerError(Exception):
    """Base class of every error the explorer raises on purpose."""


class TraceError(ExplorerError):
    """The step function could not be traced into a flat graph."""


class UnsupportedPrimitiveError(TraceError):
    """The step uses a primitive the tracer does not inline (scan, while, cond, ...)."""

    def __init__(self, primitive: str, where: str, hint: str) -> None:
        self.primitive = primitive
        self.where = where
        super().__init__(UNSUPPORTED_PRIMITIVE.format(primitive=primitive, where=where, hint=hint))


class ArgumentMismatchError(TraceError):
    """The example arguments do not match what the step expects."""


class InputError(ExplorerError):
    """An input handed to a public entry point (Python API, command line, a file) is not what
    it should be; raised where it enters, before any expensive work. The message names the
    field, what was expected and what was found."""


class MeshError(InputError):
    """A mesh shape or axis specification is invalid."""


class MeshFitError(MeshError):
    """The mesh divides no dim that any block could split: every plan on it is replicated."""


class BytesError(InputError):
    """An amount of bytes (a memory budget) is not a finite, non-negative number of bytes."""


class BackendError(InputError):
    """An unknown profiling backend was named."""


class PlatformError(InputError):
    """A platform file or platform query is invalid."""


class PlanError(InputError):
    """A plan file is malformed, of another version, or for another model or mesh."""


class CacheError(ExplorerError):
    """The profile cache was misused (closed, or given an invalid record)."""


class AnalysisError(ExplorerError):
    """An analysis stage was asked for something it cannot give."""


class NotProfiledError(AnalysisError, AttributeError):
    """Profiles, frontiers or plans asked of `analyze(..., profile=False)`'s result (an
    `AttributeError` too, so `hasattr` and `getattr(..., default)` answer as for any
    attribute the object lacks)."""


class PinError(InputError, AnalysisError):
    """A pin names no block or segment type, or a strategy its block does not have (an
    `AnalysisError` too, as pins were reported before they were checked at the door)."""


class ProfilingCancelled(ExplorerError):
    """A run stopped by its `cancel` event: the programs it finished are in the cache."""

    def __init__(self, finished: int, total: int) -> None:
        self.finished, self.total = finished, total
        super().__init__(
            f"profiling cancelled: {finished} of {total} programs to compile were profiled and "
            f"kept in the cache, {total - finished} not started; run again to continue from "
            "the cache"
        )


class ConfigCapError(AnalysisError):
    """A segment's configuration space is larger than the profiling cap (`config_cap`)."""


class FrontierTooLargeError(AnalysisError):
    """The exact frontier would hold more partial plans than the solver may (its memory
    limit), or take longer to solve than it may (its time limit)."""


class NoPlanFitsError(AnalysisError):
    """The memory budget is below the smallest plan."""


class HloComputeError(AnalysisError):
    """The HLO text has matrix work that `profile.compute.dot_flops` cannot count."""


class AlpaError(ExplorerError):
    """The Alpa-style ILP found no plan within its limits."""


class AlpaBudgetError(AlpaError):
    """No assignment of strategies fits the per-device memory budget."""


class TargetCompilerError(ExplorerError):
    """The step cannot be compiled for the platform's GPU on this machine: no compiler for
    it is installed, or JAX could not load the one that is."""


class ClusterError(ExplorerError):
    """The processes of a cluster run could not join, disagree, or lost one of them."""


class MeshFitWarning(UserWarning):
    """Some blocks can split over no axis of the mesh and stay replicated on every device."""


class RoleWarning(UserWarning):
    """An input leaf's role could not be told from the step's structure alone."""


class AlpaTimeLimitWarning(UserWarning):
    """HiGHS stopped at its time limit: the plan is the best found, not proven optimal."""


class CacheWarning(UserWarning):
    """The cache file could not be used as it was (moved aside and rebuilt, not writable, or
    a row that does not read back); the run goes on."""


UNSUPPORTED_PRIMITIVE = (
    "the step uses `{primitive}` at {where}, which the explorer cannot flatten into a graph of "
    "primitive ops. {hint}"
)

LOOP_HINT = (
    "A loop whose trip count is known only at run time (`while_loop`, `fori_loop` with traced "
    "bounds) or a branch (`cond`/`switch`) hides the repeated layers from the analysis: loop "
    "over layers with `jax.lax.scan` (or `fori_loop` with static bounds) or a Python `for` "
    "loop, and replace `lax.cond`/`lax.switch` by `jnp.where` or a Python `if` on static values."
)

GENERIC_HINT = (
    "Rewrite this part of the step with ordinary jax.numpy / jax.lax operations, or move it "
    "outside the traced training step."
)
