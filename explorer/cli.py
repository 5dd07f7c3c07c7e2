"""Command line: `python -m explorer plan|profile|calibrate|bench ...`."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from explorer import models
from explorer.cluster.join import add_cluster_arguments
from explorer.errors import ExplorerError, InputError, NoPlanFitsError, ProfilingCancelled
from explorer.units import format_bytes, parse_bytes

# The exit status of a run stopped by Ctrl-C, as shells report a process ended by SIGINT.
INTERRUPTED = 130
SHARD_PARAMETERS_HELP = (
    "also offer each batch-split block its ZeRO-3 twin (parameters and optimizer state kept "
    "sharded over the batch axes, gathered where used)"
)
BATCH_OUTER_HELP = (
    "2-D: where the batch splits over the outer axis but not over every device, also offer "
    "each block the batch's own dim on the outer axis (M', E') with any role on the inner one"
)
BATCH_INNER_HELP = (
    "2-D: pin the batch to the inner axis instead of the outer one (the paper's rule with the "
    "axes swapped; the batch's own dim primed there, M' or E', where it does not split over "
    "every device): weights split across the outer axis, the batch within each of its parts"
)
CONTRACT_LAST_HELP = (
    "give a contraction with several contracted dims its K on the last that splits evenly, "
    "not the first (a combine einsum's experts, not its capacity: the experts' outputs summed "
    "where expert parallelism left them)"
)
SEQUENCE_PARALLEL_HELP = (
    "also offer each block splitting K (or N) its twin reduce-scattering the head's partial "
    "sums (the input gradient's) onto M (the sequence, or the batch where it splits) instead "
    "of all-reducing them, so the ops between the blocks work on shards (Megatron's sequence "
    "parallelism)"
)
CONFIG_CAP_HELP = (
    "the most configurations one unique segment may have before it is cut at a block boundary "
    "into smaller types (default 81): a lower cap profiles fewer, smaller programs, and the "
    "cut instances may take different configurations"
)
WHOLE_MESH_HELP = (
    "2-D: also offer each block its 1-D strategies over the flattened mesh (each dim split "
    "over every device)"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="explorer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="analyse a model zoo training step on a mesh")
    _add_model_arguments(plan)
    plan.add_argument("--mesh", default="4", help="mesh shape, e.g. 4 or 2x4")
    _add_space_arguments(plan)
    plan.add_argument("--platform", default="a100-pcie-8", help="preset name or JSON file")
    plan.add_argument("--backend", choices=["compiled", "measured"], default="compiled")
    plan.add_argument("--cache", default="~/.cache/explorer/profiles.sqlite")
    plan.add_argument("--no-cache", action="store_true", help="keep no profiles on disk")
    plan.add_argument("--no-profile", action="store_true", help="stop after segmentation")
    plan.add_argument(
        "--budget", default=None, help="memory per device, e.g. 8GiB, 512MiB, 1.5GB or 64MB"
    )
    plan.add_argument(
        "--memory-resolution",
        default="0",
        help="solve a space too wide for the exact frontier approximately, comparing memory "
        "in units of this (e.g. 64MiB); the frontier says how far from exact it may be",
    )
    plan.add_argument("--config-cap", default=None, help=CONFIG_CAP_HELP)
    plan.add_argument(
        "--gpu-memory",
        action="store_true",
        help="judge memory on the platform's GPU: compile each plan's step with XLA:GPU (no "
        "GPU needed) and choose the fastest plan that fits there",
    )
    plan.add_argument(
        "--verify-fit",
        action="store_true",
        help="compile the chosen plan's whole step and, where it needs more than the budget "
        "(default: the device's memory) though predicted within it, leaner frontier plans "
        "(by the shortfall seen, then bisecting; 8 compiles at most) for the fastest that "
        "fits (the predictions are within a few per cent; the fastest plan sits at the "
        "budget's edge)",
    )
    plan.add_argument(
        "--each-space",
        action="store_true",
        help="analyse the paper's space and each wider space asked for (--free-axes, "
        "--whole-mesh, --shard-parameters, --batch-outer, --batch-inner, --contract-last) one "
        "at a time, print each one's plan and choose the one predicted fastest (a wider space "
        "cuts the step its own way, so its plan can be slower than the paper's); with "
        "--gpu-memory, each space's fastest plan that fits the GPU",
    )
    plan.add_argument("--out", default=None, help="write the chosen plan JSON here")
    _add_fast_compile(plan)
    profile = sub.add_parser(
        "profile",
        help="measure every program on the devices of every process (jax.distributed) and "
        "keep the rows in the cache",
        epilog="Run the same command on every host. Exit status: 0 done; 2 bad input; 3 a "
        "host could not join, was lost or hung (the rows finished are kept in process 0's "
        "cache: run the command again to resume).",
    )
    _add_model_arguments(profile)
    profile.add_argument("--mesh", required=True, help="mesh over every device, e.g. 2x4")
    _add_space_arguments(profile)
    profile.add_argument(
        "--platform",
        default="a100-pcie-8",
        help="preset name or JSON file (splits the measured time into communication and "
        "computation; plan with the same one to reuse the rows)",
    )
    profile.add_argument("--cache", default="~/.cache/explorer/profiles.sqlite")
    profile.add_argument(
        "--only",
        action="append",
        default=[],
        help="profile only this segment type or boundary (head, layer->head) or one "
        "configuration of a type (layer:M@x,N@y,...); repeat for more; default everything",
    )
    profile.add_argument(
        "--backend",
        choices=["measured", "compiled"],
        default="measured",
        help="measured: every host runs every program; compiled: the hosts share the "
        "compiles (each its share, process 0 gathers the rows)",
    )
    profile.add_argument(
        "--workers",
        type=int,
        default=None,
        help="compile threads per process (default: 1 measured, every core compiled)",
    )
    _add_fast_compile(profile)
    add_cluster_arguments(profile)
    sub.add_parser(
        "calibrate", help="measure collectives, write a platform file (see calibrate -h)"
    )
    bench = sub.add_parser("bench", help="accuracy, plan quality, overhead, interactivity report")
    bench.add_argument("--quick", action="store_true", help="a subset that runs in minutes")
    bench.add_argument(
        "--paper",
        action="store_true",
        help="plan quality at the paper's scale (report under assets/bench/paper)",
    )
    bench.add_argument(
        "--only",
        default=None,
        help="with --paper: the cases whose label contains one of these comma-separated "
        "patterns, in the patterns' order (e.g. 'llama_7b_bf16 batch 2,moe_7_1b_bf16 batch 4')",
    )
    bench.add_argument(
        "--gpu-memory",
        action="store_true",
        help="with --paper: compile every plan for the platform's GPU (XLA:GPU, no GPU needed; "
        "about a minute a plan) to judge its fit there; without it the report shows what an "
        "earlier such run kept",
    )
    bench.add_argument(
        "--shard-parameters",
        action="store_true",
        help="with --paper: also profile CFP's space with ZeRO twins (rows cfp_zero, "
        "cfp_zero_gpu); without it the report shows them where the cache holds that space",
    )
    bench.add_argument(
        "--whole-mesh",
        action="store_true",
        help="with --paper: also profile CFP's space with whole-mesh strategies on 2-D meshes "
        "(rows cfp_whole, cfp_whole_gpu); without it the report shows them where the cache "
        "holds that space",
    )
    bench.add_argument(
        "--batch-outer",
        action="store_true",
        help="with --paper: also profile CFP's space with the batch's own dim on the outer axis "
        "of 2-D meshes where the batch does not split over every device (rows cfp_outer, "
        "cfp_outer_gpu); without it the report shows them where the cache holds that space",
    )
    bench.add_argument(
        "--batch-inner",
        action="store_true",
        help="with --paper: also profile CFP's space with the batch pinned to the inner axis "
        "of 2-D meshes, its own dim primed there where it does not split over every device "
        "(rows cfp_inner, cfp_inner_gpu); without it the report shows them where the cache "
        "holds that space",
    )
    bench.add_argument(
        "--contract-last",
        action="store_true",
        help="with --paper: also profile CFP's space with K on a contraction's last "
        "contracted dim that splits evenly, where that moves a block's K (rows cfp_klast, "
        "cfp_klast_gpu), and with --default-cap that space cut at the default cap too (rows "
        "cfp_klast_default_cap); without it the report shows them where the cache holds "
        "that space",
    )
    bench.add_argument(
        "--free-axes",
        action="store_true",
        help="with --paper: also profile CFP's space with every axis-to-role assignment on "
        "2-D meshes, M on the inner axis among them (rows cfp_free, cfp_free_gpu); "
        "without it the report shows them where the cache holds that space",
    )
    bench.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="with --paper --default-cap: also profile CFP's paper space with scattering "
        "twins (see plan --sequence-parallel), cut at analyze's default cap (rows "
        "cfp_seq_default_cap, cfp_seq_default_cap_gpu); without it the report shows them "
        "where the cache holds that space",
    )
    bench.add_argument(
        "--default-cap",
        action="store_true",
        help="with --paper and another --config-cap: also profile CFP's paper space cut at "
        "analyze's default cap (rows cfp_default_cap, cfp_default_cap_gpu) where that cuts the "
        "step otherwise, and so each of --shard-parameters and --whole-mesh given (rows "
        "cfp_zero_default_cap, cfp_whole_default_cap); without it the report shows them where "
        "the cache holds that space",
    )
    bench.add_argument(
        "--config-cap",
        default=None,
        help=f"with --paper: {CONFIG_CAP_HELP}; the report's command line says so (write it "
        "elsewhere with --out, and profile into a copy of the cache with --cache)",
    )
    bench.add_argument("--out", default=None, help="report folder (default assets/bench)")
    _add_fast_compile(bench)
    bench.add_argument(
        "--cache",
        default=None,
        help="profile cache (default: a cold one; with --paper the caches committed under "
        "assets/bench/paper/kept, with --paper --quick ~/.cache/explorer)",
    )
    bench.add_argument(
        "--sections", default="overhead,accuracy,quality,slider", help="comma-separated subset"
    )
    bench.add_argument(
        "--jobs",
        default="1",
        help="with --paper: run this many cases at once, by as many worker processes (a "
        "warm regeneration on N cores takes about 1/N of the time; cold, more memory)",
    )
    args, rest = parser.parse_known_args(argv)
    try:
        if getattr(args, "fast_compile", False):
            _use_fast_compile()
        if args.command == "calibrate":
            from explorer.platforms import calibrate_main

            return calibrate_main(rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if args.command == "bench":
            return _bench(args)
        if args.command == "profile":
            return _profile(args, list(sys.argv[1:] if argv is None else argv))
        return _plan(args)
    except ProfilingCancelled as err:
        print(f"interrupted: {err}", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print(
            "interrupted (nothing in flight was lost: profiles are committed as they finish)",
            file=sys.stderr,
        )
        return INTERRUPTED
    except ExplorerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _add_space_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that widen CFP's configuration space (`analyze`'s switches)."""
    parser.add_argument("--free-axes", action="store_true", help="2-D: free the batch axis")
    parser.add_argument("--whole-mesh", action="store_true", help=WHOLE_MESH_HELP)
    parser.add_argument("--shard-parameters", action="store_true", help=SHARD_PARAMETERS_HELP)
    parser.add_argument("--batch-outer", action="store_true", help=BATCH_OUTER_HELP)
    parser.add_argument("--batch-inner", action="store_true", help=BATCH_INNER_HELP)
    parser.add_argument("--contract-last", action="store_true", help=CONTRACT_LAST_HELP)
    parser.add_argument("--sequence-parallel", action="store_true", help=SEQUENCE_PARALLEL_HELP)


