"""The benchmark harness on a real (small) case: rows come from real analyses and evaluations,
and the report and README section are generated from them."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from helpers import SHARED_CACHE

from explorer.bench import (
    README_END,
    README_START,
    Case,
    Run,
    _accuracy_case,
    geomean,
    quality_summary,
    quick_settings,
    write_report,
)
from explorer.errors import ExplorerError


def _run(tmp_path: Path) -> Run:
    return Run(quick_settings(), tmp_path / "bench", SHARED_CACHE, lambda line: None)


@pytest.mark.slow
def test_accuracy_rows_compare_real_predictions_with_whole_step_truth(tmp_path: Path) -> None:
    run = _run(tmp_path)
    # tiny GPT (2 layers) on 4 devices: the profiles the plan tests made, from the session cache
    _accuracy_case(run, Case("gpt", "tiny", (4,)), "a100-pcie-8", "compiled", 4)
    assert not run.failures
    frame = pd.DataFrame(run.accuracy)
    assert len(frame) == 4
    assert set(frame["plan"]) <= {"frontier", "random"}
    assert (frame["predicted_s"] > 0).all() and (frame["evaluated_s"] > 0).all()
    assert (frame["evaluated_memory"] > 0).all()
    expected = (frame["predicted_s"] - frame["evaluated_s"]) / frame["evaluated_s"]
    assert list(frame["time_error"]) == pytest.approx(list(expected))

    # Fig. 9 rows: every profiled configuration of every unique segment, priced symbolically
    symbolic = pd.DataFrame(run.symbolic)
    assert symbolic.groupby("segment").size().max() == 81  # the GPT layer: 3**4
    assert (symbolic["symbolic_s"] >= 0).all() and (symbolic["profiled_s"] > 0).all()

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_START}\nold\n{README_END}\n\ntail\n")
    report = write_report(run, 12.0, readme)
    text = report.read_text()
    assert "gpt-tiny 4" in text and "median abs. error" in text
    assert (run.out / "accuracy.csv").read_text().count("\n") == 5  # header + 4 rows
    assert (run.out / "accuracy.png").stat().st_size > 1000
    assert (run.out / "symbolic.png").stat().st_size > 1000
    assert "Spearman" in text
    updated = readme.read_text()
    assert "old" not in updated and "tail" in updated and "gpt-tiny 4" in updated

    readme.write_text("# no markers\n")
    with pytest.raises(ExplorerError, match="expected the markers"):
        write_report(run, 12.0, readme)


def test_quality_summary_gives_ratios_over_the_cfp_plan_and_flags_oom() -> None:
    rows = [
        {"case": "c", "platform": "p", "plan": "cfp", "evaluated_s": 2.0, "fits": True},
        {"case": "c", "platform": "p", "plan": "dp", "evaluated_s": 3.0, "fits": True},
        {"case": "c", "platform": "p", "plan": "fsdp", "evaluated_s": 1.0, "fits": False},
    ]
    summary = quality_summary(pd.DataFrame(rows)).iloc[0]
    assert summary["dp"] == "1.50" and summary["fsdp"] == "0.50 (OOM)"
    assert summary["megatron"] == "failed"
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert math.isnan(geomean([]))
