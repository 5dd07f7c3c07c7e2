"""Compile-only profiling in worker processes that are recycled.

A compiler leaves memory behind in the process that runs it: XLA's and LLVM's caches, the
arenas of the threads that compiled, code pages of executables already dropped. Over a run
of thousands of programs that grows without bound (benchmarks/profile_memory_bench.py: ~20
MiB per 100 programs after the first 700, in one process). Here each program is lowered in
this process and compiled in a worker process, which answers with the optimised HLO and
the compiler's analyses (`_jax_compat.CompiledText`) and exits after `PROGRAMS_PER_WORKER`
programs, taking what its compiles left with it.

Workers are plain subprocesses running `python -m explorer.profile.compile_workers`, not
`multiprocessing` children: spawning those re-imports the user's `__main__`, which runs a
script without a `if __name__ == "__main__"` guard once more per worker. Requests and
answers are pickled over the worker's stdin and stdout; anything else the worker prints goes
to its stderr, a temporary file read back when a worker dies.

Only compile-only pricing on the CPU uses workers: a measured program must run where it was
compiled, and a GPU worker would claim device memory of its own.

A worker is also where a compile that runs away is stopped. XLA:CPU can need far more memory
for a program than its like: BERT-large's FSDP step in float16 at batch 8 on 4 devices grows
past 9 GiB in its fusion pass within minutes (21 GB when left alone), where the same step in
bfloat16 compiles in 25 s. A watchdog stops any worker holding more than `memory_limit`
(`worker_memory_limit`: half the machine, or $EXPLORER_COMPILE_MEMORY_LIMIT), and that compile
raises `CompileOutOfMemory` instead of taking the machine, the user's notebook with it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from explorer._jax_compat import CompiledText, CompileRequest, compile_from_request
from explorer.errors import ExplorerError
from explorer.units import memory_limit

# A worker exits after compiling this many programs; the next request starts a fresh one.
# Starting one costs ~1-2 s (importing JAX); 100 programs cost ~60-90 s on the tiny MoE.
PROGRAMS_PER_WORKER = 100

# bytes one worker may hold while it compiles ("16GiB"); default: half the machine's memory
MEMORY_LIMIT_VARIABLE = "EXPLORER_COMPILE_MEMORY_LIMIT"
MEMORY_POLL_SECONDS = 0.5  # how often the watchdog reads each worker's resident memory
PARENT_POLL_SECONDS = 0.5  # how often a worker checks that the process that started it lives

# HLO text `CompileWorkers.compile_once` keeps of the programs compiled last (a paper-scale
# step's is tens of MB; the most recent one is always kept)
RECENT_TEXT_CHARS = 64 * 2**20

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
_CODE_VARIABLE = "EXPLORER_COMPILE_WORKER_CODE"


def _code_digest() -> str:
    """Identity of the code on both ends of a request: a worker imports the package afresh,
    which may have changed on disk since this process imported it (an upgrade, an edit)."""
    from explorer import _jax_compat

    digest = hashlib.sha256(Path(__file__).read_bytes())
    # every module of the package a worker compiles with, by name so that a move shows too
    for path in sorted(Path(_jax_compat.__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_CODE = _code_digest()  # the code this process runs, read when it imported it


class WorkerDied(ExplorerError):
    """A compile worker exited while compiling a program."""


class CompileFailed(ExplorerError):
    """The compiler refused a program in a worker; `kind` names the error it raised there."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class CompileOutOfMemory(CompileFailed):
    """A worker held more memory than its limit while compiling and was stopped: a fact about
    this machine's memory, not about the program (a profile of it is not kept)."""

    def __init__(self, message: str) -> None:
        super().__init__(type(self).__name__, message)


def _meminfo(name: str) -> int | None:
    """A line of Linux's /proc/meminfo, in bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith(f"{name}:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


def worker_memory_limit() -> int | None:
    """Bytes one compile worker may hold: $EXPLORER_COMPILE_MEMORY_LIMIT when set ("16GiB",
    or bytes), else half of this machine's memory; None where neither is known (no watchdog:
    resident memory is read from Linux's /proc)."""
    return memory_limit(MEMORY_LIMIT_VARIABLE)