_WIDER_SWITCHES = (
    "free_axes",
    "whole_mesh",
    "shard_parameters",
    "batch_outer",
    "sequence_parallel",
    "batch_inner",
    "contract_last",
)


def _spaces_asked(args: argparse.Namespace) -> dict[str, dict[str, bool]]:
    """The spaces `plan` analyses, by name, as `analyze`'s switches: one space with every
    switch given, or with `--each-space` the paper's and each wider one given, alone.
    Refused before any work where `--each-space` has nothing to compare."""
    given = {name: bool(getattr(args, name)) for name in _WIDER_SWITCHES}
    if not args.each_space:
        return {"asked": given}
    wider = [name for name, on in given.items() if on]
    if not wider:
        raise InputError(
            "--each-space: expected at least one wider space to compare with the paper's "
            "(--free-axes, --whole-mesh, --shard-parameters, --batch-outer, --batch-inner, "
            "--contract-last or --sequence-parallel), found none"
        )
    if args.no_profile:
        raise InputError(
            "--each-space chooses by each space's predicted plan, which needs profiles: "
            "expected it without --no-profile, found both (run each space alone with "
            "--no-profile)"
        )
    off = dict.fromkeys(_WIDER_SWITCHES, False)
    return {"paper": off, **{name.replace("_", "-"): {**off, name: True} for name in wider}}


