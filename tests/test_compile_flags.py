"""The XLA flags profiles are kept under (`explorer.profile.compile_flags`), and the command
line's `--fast-compile`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from explorer.cli import main
from explorer.profile.backends import FAST_COMPILE
from explorer.profile.compile_flags import (
    FAST_COMPILE_FLAG,
    compile_flags,
    flags_mark,
    measured_flags_mark,
    with_fast_compile,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_flags_kept_are_those_the_compile_options_do_not_set() -> None:
    suite = (
        "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
        "--xla_llvm_disable_expensive_passes=true"
    )
    assert compile_flags({"XLA_FLAGS": suite}) == ()
    assert flags_mark({"XLA_FLAGS": suite}) == flags_mark({}) == ""
    given = f"--xla_cpu_enable_fast_math=true {suite} {FAST_COMPILE_FLAG} {FAST_COMPILE_FLAG}"
    assert compile_flags({"XLA_FLAGS": given}) == (
        "--xla_cpu_enable_fast_math=true",
        FAST_COMPILE_FLAG,
    )
    assert flags_mark({"XLA_FLAGS": given}) == (
        f"xla(--xla_cpu_enable_fast_math=true {FAST_COMPILE_FLAG})"
    )


def test_a_measured_key_keeps_the_flags_the_compile_options_override() -> None:
    """A measured program is compiled without `FAST_COMPILE`: an optimisation level given in
    `XLA_FLAGS` changes how fast it runs, so its key carries the flag (sorted, deduplicated)."""
    given = (
        "--xla_llvm_disable_expensive_passes=true --xla_force_host_platform_device_count=8 "
        "--xla_backend_optimization_level=0 --xla_cpu_enable_fast_math=true "
        "--xla_backend_optimization_level=0"
    )
    assert measured_flags_mark({"XLA_FLAGS": given}) == (
        "xla(--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true)"
    )
    assert measured_flags_mark({"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}) == ""
    assert measured_flags_mark({}) == ""
    level_3 = {"XLA_FLAGS": "--xla_backend_optimization_level=3"}
    assert measured_flags_mark(level_3) != measured_flags_mark({"XLA_FLAGS": given})


def test_fast_compile_replaces_a_value_given_for_its_flag_and_keeps_the_others() -> None:
    given = "--xla_force_host_platform_device_count=16 --xla_cpu_use_fusion_emitters=true"
    environ = {"XLA_FLAGS": given}
    with_fast_compile(environ)
    assert environ["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=16",
        FAST_COMPILE_FLAG,
    ]
    empty: dict[str, str] = {}
    with_fast_compile(empty)
    assert empty == {"XLA_FLAGS": FAST_COMPILE_FLAG}


def _embedding_gradient() -> jax.stages.Lowered:
    def loss(table: jax.Array, ids: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(table[ids]))

    return jax.jit(jax.grad(loss)).lower(
        jax.ShapeDtypeStruct((1000, 64), jnp.float32), jax.ShapeDtypeStruct((4, 128), jnp.int32)
    )


def _matmul_gradient() -> jax.stages.Lowered:
    def loss(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(x @ w))

    return jax.jit(jax.grad(loss, argnums=1)).lower(
        jax.ShapeDtypeStruct((64, 128), jnp.float32), jax.ShapeDtypeStruct((128, 32), jnp.float32)
    )


def test_the_fast_compile_flag_changes_what_a_scatter_costs_and_not_what_a_matmul_does() -> None:
    """Why profiles are keyed by the flag: the gather's gradient (a scatter) is fused otherwise
    and XLA's cost analysis of it differs; a matmul's is the same."""
    loop_emitters = dict(FAST_COMPILE, xla_cpu_use_fusion_emitters=False)

    def costs(lowered: jax.stages.Lowered) -> tuple[dict[str, float], dict[str, float]]:
        return (
            lowered.compile(compiler_options=dict(FAST_COMPILE)).cost_analysis(),
            lowered.compile(compiler_options=loop_emitters).cost_analysis(),
        )

    fused, looped = costs(_embedding_gradient())
    assert fused["bytes accessed"] != looped["bytes accessed"]
    fused, looped = costs(_matmul_gradient())
    assert fused == looped


def test_fast_compile_is_refused_where_jax_has_started(capsys: pytest.CaptureFixture[str]) -> None:
    jax.devices()  # this process has read its XLA flags
    assert main(["plan", "--model", "gpt", "--preset", "tiny", "--fast-compile"]) == 2
    err = capsys.readouterr().err
    assert "--fast-compile: expected a process where JAX has not started yet" in err
    assert FAST_COMPILE_FLAG in err


def test_fast_compile_reaches_xla_here_and_in_the_compile_workers() -> None:
    """A fresh process that takes the switch as `main` does compiles the scatter as the loop
    emitters do, in itself and in its compile workers, and keys its programs by the flag."""
    script = ROOT / "tests" / "scripts" / "fast_compile_child.py"
    flags = os.environ.get("XLA_FLAGS", "")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=flags),
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert said["here"] == said["worker"] == said["options"]
    assert said["version"].endswith(f"+xla({FAST_COMPILE_FLAG})")
    default = _fused_bytes_accessed()
    assert float(said["here"]) != default


def _fused_bytes_accessed() -> float:
    """The scatter's bytes accessed as this process (no `--fast-compile`) compiles it."""
    cost = _embedding_gradient().compile(compiler_options=dict(FAST_COMPILE)).cost_analysis()
    return float(cost["bytes accessed"])
