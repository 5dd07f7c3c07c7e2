"""Paper cases run by worker processes, for `run_paper(jobs=N)`.

A warm case is mostly Python in one process (tracing the step, placing it, reading its
programs back), so one process keeps one core busy; N processes take N cases at once. A
worker runs task after task (`Task`: run a case, or count the programs of one the run left
out), each on a `PaperRun` of its own with its own connections to the same caches (SQLite's
locks keep them consistent), and hands back what the parent's report needs (`CaseResult`).
It keeps the last step it traced (`paper_steps`), and the parent (`WorkerPool`) gives each
worker the cases of the step it holds first: a step's cases on several meshes are traced
once, and no process is started per case.

A worker is `python -m benchmarks.paper_worker SETTINGS`: it reads task names on its standard
input, one a line, each naming a pickled `Task` in SETTINGS' folder, and writes each answer
beside it, pickled and renamed into place once whole. (A multiprocessing child would re-run
the parent's `__main__`, which is the command line itself.)
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks.paper_grid import PaperCase, PaperRun
from benchmarks.paper_steps import StepTraces


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What every task of a worker runs under, as the parent's run would."""

    quick: bool
    out: Path
    cache: Path
    gpu_memory: str
    wider: tuple[tuple[str, str], ...]
    config_cap: int | None = None

    @staticmethod
    def of(run: PaperRun) -> WorkerSettings:
        wider = tuple(sorted(run.wider.items()))
        return WorkerSettings(run.quick, run.out, run.cache, run.gpu_memory, wider, run.config_cap)


@dataclass(frozen=True, slots=True)
class Task:
    """Run `case` (`count=False`), or count its programs without compiling any."""

    case: PaperCase
    count: bool = False


@dataclass(frozen=True, slots=True)
class CaseResult:
    """What one task added to its run: rows, explanations, outcome, cache hits, the programs
    of a case counted, and whether it traced its step."""

    rows: tuple[dict[str, Any], ...]
    losses: tuple[dict[str, Any], ...]
    done: tuple[str, ...]
    skipped: tuple[str, ...]
    failures: tuple[str, ...]
    evaluations_kept: int
    ilp_answers_kept: int
    frontiers_kept: int
    gpu_memories_kept: int
    pending: tuple[Any, ...] = ()  # `PendingCase`s
    steps_traced: int = 0
    computed: tuple[tuple[str, int], ...] = ()  # `PaperRun.computed`

    @staticmethod
    def of(run: PaperRun, steps_traced: int) -> CaseResult:
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
            pending=tuple(run.pending),
            steps_traced=steps_traced,
            computed=tuple(run.computed.items()),
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
        run.pending += self.pending
        run.workers_traced += self.steps_traced
        run.computed.update(dict(self.computed))


@dataclass(slots=True)
class _Worker:
    """One worker process, the step it traced last and the task it runs (its index in the
    `WorkerPool.run` call, and the file its answer will be in)."""

    process: subprocess.Popen[bytes]
    number: int  # names its files
    holds: tuple[Any, ...] | None = None
    running: tuple[int, Path] | None = None
    tasks: int = 0  # given so far