def _fastest_over_spaces(analyses: list[Any], names: list[str], budget: float | None) -> Any:
    """Each space's plan within `budget`, printed, and the one predicted fastest
    (`explorer.fastest_plan`, from the same plans)."""
    from explorer.across_spaces import fastest_of, plans_by_space

    plans = plans_by_space(analyses, budget)
    for name, analysis, plan in zip(names, analyses, plans, strict=True):
        least = analysis.frontier.min_memory
        print(
            f"space {name}: {plan.summary()}"
            if plan is not None
            else f"space {name}: no plan within the budget (its smallest needs "
            f"{least / 2**30:.3f} GiB)"
        )
    return fastest_of(analyses, plans, budget)


def _verified_fit(
    analyses: list[Any], names: list[str], step: Any, example: Any, budget: float | None
) -> Any:
    """Each space's fastest plan whose compiled step fits, printed with how it was found, and
    the one predicted fastest (the earlier space's on a tie)."""
    from explorer.compiled_fit import fastest_plan_that_fits

    fits = []
    for name, analysis in zip(names, analyses, strict=True):
        try:
            fit = fastest_plan_that_fits(analysis, step, *example, memory_budget=budget)
        except NoPlanFitsError as err:
            if len(analyses) == 1:
                raise
            print(f"space {name}: {err}")
            continue
        fits.append(fit)
        where = f"space {name}: " if len(analyses) > 1 else ""
        print(f"{where}verified: {fit.summary()}")
    if not fits:
        raise NoPlanFitsError(f"no plan of the {len(analyses)} spaces fits compiled (above)")
    return min(fits, key=lambda fit: fit.plan.predicted.time)  # min keeps the first of equals


