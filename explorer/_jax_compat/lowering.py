"""Lowering rules swapped while lowering a program for an accelerator on the CPU."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def random_bits_as_accelerators_lower() -> Iterator[None]:
    """Lower `threefry2x32` (JAX's random bits) as GPUs and TPUs do while inside.

    On the CPU, JAX lowers it to a rolled `while` loop to keep compiles short; XLA's SPMD
    partitioner cannot split that loop's state, so every device computes the random bits of
    the whole global shape. A dropout mask of GPT-2.6B's attention (batch 32, 32 heads, 1024
    tokens) is then 4 GiB of u32 counters per device, twice, where an accelerator's
    elementwise (unrolled) lowering keeps only its shard. Profiles and whole steps priced
    for an accelerator are lowered the accelerator's way; the program computes the same
    bits either way."""
    from jax._src.interpreters import mlir
    from jax._src.random import threefry2x32 as threefry

    # counted, so that threads lowering at once share one swap and the last restores it
    table = mlir._platform_specific_lowerings["cpu"]
    with _RANDOM_LOWERING["lock"]:
        if _RANDOM_LOWERING["inside"] == 0:
            _RANDOM_LOWERING["cpu_rule"] = table.pop(threefry.threefry2x32_p, None)
        _RANDOM_LOWERING["inside"] += 1
    try:
        yield  # without a CPU rule, the rule every platform shares applies
    finally:
        with _RANDOM_LOWERING["lock"]:
            _RANDOM_LOWERING["inside"] -= 1
            rule = _RANDOM_LOWERING["cpu_rule"]
            if _RANDOM_LOWERING["inside"] == 0 and rule is not None:
                table[threefry.threefry2x32_p] = rule


_RANDOM_LOWERING: dict[str, Any] = {"lock": threading.Lock(), "inside": 0, "cpu_rule": None}
