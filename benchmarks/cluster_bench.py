"""Compile on every core: cold `compiled` profiling with 1 vs 2 compile worker processes.

Each run is a fresh Python process (cold: no JAX cache, no worker started, no profile cache)
that profiles every program of tiny GPT (2 layers) on a 1-D mesh of 4 with the `compiled`
backend, `workers=N` (N compile threads feeding N recycled worker processes, see
`explorer/profile/compile_workers.py`). Printed per run: wall seconds of `analyze`, the
programs compiled, the 1-minute load average before the run (other jobs on the machine take
cores from it), the memory high-water mark of the main process and of the largest compile
worker (`ru_maxrss` of the process and of its waited-for children), and their sum bounded
as main + N x worker. Runs alternate 1, 2, 1, 2... and the best of each is compared:
the ratio is t(1) / t(2), the speed-up of the second core.

XLA flags as tests/conftest.py sets them (4 virtual CPU devices here, cheap LLVM passes).

Run: `python benchmarks/cluster_bench.py [--repeats 2] [--layers 2]` (Linux: reads
`ru_maxrss` in KiB). Takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FLAGS = (
    "--xla_force_host_platform_device_count=4",
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)


def one_run(workers: int, layers: int) -> dict[str, float]:
    """In a fresh process: profile, then report time and memory high-water marks."""
    import resource

    import explorer as ex
    from explorer.profile import compile_workers
    from explorer.profile.backends import pool_size

    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=layers))
    start = time.perf_counter()
    analysis = ex.analyze(step, *args, mesh=(4,), cache=None, progress=False, workers=workers)
    seconds = time.perf_counter() - start
    programs = sum(1 for p in analysis.profile_records.entries if p.program)
    if compile_workers._shared is not None:  # wait for the workers: their peak is then known
        compile_workers._shared.close()
    main = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {
        "workers": workers,
        "processes": pool_size(workers),
        "seconds": seconds,
        "programs": programs,
        "main_mib": main,
        "worker_mib": worker,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each worker count")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args.one, args.layers)))
        return
    env = {
        **os.environ,
        "XLA_FLAGS": " ".join(_FLAGS),
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(ROOT),
    }
    cores = len(os.sched_getaffinity(0))
    print(f"cold compiled profiling of tiny GPT ({args.layers} layers) on mesh 4, {cores} cores")
    print(f"{'workers':>7} {'processes':>9} {'seconds':>8} {'programs':>8} {'main MiB':>9} "
          f"{'worker MiB':>10} {'bound MiB':>9} {'load before':>11}")  # fmt: skip
    best: dict[int, float] = {}
    for _ in range(args.repeats):
        for workers in (1, 2):
            load = os.getloadavg()[0]  # other jobs on the machine take cores from the run
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(workers), "--layers", str(args.layers)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            run = json.loads(out.strip().splitlines()[-1])
            bound = run["main_mib"] + run["processes"] * run["worker_mib"]
            print(
                f"{workers:>7} {run['processes']:>9} {run['seconds']:>8.1f} {run['programs']:>8} "
                f"{run['main_mib']:>9.0f} {run['worker_mib']:>10.0f} {bound:>9.0f} {load:>11.1f}"
            )
            best[workers] = min(best.get(workers, float("inf")), run["seconds"])
    print(
        f"best: 1 worker {best[1]:.1f} s, 2 workers {best[2]:.1f} s, ratio t(1)/t(2) = "
        f"{best[1] / best[2]:.2f}"
    )


if __name__ == "__main__":
    main()