def _fastest_on_gpu_over_spaces(
    analyses: list[Any], names: list[str], step: Any, example: Any, budget: float | None
) -> Any:
    """Each space's fastest plan that fits the GPU, printed, and the one predicted fastest
    (`explorer.across_spaces.fastest_fit_on_gpu`, from the same compiles)."""
    from explorer.across_spaces import fastest_fit_of, fits_on_gpu_by_space
    from explorer.target_memory import GpuFit

    fits = fits_on_gpu_by_space(analyses, step, *example, memory_budget=budget)
    for name, fit in zip(names, fits, strict=True):
        print(
            f"space {name}: {fit.plan.summary()}; {fit.memory.peak / 2**30:.3f} GiB on "
            f"{fit.memory.gpu} (XLA:GPU)"
            if isinstance(fit, GpuFit)
            else f"space {name}: {fit}"
        )
    return fastest_fit_of(fits)


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(models.MODELS), default="gpt")
    parser.add_argument("--preset", default="tiny", help="tiny, small or a paper-scale preset")
    parser.add_argument("--layers", type=int, default=None, help="override num_layers")


def _profile(args: argparse.Namespace, argv: list[str]) -> int:
    """`explorer profile`: profiling on the global mesh of every process of a cluster run."""
    from explorer.cluster.join import run_joined, spec_from_arguments
    from explorer.cluster.supervise import die_with_parent, in_child, report, supervise
    from explorer.mesh import mesh_spec
    from explorer.platforms import load_platform

    spec = spec_from_arguments(args)
    if spec.distributed and not in_child():
        return supervise(
            argv,
            spec,
            resume_hint=". The rows finished before are kept in process 0's cache "
            f"({args.cache}); run the same command again on every host to resume from them",
        )
    if in_child():
        die_with_parent()
    # everything that can be checked alone is checked before joining the others
    config = models.model_config(args.model, args.preset, layers=args.layers)
    mesh = mesh_spec(args.mesh)
    platform = load_platform(args.platform)
    only = tuple(entry.strip() for entry in args.only if entry.strip())
    if args.workers is not None and args.workers < 1:
        raise ExplorerError(f"--workers: expected >= 1 compile threads, found {args.workers}")
    request = {
        "command": "profile",
        "backend": args.backend,
        "model": args.model,
        "config": repr(config),
        "mesh": str(mesh),
        "free axes": args.free_axes,
        "whole mesh": args.whole_mesh,
        "shard parameters": args.shard_parameters,
        "batch outer": args.batch_outer,
        "batch inner": args.batch_inner,
        "contract last": args.contract_last,
        "sequence parallel": args.sequence_parallel,
        "platform": json.dumps(platform.to_json(), sort_keys=True, default=str),
        "only": list(only),
    }

    def joined(cluster: Any) -> None:
        report("joined", f"{cluster.processes} processes x {cluster.local_devices} devices")

    def body(cluster: Any) -> int:
        from explorer.cluster.profile import profile_on_cluster

        # built only now: building touches JAX, which must join the cluster first
        model = models.build(args.model, args.preset, layers=args.layers, abstract=True)
        start = time.perf_counter()
        result = profile_on_cluster(
            model.step,
            *model.args,
            cluster=cluster,
            mesh=mesh,
            platform=platform,
            cache=args.cache,
            only=only,
            backend=args.backend,
            free_axes=args.free_axes,
            whole_mesh=args.whole_mesh,
            shard_parameters=args.shard_parameters,
            batch_outer=args.batch_outer,
            sequence_parallel=args.sequence_parallel,
            batch_inner=args.batch_inner,
            contract_last=args.contract_last,
            workers=args.workers or (1 if args.backend == "measured" else None),
            on_program=lambda r: report("profiling", f"{r.key.segment[:24]} {r.key.config}"),
        )
        report("profiled", result.summary())
        print(result.summary())
        print(f"profiling took {time.perf_counter() - start:.1f} s")
        return 0

    return run_joined(spec, request, body, on_joined=joined)


