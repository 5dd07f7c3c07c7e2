"""`python -m explorer bench [--quick]`: the claims that matter to users, measured in one run.

Each section is a module of this package:

1. Accuracy (`accuracy`): the composed prediction (profiles + Eq. 8, memory following the
   step's order) against the whole step compiled under the same plan (`evaluate_on`), for
   frontier plans and random configurations; in `measured` mode the whole step is run and
   timed on CPU devices.
2. Plan quality (`quality`): the CFP plan against DP, Megatron, FSDP and the Alpa-style ILP,
   all judged by the same whole-program truth, per model, mesh, batch and platform;
   out-of-memory flagged against the platform's device memory.
3. Search overhead against depth (`overhead`): trace, blocks, segments, programs profiled
   (cold cache), profiling, solving; the Alpa-style ILP's size and solve time beside it.
4. Interactivity (`slider`): kernel-side latency of one memory-budget slider step.

Everything lands in CSV files, PNG plots (matplotlib, no browser) and `report.md` under the
output folder (`report`), and the README's results section is rewritten from the same tables.
This is a measuring harness: the overhead section times the stages one by one, which is why it
calls them itself rather than through `analyze`.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.accuracy import accuracy
from benchmarks.cases import REPORT_DIR, SECTIONS, Run, full_settings, quick_settings
from benchmarks.overhead import overhead
from benchmarks.quality import quality
from benchmarks.report import write_report
from benchmarks.slider import slider
from explorer.errors import ExplorerError


def run_bench(
    quick: bool,
    *,
    out: Path = REPORT_DIR,
    cache: Path | None = None,
    sections: Sequence[str] = SECTIONS,
    log: Callable[[str], None] = print,
    readme: Path | None = None,
) -> Path:
    """Run the benchmark and write the report (and `readme`'s results section, when given);
    returns the report's path."""
    settings = quick_settings() if quick else full_settings()
    steps = {"overhead": overhead, "accuracy": accuracy, "quality": quality, "slider": slider}
    unknown = set(sections) - set(steps)
    if unknown:
        raise ExplorerError(
            f"bench sections: expected some of {', '.join(steps)}, found {sorted(unknown)}"
        )
    with tempfile.TemporaryDirectory() as scratch:
        # a cold profile cache unless one is given: the run's times include profiling
        run = Run(settings, out, cache or Path(scratch) / "bench.sqlite", log)
        run.requested = tuple(s for s in SECTIONS if s in sections)
        start = run.started
        for name, measure in steps.items():
            if name in sections:
                with run.section(name):
                    measure(run)
                # after every section, so that a long run stopped early keeps what it measured
                run.checkpoint()
        return write_report(run, time.perf_counter() - start, readme)
