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
from explorer.profile.runner import distinct_programs


def _run(config: object, mesh: tuple[int, ...], cache: Path, platform: str) -> tuple[float, object]:
    step, args = ex.models.gpt(config, abstract=True)  # type: ignore[arg-type]
    start = time.perf_counter()
    analysis = ex.analyze(step, *args, mesh=mesh, platform=platform, cache=cache, progress=False)
    return time.perf_counter() - start, analysis


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "profiles.sqlite"
        tiny = ex.models.GPTConfig.tiny()
        cold, analysis = _run(tiny, (4,), cache, "a100-pcie-8")
        table = analysis.profiles  # type: ignore[attr-defined]
        warm, again = _run(tiny, (4,), cache, "a100-pcie-8")
        print(
            f"tiny GPT, mesh 4, compiled: {distinct_programs(table)} programs cold in {cold:.1f} s "
            f"(target < 180 s); warm cache {warm:.2f} s (target < 5 s), "
            f"{int(again.profiles['cached'].sum())} of {len(again.profiles)} from the cache"  # type: ignore[attr-defined]
        )
        other, _ = _run(tiny, (4,), cache, "h100-sxm-8")
        print(f"same cache, another platform (re-priced, nothing compiled): {other:.2f} s")
        big, analysis = _run(ex.models.GPTConfig.gpt_6_7b(), (8,), cache, "a100-pcie-8")
        table = analysis.profiles  # type: ignore[attr-defined]
        ok = table[table["status"] == "ok"]
        layer = ok[ok["label"] == "layer"].sort_values("t_total")
        print(
            f"GPT-6.7B (32 layers), mesh 8, compiled from abstract shapes: "
            f"{distinct_programs(table)} programs in {big:.1f} s; "
            f"fastest layer configuration {layer.iloc[0]['config']} "
            f"({1e3 * layer.iloc[0]['t_total']:.1f} ms, {layer.iloc[0]['memory'] / 2**30:.2f} GiB)"
        )


if __name__ == "__main__":
    main()
