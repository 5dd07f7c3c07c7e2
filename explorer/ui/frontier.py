"""The time/memory frontier of composed plans, the current plan and the budget marked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from explorer.ui import style

if TYPE_CHECKING:
    from explorer.solve import Frontier


@dataclass(frozen=True, slots=True)
class FrontierData:
    """Memory in `unit` (the analysis's one memory unit), times in ms."""

    memory: tuple[float, ...]
    time_ms: tuple[float, ...]
    current: tuple[float, float] | None  # (memory, time ms) of the current plan
    budget: float | None
    others: tuple[tuple[str, float, float], ...] = ()  # (name, memory, time ms) baselines
    note: str = ""
    unit: style.MemoryUnit = style.MIB
    memory_bytes: tuple[int, ...] = ()  # exact, for the hover


def frontier_data(
    frontier: Frontier | None,
    current: tuple[int, float] | None,
    budget: float | None,
    others: tuple[tuple[str, int, float], ...] = (),
    note: str = "",
    *,
    unit: style.MemoryUnit = style.MIB,
) -> FrontierData:
    """`current`/`others` as (memory bytes, time seconds). An approximate frontier (a memory
    resolution: `analyze`) says how far from the exact one it may be in the note."""
    points = frontier.points if frontier is not None else ()
    within = frontier.approximation(unit.text) if frontier is not None else ""
    if within:
        note = f"{within}; {note}" if note else within
    return FrontierData(
        memory=tuple(unit.of(p.memory) for p in points),
        time_ms=tuple(1e3 * p.time for p in points),
        current=None if current is None else (unit.of(current[0]), 1e3 * current[1]),
        budget=None if budget is None else unit.of(budget),
        others=tuple((name, unit.of(m), 1e3 * t) for name, m, t in others),
        note=note,
        unit=unit,
        memory_bytes=tuple(int(p.memory) for p in points),
    )


class FrontierView:
    def __init__(self) -> None:
        self.data = FrontierData((), (), None, None)
        self._drawn = False  # nothing sent yet
        self._title = ""
        layout = style.figure_layout(height=360, margin={"l": 50, "r": 40, "t": 60, "b": 50})
        self.figure = go.FigureWidget(
            data=[
                go.Scatter(
                    name="Pareto frontier",
                    mode="lines+markers",
                    line={"shape": "hv", "color": style.OKABE_ITO[4]},
                    marker={"size": 6},
                ),
                go.Scatter(
                    name="current plan",
                    mode="markers",
                    marker={"size": 14, "symbol": "star", "color": style.OKABE_ITO[5]},
                    hovertemplate="%{x:.4g}, %{y:.4g} ms<extra>current plan</extra>",
                ),
                go.Scatter(
                    name="baselines",
                    mode="markers+text",
                    textposition="top center",
                    marker={"size": 9, "symbol": "diamond", "color": style.OKABE_ITO[6]},
                    hovertemplate="%{text}: %{x:.4g}, %{y:.4g} ms<extra></extra>",
                ),
            ],
            layout=go.Layout(
                **layout,
                xaxis={"title": {"text": "memory per device (MiB)"}},
                yaxis={"title": {"text": "time per step (ms)"}},
            ),
        )

    def show(self, data: FrontierData) -> None:
        """Redraw. A slider step moves only the current plan's marker and the budget line,
        sent as one message; the rest is re-sent when it changed."""
        previous, self.data = self.data, data
        fig = self.figure
        title = f"{len(data.time_ms)} Pareto-optimal plans" + (
            f" ({data.note})" if data.note else ""
        )
        current = {
            "x": [] if data.current is None else [data.current[0]],
            "y": [] if data.current is None else [data.current[1]],
        }
        steady = (
            self._drawn
            and (previous.memory, previous.time_ms, previous.unit, previous.others)
            == (data.memory, data.time_ms, data.unit, data.others)
            and (previous.budget is None) == (data.budget is None)
        )
        if steady:
            relayout: dict[str, object] = {}
            if data.budget is not None and data.budget != previous.budget:
                relayout.update({"shapes[0].x0": data.budget, "shapes[0].x1": data.budget})
            if title != self._title:
                relayout["title.text"] = title
            restyle = {1: current} if previous.current != data.current else {}
            style.send(fig, restyle, relayout)
            self._title = title
            return
        self._drawn = True
        with fig.batch_update():
            fig.data[0].x = list(data.memory)
            fig.data[0].y = list(data.time_ms)
            fig.data[0].customdata = [style.exact_bytes(b) for b in data.memory_bytes]
            fig.data[0].hovertemplate = (
                f"%{{x:.4g}} {data.unit.name} (%{{customdata}}), %{{y:.4g}} ms"
                "<extra>frontier plan</extra>"
            )
            fig.layout.xaxis.title = {"text": f"memory per device ({data.unit.name})"}
            fig.data[1].x, fig.data[1].y = current["x"], current["y"]
            fig.data[2].x = [m for _, m, _ in data.others]
            fig.data[2].y = [t for _, _, t in data.others]
            fig.data[2].text = [n for n, _, _ in data.others]
            fig.layout.shapes = (
                []
                if data.budget is None
                else [
                    {
                        "type": "line",
                        "x0": data.budget,
                        "x1": data.budget,
                        "yref": "paper",
                        "y0": 0,
                        "y1": 1,
                        "line": {"dash": "dash", "color": "#555555"},
                    }
                ]
            )
            fig.layout.title = style.title(title)
        self._title = title
