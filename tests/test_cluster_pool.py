"""Compile worker pools are sized to the cores this process may use, not the machine's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from explorer.profile.backends import pool_size
from explorer.profile.compile_workers import usable_cores

ROOT = Path(__file__).resolve().parents[1]


def test_one_worker_per_thread_up_to_the_usable_cores() -> None:
    assert pool_size(1) == 1
    assert pool_size(10_000) == usable_cores() <= (os.cpu_count() or 1)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_a_process_pinned_to_one_core_starts_one_worker() -> None:
    # as a SLURM task given 1 CPU of a larger node would be
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from explorer.profile.backends import pool_size\n"
        "print(os.cpu_count(), pool_size(os.cpu_count()))\n"
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
