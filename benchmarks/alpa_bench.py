"""Size and solve time of the Alpa-style ILP against depth (issue 7: tiny GPT at 2, 4, 8 and 16
layers on mesh (4,), platform a100-pcie-8). Printed, never asserted.

Without a budget the ILP has no memory rows; with `--budget` each depth is solved again under
80% of the unconstrained plan's peak, which adds one row per maximal live set.

    python benchmarks/alpa_bench.py [--layers 2 4 8 16] [--mesh 4] [--budget]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import explorer as ex
from explorer.alpa import solve_alpa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--mesh", default="4", help="mesh shape, e.g. 4 or 2x2")
    parser.add_argument("--platform", default="a100-pcie-8")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument(
        "--budget", action="store_true", help="also solve under a memory budget (liveness rows)"
    )
    args = parser.parse_args()
    mesh = tuple(int(n) for n in args.mesh.split("x"))
    print(
        f"tiny GPT on mesh {args.mesh}, {args.platform}; HiGHS time limit {args.time_limit} s\n"
        f"{'layers':>6} {'ops':>6} {'groups':>6} {'edges':>6} {'variables':>9} {'binary':>7} "
        f"{'constraints':>11} {'nonzeros':>9} {'build s':>8} {'solve s':>8}  status, objective"
    )
    for layers in args.layers:
        step, example = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=layers))
        graph = ex.trace(step, *example)
        runs = [None]
        if args.budget:
            free = solve_alpa(graph, mesh, args.platform, time_limit=args.time_limit)
            runs.append(0.8 * free.memory)
        for budget in runs:
            start = time.perf_counter()
            solution = solve_alpa(
                graph, mesh, args.platform, memory_budget=budget, time_limit=args.time_limit
            )
            total = time.perf_counter() - start
            p = solution.problem
            label = f"{layers:>6}" if budget is None else f"{'+mem':>6}"
            print(
                f"{label} {len(graph.ops):>6} {p.groups:>6} {p.edges:>6} {p.variables:>9} "
                f"{p.integer_variables:>7} {p.constraints:>11} {p.nonzeros:>9} "
                f"{p.build_seconds:>8.2f} {solution.solve_seconds:>8.2f}  {solution.status}, "
                f"{1e3 * solution.objective:.4f} ms comm, peak "
                f"{solution.memory / 2**20:.2f} MiB (total {total:.1f} s)"
            )


if __name__ == "__main__":
    main()
