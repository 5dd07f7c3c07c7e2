"""Compile-only profiling in recycled worker processes (explorer/profile/compile_workers.py).

Real subprocesses, real XLA compiles: what a worker answers is what the compiler makes of the
program in this process, a worker is recycled and replaced, and one that dies is named.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from explorer._jax_compat import CompileRequest, compile_request, read_executable
from explorer.errors import BytesError
from explorer.profile import compile_workers
from explorer.profile.backends import FAST_COMPILE
from explorer.profile.compile_workers import (
    MEMORY_LIMIT_VARIABLE,
    CompileFailed,
    CompileOutOfMemory,
    CompileWorkers,
    WorkerDied,
    resident_bytes,
    worker_memory_limit,
)

ROOT = Path(__file__).resolve().parents[1]


def _layer(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    # a sharded contraction, its loss and its gradient: all-reduces, dots, temporaries
    return jax.value_and_grad(lambda w: jnp.tanh(x @ w).sum())(w)


def _lowered(columns: int = 128) -> jax.stages.Lowered:
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    w = jax.ShapeDtypeStruct((64, columns), jnp.float32, sharding=NamedSharding(mesh, P(None, "x")))
    x = jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=NamedSharding(mesh, P("x", None)))
    return jax.jit(_layer).lower(w, x)


def _request(columns: int = 128) -> CompileRequest:
    request = compile_request(_lowered(columns), FAST_COMPILE)
    assert request is not None
    return request


def test_a_worker_answers_what_the_compiler_makes_of_the_program_here() -> None:
    here = read_executable(_lowered().compile(compiler_options=FAST_COMPILE))
    workers = CompileWorkers(processes=1, device_count=jax.device_count())
    try:
        there = workers.compile(_request())
    finally:
        workers.close()
    assert "all-reduce" in here.hlo and here.memory is not None and here.cost
    assert there == here  # the optimised HLO text, the cost and the memory analyses


def test_a_jax_setting_changed_here_reaches_the_worker() -> None:
    """The compile options follow JAX settings a user may change in this process: the worker
    compiles under them (without them it partitions a GSPMD module as an unsharded one)."""
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        here = read_executable(_lowered().compile(compiler_options=FAST_COMPILE))
        request = _request()
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)
    assert ("jax_use_shardy_partitioner", False) in request.settings
    workers = CompileWorkers(processes=1, device_count=jax.device_count())
    try:
        assert workers.compile(request) == here
    finally:
        workers.close()


def test_compile_once_answers_a_request_compiled_last_without_compiling_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step evaluated and then explained is one request: the second is answered from the
    pool's recent compiles (no worker started for it: each program has a fresh worker). The
    recent ones are bounded by their text: past it the oldest is compiled again."""
    workers = CompileWorkers(processes=1, device_count=jax.device_count(), programs_per_worker=1)
    try:
        first = workers.compile_once(_request(64))
        assert workers.compile_once(_request(64)) == first and workers.started == 1
        other = workers.compile_once(_request(128))
        assert other != first and workers.started == 2
        assert workers.compile_once(_request(64)) == first and workers.started == 2
        # room for one program's text: the newest stays, the one before it goes
        monkeypatch.setattr(compile_workers, "RECENT_TEXT_CHARS", len(first.hlo))
        workers.compile_once(_request(192))
        assert workers.started == 3
        assert workers.compile_once(_request(64)) == first and workers.started == 4
    finally:
        workers.close()


def test_workers_are_recycled_and_a_worker_dead_between_programs_is_replaced() -> None:
    workers = CompileWorkers(processes=1, device_count=jax.device_count(), programs_per_worker=2)
    try:
        answers = [workers.compile(_request(columns)) for columns in (64, 128, 192)]
        assert workers.started == 2  # the first exited after its second program
        assert len({a.hlo for a in answers}) == 3
        (pid,) = workers.pids()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        # not the program's doing: it is sent again, to a fresh worker
        assert workers.compile(_request(64)) == answers[0]
        assert workers.started == 3
    finally:
        workers.close()
    assert workers.pids() == []


def test_a_program_the_compiler_refuses_is_an_error_named_by_the_compiler() -> None:
    broken = CompileRequest(
        module=b"not a module",
        name="broken",
        tuple_args=False,
        allow_prop_to_inputs=(),
        allow_prop_to_outputs=(),
        device_ids=(0,),
        platform="cpu",
        options=(),
    )
    workers = CompileWorkers(processes=1, device_count=jax.device_count())
    try:
        with pytest.raises(CompileFailed) as refused:
            workers.compile(broken)
        # the worker survives a refused program and compiles the next
        assert workers.compile(_request()).memory is not None
        assert workers.started == 1
    finally:
        workers.close()
    assert refused.value.kind and str(refused.value)


def test_a_worker_that_cannot_start_is_named_with_its_last_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = _request()  # lowered here first: this process's XLA reads its flags once
    # XLA aborts the worker on a flag it does not know, before any program compiles
    monkeypatch.setenv("XLA_FLAGS", "--xla_no_such_flag_for_the_test=1")
    workers = CompileWorkers(processes=1, device_count=jax.device_count())
    try:
        with pytest.raises(WorkerDied, match=r"compile worker (exited|killed).*no_such_flag"):
            workers.compile(request)
    finally:
        workers.close()
    assert workers.started == 2  # tried once more on a fresh worker, then named