def resident_bytes(pid: int) -> int | None:
    """The resident memory of process `pid` (Linux's /proc/PID/statm); None once it has
    gone, or where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(eq=False)  # one per process: compared and hashed by identity
class _Worker:
    process: subprocess.Popen[bytes]
    stderr: IO[bytes]
    compiled: int = 0
    busy: bool = False  # compiling a program now
    stopped_because: str | None = None  # why the watchdog stopped it in this program

    def ask(self, request: CompileRequest) -> tuple[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        # a worker stopped while idle died between programs: not this program's doing
        self.stopped_because, self.busy = None, True
        try:
            pickle.dump(request, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.process.stdin.flush()
            answer: tuple[str, Any] = pickle.load(self.process.stdout)
        except (BrokenPipeError, EOFError, OSError, pickle.UnpicklingError) as err:
            death = self._death(err)  # reaps the process either way
            if self.stopped_because is not None:
                raise CompileOutOfMemory(self.stopped_because) from None
            raise WorkerDied(death) from None
        finally:
            self.busy = False
        self.compiled += 1
        return answer

    def _death(self, err: BaseException) -> str:
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace").strip().splitlines()[-3:]
        said = f"; its last words: {' | '.join(tail)}" if tail else ""
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"the compile worker {how} ({type(err).__name__}){said}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()  # the worker's loop ends at end of input
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdout, self.stderr):
            if stream is not None:
                stream.close()


@dataclass
class CompileWorkers:
    """Up to `processes` workers, each recycled after `programs_per_worker` programs, each
    stopped when it holds more than `memory_limit` bytes (None: never).

    `compile` is safe to call from several threads: each call takes an idle worker (starting
    one when fewer than `processes` run), so `processes` programs compile at once.
    """

    processes: int
    device_count: int
    programs_per_worker: int = PROGRAMS_PER_WORKER
    memory_limit: int | None = field(default_factory=worker_memory_limit)
    _idle: queue.LifoQueue[_Worker | None] = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)
    _all: set[_Worker] = field(init=False, repr=False, default_factory=set)
    _watchdog: threading.Thread | None = field(init=False, repr=False, default=None)
    started: int = field(init=False, default=0)  # workers started so far (a probe for tests)
    _recent: OrderedDict[bytes, CompiledText] = field(
        init=False, repr=False, default_factory=OrderedDict
    )

    def __post_init__(self) -> None:
        if self.processes < 1 or self.programs_per_worker < 1:
            raise ValueError(
                f"compile workers need processes >= 1 and programs_per_worker >= 1, got "
                f"{self.processes} and {self.programs_per_worker}"
            )
        self._idle = queue.LifoQueue()
        for _ in range(self.processes):
            self._idle.put(None)  # a slot where a worker may be started

    def compile(self, request: CompileRequest) -> CompiledText:
        """Compile one program in a worker. A worker that died between programs (not this
        program's doing) is replaced and the program sent again, once; a worker that dies on
        the program itself raises `WorkerDied`, which names how it ended."""
        try:
            status, payload = self._ask(request)
        except WorkerDied:
            status, payload = self._ask(request)
        if status == "error":
            raise CompileFailed(*payload)
        text: CompiledText = payload
        return text

    def compile_once(self, request: CompileRequest) -> CompiledText:
        """`compile`, or the answer to the same request among the last ones this pool
        compiled (`RECENT_TEXT_CHARS` of HLO text): the same request compiles to the same
        program, and a step evaluated and then explained (`explain.attribute`) is one."""
        key = hashlib.sha256(pickle.dumps(request)).digest()
        with self._lock:
            if key in self._recent:
                self._recent.move_to_end(key)
                return self._recent[key]
        text = self.compile(request)
        with self._lock:
            self._recent[key] = text
            kept = sum(len(t.hlo) for t in self._recent.values())
            while kept > RECENT_TEXT_CHARS and len(self._recent) > 1:
                kept -= len(self._recent.popitem(last=False)[1].hlo)
        return text

    def _ask(self, request: CompileRequest) -> tuple[str, Any]:
        """Send a request to an idle worker (started if none is) and read its answer."""
        worker = self._idle.get()  # blocks while every worker is busy
        try:
            worker = worker or self._start()
            answer = worker.ask(request)
        except BaseException:
            # the slot goes back whatever happened, or later calls would wait forever
            if worker is not None:
                self._retire(worker)
            self._idle.put(None)
            raise
        if worker.compiled >= self.programs_per_worker:
            self._retire(worker)
            self._idle.put(None)
        else:
            self._idle.put(worker)
        return answer

    def pids(self) -> list[int]:
        """The process ids of the workers running now."""
        with self._lock:
            return [w.process.pid for w in self._all if w.process.poll() is None]

    def close(self) -> None:
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.close()

    def _start(self) -> _Worker:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the worker holds it; closed in close()
        process = subprocess.Popen(
            [sys.executable, "-m", "explorer.profile.compile_workers"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=_worker_environment(self.device_count),
        )
        worker = _Worker(process, stderr)
        with self._lock:
            self._all.add(worker)
            self.started += 1
            if self.memory_limit is not None and self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch_memory, name="compile-worker-watchdog", daemon=True
                )
                self._watchdog.start()
        return worker

    def _watch_memory(self) -> None:
        """Stop every worker that holds more than `memory_limit`; end when none runs (the
        next worker started starts another watchdog)."""
        limit = self.memory_limit
        assert limit is not None
        while True:
            with self._lock:
                workers = list(self._all)
                if not workers:
                    self._watchdog = None
                    return
            for worker in workers:
                held = resident_bytes(worker.process.pid)
                if held is None or held <= limit or worker.process.poll() is not None:
                    continue
                if worker.busy:  # its program made it grow; idle, it is only replaced
                    worker.stopped_because = (
                        f"compiling this program, the compiler grew past the "
                        f"{limit / 2**30:.1f} GiB a compile worker may hold and was stopped "
                        f"at {held / 2**30:.2f} GiB, before it took the machine's memory. Set "
                        f"{MEMORY_LIMIT_VARIABLE} (default: half of this machine's memory; e.g. "
                        f"'{2 * limit / 2**30:.0f}GiB') to allow more"
                    )
                worker.process.kill()
            time.sleep(MEMORY_POLL_SECONDS)

    def _retire(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.close()


def _worker_environment(device_count: int) -> dict[str, str]:
    """This process's environment, with as many CPU devices as this process has (however it
    got them: XLA_FLAGS, or `jax_num_cpu_devices`) and no other platform to probe."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT_FLAG)]
    env["XLA_FLAGS"] = " ".join([*flags, f"{_DEVICE_COUNT_FLAG}={device_count}"])
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env["JAX_PLATFORMS"] = "cpu"
    env[_CODE_VARIABLE] = _CODE
    # the worker imports this package as the parent did
    paths = [p for p in sys.path if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a SLURM task's or a container's
    share), not the machine's count that `os.cpu_count()` gives."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# What one worker may reach: its JAX runtime and the compiler's peak on one program
