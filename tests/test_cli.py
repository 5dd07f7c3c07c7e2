"""The command line: `plan` and `calibrate`, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from explorer.cli import main
from explorer.platforms import load_platform


def test_plan_without_profiling_prints_blocks_and_program_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["plan", "--model", "llama", "--preset", "tiny", "--mesh", "2x2", "--no-profile"]) == 0
    )
    out = capsys.readouterr().out
    assert "ParallelBlocks" in out and "programs to profile (Eq. 7)" in out
    assert "M@x+y" in out  # 2-D strategies with batch pinned to the outer axis


def test_plan_rejects_an_unknown_preset_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "gpt", "--preset", "huge", "--no-profile"]) == 2
    err = capsys.readouterr().err
    assert "no preset 'huge'" in err and "tiny" in err


def test_calibrate_writes_a_platform_file_that_loads(tmp_path: Path) -> None:
    out = tmp_path / "here.json"
    assert main(["calibrate", "--out", str(out), "--sizes", "4096,65536", "--repeats", "2"]) == 0
    platform = load_platform(out)
    assert platform.devices == 8
    assert json.loads(out.read_text())["sources"]
