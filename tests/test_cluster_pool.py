"""Compile worker pools are sized to the cores this process may use, not the machine's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from explorer.profile.backends import pool_size
from explorer.profile.compile_workers import WORKER_MEMORY_BYTES, usable_cores

ROOT = Path(__file__).resolve().parents[1]


def test_one_worker_per_thread_up_to_the_usable_cores() -> None:
    assert pool_size(1) == 1
    assert pool_size(10_000, memory=10_000 * WORKER_MEMORY_BYTES) == usable_cores()
    assert usable_cores() <= (os.cpu_count() or 1)


def test_no_more_workers_than_the_memory_available_holds() -> None:
    assert pool_size(96, cores=96, memory=4 * WORKER_MEMORY_BYTES) == 4
    assert pool_size(96, cores=96, memory=WORKER_MEMORY_BYTES // 2) == 1  # one at least
    assert pool_size(8, cores=96, memory=96 * WORKER_MEMORY_BYTES) == 8  # one per thread


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_a_process_pinned_to_one_core_starts_one_worker() -> None:
    # as a SLURM task given 1 CPU of a larger node would be
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from explorer.profile.backends import pool_size\n"
        "print(os.cpu_count(), pool_size(os.cpu_count(), memory=2**40))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    machine, workers = map(int, result.stdout.split())
    assert workers == 1 and machine >= 1