# (benchmarks/cluster_bench.py: 439-468 MiB high-water for tiny GPT's programs), with room.
WORKER_MEMORY_BYTES = 512 * 2**20


def available_memory() -> int | None:
    """Bytes the machine can still give without swapping (Linux's MemAvailable); None
    where it cannot be read."""
    return _meminfo("MemAvailable")


_shared: CompileWorkers | None = None
_shared_lock = threading.Lock()


def shared_workers(processes: int, device_count: int) -> CompileWorkers:
    """The process's compile workers, kept between profiling runs (a notebook re-profiles as
    the mesh changes); replaced when a run asks for more workers or other devices."""
    global _shared  # noqa: PLW0603 - one set of workers per process, made on first use
    with _shared_lock:
        current = _shared
        if current is None or current.processes < processes or current.device_count != device_count:
            if current is not None:
                current.close()
            current = _shared = CompileWorkers(processes, device_count)
            atexit.register(current.close)
        return current


def _serve() -> None:
    """The worker's loop: compile each request read from stdin, answer on stdout, end at
    the end of input."""
    expected = os.environ.get(_CODE_VARIABLE)
    if expected != _CODE:
        sys.stderr.write(
            "the explorer package on disk is not the code of the process that started this "
            "compile worker (it was upgraded or edited since that process imported it): "
            "restart that process (the notebook's kernel) to profile with the code on disk\n"
        )
        sys.exit(3)
    # Ctrl-C in a terminal reaches the whole process group: the parent decides what stops
    # (it cancels, then closes this worker's input); a worker that died of it would only be
    # restarted for the programs in flight, delaying the stop by a compile or two
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(
        target=_exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True
    ).start()
    requests = sys.stdin.buffer
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not corrupt answers
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            break
        try:
            answer: tuple[str, Any] = ("ok", compile_from_request(request))
        except Exception as err:  # a program that fails to compile is an answer
            answer = ("error", (type(err).__name__, str(err).strip()))
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


def _exit_with_parent(parent: int) -> None:
    """End this worker once the process that started it is gone (killed, crashed): its end
    of input is read only between programs, and the parent's watchdog went with the parent,
    so a compile running away would otherwise go on taking the machine's memory."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(4)


if __name__ == "__main__":
    _serve()
