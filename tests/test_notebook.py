"""The notebook runs headless, top to bottom, as "run all" would.

Its profile cache is a fresh temporary file (EXPLORER_CACHE), so this is the cold run the
notebook promises to finish in about a minute on two cores; the wall time is printed.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the test extra is not installed")
nbclient = pytest.importorskip("nbclient", reason="the test extra is not installed")
pytest.importorskip("ipywidgets", reason="the ui extra is not installed")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore.ipynb"
CELL_TIMEOUT_S = 600


@pytest.mark.slow
def test_the_notebook_runs_all_cells_cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, copy)
    plan = tmp_path / "exported.json"
    monkeypatch.setenv("EXPLORER_CACHE", str(tmp_path / "profiles.sqlite"))
    monkeypatch.setenv("EXPLORER_PLAN", str(plan))
    notebook = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    print(f"\nnotebook run-all, cold profile cache: {seconds:.1f} s")

    outputs = [
        "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stdout")
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]
    errors = [
        o for cell in notebook.cells for o in cell.get("outputs", []) if o.output_type == "error"
    ]
    assert errors == []
    assert plan.is_file() and f"exported {plan}" in outputs[-3]
    assert "cfp plan on mesh 8 (x)" in outputs[-3]
    # why this plan: every collective of the compiled step attributed, with its time
    assert outputs[-2].startswith("cfp plan on 8 (x) (a100-pcie-8): ")
    assert re.search(r"\d+ collectives, [\d.]+ us: block \d+", outputs[-2]), outputs[-2]
    assert "profiled 32 programs" in outputs[2]  # the embedding once per head strategy
    last = outputs[-1]
    assert last.startswith("one step of the cfp plan on mesh 8 (x): loss ")
    loss = float(last.rsplit(" ", 1)[1])
    assert 0 < loss < 20  # cross-entropy over a 256-token vocabulary starts near ln 256 = 5.5
    # the app widget was displayed (its view is in the third code cell's outputs)
    widget_views = [
        o
        for o in notebook.cells[3].get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert widget_views
