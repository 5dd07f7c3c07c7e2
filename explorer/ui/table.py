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

from explorer.ui import style

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


def table_html(rows: tuple[BaselineRow, ...], unit: style.MemoryUnit = style.MIB) -> str:
    def ms(v: float | None) -> str:
        return "" if v is None else f"{1e3 * v:.4f}"

    def memory(v: int | None) -> str:
        if v is None:
            return ""
        return f"<span title='{style.exact_bytes(v)}'>{unit.of(v):.4g}</span>"

    head = (
        "<tr><th>plan</th><th>predicted ms</th><th>evaluated ms</th>"
        f"<th>predicted {unit.name}</th><th>evaluated {unit.name}</th><th>note</th></tr>"
    )
    body = "".join(
        f"<tr><td title='{html.escape(r.name)}'><b>{html.escape(style.plan_name(r.name))}</b>"
        f"</td><td>{ms(r.predicted_s)}</td><td>{ms(r.evaluated_s)}</td><td>{memory(r.memory)}"
        f"</td><td>{memory(r.evaluated_memory)}</td>"
        f"<td style='color:#B00020'>{html.escape(r.error)}</td></tr>"
        for r in rows
    )
    return (
        "<table class='explorer-baselines' style='border-collapse:collapse;font-size:12px'>"
        f"{head}{body}</table>"
    )
