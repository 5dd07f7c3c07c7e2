"""Profiling benchmarks (issue targets, printed, never asserted).

- Cold `compiled` profiling of tiny GPT on a 1-D mesh of 4 (target: under 3 min on the 2-core
  machine), then the same analysis with a warm cache (target: under 5 s).
- GPT-6.7B on an 8-device mesh profiled in `compiled` mode from abstract shapes.

Run: `python benchmarks/profile_bench.py` (or `make bench`). Uses a temporary cache file.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import explorer as ex


def _run(
    config: object, mesh: tuple[int, ...], cache: Path, platform: str
) -> tuple[float, ex.Analysis]:
    step, args = ex.models.gpt(config, abstract=True)  # type: ignore[arg-type]
    start = time.perf_counter()
    analysis = ex.analyze(step, *args, mesh=mesh, platform=platform, cache=cache, progress=False)
    return time.perf_counter() - start, analysis


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "profiles.sqlite"
        tiny = ex.models.GPTConfig.tiny()
        cold, analysis = _run(tiny, (4,), cache, "a100-pcie-8")
        profiled = analysis.profile_records
        warm, again = _run(tiny, (4,), cache, "a100-pcie-8")
        cached = sum(p.cached for p in again.profile_records.entries)
        print(
            f"tiny GPT, mesh 4, compiled: {profiled.programs} programs cold in {cold:.1f} s "
            f"(target < 180 s); warm cache {warm:.2f} s (target < 5 s), "
            f"{cached} of {len(again.profile_records)} from the cache"
        )
        other, _ = _run(tiny, (4,), cache, "h100-sxm-8")
        print(f"same cache, another platform (re-priced, nothing compiled): {other:.2f} s")
        big, analysis = _run(ex.models.GPTConfig.gpt_6_7b(), (8,), cache, "a100-pcie-8")
        profiled = analysis.profile_records
        fastest = min(
            (p for p in profiled.segments if p.ok and p.label == "layer"), key=lambda p: p.t_total
        )
        print(
            f"GPT-6.7B (32 layers), mesh 8, compiled from abstract shapes: "
            f"{profiled.programs} programs in {big:.1f} s; "
            f"fastest layer configuration {fastest.config} "
            f"({1e3 * fastest.t_total:.1f} ms, {fastest.memory / 2**30:.2f} GiB)"
        )


if __name__ == "__main__":
    main()
