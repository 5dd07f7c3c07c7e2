"""A parent process per host that turns every way a cluster run can end into a clear error.

JAX ends a process with a fatal log and a C++ stack trace when its coordination service
fails: a coordinator that never answers, a count that does not match, a host that stops
sending heartbeats. Those messages name RPCs, not the fix, and a host that hangs without
dying is never ended at all. So `python -m explorer profile|calibrate` on a cluster runs the
work in a child process (the same command) and watches it from here:

- the child reports its stage (`report`) through a pipe: joined, each program finished...;
- the child's stderr passes through, with JAX's fatal log and stack trace kept back and read
  for which host failed;
- a child silent for twice the timeout (a hung host, or one waiting on it) is killed;
- a child that ends by a signal or a fatal log is reported in one `error:` line that says
  what failed, where, and what to do, and the command exits with `EXIT_CLUSTER`.

The child dies with its parent (`PR_SET_PDEATHSIG`), so killing a host's command, as a
scheduler or a test does, takes the whole host out of the run.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from explorer.cluster.join import EXIT_CLUSTER, ClusterSpec

STATUS_VARIABLE = "EXPLORER_CLUSTER_STATUS_FD"
_FATAL = re.compile(r"^F\d{4} ")  # an abseil fatal log line: JAX is ending the process
_STACK = ("*** Check failure stack trace", "    @ ")
_PR_SET_PDEATHSIG = 1


def in_child() -> bool:
    """Whether this process is the child of a supervisor."""
    return STATUS_VARIABLE in os.environ


def report(stage: str, detail: str = "") -> None:
    """Tell the supervisor (if any) how far this process got; a beat of progress."""
    fd = os.environ.get(STATUS_VARIABLE)
    if fd is None:
        return
    line = json.dumps({"stage": stage, "detail": detail}) + "\n"
    with contextlib.suppress(OSError, ValueError):
        os.write(int(fd), line.encode())


def die_with_parent() -> None:
    """In a child: be killed when the supervisor dies (Linux), and stop if it already has."""
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(EXIT_CLUSTER)


@dataclass
class _Watch:
    """What the supervisor knows of its child (written by its reader threads)."""

    stage: str = "starting"
    detail: str = ""
    beat: float = field(default_factory=time.monotonic)
    joined: bool = False
    fatal: list[str] = field(default_factory=list)  # JAX's fatal log, without the stack
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_status(self, line: str) -> None:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            return
        with self.lock:
            self.stage, self.detail = str(event["stage"]), str(event.get("detail", ""))
            self.beat = time.monotonic()
            self.joined = self.joined or self.stage == "joined"


def supervise(argv: Sequence[str], spec: ClusterSpec, resume_hint: str = "") -> int:
    """Run `python -m explorer *argv` as a watched child; its exit status, or `EXIT_CLUSTER`
    with a clear error when it could not join, lost a host or hung (`resume_hint` ends the
    error once the child had joined)."""
    read, write = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "explorer", *argv],
        env={**os.environ, STATUS_VARIABLE: str(write)},
        pass_fds=(write,),
        stderr=subprocess.PIPE,
    )
    os.close(write)
    watch = _Watch()
    readers = [
        threading.Thread(target=_read_status, args=(read, watch), daemon=True),
        threading.Thread(target=_forward_stderr, args=(child.stderr, watch), daemon=True),
    ]
    for reader in readers:
        reader.start()
    stall = 2 * spec.timeout + 10
    stalled = False
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def forward(signum: int, frame: Any) -> None:
        child.send_signal(signum)

    for s in previous:
        signal.signal(s, forward)
    try:
        while child.poll() is None:
            with watch.lock:
                silent = time.monotonic() - watch.beat
            if silent > stall:
                stalled = True
                child.kill()
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.5)
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if child.poll() is None:
            child.kill()
            child.wait()
    for reader in readers:
        reader.join(timeout=5)
    if code == 0 or (code > 0 and not watch.fatal and not stalled):
        return code  # success, or an error the child explained itself
    hint = resume_hint if watch.joined else ""
    print(f"error: {_explain(spec, watch, code, stalled, stall)}{hint}", file=sys.stderr)
    return EXIT_CLUSTER


def _read_status(fd: int, watch: _Watch) -> None:
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as stream:
        for line in stream:
            watch.on_status(line)


def _forward_stderr(stream: IO[bytes] | None, watch: _Watch) -> None:
    """Pass the child's stderr through, keeping JAX's fatal log back (read by `_explain`)."""
    if stream is None:
        return
    in_fatal = False
    for raw in stream:
        line = raw.decode(errors="replace")
        if _FATAL.match(line):
            in_fatal = True
        if in_fatal:
            if not line.startswith(_STACK):
                watch.fatal.append(line.rstrip())
            continue
        watch.tail.append(line.rstrip())
        sys.stderr.write(line)
        sys.stderr.flush()


def lost_processes(text: str) -> list[int]:
    """The process ids JAX's coordination service names as having stopped heartbeats.

    JAX says it two ways: the coordinator lists the unhealthy tasks one id per line, and a host
    whose own collective broke first reports the shutdown barrier's "Task N heartbeat timeout".
    """
    found: list[int] = []
    marker = "stopped sending heartbeats"
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if marker not in line:
            continue
        for following in lines[i + 1 :]:
            ids = re.findall(r"\d+", following)
            if not ids or not re.fullmatch(r"[\d,\s]+", following.strip()):
                break
            found += [int(x) for x in ids if int(x) not in found]
    # a survivor whose collective failed first hears it from the shutdown barrier instead
    for task in re.findall(r"Task (\d+) heartbeat timeout", text):
        if int(task) not in found:
            found.append(int(task))
    return found


def _explain(spec: ClusterSpec, watch: _Watch, code: int, stalled: bool, stall: float) -> str:
    where = spec.describe()
    fatal = "\n".join(watch.fatal)
    status = _jax_status(fatal)
    lost = lost_processes(fatal + "\n" + "\n".join(watch.tail))
    doing = f"{watch.stage}{f' ({watch.detail})' if watch.detail else ''}"
    if stalled:
        return (
            f"{where}: nothing happened for {stall:g} s while {doing}; a host is hung or one "
            "program takes longer than that on some host. This process was stopped; raise "
            "--timeout if programs are that slow, or look for the host that stopped"
        )
    if not watch.joined:
        return (
            f"{where} could not join the cluster within --timeout {spec.timeout:g} s "
            f"({status or _ended(code)}). Expected every process to start with the same "
            "--coordinator and --num-processes and a distinct --process-id 0..N-1, and the "
            "coordinator (process 0) to be reachable from this host on its port; check that "
            "all processes were started, that the counts match and that no firewall is in "
            "the way"
        )
    if lost:
        hosts = ", ".join(map(str, lost))
        return (
            f"{where}: process(es) {hosts} stopped answering (no heartbeat for --timeout "
            f"{spec.timeout:g} s) while {doing}: the host died, was killed or lost the "
            f"network, so every host ends the run"
        )
    return (
        f"{where}: the run was ended while {doing} ({status or _ended(code)}); a host died, "
        "was killed or lost the network (process 0 runs the coordinator: if it ends, every "
        "host does)"
    )


def _jax_status(fatal: str) -> str:
    """The status JAX's fatal log gives, in one line ("DEADLINE_EXCEEDED: ... at RegisterTask")."""
    match = re.search(r"absl::Status: (.*)", fatal, flags=re.DOTALL)
    if not match:
        return ""
    text = " ".join(part.strip() for part in match.group(1).splitlines() if part.strip())
    return f"JAX: {text[:300]}"


def _ended(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"the process was ended by {signal.Signals(-code).name}"
    return f"the process exited with status {code}"