def _config_cap(text: str | None) -> int | None:
    """`--config-cap`, checked before any work (None: the engine's default)."""
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise InputError(
            f"--config-cap: expected a whole number of configurations >= 1, found {text!r}"
        )
    return int(text)


def _plan(args: argparse.Namespace) -> int:
    from explorer.baselines import BASELINES
    from explorer.mesh import mesh_spec
    from explorer.pipeline import Analysis, analyze
    from explorer.plan import evaluate, writable_path
    from explorer.platforms import load_platform
    from explorer.segments import DEFAULT_CONFIG_CAP

    # what can be checked without the model is checked before minutes of profiling
    budget = parse_bytes(args.budget, "--budget") if args.budget is not None else None
    resolution = parse_bytes(args.memory_resolution, "--memory-resolution")
    cap = _config_cap(args.config_cap)
    out = writable_path(args.out, "--out") if args.out is not None else None
    mesh = mesh_spec(args.mesh)
    platform = load_platform(args.platform)
    spaces = _spaces_asked(args)
    if args.verify_fit and (args.gpu_memory or args.no_profile):
        other = (
            "--gpu-memory (which judges the fit by XLA:GPU's memory)"
            if args.gpu_memory
            else "--no-profile (which leaves no frontier to choose from)"
        )
        raise InputError(
            "--verify-fit compiles frontier plans until one fits by XLA:CPU's compiled step: "
            f"expected it without {other}, found both"
        )
    if args.gpu_memory:  # a platform that is no known GPU, or no compiler for it, fails now
        from explorer._jax_compat.deviceless import plugin_versions
        from explorer.platforms.gpu_targets import gpu_target

        gpu_target(platform)
        plugin_versions()
        _jax_on_cpu()
    # measured runs time real arrays; the compiled backend needs only shapes
    model = models.build(
        args.model, args.preset, layers=args.layers, abstract=args.backend != "measured"
    )
    step, example = model.step, model.args
    start = time.perf_counter()
    cancel = threading.Event()
    analyses: list[Any] = []
    with _ctrl_c_cancels(cancel):
        for switches in spaces.values():
            analyses.append(
                analyze(
                    step,
                    *example,
                    mesh=mesh,
                    free_axes=switches["free_axes"],
                    whole_mesh=switches["whole_mesh"],
                    shard_parameters=switches["shard_parameters"],
                    batch_outer=switches["batch_outer"],
                    sequence_parallel=switches["sequence_parallel"],
                    batch_inner=switches["batch_inner"],
                    contract_last=switches["contract_last"],
                    platform=platform,
                    backend=args.backend,
                    cache=None if args.no_cache else args.cache,
                    profile=not args.no_profile,
                    cancel=cancel,
                    memory_resolution=resolution,
                    config_cap=cap or DEFAULT_CONFIG_CAP,
                    traced=analyses[0].graph if analyses else None,  # traced once
                )
            )
    analysis = analyses[0]  # the only one, or the paper's: baselines are priced on it
    print(f"{args.model} {args.preset}: {model.config}")
    print(analysis.summary())
    if not isinstance(analysis, Analysis):
        print(f"analysis took {time.perf_counter() - start:.2f} s")
        return 0
    _print_best(analysis.profiles)
    print(f"frontier: {len(analysis.frontier.points)} Pareto-optimal plans")
    if approximate := analysis.frontier.approximation(format_bytes):
        print(f"  {approximate}")
    from explorer.target_memory import fastest_plan_on_gpu, target_memory

    fit = None
    if args.gpu_memory:
        fit = (
            _fastest_on_gpu_over_spaces(analyses, list(spaces), step, example, budget)
            if len(analyses) > 1
            else fastest_plan_on_gpu(analysis, step, *example, memory_budget=budget)
        )
        chosen = fit.plan
        print(
            f"chosen on the GPU: {fit.memory.peak / 2**30:.3f} GiB on {fit.memory.gpu} "
            f"(XLA:GPU; {len(fit.compiled)} frontier plans compiled for it to find this one)"
        )
    elif args.verify_fit:
        verified = _verified_fit(analyses, list(spaces), step, example, budget)
        chosen = verified.plan
    elif len(analyses) > 1:
        chosen = _fastest_over_spaces(analyses, list(spaces), budget)
    else:
        chosen = analysis.plan(memory_budget=budget)

    def on_gpu(plan: Any) -> str:
        """The plan's memory on the platform's GPU, as a column, where it was asked for (the
        chosen plan's was compiled while choosing it)."""
        if fit is None:
            return ""
        memory = fit.memory if plan is fit.plan else target_memory(plan, platform, step, *example)
        return f" {memory.peak / 2**30:10.3f}"

    print(f"chosen: {chosen.summary()}")
    gpu_column = f" {'GPU GiB':>10}" if args.gpu_memory else ""
    print(f"{'plan':10} {'predicted ms':>12} {'evaluated ms':>12} {'memory GiB':>10}{gpu_column}")
    truth = verified.truth if args.verify_fit else evaluate(chosen, step, *example)
    print(_row("cfp", chosen, truth) + on_gpu(chosen))
    for name in BASELINES:  # fsdp and alpa are priced by evaluation: predicted = evaluated
        try:
            plan = analysis.baseline(name)
            print(_row(name, plan, evaluate(plan, step, *example)) + on_gpu(plan))
        except ExplorerError as err:  # one failed baseline does not hide the others
            print(f"{name:10} failed: {err}")
    if out is not None:
        print(f"wrote {chosen.save(out)}")
    print(f"analysis took {time.perf_counter() - start:.2f} s")
    return 0


