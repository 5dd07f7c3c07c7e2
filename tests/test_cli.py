"""The command line: `plan` and `calibrate`, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import SHARED_CACHE

from explorer.cli import CONFIG_CAP_HELP, main
from explorer.plan import load_plan
from explorer.platforms import load_platform
from explorer.segments import DEFAULT_CONFIG_CAP

REPO = Path(__file__).resolve().parents[1]


def test_plan_without_profiling_prints_blocks_and_program_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["plan", "--model", "llama", "--preset", "tiny", "--mesh", "2x2", "--no-profile"]) == 0
    )
    out = capsys.readouterr().out
    assert "ParallelBlocks" in out and "programs to profile (Eq. 7)" in out
    assert "M@x+y" in out  # 2-D strategies with batch pinned to the outer axis


def test_a_lower_configuration_cap_cuts_the_layer_into_smaller_types(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Tiny GPT's layer has 81 configurations (4 blocks of 3 strategies): a cap of 27 cuts it,
    and the programs to profile say so."""
    assert main([*ZOO, "--no-profile"]) == 0
    whole = capsys.readouterr().out
    assert main([*ZOO, "--no-profile", "--config-cap", "27"]) == 0
    cut = capsys.readouterr().out
    assert "split over the configuration cap" not in whole and "+ 81 +" in whole
    assert "split over the configuration cap" in cut and "+ 81 +" not in cut
    assert f"(default {DEFAULT_CONFIG_CAP})" in CONFIG_CAP_HELP  # the help says the engine's


def test_plan_rejects_an_unknown_preset_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "gpt", "--preset", "huge", "--no-profile"]) == 2
    err = capsys.readouterr().err
    assert "no preset 'huge'" in err and "tiny" in err


def test_plan_on_the_gpu_of_a_platform_without_one_is_refused_before_profiling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--model", "gpt", "--preset", "tiny", "--no-cache"]
    assert main([*argv, "--platform", "cpu-local", "--gpu-memory"]) == 2
    err = capsys.readouterr().err
    assert "its device 'cpu (virtual, 1/8 of a 2-core host)' is not a GPU" in err


def test_calibrate_writes_a_platform_file_that_loads(tmp_path: Path) -> None:
    out = tmp_path / "here.json"
    assert main(["calibrate", "--out", str(out), "--sizes", "4096,65536", "--repeats", "2"]) == 0
    platform = load_platform(out)
    assert platform.devices == 8
    assert json.loads(out.read_text())["sources"]


# -- bad input is refused before profiling; Ctrl-C stops a run, keeping what it profiled --------

