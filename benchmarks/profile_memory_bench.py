"""Memory of one long profiling run (issue target: flat, printed, never asserted).

One process lowers and prices N programs (default 1,000) with the `compiled` backend and no
persistent cache, compiling them in recycled worker processes (`profile/compile_workers.py`;
`--in-process` compiles them in the process itself, as before): the tiny MoE on a 1-D mesh of
4, whose MoE layer alone has 6,912 configurations (the old unsplit space), cut to the first N
programs in planning order by an `only=` counter. Every 100 programs it prints the count, the
number of memory maps of the process (`/proc/self/maps` lines; LLVM dies with "Unable to
allocate section memory" when they reach vm.max_map_count, 65,530 by default), its resident
memory and the resident memory of the compile workers alive at that moment (each exits after
`PROGRAMS_PER_WORKER` programs), then a summary: first vs last, and growth per 100 programs.

XLA flags used (set before JAX is imported, as tests/conftest.py does): 8 virtual CPU devices,
`--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true` (cheaper CPU
code generation; the runner passes the same as compile options for `compiled` profiling).

Run: `python benchmarks/profile_memory_bench.py [--programs 1000] [--every 100]` (Linux only:
reads /proc). Takes several minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
import time

_FLAGS = (
    "--xla_force_host_platform_device_count=8",
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_FLAGS)] + list(_FLAGS)
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import explorer as ex  # noqa: E402
from explorer.profile import backends, runner  # noqa: E402
from explorer.profile.cache import ProfileCache  # noqa: E402
from explorer.segments import build_segments  # noqa: E402


def memory_maps() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024  # kB
    return float("nan")


def workers_rss_mib() -> float:
    """Resident memory of this process's children (the compile workers), summed."""
    total_kb = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:  # exited meanwhile
            continue
        if int(fields.get("PPid", "0").split()[0]) == os.getpid():
            total_kb += int(fields.get("VmRSS", "0 kB").split()[0])
    return total_kb / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=1000, help="programs to profile")
    parser.add_argument("--every", type=int, default=100, help="report every this many")
    parser.add_argument("--workers", type=int, default=None, help="compile threads")
    parser.add_argument(
        "--release-every",
        type=int,
        default=runner.RELEASE_EVERY,
        help="programs between the runner's memory releases (0: never, the old behaviour)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="compile in this process, not in recycled workers (the behaviour before them)",
    )
    options = parser.parse_args()
    runner.RELEASE_EVERY = options.release_every or sys.maxsize
    backends.COMPILE_IN_WORKERS = not options.in_process

    step, args = ex.models.moe(ex.models.MoEConfig.tiny(), abstract=True)
    analysis = ex.analyze(step, *args, mesh=(4,), profile=False)
    # the old unsplit space: no configuration cap, so the MoE layer stays one segment type
    unsplit = build_segments(analysis.graph, analysis.block_analysis, cap=sys.maxsize)
    analysis = dataclasses.replace(analysis, segments=unsplit)
    counts = analysis.program_counts
    print(f"XLA_FLAGS={os.environ['XLA_FLAGS']}")
    print(
        f"tiny MoE, mesh 4: {counts.segment_programs + counts.reshard_programs} programs in the "
        f"space (per segment type {dict(counts.per_type)}); profiling the first "
        f"{options.programs}, compiled backend, no persistent cache, memory released every "
        f"{options.release_every or 'never'} programs, compiled "
        f"{'in this process' if options.in_process else 'in recycled worker processes'}"
    )

    selected = 0

    def first_n(kind: str, label: str, config: str) -> bool:
        nonlocal selected
        selected += 1
        return selected <= options.programs

    start = time.perf_counter()
    samples: list[tuple[int, int, float, float, float]] = []
    print(f"{'programs':>8} {'maps':>7} {'rss_mib':>8} {'workers_mib':>11} {'seconds':>8}")

    def report(done: int) -> None:
        sample = (done, memory_maps(), rss_mib(), workers_rss_mib(), time.perf_counter() - start)
        samples.append(sample)
        print(
            f"{sample[0]:>8} {sample[1]:>7} {sample[2]:>8.1f} {sample[3]:>11.1f} {sample[4]:>8.1f}",
            flush=True,
        )

    report(0)

    def on_program(done: int) -> None:
        if done % options.every == 0:
            report(done)

    with ProfileCache(None) as cache:
        profiles = runner.profile_all(
            analysis.graph,
            analysis.block_analysis,
            analysis.segments,
            analysis.mesh,
            platform=analysis.platform,
            backend="compiled",
            cache=cache,
            workers=options.workers,
            progress=False,
            only=first_n,
            on_program=on_program,
        )
    ok = sum(p.ok for p in profiles.entries)
    failed = collections.Counter(p.reason for p in profiles.entries if not p.ok)
    for reason, count in failed.most_common():
        print(f"not ok: {count} x {reason}")
    # growth is taken from the first report on (the first programs warm up JAX and XLA)
    first, last = samples[1] if len(samples) > 2 else samples[0], samples[-1]
    hundreds = (last[0] - first[0]) / 100 or 1
    print(
        f"summary: {len(profiles)} programs ({ok} ok) in {time.perf_counter() - start:.0f} s; "
        f"maps {first[1]} at {first[0]} -> {last[1]} at {last[0]} "
        f"({(last[1] - first[1]) / hundreds:+.1f} per 100 programs); "
        f"RSS {first[2]:.0f} -> {last[2]:.0f} MiB ({(last[2] - first[2]) / hundreds:+.1f} MiB "
        f"per 100 programs, over {last[0] - first[0]} programs); workers' RSS at the reports: "
        f"{min(s[3] for s in samples[1:]):.0f} to {max(s[3] for s in samples[1:]):.0f} MiB"
    )


if __name__ == "__main__":
    main()
