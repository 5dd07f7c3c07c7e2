"""One paper case in a process of its own, for `run_paper(jobs=N)`.

A warm case is mostly Python in one process (tracing the step, placing it, reading its
programs back), so one process keeps one core busy; N processes take N cases at once. Each
runs `run_case` on a `PaperRun` of its own, with its own connections to the same caches
(SQLite's locks keep them consistent), and hands back what the parent's report needs
(`CaseResult`). Started with `python -m benchmarks.paper_worker REQUEST RESULT`: pickled
`CaseRequest` in, pickled `CaseResult` out (a multiprocessing child would re-run the
parent's `__main__`, which is the command line itself).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.paper_grid import PaperCase, PaperRun


@dataclass(frozen=True, slots=True)
class CaseRequest:
    """What a worker needs to run one case as the parent's run would."""

    quick: bool
    case: PaperCase
    out: Path
    cache: Path
    gpu_memory: str
    wider: tuple[tuple[str, str], ...]
    config_cap: int | None = None


@dataclass(frozen=True, slots=True)
class CaseResult:
    """What one case added to its run: rows, explanations, outcome and cache hits."""

    rows: tuple[dict[str, Any], ...]
    losses: tuple[dict[str, Any], ...]
    done: tuple[str, ...]
    skipped: tuple[str, ...]
    failures: tuple[str, ...]
    evaluations_kept: int
    ilp_answers_kept: int
    frontiers_kept: int
    gpu_memories_kept: int

    @staticmethod
    def of(run: PaperRun) -> CaseResult:
        return CaseResult(
            rows=tuple(run.rows),
            losses=tuple(run.losses),
            done=tuple(run.done),
            skipped=tuple(run.skipped),
            failures=tuple(run.failures),
            evaluations_kept=run.evaluations_kept,
            ilp_answers_kept=run.ilp_answers_kept,
            frontiers_kept=run.frontiers_kept,
            gpu_memories_kept=run.gpu_memories_kept,
        )

    def add_to(self, run: PaperRun) -> None:
        run.rows += self.rows
        run.losses += self.losses
        run.done += self.done
        run.skipped += self.skipped
        run.failures += self.failures
        run.evaluations_kept += self.evaluations_kept
        run.ilp_answers_kept += self.ilp_answers_kept
        run.frontiers_kept += self.frontiers_kept
        run.gpu_memories_kept += self.gpu_memories_kept


def start(request: CaseRequest, folder: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    """A worker running `request`, and the file its result will be in (`name`, unique in
    `folder`, names its files). Its output goes to this process' own (the case's progress
    lines)."""
    asked, answer = folder / f"{name}.request", folder / f"{name}.result"
    asked.write_bytes(pickle.dumps(request))
    checkout = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (checkout, env.get("PYTHONPATH")) if p)
    env.setdefault("JAX_PLATFORMS", "cpu")  # the grid runs on virtual CPU devices
    command = [sys.executable, "-m", "benchmarks.paper_worker", str(asked), str(answer)]
    return subprocess.Popen(command, env=env), answer


def main(argv: list[str]) -> int:
    from benchmarks.paper import count_hits, open_stores, run_case

    # run as `-m`, this file is `__main__`: the result's class is pickled by its importable
    # name, which the parent unpickles
    from benchmarks.paper_worker import CaseResult as Result

    asked, answer = Path(argv[0]), Path(argv[1])
    request: CaseRequest = pickle.loads(asked.read_bytes())
    run = PaperRun(
        request.quick,
        (request.case,),
        request.out,
        request.cache,
        lambda line: print(line, flush=True),
    )
    run.gpu_memory, run.wider = request.gpu_memory, dict(request.wider)
    run.config_cap = request.config_cap
    with open_stores(run) as stores:
        try:
            run_case(run, request.case)
        except Exception as err:
            run.failed(request.case.label, err)
        count_hits(run, stores)
    answer.write_bytes(pickle.dumps(Result.of(run)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
