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
    memory_mib: tuple[float, ...]
    time_ms: tuple[float, ...]
    current: tuple[float, float] | None  # (memory MiB, time ms) of the current plan
    budget_mib: float | None
    others: tuple[tuple[str, float, float], ...] = ()  # (name, memory MiB, time ms) baselines
    note: str = ""


def frontier_data(
    frontier: Frontier | None,
    current: tuple[int, float] | None,
    budget: float | None,
    others: tuple[tuple[str, int, float], ...] = (),
    note: str = "",
) -> FrontierData:
    """`current`/`others` as (memory bytes, time seconds)."""
    points = frontier.points if frontier is not None else ()
    return FrontierData(
        memory_mib=tuple(p.memory / 2**20 for p in points),
        time_ms=tuple(1e3 * p.time for p in points),
        current=None if current is None else (current[0] / 2**20, 1e3 * current[1]),
        budget_mib=None if budget is None else budget / 2**20,
        others=tuple((name, m / 2**20, 1e3 * t) for name, m, t in others),
        note=note,
    )


class FrontierView:
    def __init__(self) -> None:
        self.data = FrontierData((), (), None, None)
        self.figure = go.FigureWidget(
            data=[
                go.Scatter(
                    name="Pareto frontier",
                    mode="lines+markers",
                    line={"shape": "hv", "color": style.OKABE_ITO[4]},
                    marker={"size": 6},
                    hovertemplate="%{x:.4g} MiB, %{y:.4g} ms<extra>frontier</extra>",
                ),
                go.Scatter(
                    name="current plan",
                    mode="markers",
                    marker={"size": 14, "symbol": "star", "color": style.OKABE_ITO[5]},
                    hovertemplate="%{x:.4g} MiB, %{y:.4g} ms<extra>current plan</extra>",
                ),
                go.Scatter(
                    name="baselines",
                    mode="markers+text",
                    textposition="top center",
                    marker={"size": 9, "symbol": "diamond", "color": style.OKABE_ITO[6]},
                    hovertemplate="%{text}: %{x:.4g} MiB, %{y:.4g} ms<extra></extra>",
                ),
            ],
            layout=go.Layout(
                height=360,
                width=430,
                margin={"l": 50, "r": 10, "t": 80, "b": 50},
                xaxis={"title": {"text": "memory per device (MiB)"}},
                yaxis={"title": {"text": "time per step (ms)"}},
                legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
                template="plotly_white",
            ),
        )

    def show(self, data: FrontierData) -> None:
        """Redraw; the frontier line is only re-sent when it changed."""
        previous, self.data = self.data, data
        fig = self.figure
        with fig.batch_update():
            if (previous.memory_mib, previous.time_ms) != (data.memory_mib, data.time_ms):
                fig.data[0].x = list(data.memory_mib)
                fig.data[0].y = list(data.time_ms)
            fig.data[1].x = [] if data.current is None else [data.current[0]]
            fig.data[1].y = [] if data.current is None else [data.current[1]]
            if previous.others != data.others:
                fig.data[2].x = [m for _, m, _ in data.others]
                fig.data[2].y = [t for _, _, t in data.others]
                fig.data[2].text = [n for n, _, _ in data.others]
            fig.layout.shapes = (
                []
                if data.budget_mib is None
                else [
                    {
                        "type": "line",
                        "x0": data.budget_mib,
                        "x1": data.budget_mib,
                        "yref": "paper",
                        "y0": 0,
                        "y1": 1,
                        "line": {"dash": "dash", "color": "#555555"},
                    }
                ]
            )
            fig.layout.title = {
                "text": f"{len(data.time_ms)} Pareto-optimal plans"
                + (f" ({data.note})" if data.note else ""),
                "font": {"size": 12},
                "y": 0.98,
            }
