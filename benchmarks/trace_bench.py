"""Trace and block-construction benchmarks (issue targets, printed, never asserted).

- Tracing LLaMA-7B from abstract shapes: target under 30 s and 1 GiB.
- Block construction on abstract GPT graphs of 12, 24, 48, 96 layers: target under 5 s at
  48 layers and linear growth with depth; segmentation of 96 layers under 10 s.

Each measurement runs in a fresh subprocess so peak RSS belongs to that measurement alone.
Run: `python benchmarks/trace_bench.py` (or `make bench`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_CHILD = r"""
import json, os, resource, sys, time
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
import explorer as ex
from explorer.blocks import build_blocks
from explorer.segments import build_segments
kind, layers = sys.argv[1], int(sys.argv[2])
if kind == "trace-llama":
    config = ex.models.LlamaConfig.llama_7b()
    fn = ex.models.llama
else:
    config = ex.models.GPTConfig.gpt_2_6b().replace(num_layers=layers)
    fn = ex.models.gpt
step, args = fn(config, abstract=True)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
graph = ex.trace(step, *args)
traced = time.perf_counter()
blocks = build_blocks(graph, 8)
done = time.perf_counter()
segmentation = build_segments(graph, blocks)
segmented = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({
    "kind": kind, "layers": config.num_layers, "ops": len(graph.ops),
    "blocks": len(blocks.blocks), "trace_s": traced - start, "blocks_s": done - traced,
    "segments_s": segmented - done, "unique": len(segmentation.unique),
    "peak_rss_growth_mib": (peak - base) / 1024, "peak_rss_mib": peak / 1024,
}))
"""


def _run(kind: str, layers: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(layers)],
        capture_output=True, text=True, check=True, env=dict(os.environ),
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    llama = _run("trace-llama", 32)
    print(
        f"LLaMA-7B abstract trace: {llama['ops']} ops in {llama['trace_s']:.2f} s, "
        f"peak RSS growth {llama['peak_rss_growth_mib']:.0f} MiB "
        f"(process peak {llama['peak_rss_mib']:.0f} MiB); targets: < 30 s, < 1024 MiB"
    )
    print("GPT-2.6B shapes, blocks (P=8) and segments against depth:")
    print(
        f"{'layers':>6} {'ops':>7} {'blocks':>6} {'trace s':>8} {'blocks s':>9} "
        f"{'ms/layer':>8} {'segments s':>10} {'unique':>6}"
    )
    for layers in (12, 24, 48, 96):
        row = _run("blocks-gpt", layers)
        print(
            f"{layers:6d} {row['ops']:7d} {row['blocks']:6d} {row['trace_s']:8.2f} "
            f"{row['blocks_s']:9.3f} {1000 * row['blocks_s'] / layers:8.1f} "
            f"{row['segments_s']:10.3f} {row['unique']:6d}"
        )
    print("targets: blocks under 5 s at 48 layers and linear; segmenting 96 layers under 10 s")


if __name__ == "__main__":
    main()
