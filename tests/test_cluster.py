"""Cluster runs: `python -m explorer profile|calibrate` on processes joined with jax.distributed.

The multi-process tests start real processes on 127.0.0.1 (gloo collectives between the CPU
devices of different processes), each with 2 virtual CPU devices, as a cluster of hosts
would run them; every process is killed in `finally`, whatever the test found.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

import explorer as ex
from explorer.cli import main
from explorer.cluster.join import EXIT_CLUSTER, cluster_spec, detect_launcher
from explorer.cluster.supervise import lost_processes
from explorer.errors import ClusterError
from explorer.platforms import LinkLevel, load_platform
from explorer.profile.runner import distinct_programs, own_config, profile_all

ROOT = Path(__file__).resolve().parents[1]
LAYER = "M@x+y,M@x+y,M@x+y,M@x+y"  # one configuration of the tiny GPT layer on 2x4
# a part of tiny GPT's space on 2x4 that a plan can be made of: every type, one layer config
PLANNABLE = ("embed", "head", "embed->layer", "layer->head", f"layer:{LAYER}")
_LAUNCH_VARIABLES = ("SLURM_", "OMPI_", "PMI_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES")


# -- choosing the cluster (no processes started) -------------------------------------------------


def test_no_flags_and_no_launcher_runs_alone() -> None:
    spec = cluster_spec(None, None, None, environ={})
    assert not spec.distributed and spec.processes == 1


def test_a_slurm_job_with_several_tasks_is_read_from_the_environment() -> None:
    environ = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "1"}
    assert detect_launcher(environ) == "SLURM"
    spec = cluster_spec(None, None, None, environ=environ)
    assert spec.distributed and spec.processes is None  # JAX reads them from SLURM
    assert detect_launcher({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) is None


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("127.0.0.1:1234", 4, None), "missing --process-id"),
        (("127.0.0.1:1234", 4, 4), "expected an id in 0..3"),
        (("127.0.0.1", 4, 0), "expected HOST:PORT"),
        (("127.0.0.1:1234", 0, 0), "--num-processes: expected >= 1"),
    ],
)
def test_bad_flags_are_refused_before_joining(
    flags: tuple[str | None, int | None, int | None], says: str
) -> None:
    with pytest.raises(ClusterError, match=says):
        cluster_spec(*flags, environ={})


def test_the_hosts_jax_names_as_lost_are_read_from_its_fatal_log() -> None:
    # as JAX 0.10 logs it on the hosts that survive
    fatal = (
        "F1125 04:16:23.494069   26317 client.h:80] Terminating process because the JAX "
        "distributed service detected fatal errors. absl::Status: UNAVAILABLE: The following "
        "tasks are unhealthy (stopped sending heartbeats):\n2\nThe tasks have crashed."
    )
    assert lost_processes(fatal) == [2]
    assert lost_processes("RPC: /xla.coordination.CoordinationService/RegisterTask") == []
    # as a survivor whose all-gather broke on the dead host's socket first says it (CI, JAX 0.10)
    barrier = (
        "JaxRuntimeError: UNKNOWN: Gloo AllGather failed: Read error [127.0.0.1]:24756: "
        "Connection reset by peer\nINTERNAL: Shutdown barrier has failed. Barrier result: "
        "'INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 2 heartbeat "
        "timeout. This indicates that the remote task has failed"
    )
    assert lost_processes(barrier) == [2]


# -- real processes ----------------------------------------------------------------------------


@dataclass
class _Host:
    process: subprocess.Popen[str]
    out: str = ""
    err: str = ""

    @property
    def code(self) -> int | None:
        return self.process.returncode


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment(devices: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARIABLES)}
    # the suite's other XLA flags as well: a measured program is kept under the flags it ran
    # with, and this process plans from the hosts' rows under the suite's
    count = "--xla_force_host_platform_device_count"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(count)]
    env["XLA_FLAGS"] = " ".join([*flags, f"{count}={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT)
    return env


@contextmanager
def _hosts(
    command: Sequence[str],
    processes: int = 4,
    *,
    counts: Sequence[int] | None = None,
    ids: Sequence[int] | None = None,
    devices: Sequence[int] | None = None,
    timeout: float = 20,
    port: int | None = None,
    extra: Sequence[Sequence[str]] | None = None,
) -> Iterator[list[_Host]]:
    """`python -m explorer *command` on `processes` hosts of this machine (own sessions, so
    a host is killed with everything it started); every one is killed on the way out."""
    port = port or _free_port()
    hosts = []
    try:
        for i in range(processes):
            flags = [
                "--coordinator", f"127.0.0.1:{port}",
                "--num-processes", str(counts[i] if counts else processes),
                "--process-id", str(ids[i] if ids else i),
                "--timeout", str(timeout),
            ]  # fmt: skip
            own = list(extra[i]) if extra else []
            hosts.append(
                _Host(
                    subprocess.Popen(
                        [sys.executable, "-m", "explorer", *command, *flags, *own],
                        env=_environment(devices[i] if devices else 2),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                        start_new_session=True,
                    )
                )
            )
        yield hosts
    finally:
        for host in hosts:
            if host.process.poll() is None:
                os.killpg(host.process.pid, signal.SIGKILL)
            host.process.wait(timeout=30)
            for stream in (host.process.stdout, host.process.stderr):
                if stream is not None:
                    stream.close()


def _wait(hosts: Sequence[_Host], limit: float) -> float:
    """Wait for every host to end (failing the test past `limit` s); the seconds it took."""
    start = time.monotonic()
    for host in hosts:
        left = max(limit - (time.monotonic() - start), 1)
        try:
            host.out, host.err = host.process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a host was still running after {limit} s: the run hung")
    return time.monotonic() - start


def _logs(hosts: Sequence[_Host]) -> str:
    return "\n".join(
        f"--- host {i} (exit {h.code})\n{h.out[-1500:]}\n{_quiet(h.err)[-3000:]}"
        for i, h in enumerate(hosts)
    )


def _quiet(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "[Gloo]" not in line)


def _rows(path: Path) -> int:
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(path, timeout=5) as db:
            return int(db.execute("SELECT COUNT(*) FROM profiles").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


def _profile_command(cache: Path, only: Sequence[str], mesh: str = "2x4") -> list[str]:
    entries = [arg for entry in only for arg in ("--only", entry)]
    return ["profile", "--layers", "1", "--mesh", mesh, "--cache", str(cache), *entries]


def _plannable(kind: str, label: str, config: str) -> bool:
    return label in PLANNABLE or (label == "layer" and own_config(config) == LAYER)


def _tiny_gpt() -> tuple[object, tuple[object, ...]]:
    return ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=1), abstract=True)


@pytest.mark.slow
def test_profile_and_calibrate_on_four_processes_then_plan_alone(tmp_path: Path) -> None:
    cache = tmp_path / "cluster.sqlite"
    with _hosts(_profile_command(cache, PLANNABLE)) as hosts:
        took = _wait(hosts, 240)
    assert [h.code for h in hosts] == [0] * 4, _logs(hosts)
    with sqlite3.connect(cache) as db:
        rows = db.execute("SELECT mesh, backend, status FROM profiles").fetchall()
    assert rows and set(rows) == {("2x4(x,y)", "measured", "ok")}, rows
    n = len(rows)
    assert f"{n} programs measured ({n} by this process) into {cache}" in hosts[0].out
    assert "process 0 keeps the rows; this is process 3" in hosts[3].out
    print(f"profiled {len(rows)} programs on 4 processes x 2 devices in {took:.1f} s")

    # the cache, made on 4 processes, plans in this one process: every row is found
    step, args = _tiny_gpt()
    analysis = ex.analyze(
        step,
        *args,
        mesh=(2, 4),
        backend="measured",
        cache=cache,
        progress=False,
        only=_plannable,
    )
    table = analysis.profiles
    assert table.loc[table["program"] != "", "cached"].all()
    assert distinct_programs(table) == len(rows)
    plan = analysis.plan()
    assert plan.time > 0 and plan.memory > 0

    # calibrate over the same 4 processes: a two-level platform file
    out = tmp_path / "cluster.json"
    command = ["calibrate", "--out", str(out), "--sizes", "4096,65536", "--repeats", "2"]
    with _hosts(command) as hosts:
        _wait(hosts, 180)
    assert [h.code for h in hosts] == [0] * 4, _logs(hosts)
    platform = load_platform(out)  # validates
    assert (platform.devices, platform.devices_per_node, platform.nodes) == (8, 2, 4)
    assert platform.inter is not None and platform.intra.name == "measured-intra"
    assert "4 process(es)" in platform.description
    # the compiled backend prices on it: an inter-process group costs more than an intra one
    compiled = ex.analyze(
        step, *args, mesh=(2, 4), platform=platform, cache=None, progress=False, only=_plannable
    )
    assert (compiled.profiles["status"] == "ok").all()
    assert compiled.profiles["t_comm"].max() > 0 and compiled.plan().time > 0

    # a group across processes is priced on the measured inter level, one inside a process
    # on the intra level (which is faster depends on how loaded the machine was: not asserted)
    def ring(level: LinkLevel, nbytes: int) -> float:  # all-to-all, 2 devices (collective_time)
        link = level["all-to-all"]
        return link.latency_s + nbytes / 2 / link.bandwidth_Bps

    across = platform.collective_time("all-to-all", 2**16, [0, 2])
    inside = platform.collective_time("all-to-all", 2**16, [0, 1])
    assert (across, inside) == pytest.approx(
        (ring(platform.inter, 2**16), ring(platform.intra, 2**16))
    )


@pytest.mark.slow
def test_a_host_killed_half_way_ends_the_run_everywhere_and_a_rerun_resumes(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cluster.sqlite"
    command = _profile_command(cache, ("head", "layer->head"))
    with _hosts(command, timeout=10) as hosts:
        deadline = time.monotonic() + 180
        while _rows(cache) < 1 and time.monotonic() < deadline:
            if any(h.process.poll() is not None for h in hosts):
                break
            time.sleep(0.05)
        os.killpg(hosts[2].process.pid, signal.SIGKILL)  # the whole host: parent and child
        killed = time.monotonic()
        _wait(hosts[:2] + hosts[3:], 120)
        ended = time.monotonic() - killed
    survivors = hosts[:2] + hosts[3:]
    assert [h.code for h in survivors] == [EXIT_CLUSTER] * 3, _logs(hosts)
    for host in survivors:
        assert "process(es) 2 stopped answering" in host.err, _logs(hosts)
        assert "run the same command again on every host to resume" in host.err
        assert "Check failure stack trace" not in host.err  # JAX's fatal log is explained
    assert ended < 10 + 30, f"the survivors took {ended:.0f} s to end"
    print(f"survivors ended {ended:.1f} s after the kill; host 0 said:")
    print([line for line in survivors[0].err.splitlines() if line.startswith("error:")][-1])
    before = _rows(cache)
    assert before >= 1

    with _hosts(command) as hosts:
        _wait(hosts, 240)
    assert [h.code for h in hosts] == [0] * 4, _logs(hosts)
    assert f"{before} from the cache" in hosts[0].out, hosts[0].out
    assert _rows(cache) > before


@pytest.mark.slow
def test_an_unreachable_coordinator_is_a_clear_error_within_the_timeout(tmp_path: Path) -> None:
    # process 1 of 2, and nobody runs process 0
    command = _profile_command(tmp_path / "c.sqlite", ("head",))
    with _hosts(command, processes=1, counts=[2], ids=[1], timeout=5) as hosts:
        took = _wait(hosts, 90)
    assert hosts[0].code == EXIT_CLUSTER, _logs(hosts)
    err = hosts[0].err
    assert "process 1 of 2 at 127.0.0.1:" in err and "could not join the cluster within" in err
    assert "Check failure stack trace" not in err and "to resume" not in err
    print(f"the unreachable coordinator was reported after {took:.1f} s")


@pytest.mark.slow
def test_mismatched_process_counts_are_a_clear_error_on_every_host(tmp_path: Path) -> None:
    command = _profile_command(tmp_path / "c.sqlite", ("head",))
    with _hosts(command, processes=2, counts=[3, 2], timeout=5) as hosts:
        _wait(hosts, 90)
    assert [h.code for h in hosts] == [EXIT_CLUSTER] * 2, _logs(hosts)
    for host in hosts:
        assert "could not join the cluster" in host.err and "--num-processes" in host.err


@pytest.mark.slow
def test_hosts_with_different_device_counts_are_refused_on_every_host(tmp_path: Path) -> None:
    command = _profile_command(tmp_path / "c.sqlite", ("head",))
    with _hosts(command, processes=2, devices=[2, 1], timeout=10) as hosts:
        _wait(hosts, 90)
    assert [h.code for h in hosts] == [EXIT_CLUSTER] * 2, _logs(hosts)
    for host in hosts:
        assert "same number of devices; process 0 has 2, process 1 has 1" in host.err
    assert not (tmp_path / "c.sqlite").exists()  # refused before any profiling


@pytest.mark.slow
def test_hosts_asked_different_things_are_refused_on_every_host(tmp_path: Path) -> None:
    # the check that also catches different JAX, jaxlib or explorer code across hosts
    command = _profile_command(tmp_path / "c.sqlite", ("head",))
    with _hosts(command, processes=2, timeout=10, extra=[[], ["--preset", "small"]]) as hosts:
        _wait(hosts, 90)
    assert [h.code for h in hosts] == [EXIT_CLUSTER] * 2, _logs(hosts)
    for host in hosts:
        assert "the processes of this run disagree" in host.err
        assert "config: process 0 has" in host.err and "process 1 has" in host.err


@pytest.mark.slow
def test_compiled_profiling_is_shared_among_the_hosts(tmp_path: Path) -> None:
    cache = tmp_path / "cluster.sqlite"
    command = [*_profile_command(cache, ("head", "layer->head"), mesh="4"), "--backend", "compiled"]
    with _hosts(command, processes=2) as hosts:
        _wait(hosts, 180)
    assert [h.code for h in hosts] == [0, 0], _logs(hosts)
    here = [int(h.out.split(" by this process")[0].rsplit("(", 1)[1]) for h in hosts]
    assert all(n > 0 for n in here), here  # each host compiled its share
    # the same rows as one process compiling everything itself
    step, args = _tiny_gpt()
    a = ex.analyze(step, *args, mesh=(4,), profile=False)
    alone = profile_all(
        a.graph, a.block_analysis, a.segments, a.mesh, platform=load_platform("a100-pcie-8"),
        progress=False, only=lambda kind, label, config: label in ("head", "layer->head"),
    )  # fmt: skip
    with sqlite3.connect(cache) as db:
        rows = db.execute("SELECT backend, mesh, status FROM profiles").fetchall()
    assert len(rows) == sum(here) == alone.programs
    assert set(rows) == {("compiled", "4(x)", "ok")}


def test_profile_alone_measures_on_the_devices_of_this_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # no flags and no launcher: this process alone (the test session's 8 CPU devices)
    for name in list(os.environ):
        if name.startswith(_LAUNCH_VARIABLES):
            monkeypatch.delenv(name)
    cache = tmp_path / "alone.sqlite"
    assert main([*_profile_command(cache, ("head",)), "--platform", "cpu-local"]) == 0
    out = capsys.readouterr().out
    summary = "over 1 process(es) x 8 device(s): 3 programs measured (3 by this process)"
    assert f"{summary} into {cache}" in out
    with sqlite3.connect(cache) as db:
        assert db.execute("SELECT COUNT(*), MIN(status) FROM profiles").fetchone() == (3, "ok")
