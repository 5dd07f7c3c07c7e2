"""The XLA flags a compiled program depends on beyond the options every compile passes.

XLA reads `XLA_FLAGS` once, when a process first starts a backend, and a flag there can change
the optimised HLO that profiles and evaluations are read from. So the flags in force are part of
the version every program is kept under (`jobs.program_version`): profiles and whole steps
compiled under other flags are never read back as these.

Two kinds of flag are left out of that version. The virtual device count: the mesh is in every
key already. And a flag the compiled backend's own options set (`backends.FAST_COMPILE`): the
option overrides it, so it changes nothing (the test suite sets the same ones in `XLA_FLAGS`).
A measured profile is compiled without those options, so there such a flag does change what
runs (an optimisation level changes the time): its key carries them (`measured_flags_mark`).

`FAST_COMPILE_FLAG` (the command line's `--fast-compile`) has XLA:CPU emit its fusions with the
loop emitters instead of the fusion emitters: compiling takes a half to a third of the time, and
most programs price the same to the bit, but a gather or a scatter is fused otherwise (the
embedding programs' computation and memory differ; assets/bench/paper/NOTE.md has the figures).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from explorer.profile.backends import FAST_COMPILE

FAST_COMPILE_FLAG = "--xla_cpu_use_fusion_emitters=false"

_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def _name(flag: str) -> str:
    return flag.split("=", 1)[0]


# the flags the compiled backend's options set (`backends.FAST_COMPILE`)
_OVERRIDDEN = frozenset(f"--{option}" for option in FAST_COMPILE)


def _given(environ: Mapping[str, str] | None) -> list[str]:
    """The flags of `XLA_FLAGS` in `environ`, by default this process's."""
    return (os.environ if environ is None else environ).get("XLA_FLAGS", "").split()


def _mark(flags: set[str]) -> str:
    return f"xla({' '.join(sorted(flags))})" if flags else ""


def compile_flags(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The flags of `XLA_FLAGS` (in `environ`, by default this process's) that can change what
    XLA emits for a profile or an evaluation, sorted: every one but the device count and those
    the compile options set."""
    left_out = _OVERRIDDEN | {_DEVICE_COUNT}
    return tuple(sorted({flag for flag in _given(environ) if _name(flag) not in left_out}))


def flags_mark(environ: Mapping[str, str] | None = None) -> str:
    """What the flags add to a program's version: nothing where there are none."""
    return _mark(set(compile_flags(environ)))


def measured_flags_mark(environ: Mapping[str, str] | None = None) -> str:
    """What a measured program's key adds to `flags_mark`: the flags of `XLA_FLAGS` the compiled
    backend's options override, which a measured compile (without those options) obeys."""
    return _mark({flag for flag in _given(environ) if _name(flag) in _OVERRIDDEN})


def with_fast_compile(environ: MutableMapping[str, str]) -> None:
    """Add `FAST_COMPILE_FLAG` to `XLA_FLAGS` in `environ` (before JAX starts a backend: XLA
    reads the flags once), replacing any value given for the same flag."""
    kept = [f for f in environ.get("XLA_FLAGS", "").split() if _name(f) != _name(FAST_COMPILE_FLAG)]
    environ["XLA_FLAGS"] = " ".join([*kept, FAST_COMPILE_FLAG])
