"""The explorer against one real GPU: what its figures are worth where no cluster is at hand.

On a machine with one GPU (mesh 1, so every plan is the step itself and communication is
nil), for paper-scale models cut to a few layers:

- `measured`: the composed profiles of the measured backend (each segment run alone on the
  GPU) against the whole step run on the GPU: does the sum of the parts time the step?
- `compiled`: the compile-only backend on the same GPU (XLA:GPU's optimised HLO, cost and
  memory analyses priced on the platform's roofline) against the same measured step;
- `memory`: the whole step's memory as XLA:GPU's memory analysis gives it, with and without
  rematerialisation, and (with `--peaks`) the GPU allocator's peak while it runs;
- `overhead`: what a run of a program that does next to nothing takes (one input, and as
  many inputs as a layer program has): the launch every segment program pays and a whole
  step pays once. The measured backend takes the one-input time off every time since
  `MEASURED_VERSION` launch-1; before, composed profiles of many short programs overcounted it.

With `--predict-only` the same cases run compile-only on this machine's devices (XLA:CPU), as
a user plans on a laptop: their predictions are compared with the GPU's truth afterwards.
Results are appended to `OUT/gpu_check.jsonl` after every phase, so a stopped run keeps them.

    python benchmarks/gpu_check.py --out DIR                  # on the GPU machine
    XLA_FLAGS=--xla_force_host_platform_device_count=1 \
        python benchmarks/gpu_check.py --out DIR --predict-only   # here, 1 CPU device
    python benchmarks/gpu_check.py --summarise DIR            # tables from DIR/*.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = (  # (model, preset, layers, batch): one device's share of the paper grid's steps
    ("gpt", "gpt_2_6b_bf16", 2, 8),
    ("bert", "bert_large_bf16", 4, 8),
    ("llama", "llama_7b_bf16", 2, 2),
    # a dense layer and a MoE layer (every other layer is MoE): the gate, dispatch, experts
    # and combine cut into several short programs, where composing parts weighs most
    ("moe", "moe_7_1b_bf16", 2, 4),
)
# a strategy that splits no weight: on one device every strategy is the same program, and
# profiling one per segment keeps the run inside minutes
_UNSPLIT = {"M@x", "E@x", "none", "-"}

_PEAK_CHILD = r"""
import json, sys
import jax
sys.path.insert(0, sys.argv[1])
from explorer.models import build
model, preset, layers, batch, remat = json.loads(sys.argv[2])
built = build(model, preset, layers=layers, batch=batch, remat=remat)
step = jax.jit(built.step, donate_argnums=(0, 1))
jax.block_until_ready(built.args)
before = jax.devices()[0].memory_stats()["bytes_in_use"]
jax.block_until_ready(step(*built.args))
stats = jax.devices()[0].memory_stats()
print(json.dumps({"inputs": before, "peak": stats["peak_bytes_in_use"]}))
"""


class FirstUnsplit:
    """`analyze`'s `only`: per segment, the first configuration whose every strategy splits
    no weight (on one device they are all the same program), and per boundary those that
    join the segments' chosen configurations (segments are offered first). Two types can
    share a label (a dense layer's part 2 and a MoE layer's), so a segment's choice is kept
    per label and block count; and a MoE layer's expert part starts with `E@x` where the
    part before it ends with `M@x`, so the first unsplit boundary would join nothing.
    (On one device every strategy is 1-D, so a comma separates blocks: "M@x,E@x" is two.)"""

    def __init__(self) -> None:
        self.segments: dict[tuple[str, int], str] = {}  # (label, blocks) -> configuration
        self.boundaries: dict[str, str] = {}

    def __call__(self, kind: str, label: str, config: str) -> bool:
        tokens = [t for t in re.split(r"->|[, ]+", config) if t]
        if not all(token in _UNSPLIT for token in tokens):
            return False
        if kind != "reshard":
            return self.segments.setdefault((label, _blocks(config)), config) == config
        before, _, after = label.partition("->")
        lasts = {_end(c, -1) for (name, _), c in self.segments.items() if name == before}
        firsts = {_end(c, 0) for (name, _), c in self.segments.items() if name == after}
        if lasts and firsts:
            source, _, target = config.partition("->")
            return source in lasts and target in firsts
        return self.boundaries.setdefault(label, config) == config


def _blocks(config: str) -> int:
    """How many blocks a segment configuration names (its own part, before any context)."""
    from explorer.profile.runner import own_config

    return len(own_config(config).split(","))


def _end(config: str, position: int) -> str:
    """A segment configuration's first or last strategy, as a boundary's configuration
    names it (a segment without blocks, "-", is "none" there)."""
    return "none" if config == "-" else config.split(",")[position]


def default_platform() -> str:
    import jax

    kind = jax.devices()[0].device_kind
    return "h200-sxm-8" if "H200" in kind else "h100-sxm-8"


def step_memory(case: Case, remat: bool) -> dict[str, Any]:
    """XLA's memory analysis of the whole step on this process's first device."""
    import jax

    from explorer._jax_compat import read_executable
    from explorer.models import build

    model, preset, layers, batch = case
    built = build(model, preset, layers=layers, batch=batch, remat=remat, abstract=True)
    start = time.perf_counter()
    compiled = jax.jit(built.step, donate_argnums=(0, 1)).lower(*built.args).compile()
    memory = read_executable(compiled).memory
    if memory is None:
        raise RuntimeError(f"the {jax.default_backend()} compiler gave no memory analysis")
    return _memory_fields(memory, start)


def _memory_fields(memory: tuple[int, int, int, int], start: float) -> dict[str, Any]:
    """A memory analysis as a row's fields, with the seconds since `start`."""
    arguments, outputs, temporaries, aliased = memory
    return {
        "arguments": arguments,
        "outputs": outputs,
        "temporaries": temporaries,
        "aliased": aliased,
        "peak": arguments + outputs + temporaries - aliased,
        "compile_s": time.perf_counter() - start,
    }