def _bench(args: argparse.Namespace) -> int:
    # before JAX starts: a checkout without the harness is refused in a second, not minutes in
    claims = _harness("claims")
    readme = _harness("cases").README  # the README quotes the repository's reports
    # the meshes go up to 8 devices (16 for the paper's two-node platform); JAX reads this
    # when it first touches a device
    flags = os.environ.get("XLA_FLAGS", "")
    if args.paper:
        flags = " ".join(
            f for f in flags.split() if "xla_force_host_platform_device_count" not in f
        )
    if "xla_force_host_platform_device_count" not in flags:
        devices = 16 if args.paper else 8
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={devices}".strip()
        )
    if args.only is not None and not args.paper:
        raise InputError("--only selects paper cases: expected it with --paper, found it alone")
    if not (args.jobs.isdigit() and int(args.jobs) >= 1):
        raise InputError(f"--jobs: expected a whole number of processes >= 1, found {args.jobs!r}")
    cap = _config_cap(args.config_cap)
    if cap is not None and not args.paper:
        raise InputError(
            "--config-cap is for paper cases: expected it with --paper, found it alone"
        )
    if int(args.jobs) > 1 and not args.paper:
        raise InputError("--jobs is for paper cases: expected it with --paper, found it alone")
    for flag, given in (
        ("--gpu-memory", args.gpu_memory),
        ("--shard-parameters", args.shard_parameters),
        ("--whole-mesh", args.whole_mesh),
        ("--batch-outer", args.batch_outer),
        ("--free-axes", args.free_axes),
        ("--batch-inner", args.batch_inner),
        ("--contract-last", args.contract_last),
        ("--default-cap", args.default_cap),
        ("--sequence-parallel", args.sequence_parallel),
    ):
        if given and not args.paper:
            raise InputError(f"{flag} is for paper cases: expected it with --paper, found it alone")
    if args.sequence_parallel and not args.default_cap:
        raise InputError(
            "--sequence-parallel: the paper grid profiles that space cut at the default cap; "
            "expected it with --default-cap, found it without"
        )
    if args.paper:
        _jax_on_cpu()  # the grid runs on virtual CPU devices
    start = time.perf_counter()
    if args.paper:
        paper = _harness("paper")
        report = paper.run_paper(
            quick=args.quick,
            only=[p.strip() for p in args.only.split(",")] if args.only is not None else None,
            out=Path(args.out) if args.out else paper.PAPER_DIR,
            readme=None if args.out else readme,
            cache=Path(args.cache).expanduser() if args.cache else None,
            gpu_memory="compile" if args.gpu_memory else "kept",
            wider={
                "cfp_zero": "compile" if args.shard_parameters else "kept",
                "cfp_whole": "compile" if args.whole_mesh else "kept",
                "cfp_outer": "compile" if args.batch_outer else "kept",
                "cfp_default_cap": "compile" if args.default_cap else "kept",
                "cfp_zero_default_cap": "compile"
                if args.default_cap and args.shard_parameters
                else "kept",
                "cfp_whole_default_cap": "compile"
                if args.default_cap and args.whole_mesh
                else "kept",
                "cfp_seq_default_cap": "compile" if args.sequence_parallel else "kept",
                "cfp_free": "compile" if args.free_axes else "kept",
                "cfp_inner": "compile" if args.batch_inner else "kept",
                "cfp_klast": "compile" if args.contract_last else "kept",
                "cfp_klast_default_cap": "compile"
                if args.contract_last and args.default_cap
                else "kept",
            },
            jobs=int(args.jobs),
            config_cap=cap,
        )
        print(f"wrote {report} in {(time.perf_counter() - start) / 60:.1f} min")
        return 0
    report = claims.run_bench(
        quick=args.quick,
        out=Path(args.out) if args.out else claims.REPORT_DIR,
        readme=None if args.out else readme,
        cache=Path(args.cache).expanduser() if args.cache else None,
        sections=[s.strip() for s in args.sections.split(",") if s.strip()],
    )
    print(f"wrote {report} in {(time.perf_counter() - start) / 60:.1f} min")
    return 0