ZOO = ["plan", "--model", "gpt", "--preset", "tiny", "--mesh", "4"]


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--budget", "lots"], "--budget"),
        (["--budget=-1GiB"], "--budget"),
        (["--budget", "nan"], "--budget"),
        (["--budget", "12 XB"], "--budget"),
        (["--out", "{tmp}"], "--out"),  # a folder
        (["--out", "{tmp}/plain/plan.json"], "--out"),  # under a file
        (["--mesh", "0"], "mesh"),
        (["--mesh", "2x"], "mesh"),
        (["--platform", "a100-pcie-9"], "platform"),
        (["--each-space"], "--each-space"),  # nothing to compare with the paper's space
        (["--each-space", "--whole-mesh", "--no-profile"], "--each-space"),
        (["--each-space", "--gpu-memory"], "--each-space"),  # still nothing to compare
        (["--verify-fit", "--gpu-memory"], "--verify-fit"),  # two judges of the fit
        (["--verify-fit", "--no-profile"], "--verify-fit"),  # no frontier to go down
        (["--config-cap", "0"], "--config-cap"),
        (["--config-cap", "many"], "--config-cap"),
    ],
)
def test_plan_refuses_bad_input_before_profiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], field: str
) -> None:
    (tmp_path / "plain").write_text("a file")
    cache = tmp_path / "profiles.sqlite"
    start = time.perf_counter()
    argv = [*ZOO, "--cache", str(cache), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and field in err and "expected" in err
    assert not cache.exists()  # nothing was profiled
    assert time.perf_counter() - start < 5.0


def test_plan_refuses_an_unwritable_out_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make_read_only: Callable[[Path], Path]
) -> None:
    (tmp_path / "locked").mkdir()
    folder = make_read_only(tmp_path / "locked")
    argv = [*ZOO, "--cache", str(tmp_path / "c.sqlite"), "--out", str(folder / "plan.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--out: expected a path where a plan file can be written" in err
    assert str(folder) in err and not (tmp_path / "c.sqlite").exists()


@pytest.mark.parametrize("budget", ["64MB", "64MiB", "1.5GiB"])
def test_plan_takes_budgets_with_units(budget: str, capsys: pytest.CaptureFixture[str]) -> None:
    # checked at the door: with --no-profile the run stops after segmentation, budget read
    assert main([*ZOO, "--no-profile", "--budget", budget]) == 0
    assert "programs to profile" in capsys.readouterr().out


@pytest.mark.slow
def test_plan_with_a_budget_in_units_writes_a_plan_within_it(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    argv = [*ZOO, "--cache", str(SHARED_CACHE), "--budget", "1.5GiB", "--out", str(out)]
    assert main(argv) == 0
    plan = load_plan(out)
    assert plan.predicted.budget == 3 * 2**29 and plan.memory <= 3 * 2**29


def test_plan_over_each_space_prints_each_plan_and_keeps_the_fastest_predicted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--each-space` analyses the paper's space and each wider one asked for alone, prints
    each one's plan and writes the one predicted fastest. On a 1-D mesh the whole-mesh space
    is the paper's: the two plans tie, and the paper's (the first) is kept."""
    out = tmp_path / "plan.json"
    argv = [*ZOO, "--cache", str(SHARED_CACHE), "--each-space", "--whole-mesh", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    chosen = load_plan(out)
    # each space's plan on a line of its own; the paper's is the one written
    assert f"space paper: {chosen.summary()}" in printed, printed
    assert re.search(r"^space whole-mesh: cfp plan on mesh .* ms/step", printed, re.MULTILINE)
    assert f"chosen: {chosen.summary()}" in printed
    assert chosen.space is None  # the paper's plan, not the whole-mesh space's twin


def test_plan_verifying_the_fit_writes_the_fastest_plan_whose_compiled_step_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--verify-fit` at a budget the fastest predicted plan's compiled step misses (its own
    predicted memory: the tiny GPT's predictions on mesh 4 run a little low) writes a slower
    plan whose compiled step fits, and says how it was found."""
    import explorer as ex

    step, args = ex.models.gpt(ex.models.GPTConfig.tiny())
    analysis = ex.analyze(
        step, *args, mesh=(4,), platform="a100-pcie-8", cache=SHARED_CACHE, progress=False
    )
    fastest = analysis.plan()
    budget = fastest.memory
    assert ex.evaluate(fastest, step, *args).memory > budget, "the test needs a missed budget"
    out = tmp_path / "plan.json"
    argv = [*ZOO, "--cache", str(SHARED_CACHE), "--verify-fit", "--budget", str(budget)]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    chosen = load_plan(out)
    assert "verified: " in printed and "plans compiled to find one that fits" in printed
    assert chosen.time > fastest.time and chosen.memory <= budget
    assert ex.evaluate(chosen, step, *args).memory <= budget
    assert f"chosen: {chosen.summary()}" in printed


@pytest.mark.slow  # XLA:GPU compiles of the chosen plan and of every baseline for the table
def test_plan_over_each_space_on_the_gpu_keeps_the_fastest_predicted_that_fits_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--each-space --gpu-memory`: each space's fastest plan that fits the GPU by XLA:GPU's
    memory, printed with that memory, and the one predicted fastest written (a tie on a 1-D
    mesh: the paper's)."""
    out = tmp_path / "plan.json"
    argv = [*ZOO, "--cache", str(SHARED_CACHE), "--each-space", "--whole-mesh", "--gpu-memory"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    chosen = load_plan(out)
    on_gpu = r"; \d+\.\d{3} GiB on A100-PCIe-40GB \(XLA:GPU\)$"
    assert re.search(f"^space paper: {re.escape(chosen.summary())}{on_gpu}", printed, re.M)
    assert re.search(f"^space whole-mesh: cfp plan on mesh .*{on_gpu}", printed, re.M), printed
    assert "chosen on the GPU: " in printed and chosen.space is None


def _rows(cache: Path) -> int:
    if not cache.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{cache}?mode=ro", uri=True, timeout=5) as db:
            return int(db.execute("SELECT COUNT(*) FROM profiles").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


def test_ctrl_c_stops_profiling_in_seconds_keeps_rows_and_exits_130(tmp_path: Path) -> None:
    """A real `python -m explorer plan` in its own session, sent SIGINT on its whole process
    group as a terminal's Ctrl-C is (the compile workers get it too), once it has profiled a
    program: it stops within seconds, exits 130 with a line saying so and no traceback, and
    the rows it finished stay in the cache."""
    cache = tmp_path / "profiles.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": os.environ["XLA_FLAGS"]}
    process = subprocess.Popen(
        [sys.executable, "-m", "explorer", *ZOO, "--cache", str(cache)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while _rows(cache) == 0 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert process.poll() is None, "the run ended before it could be interrupted"
        assert _rows(cache) > 0, "no program was profiled in 4 minutes"
        sent = time.perf_counter()
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=120)
        stopped = time.perf_counter() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = err.decode()
    assert process.returncode == 130, text
    assert "Traceback" not in text, text
    last = text.strip().splitlines()[-1]
    assert last.startswith("interrupted: profiling cancelled:") and "kept in the cache" in last
    said = re.search(r"(\d+) of (\d+) programs to compile were profiled", last)
    assert said is not None, last
    finished, total = int(said[1]), int(said[2])
    assert 0 < finished < total  # it stopped: the programs after the ones in flight never ran
    assert _rows(cache) == finished  # and every one it finished is in the cache
    # seconds (the programs compiling when Ctrl-C came finish), however many are queued; the
    # bound is loose for a loaded machine: 7-18 s measured on 2 shared cores
    assert stopped < 60.0, f"took {stopped:.1f} s to stop"
    print(f"stopped {stopped:.1f} s after Ctrl-C, {finished} of {total} programs kept")


# -- bench: the harness is the repository's (benchmarks/), imported by the command lazily -------


def test_bench_from_a_checkout_finds_the_harness_outside_the_library(tmp_path: Path) -> None:
    # from the repository root, as the README says; a bad section is refused before any work,
    # by the harness itself (so it was imported)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "explorer", "bench", "--sections", "speed", "--out", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "bench sections: expected some of overhead, accuracy, quality, slider" in result.stderr
    assert not any(tmp_path.iterdir())


def test_bench_without_out_writes_the_repository_report_and_is_refused_alike() -> None:
    # no --out: the report goes to the repository's assets and the README quotes it, so the
    # command must find the README itself (it once looked for it in the wrong module and died
    # with an AttributeError before doing anything)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    readme = (REPO / "README.md").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "explorer", "bench", "--quick", "--sections", "speed"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "bench sections: expected some of overhead, accuracy, quality, slider" in result.stderr
    assert "Traceback" not in result.stderr
    assert (REPO / "README.md").read_text() == readme


def test_bench_without_the_repository_says_to_run_it_from_a_checkout(tmp_path: Path) -> None:
    # explorer installed alone: the package without the repository around it
    site = tmp_path / "site"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "explorer", site / "explorer", ignore=skip)
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-m", "explorer", "bench", "--quick"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert err.startswith("error: explorer bench: expected the benchmark harness"), err
    assert "runs from a checkout of the repository" in err and "cd into it" in err
    assert str(site) in err and "Traceback" not in err
