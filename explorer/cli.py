"""Command line: `python -m explorer plan ...`."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

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
    args = parser.parse_args(argv)
    try:
        return _plan(args)
    except ExplorerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _plan(args: argparse.Namespace) -> int:
    from explorer.pipeline import analyze

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
    step, example = model_fn(config, abstract=True)
    start = time.perf_counter()
    analysis = analyze(step, *example, mesh=args.mesh, free_axes=args.free_axes)
    print(f"{args.model} {args.preset}: {config}")
    print(analysis.summary())
    print(f"analysis took {time.perf_counter() - start:.2f} s")
    print(
        "note: profiling, cost composition and the solver are later stages of the pipeline; "
        "this build stops after segmentation."
    )
    return 0


_PRESETS = {
    "tiny", "small", "gpt_2_6b", "gpt_6_7b", "llama_7b", "moe_7_1b", "bert_large",
}  # fmt: skip