BENCH_NEEDS_CHECKOUT = (
    "explorer bench: expected the benchmark harness (the `benchmarks` package of the "
    "repository), found no module `benchmarks` on the path nor beside this explorer ({where}): "
    "explorer is installed without its repository. The benchmark runs from a checkout of the "
    "repository: clone it, cd into it and run `python -m explorer bench` there."
)


def _harness(module: str) -> ModuleType:
    """`benchmarks.<module>`: the harness lives in the repository, outside the library. From
    the checkout this explorer was imported from (an editable install, or `python -m` at its
    root), else wherever the path finds it."""
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "benchmarks" / "__init__.py").is_file() and str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        return importlib.import_module(f"benchmarks.{module}")
    except ModuleNotFoundError as err:
        if err.name not in ("benchmarks", f"benchmarks.{module}"):
            raise  # the harness is there, something it needs is not: say that
        raise ExplorerError(BENCH_NEEDS_CHECKOUT.format(where=checkout)) from err


def _add_fast_compile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fast-compile",
        action="store_true",
        help="compile XLA:CPU's fusions with its loop emitters: profiling takes a half to a "
        "third of the time; a gather or a scatter is fused otherwise, so the embedding "
        "programs price slightly otherwise, and every profile is kept apart from those "
        "compiled without it",
    )


