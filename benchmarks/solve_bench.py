"""Solver speed (issue target: 96 instances x 81 configurations, full frontier < 2 s, a budget
query < 5 ms). Printed, never asserted. The costs are random but shaped like a GPT layer: 81
configurations = 4 blocks x 3 strategies, resharding by (last, first) strategy."""

from __future__ import annotations

import itertools
import random
import statistics
import time

from explorer.cost import CostModel, Option
from explorer.solve import solve_frontier


def _model(
    instances: int, seed: int = 0, transient_levels: int = 15, saved: bool = False
) -> CostModel:
    rng = random.Random(seed)
    layer = tuple(
        Option(
            choices=c,
            name=",".join(map(str, c)),
            t_comm=rng.uniform(0, 2e-3),
            t_comp=rng.uniform(1e-3, 3e-3),
            persistent=rng.randrange(1, 64) * 2**24,
            transient=rng.randrange(1, transient_levels + 1) * 2**26,
            peak=0,
            # activations held from the layer's forward part to its backward part
            saved=rng.randrange(1, 32) * 2**24 if saved else 0,
        )
        for c in itertools.product(range(3), repeat=4)
    )
    reshard = {(a, b): 0.0 if a == b else rng.uniform(0, 5e-4) for a in range(3) for b in range(3)}
    return CostModel(
        tuple(f"layer_{n}" for n in range(instances)),
        (layer,) * instances,
        (reshard,) * (instances - 1),
    )


def main() -> None:
    # transient peaks on 15 distinct levels, then all 81 distinct (the harder case); then
    # with saved activations, random and independent of the other costs (real layers save
    # less where they shard more): memory levels then vary along the chain
    cases = ((12, 15, False), (48, 15, False), (96, 15, False), (96, 10_000, False))
    cases += ((12, 15, True), (48, 15, True), (96, 15, True))
    for instances, levels, saved in cases:
        model = _model(instances, transient_levels=levels, saved=saved)
        start = time.perf_counter()
        frontier = solve_frontier(model)
        solve_s = time.perf_counter() - start
        budgets = [
            random.uniform(frontier.min_memory, frontier.points[-1].memory) for _ in range(200)
        ]
        lookups = []
        for budget in budgets:
            start = time.perf_counter()
            frontier.query(budget)
            lookups.append(time.perf_counter() - start)
        print(
            f"{instances:3d} instances x 81 configurations, transients on <= {min(levels, 81)} "
            f"levels{', random saved activations' if saved else ''}: frontier of "
            f"{len(frontier.points)} "
            f"plans in {solve_s:.2f} s; budget query median "
            f"{1e6 * statistics.median(lookups):.0f} us"
        )
    print("targets (96 instances): frontier < 2 s, query < 5 ms")


if __name__ == "__main__":
    main()
