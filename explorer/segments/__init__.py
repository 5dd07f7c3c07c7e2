"""Segments: fingerprints, unique segment types, and the instance sequence (paper Sec. 4.3).

A segment instance is a contiguous stretch of the forward program together with the backward
and optimizer ops derived from it. Instances follow the user's top-level scopes when the step
has them (`embed`, `layer_0`, `layer_1`, ..., `head`); otherwise the block sequence is covered
greedily by the longest tandem repeats of block fingerprints. Instances with equal fingerprints
share a unique type, which is profiled once whatever the depth.

A fingerprint is built from the fine-grained dependency graph of the instance's contraction
ops (shapes, dimension numbers, how each role's split lands on their results, which contraction
feeds which through which operand) plus the multiset of non-trivial primitives (reductions,
gathers, RNG) that change communication under a fixed configuration. Elementwise and layout ops
are left out, so an extra residual add does not make a new type.

A `scan` the tracer unrolled keeps its iterations apart: each iteration's ops (its norm too,
though it reads the previous iteration's residual) stay in its own segment, ops outside the
scan never join one, and the updates of the parameters the scan reads (stacked, one slice per
iteration) form segments of their own, one per block deciding their layout. Every iteration
then holds the same ops, so the program count does not grow with the scan's length.

Modules: `build` (the cut that wins, typed and bounded), `scopes` and `structure` (the two
cuts), `cover` (tandem repeats, cuts under the cap), `loops` (scans), `assign` (backward and
optimizer ops), `fingerprints`, `boundaries`, `count` (Eq. 7 and the profiling cap).
"""

from explorer.segments.build import build_segments
from explorer.segments.count import (
    DEFAULT_CONFIG_CAP,
    ProgramCount,
    check_config_cap,
    program_count,
)
from explorer.segments.cover import SKIPPING_FLOATS
from explorer.segments.fingerprints import TRIVIAL

__all__ = [
    "DEFAULT_CONFIG_CAP",
    "SKIPPING_FLOATS",
    "TRIVIAL",
    "ProgramCount",
    "build_segments",
    "check_config_cap",
    "program_count",
]