def target_step_memory(case: Case, remat: bool, platform: str) -> dict[str, Any]:
    """XLA:GPU's memory analysis of the whole step compiled here, without a GPU, for the
    platform's GPU: the compiler and target configuration `explorer.target_memory` uses."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from explorer._jax_compat import read_executable
    from explorer._jax_compat.deviceless import deviceless_gpus, plugin_versions
    from explorer.mesh import make_mesh, mesh_spec
    from explorer.models import build
    from explorer.platforms import load_platform
    from explorer.platforms.gpu_targets import target_config
    from explorer.target_memory import TARGET_COMPILE_OPTIONS

    model, preset, layers, batch = case
    target = load_platform(platform)
    cudnn, cuda = plugin_versions()
    config = target_config(target, cudnn=cudnn, cuda=cuda)
    mesh = make_mesh(mesh_spec((1,)), deviceless_gpus(config, 1, 1))
    one = NamedSharding(mesh, PartitionSpec())
    built = build(model, preset, layers=layers, batch=batch, remat=remat, abstract=True)
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), built.args)
    start = time.perf_counter()
    lowered = jax.jit(built.step, donate_argnums=(0, 1)).lower(*args)
    memory = read_executable(lowered.compile(TARGET_COMPILE_OPTIONS)).memory
    assert memory is not None  # XLA:GPU always analyses memory
    device = f"cpu, compiled for {target.device.name}"
    return {"device": device, **_memory_fields(memory, start)}


def allocator_peak(case: Case, remat: bool) -> dict[str, Any]:
    """The GPU allocator's peak over one run of the step, in a fresh process (the peak
    cannot be reset in this one)."""
    fields = json.dumps([*case, remat])
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, root, fields],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the step's run exited with {done.returncode}: {last}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


Case = tuple[str, str, int, int]

# inputs of the near-empty programs: one, and about as many as a layer program takes (its
# parameters, their optimizer moments and the activations it reads)
OVERHEAD_INPUTS = (1, 64)


def dispatch_overhead(platform: str) -> dict[str, Any]:
    """What a run of a near-empty program takes (each input plus one, 8 elements), launch
    included, timed as a segment program is (`profile.backends`): with one input that is the
    launch the measured backend takes off every time (`launch_time`)."""
    import jax
    import jax.numpy as jnp

    from explorer.mesh import mesh_spec
    from explorer.platforms import load_platform
    from explorer.profile.backends import launch_time, measure

    device = jax.devices()[0]
    one = jax.sharding.SingleDeviceSharding(device)
    target = load_platform(platform)
    fields: dict[str, Any] = {}
    for count in OVERHEAD_INPUTS:
        inputs = tuple(jax.ShapeDtypeStruct((8,), jnp.bfloat16, sharding=one) for _ in range(count))
        compiled = jax.jit(lambda *xs: tuple(x + 1 for x in xs)).lower(*inputs).compile()
        profile = measure(compiled, inputs, target, mesh_spec((1,)))
        fields[f"inputs_{count}_s"] = profile.t_comm + profile.t_comp + launch_time((device,))
    return fields


def plan_against_truth(case: Case, backend: str, platform: str) -> dict[str, Any]:
    """Profile the unsplit configurations with `backend`, compose the plan, and evaluate the
    whole step with the same backend (measured: timed here; compiled: priced from one
    compile)."""
    import explorer as ex
    from explorer.models import build
    from explorer.plan import evaluate_on

    model, preset, layers, batch = case
    built = build(model, preset, layers=layers, batch=batch, abstract=True)
    start = time.perf_counter()
    analysis = ex.analyze(
        built.step,
        *built.args,
        mesh=(1,),
        platform=platform,
        backend=backend,
        cache=None,
        progress=False,
        only=FirstUnsplit(),
    )
    profiled_s = time.perf_counter() - start
    plan = analysis.plan()
    evaluation = evaluate_on(plan, [platform], built.step, *built.args, backend=backend)[platform]
    rows = analysis.profiles
    rows = rows[rows["status"] == "ok"]
    return {
        "programs": len(rows),
        "instances": len(analysis.cost_model.labels),
        "profiling_s": profiled_s,
        "predicted_s": plan.time,
        "predicted_memory": plan.memory,
        "evaluated_s": evaluation.time,
        "evaluated_memory": evaluation.memory,
        "segments": [
            {"label": r["label"], "config": r["config"], "t_comp": r["t_comp"]}
            for r in rows.to_dict("records")
            if r["kind"] == "segment"
        ],
    }


def _rows(folder: Path) -> list[dict[str, Any]]:
    rows = []

    def by_name(path: Path) -> list[object]:  # h200-run9 before h200-run10
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.stem)]

    for path in sorted(folder.glob("*.jsonl"), key=by_name):
        for line in path.read_text().splitlines():
            rows.append({**json.loads(line), "run": path.stem})
    return rows


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f}"


def _error(predicted: float, truth: float) -> str:
    return f"{(predicted - truth) / truth * 100:+.1f} %"


def _overhead_table(gpu: list[dict[str, Any]]) -> list[str]:
    """Each measured row after an `overhead` row of its run and case, from before the measured
    backend took the launch off (`MEASURED_VERSION`): the composed profiles less what all but
    one of its segment instances pay again. That is the one-input program's
    time (a launch and a wait); the cost per input (the 64-input program's extra) is paid once
    per input by the step and by the parts alike, so it is not subtracted."""
    few, many = OVERHEAD_INPUTS[0], OVERHEAD_INPUTS[-1]
    out = [
        "",
        "Near-empty programs, timed as a segment program is, and the composed profiles less",
        f"(instances - 1) times the {few}-input one (what the whole step pays once):",
        "",
        f"| run | model | {few} input us | {many} inputs us | instances "
        "| composed less overhead ms | step ms | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    overhead: dict[tuple[str, str], dict[str, Any]] = {}
    shown = 0
    for r in gpu:
        if r["phase"] == "overhead":
            overhead[(r["run"], r["preset"])] = r
            continue
        before = overhead.get((r["run"], r["preset"]))
        launch_free = "measured_version" in r  # launch-1 on: the launch is already taken off
        if r["phase"] != "measured" or before is None or "instances" not in r or launch_free:
            continue
        each = before[f"inputs_{few}_s"]
        composed = r["predicted_s"] - (r["instances"] - 1) * each
        out.append(
            f"| {r['run']} | {r['preset']} | {each * 1e6:.0f} "
            f"| {before[f'inputs_{many}_s'] * 1e6:.0f} | {r['instances']} | {_ms(composed)} "
            f"| {_ms(r['evaluated_s'])} | {_error(composed, r['evaluated_s'])} |"
        )
        shown += 1
    return out if shown else []


def summarise(folder: Path) -> str:
    """Markdown tables of every run kept in `folder` (one `.jsonl` file a run)."""
    rows = [r for r in _rows(folder) if "error" not in r]
    gpu = [r for r in rows if r["backend"] == "gpu"]
    out = [
        "Measured backend: the composed profiles against the whole step, both timed on the GPU",
        "(launch taken off: every time less a near-empty program's, since `MEASURED_VERSION`",
        "launch-1).",
        "",
    ]
    out += [
        "| run | model | launch taken off | composed ms | step ms | error "
        "| same program, slowest / fastest |"
    ]
    out += ["|---|---|---|---|---|---|---|"]
    for r in (r for r in gpu if r["phase"] == "measured"):
        # one program per label and block count (a dense and a MoE layer's part 2 share
        # a label; on one device the other blocks' strategies after "|" change nothing)
        by_program: dict[tuple[str, int], list[float]] = {}
        for segment in r["segments"]:
            program = (segment["label"], _blocks(segment["config"]))
            by_program.setdefault(program, []).append(segment["t_comp"])
        spread = max(max(v) / min(v) for v in by_program.values() if min(v) > 0)
        out.append(
            f"| {r['run']} | {r['preset']} | {'yes' if 'measured_version' in r else 'no'} "
            f"| {_ms(r['predicted_s'])} | {_ms(r['evaluated_s'])} "
            f"| {_error(r['predicted_s'], r['evaluated_s'])} | {spread:.2f}x |"
        )
    out += _overhead_table(gpu)
    truth: dict[str, list[float]] = {}
    for r in (r for r in gpu if r["phase"] == "measured"):
        truth.setdefault(r["preset"], []).append(r["evaluated_s"])
    out += [
        "",
        "Compiled backend (roofline at the platform's peaks) against the step timed on the GPU",
    ]
    out += ["(the median of every measured run of it):", ""]
    out += [
        "| run | device | JAX | model | predicted ms | its step, compiled, ms | timed ms | error |"
    ]
    out += ["|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["phase"] == "compiled" and r["preset"] in truth):
        timed = statistics.median(truth[r["preset"]])
        out.append(
            f"| {r['run']} | {r['device']} | {r['jax']} | {r['preset']} | {_ms(r['predicted_s'])} "
            f"| {_ms(r['evaluated_s'])} | {_ms(timed)} | {_error(r['predicted_s'], timed)} |"
        )
    out += ["", "Memory of the whole step (GB, 10^9 bytes): XLA's memory analysis on each device,"]
    out += ["and the GPU allocator's peak over one run where it was taken:", ""]
    out += ["| run | device | JAX | model | step | step, remat | allocator | allocator, remat |"]
    out += ["|---|---|---|---|---|---|---|---|"]
    keyed = {(r["run"], r["preset"], r["phase"]): r for r in rows}
    for run, preset in dict.fromkeys(
        (r["run"], r["preset"]) for r in rows if "memory" in r["phase"]
    ):
        cells = []
        for phase in ("memory", "allocator"):
            for remat in (False, True):
                found = keyed.get((run, preset, f"{phase} remat={remat}")) or keyed.get(
                    (run, preset, f"target {phase} remat={remat}")
                )
                cells.append(_gb(found["peak"]) if found else "")
        first = (
            keyed.get((run, preset, "memory remat=False"))
            or keyed[(run, preset, "target memory remat=False")]
        )
        out.append(
            f"| {run} | {first['device']} | {first['jax']} | {preset} | " + " | ".join(cells) + " |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--summarise", type=Path, help="print the tables of a folder of runs")
    parser.add_argument("--predict-only", action="store_true")
    parser.add_argument("--platform", default=None, help="default: by the GPU's name")
    parser.add_argument("--cases", default="", help="comma-separated models (default: all)")
    parser.add_argument("--peaks", default="", help="comma-separated models to run for peaks")
    parser.add_argument("--phases", default="", help="comma-separated: measured, compiled, ...")
    parser.add_argument("--smoke", action="store_true", help="the tiny presets: a dry run")
    args = parser.parse_args()
    if args.summarise is not None:
        print(summarise(args.summarise), end="")
        return
    if args.out is None:
        parser.error("--out is required (or --summarise)")
    import jax

    args.out.mkdir(parents=True, exist_ok=True)
    sink = args.out / "gpu_check.jsonl"
    device = jax.devices()[0]
    platform = args.platform or default_platform()
    from explorer.profile.backends import MEASURED_VERSION

    where = {
        "device": device.device_kind,
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "platform": platform,
        "measured_version": MEASURED_VERSION,
    }
    print(json.dumps(where), flush=True)
    wanted = {m for m in args.cases.split(",") if m}
    peaks = {m for m in args.peaks.split(",") if m}

    def record(case: Case, phase: str, fields: dict[str, Any]) -> None:
        row = {**where, "model": case[0], "preset": case[1], "layers": case[2], "batch": case[3]}
        row |= {"phase": phase, **fields}
        with sink.open("a") as out:
            out.write(json.dumps(row) + "\n")
        brief = {k: v for k, v in fields.items() if k != "segments"}
        print(f"{case[1]} {phase}: {json.dumps(brief)}", flush=True)

    cases: tuple[Case, ...] = tuple((m, "tiny", 2, 8) for m, *_ in CASES) if args.smoke else CASES
    for case in cases:
        if wanted and case[0] not in wanted:
            continue
        phases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            (backend, functools.partial(plan_against_truth, case, backend, platform))
            for backend in (("compiled",) if args.predict_only else ("measured", "compiled"))
        ]
        if not args.predict_only:
            phases.insert(0, ("overhead", functools.partial(dispatch_overhead, platform)))
        phases += [
            (f"memory remat={remat}", functools.partial(step_memory, case, remat))
            for remat in (False, True)
        ]
        phases += [
            (
                f"target memory remat={remat}",
                functools.partial(target_step_memory, case, remat, platform),
            )
            for remat in (False, True)
        ]
        if case[0] in peaks and not args.predict_only:
            phases += [
                (f"allocator remat={remat}", functools.partial(allocator_peak, case, remat))
                for remat in (False, True)
            ]
        chosen = {p for p in args.phases.split(",") if p}
        phases = [(n, r) for n, r in phases if not chosen or n.split()[0] in chosen]
        for phase, run in phases:
            start = time.perf_counter()
            try:
                fields = run()
            except Exception as err:
                fields = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
            record(case, phase, {**fields, "wall_s": time.perf_counter() - start})


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