def _use_fast_compile() -> None:
    """Set `--fast-compile`'s XLA flag for this process and the compile workers it starts,
    which XLA reads once: before JAX starts a backend, or never."""
    from explorer._jax_compat import backends_started
    from explorer.profile.compile_flags import FAST_COMPILE_FLAG, with_fast_compile

    if backends_started():
        raise InputError(
            "--fast-compile: expected a process where JAX has not started yet (XLA reads its "
            "flags once), found JAX started; run the command in a fresh process, or set "
            f"XLA_FLAGS={FAST_COMPILE_FLAG} before importing JAX"
        )
    with_fast_compile(os.environ)


def _jax_on_cpu() -> None:
    """JAX on the CPU unless JAX_PLATFORMS says otherwise: there JAX's CUDA plugin (what
    compiles for the platforms' GPUs) loads without CUDA's libraries. JAX read its environment
    when it was imported, so the setting is made where JAX reads it now."""
    if not os.environ.get("JAX_PLATFORMS"):
        import jax

        jax.config.update("jax_platforms", "cpu")


def _row(name: str, plan: Any, truth: Any) -> str:
    return f"{name:10} {1e3 * plan.time:12.4f} {1e3 * truth.time:12.4f} {plan.memory / 2**30:10.3f}"


@contextlib.contextmanager
def _ctrl_c_cancels(cancel: threading.Event) -> Iterator[None]:
    """Within the block, Ctrl-C sets `cancel`: profiling starts no other program, keeps what
    finished in the cache and raises `ProfilingCancelled` (`main` exits 130 with one line).
    A second Ctrl-C quits at once: every finished profile is already committed."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may take signals; an embedding caller keeps its own
        return

    def on_interrupt(signum: int, frame: Any) -> None:
        if cancel.is_set():
            print("interrupted again: quitting now", file=sys.stderr, flush=True)
            os._exit(INTERRUPTED)  # the programs in flight are all that is dropped
        cancel.set()
        print(
            "\ninterrupting: finishing the programs compiling now, starting no other "
            "(Ctrl-C again to quit at once)",
            file=sys.stderr,
            flush=True,
        )

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