def test_a_worker_refuses_to_serve_code_other_than_this_process_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker imports the package afresh: after an upgrade or an edit on disk it would
    answer requests of another version. It says so and exits, and the program is named."""
    # this process as if it had imported the package before it changed on disk
    monkeypatch.setattr(compile_workers, "_CODE", "0123456789abcdef")
    workers = CompileWorkers(processes=1, device_count=jax.device_count())
    try:
        with pytest.raises(WorkerDied, match=r"status 3.*upgraded or edited.*restart"):
            workers.compile(_request())
    finally:
        workers.close()


def test_a_worker_over_its_memory_limit_is_stopped_and_its_compile_says_so() -> None:
    """A compile that runs away is stopped before it takes the machine: here the limit is
    below what a worker holds once JAX is imported, so the watchdog stops it while it
    answers its first program. The program is not sent again (it would only grow again),
    and the error says what was held, what is allowed and how to allow more."""
    limit = 64 * 2**20
    workers = CompileWorkers(processes=1, device_count=jax.device_count(), memory_limit=limit)
    try:
        with pytest.raises(CompileOutOfMemory) as stopped:
            workers.compile(_request())
        assert workers.started == 1 and workers.pids() == []
    finally:
        workers.close()
    said = str(stopped.value)
    assert stopped.value.kind == "CompileOutOfMemory" and isinstance(stopped.value, CompileFailed)
    assert "the compiler grew past the 0.1 GiB a compile worker may hold" in said
    assert "was stopped at " in said
    assert f"Set {MEMORY_LIMIT_VARIABLE}" in said
    # a limit above what compiling the program takes stops nothing
    roomy = CompileWorkers(processes=1, device_count=jax.device_count(), memory_limit=2**40)
    try:
        assert roomy.compile(_request()).memory is not None
        (pid,) = roomy.pids()
        held = resident_bytes(pid)
        assert held is not None and limit < held < 2**40
    finally:
        roomy.close()


@pytest.mark.slow
def test_a_worker_whose_parent_dies_mid_compile_stops_with_it() -> None:
    """The parent reads a worker's memory and closes its input: once the parent is killed,
    a worker in a long (or runaway) compile would go on alone. It stops within a second or
    so, long before the compile it was in would have ended."""
    script = ROOT / "tests" / "scripts" / "compile_orphan.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def run(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, str(script), *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        return done.stdout

    layers, waited = "3000", 3.0
    said = run("die", layers, str(waited))  # the worker imports JAX, then compiles
    pid = int(said.split("worker ")[1].split()[0])
    gone_after = None
    start = time.perf_counter()
    while time.perf_counter() - start < 30:
        if not os.path.exists(f"/proc/{pid}") or "zombie" in _state(pid):
            gone_after = time.perf_counter() - start
            break
        time.sleep(0.1)
    assert gone_after is not None and gone_after < 2.5
    # the compile was far from its end: given as long again and 2 s more, it is still on
    bound = waited + gone_after + 2
    assert run("time", layers, f"{bound:.2f}").startswith("still compiling after")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((line for line in status if line.startswith("State:")), "").lower()
    except OSError:
        return ""


def test_the_worker_memory_limit_is_half_the_machine_or_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MEMORY_LIMIT_VARIABLE, raising=False)
    with open("/proc/meminfo") as meminfo:
        total = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal"))
    assert worker_memory_limit() == total // 2
    monkeypatch.setenv(MEMORY_LIMIT_VARIABLE, "12GiB")
    assert worker_memory_limit() == 12 * 2**30
    assert CompileWorkers(processes=1, device_count=8).memory_limit == 12 * 2**30
    monkeypatch.setenv(MEMORY_LIMIT_VARIABLE, "a lot")
    with pytest.raises(BytesError, match=MEMORY_LIMIT_VARIABLE):
        CompileWorkers(processes=1, device_count=8)


def test_bad_worker_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="processes >= 1"):
        CompileWorkers(processes=0, device_count=8)


def test_a_script_without_a_main_guard_runs_once(tmp_path: Path) -> None:
    """multiprocessing's spawned children re-import the user's script: workers are plain
    subprocesses of our own module, so a script that profiles at top level runs once."""
    script = tmp_path / "user_script.py"
    script.write_text(
        textwrap.dedent(
            """
            import jax, jax.numpy as jnp, numpy as np
            from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
            from explorer._jax_compat import compile_request
            from explorer.profile.compile_workers import CompileWorkers

            print("top level ran", flush=True)
            mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
            x = jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(mesh, P("x")))
            request = compile_request(jax.jit(lambda x: x.sum()).lower(x), {})
            workers = CompileWorkers(processes=1, device_count=jax.device_count())
            print("compiled", "all-reduce" in workers.compile(request).hlo, flush=True)
            workers.close()
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("top level ran") == 1
    assert "compiled True" in result.stdout
