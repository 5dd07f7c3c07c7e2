"""What the paper grid's cases a run left out would cost to run.

The grid is too costly to run whole on this machine, so a report of part of it says, for each
case left out, how many programs its paper space has and how many of them the profile cache
lacks: traced and segmented, nothing compiled (a few seconds a case). The report prices them
at the compile seconds per program of the cases it ran (`pending_table`, under "Not run").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.paper_grid import PaperCase
from benchmarks.paper_steps import StepTraces
from explorer.mesh import mesh_spec


@dataclass(frozen=True, slots=True)
class PendingCase:
    """One case of the grid a run did not run: its paper space's programs."""

    label: str
    model: str  # the preset, as the report's rows name it
    devices: int
    batch: int
    programs: int  # distinct programs of the paper space (`programs_to_compile`, no cache)
    to_compile: int  # those the profile cache lacks: what running it would compile
    error: str = ""  # why it could not be counted (then both counts are 0)

    @staticmethod
    def of(case: PaperCase, programs: int = 0, to_compile: int = 0, error: str = "") -> PendingCase:
        return PendingCase(
            case.label, case.preset, math.prod(case.mesh), case.batch, programs, to_compile, error
        )

    @property
    def batch_splits(self) -> bool:
        """The batch splits over every device (else the layers take far more programs)."""
        return self.batch % self.devices == 0


def count_pending(
    case: PaperCase,
    cache: Path,
    config_cap: int | None = None,
    steps: StepTraces | None = None,
) -> PendingCase:
    """`case`'s programs, and those `cache` lacks, found without compiling any (segments
    cut at `config_cap` configurations, else at `analyze`'s default). `steps` keeps the
    step's trace for the next case of it (a case of a step traced before reuses it)."""
    from explorer.layouts import instance_dependencies
    from explorer.pipeline import analyze
    from explorer.platforms import load_platform
    from explorer.profile.cache import ProfileCache
    from explorer.profile.runner import programs_to_compile
    from explorer.segments import DEFAULT_CONFIG_CAP

    try:
        platform = load_platform(case.platform)
        traced = (steps or StepTraces()).of(case)
        cap = config_cap or DEFAULT_CONFIG_CAP
        space = analyze(
            traced.step,
            *traced.args,
            mesh=case.mesh,
            platform=platform,
            profile=False,
            progress=False,
            config_cap=cap,
            traced=traced.graph,
        )
        found = (space.graph, space.block_analysis, space.segments, space.mesh)
        # placing the step to find them takes seconds at full depth: once for both counts
        known = instance_dependencies(*found)

        def count(store: ProfileCache | None) -> int:
            return programs_to_compile(
                *found, platform=platform, cache=store, config_cap=cap, dependencies=known
            )

        with ProfileCache(cache) as kept:
            return PendingCase.of(case, count(None), count(kept))
    except Exception as err:  # said in the report; the other cases are counted
        return PendingCase.of(case, error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")


def seconds_per_program(done: pd.DataFrame, pending: PendingCase) -> tuple[float, str]:
    """The profiling seconds per program of the cases run (`done`: one CFP row per case) that
    best stand for `pending`: the same model on as many devices, else the same model, else
    every case; and which those were."""
    if done.empty:
        return math.nan, "no case run"
    devices = done["mesh"].astype(str).map(lambda mesh: mesh_spec(mesh).size)
    same_model = done["model"] == pending.model
    choices = (
        (
            same_model & (devices == pending.devices),
            f"{pending.model} on {pending.devices} devices",
        ),
        (same_model, pending.model),
        (pd.Series(True, index=done.index), "every case run"),
    )
    for chosen, basis in choices:
        picked = done[chosen]
        if picked["programs"].sum() > 0:
            rate = float(picked["profiling_s"].sum() / picked["programs"].sum())
            return rate, f"{basis}, {len(picked)} {'case' if len(picked) == 1 else 'cases'}"
    return math.nan, "no case run"


def pending_table(done: pd.DataFrame, pending: Sequence[PendingCase]) -> pd.DataFrame:
    """Per case left out: its programs, those not kept, and their profiling in CPU-hours cold
    and from the cache as it is, at `seconds_per_program`."""
    rows: list[dict[str, Any]] = []
    for case in pending:
        if case.error:  # its cells stay empty; the note says why
            rows.append({"case": case.label, "note": f"not counted: {case.error}"})
            continue
        rate, basis = seconds_per_program(done, case)
        rows.append(
            {
                "case": case.label,
                "batch splits every device": case.batch_splits,
                "programs": case.programs,
                "not kept": case.to_compile,
                "CPU-h cold": case.programs * rate / 3600,
                "CPU-h now": case.to_compile * rate / 3600,
                "s per program, from": f"{rate:.1f} ({basis})",
            }
        )
    return pd.DataFrame(rows)
