"""Command line: `python -m explorer plan|bench|calibrate ...`."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from explorer import models
from explorer.errors import ExplorerError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="explorer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="analyse a model zoo training step on a mesh")
    plan.add_argument("--model", choices=sorted(models.MODELS), default="gpt")
    plan.add_argument("--preset", default="tiny", help="tiny, small or a paper-scale preset")
    plan.add_argument("--layers", type=int, default=None, help="override num_layers")
    plan.add_argument("--mesh", default="4", help="mesh shape, e.g. 4 or 2x4")
    plan.add_argument("--free-axes", action="store_true", help="2-D: free the batch axis")
    plan.add_argument("--platform", default="a100-pcie-8", help="preset name or JSON file")
    plan.add_argument("--backend", choices=["compiled", "measured"], default="compiled")
    plan.add_argument("--cache", default="~/.cache/explorer/profiles.sqlite")
    plan.add_argument("--no-cache", action="store_true", help="keep no profiles on disk")
    plan.add_argument("--no-profile", action="store_true", help="stop after segmentation")
    plan.add_argument("--budget", default=None, help="memory per device, e.g. 8GiB or 512MiB")
    plan.add_argument("--out", default=None, help="write the chosen plan JSON here")
    sub.add_parser(
        "calibrate", help="measure collectives, write a platform file (see calibrate -h)"
    )
    bench = sub.add_parser("bench", help="accuracy, plan quality, overhead, interactivity report")
    bench.add_argument("--quick", action="store_true", help="a subset that runs in minutes")
    bench.add_argument("--out", default=None, help="report folder (default assets/bench)")
    bench.add_argument("--cache", default=None, help="profile cache (default: a cold one)")
    bench.add_argument(
        "--sections", default="overhead,accuracy,quality,slider", help="comma-separated subset"
    )
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "calibrate":
            from explorer.platforms import calibrate_main

            return calibrate_main(rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if args.command == "bench":
            return _bench(args)
        return _plan(args)
    except ExplorerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _plan(args: argparse.Namespace) -> int:
    from explorer.baselines import BASELINES
    from explorer.pipeline import analyze
    from explorer.plan import evaluate

    model_fn, config_cls = models.MODELS[args.model]
    preset = getattr(config_cls, args.preset, None)
    if preset is None or not callable(preset):
        raise ExplorerError(
            f"--preset: {config_cls.__name__} has no preset {args.preset!r}; expected one of "
            + ", ".join(n for n in dir(config_cls) if n in _PRESETS)
        )
    config = preset()
    if args.layers is not None:
        config = config.replace(num_layers=args.layers)
    measured = args.backend == "measured"
    step, example = model_fn(config, abstract=not measured)
    start = time.perf_counter()
    analysis = analyze(
        step,
        *example,
        mesh=args.mesh,
        free_axes=args.free_axes,
        platform=args.platform,
        backend=args.backend,
        cache=None if args.no_cache else args.cache,
        profile=not args.no_profile,
    )
    print(f"{args.model} {args.preset}: {config}")
    print(analysis.summary())
    if analysis.profile_table is None:
        print(f"analysis took {time.perf_counter() - start:.2f} s")
        return 0
    _print_best(analysis.profile_table)
    budget = _bytes(args.budget) if args.budget else None
    chosen = analysis.plan(memory_budget=budget)
    print(f"frontier: {len(analysis.frontier.points)} Pareto-optimal plans")
    print(f"chosen: {chosen.summary()}")
    print(f"{'plan':10} {'predicted ms':>12} {'evaluated ms':>12} {'memory GiB':>10}")
    print(_row("cfp", chosen, evaluate(chosen, step, *example)))
    for name in BASELINES:  # fsdp and alpa are priced by evaluation: predicted = evaluated
        try:
            plan = analysis.baseline(name)
            print(_row(name, plan, evaluate(plan, step, *example)))
        except ExplorerError as err:  # one failed baseline does not hide the others
            print(f"{name:10} failed: {err}")
    if args.out:
        print(f"wrote {chosen.save(args.out)}")
    print(f"analysis took {time.perf_counter() - start:.2f} s")
    return 0


def _bench(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    # the meshes go up to 8 devices; JAX reads this when it first touches a device
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()
    from explorer.bench import README, REPORT_DIR, run_bench

    start = time.perf_counter()
    report = run_bench(
        quick=args.quick,
        out=Path(args.out) if args.out else REPORT_DIR,
        readme=None if args.out else README,  # the README quotes the repository's report
        cache=Path(args.cache).expanduser() if args.cache else None,
        sections=[s.strip() for s in args.sections.split(",") if s.strip()],
    )
    print(f"wrote {report} in {(time.perf_counter() - start) / 60:.1f} min")
    return 0


def _row(name: str, plan: Any, truth: Any) -> str:
    return f"{name:10} {1e3 * plan.time:12.4f} {1e3 * truth.time:12.4f} {plan.memory / 2**30:10.3f}"


def _bytes(text: str) -> float:
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "b": 1}
    lowered = text.strip().lower()
    for unit, scale in units.items():
        if lowered.endswith(unit):
            try:
                return float(lowered[: -len(unit)]) * scale
            except ValueError:
                break
    try:
        return float(lowered)
    except ValueError:
        raise ExplorerError(
            f"--budget: expected bytes such as 8GiB, 512MiB or 1e9, found {text!r}"
        ) from None


def _print_best(table: Any) -> None:
    """The fastest profiled configuration of each unique segment and boundary."""
    ok = table[table["status"] == "ok"]
    print(
        f"{'kind':8} {'segment':10} {'best configuration':32} {'comm ms':>9} {'comp ms':>9} "
        f"{'memory MiB':>10}"
    )
    for (kind, label), rows in ok.groupby(["kind", "label"], sort=False):
        best = rows.loc[rows["t_total"].idxmin()]
        print(
            f"{kind:8} {label:10} {best['config']:32} {1e3 * best['t_comm']:9.3f} "
            f"{1e3 * best['t_comp']:9.3f} {best['memory'] / 2**20:10.1f}"
        )


_PRESETS = {
    "tiny", "small", "gpt_2_6b", "gpt_6_7b", "llama_7b", "moe_7_1b", "bert_large",
}  # fmt: skip