class WorkerPool:
    """`jobs` worker processes under `settings`, their files in `folder`; a worker that dies
    is replaced for the tasks still waiting. Use it as a context manager: on leaving, the
    workers are told to stop (or killed, if the block raised)."""

    def __init__(self, settings: WorkerSettings, jobs: int, folder: Path) -> None:
        self.settings, self.jobs, self.folder = settings, jobs, folder
        self._workers: list[_Worker] = []
        self._started = 0  # workers started so far: names their files

    def __enter__(self) -> WorkerPool:
        (self.folder / "settings").write_bytes(pickle.dumps(self.settings))
        self._workers = [self._start() for _ in range(self.jobs)]
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        for worker in self._workers:
            if kind is None and worker.process.poll() is None:
                _stdin(worker).close()  # end of input: the worker exits
            else:
                worker.process.kill()
        for worker in self._workers:
            try:
                worker.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()

    def _start(self) -> _Worker:
        """A worker process; its output goes to this process' own (the cases' progress)."""
        self._started += 1
        checkout = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (checkout, env.get("PYTHONPATH")) if p)
        env.setdefault("JAX_PLATFORMS", "cpu")  # the grid runs on virtual CPU devices
        settings = str(self.folder / "settings")
        command = [sys.executable, "-m", "benchmarks.paper_worker", settings]
        return _Worker(subprocess.Popen(command, env=env, stdin=subprocess.PIPE), self._started)

    def run(
        self,
        tasks: Sequence[Task],
        joined: Callable[[int, CaseResult | str], None],
        *,
        started: Callable[[Task], None] = lambda task: None,
    ) -> None:
        """Run every task; `joined(i, outcome)` is called for each task in their order, once
        it and those before it are done (`outcome`: its result, or why it has none).
        `started(task)` is called as a worker takes it."""
        waiting = list(range(len(tasks)))
        finished: dict[int, CaseResult | str] = {}
        joined_so_far = 0
        while joined_so_far < len(tasks):
            for slot in range(len(self._workers)):
                self._collect(slot, finished, restart=bool(waiting))
                worker = self._workers[slot]
                if waiting and worker.running is None:
                    index = self._choose(worker, tasks, waiting)
                    waiting.remove(index)
                    started(tasks[index])
                    self._give(worker, index, tasks[index])
            while joined_so_far in finished:
                joined(joined_so_far, finished.pop(joined_so_far))
                joined_so_far += 1
            if any(worker.running is not None for worker in self._workers):
                time.sleep(0.2)

    def _collect(self, slot: int, finished: dict[int, CaseResult | str], restart: bool) -> None:
        """The outcome of the task the worker in `slot` runs, into `finished` once it has
        one; a worker that died is replaced where `restart` says tasks still wait."""
        worker = self._workers[slot]
        if worker.running is not None:
            outcome = self._outcome(worker)
            if outcome is None:
                return
            finished[worker.running[0]] = outcome
            worker.running = None
        if restart and worker.process.poll() is not None:
            self._workers[slot] = self._start()

    def _choose(self, worker: _Worker, tasks: Sequence[Task], waiting: list[int]) -> int:
        """The first waiting task of the step `worker` holds, else the first of a step no
        other worker holds (two would trace it twice), else the first."""
        held = {w.holds for w in self._workers if w is not worker}
        for index in waiting:
            if tasks[index].case.step_key == worker.holds:
                return index
        for index in waiting:
            if tasks[index].case.step_key not in held:
                return index
        return waiting[0]

    def _give(self, worker: _Worker, index: int, task: Task) -> None:
        worker.tasks += 1
        name = f"worker-{worker.number}-task-{worker.tasks}"
        (self.folder / name).write_bytes(pickle.dumps(task))
        worker.running, worker.holds = (index, self.folder / f"{name}.result"), task.case.step_key
        stdin = _stdin(worker)
        try:
            stdin.write(f"{name}\n".encode())
            stdin.flush()
        except OSError:  # it died since it was collected: `_outcome` says so, as for any task
            pass

    @staticmethod
    def _outcome(worker: _Worker) -> CaseResult | str | None:
        """The answer of `worker`'s task, why it has none (its process died), or None while
        it runs."""
        assert worker.running is not None
        answer = worker.running[1]
        if answer.is_file():
            result: CaseResult = pickle.loads(answer.read_bytes())
            return result
        code = worker.process.poll()
        if code is None:
            return None
        return f"its worker process exited with code {code}"


def _stdin(worker: _Worker) -> IO[bytes]:
    assert worker.process.stdin is not None
    return worker.process.stdin


def _perform(task: Task, settings: WorkerSettings, steps: StepTraces) -> CaseResult:
    """Run or count `task`'s case on a run of its own, with this process' traced steps."""
    from benchmarks.paper import count_hits, open_stores, run_case
    from benchmarks.paper_pending import count_pending

    # run as `-m`, this file is `__main__`: the result's class is pickled by its importable
    # name, which the parent unpickles
    from benchmarks.paper_worker import CaseResult as Result

    run = PaperRun(
        settings.quick,
        (task.case,),
        settings.out,
        settings.cache,
        lambda line: print(line, flush=True),
        steps=steps,
    )
    run.gpu_memory, run.wider = settings.gpu_memory, dict(settings.wider)
    run.config_cap = settings.config_cap
    traced_before = steps.traced
    if task.count:
        run.pending.append(count_pending(task.case, run.cache, run.segment_cap(), steps))
        return Result.of(run, steps.traced - traced_before)
    with open_stores(run) as stores:
        try:
            run_case(run, task.case)
        except Exception as err:
            run.failed(task.case.label, err)
        count_hits(run, stores)
    return Result.of(run, steps.traced - traced_before)


def main(argv: list[str]) -> int:
    settings_path = Path(argv[0])
    settings: WorkerSettings = pickle.loads(settings_path.read_bytes())
    steps = StepTraces()
    while name := sys.stdin.readline().strip():
        asked = settings_path.parent / name
        result = _perform(pickle.loads(asked.read_bytes()), settings, steps)
        answer = asked.with_name(f"{name}.result")
        partial = asked.with_name(f"{name}.partial")
        partial.write_bytes(pickle.dumps(result))
        partial.replace(answer)  # whole, or not there: the parent never reads half of one
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
