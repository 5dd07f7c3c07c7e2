"""The baseline table: the CFP plan against DP, Megatron, FSDP and the Alpa-style ILP.

Each row is predicted by the cost model and evaluated by compiling the whole step under the
plan (`explorer.evaluate`), so it is computed on request, never on a slider move. A baseline
that cannot be built keeps its row, with the reason.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from explorer.pipeline import Analysis
    from explorer.plan import Plan

BASELINES = ("dp", "megatron", "fsdp", "alpa")


@dataclass(frozen=True, slots=True)
class BaselineRow:
    name: str
    predicted_s: float | None = None
    evaluated_s: float | None = None
    memory: int | None = None  # predicted bytes per device
    evaluated_memory: int | None = None
    error: str = ""


def baseline_rows(
    analysis: Analysis,
    plan: Plan | None,
    names: tuple[str, ...] = BASELINES,
    done: Callable[[BaselineRow], None] | None = None,
) -> tuple[BaselineRow, ...]:
    """One row per plan: `cfp` (the current plan) then each baseline by name."""
    from explorer.plan import evaluate

    rows = []
    candidates: list[tuple[str, Callable[[], Plan]]] = []
    if plan is not None:
        candidates.append(("cfp", lambda: plan))
    candidates += [(name, lambda name=name: analysis.baseline(name)) for name in names]  # type: ignore[misc]
    for name, make in candidates:
        try:
            chosen = make()
        except Exception as err:
            row = BaselineRow(name, error=f"{type(err).__name__}: {err}")
        else:
            try:
                truth = evaluate(chosen, analysis.step, *analysis.args)
            except Exception as err:
                row = BaselineRow(
                    name, chosen.time, memory=chosen.memory, error=f"evaluation failed: {err}"
                )
            else:
                row = BaselineRow(name, chosen.time, truth.time, chosen.memory, truth.memory)
        rows.append(row)
        if done is not None:
            done(row)
    return tuple(rows)


def table_html(rows: tuple[BaselineRow, ...]) -> str:
    def ms(v: float | None) -> str:
        return "" if v is None else f"{1e3 * v:.4f}"

    def mib(v: int | None) -> str:
        return "" if v is None else f"{v / 2**20:.3f}"

    head = (
        "<tr><th>plan</th><th>predicted ms</th><th>evaluated ms</th>"
        "<th>predicted MiB</th><th>evaluated MiB</th><th>note</th></tr>"
    )
    body = "".join(
        f"<tr><td><b>{html.escape(r.name)}</b></td><td>{ms(r.predicted_s)}</td>"
        f"<td>{ms(r.evaluated_s)}</td><td>{mib(r.memory)}</td><td>{mib(r.evaluated_memory)}</td>"
        f"<td style='color:#B00020'>{html.escape(r.error)}</td></tr>"
        for r in rows
    )
    return (
        "<table class='explorer-baselines' style='border-collapse:collapse;font-size:12px'>"
        f"{head}{body}</table>"
    )
