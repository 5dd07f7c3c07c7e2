"""Per-configuration bars for one segment type (the paper's Fig. 9 view).

For the profiled configurations of the selected segment type, ranked by total time: the
communication time in the upper panel and the computation time in the lower one, each on its
own axis scaled to its own values (stacked on one axis, a layer's computation is a pixel
beside its communication at scale); the configurations the current plan uses outlined; peak
memory on a right-hand axis of the upper panel; the Alpa-style symbolic cost as markers there
when `explorer.alpa` provides it; both times, their shares and the collectives the compiler
emitted in the hover. A type with many configurations (a GPT
layer has 81) shows the `TOP` fastest and every one the plan uses, whatever its rank; a text
filter narrows the ranking to the configurations whose name holds it (the plan's stay).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from explorer.ui import style

if TYPE_CHECKING:
    from explorer.pipeline import Analysis

TOP = 24  # configurations drawn when a type has more (the plan's are always drawn too)
# the panels' vertical extents (paper fractions): communication above, computation below
COMM_DOMAIN = (0.5, 1.0)
COMPUTE_DOMAIN = (0.0, 0.4)

ALPA_MISSING = (
    "no Alpa-style symbolic cost markers: explorer.alpa is not part of this build "
    "(symbolic_config_costs could not be imported)"
)


@dataclass(frozen=True, slots=True)
class Symbolic:
    """The Alpa-style symbolic cost per (segment type, configuration), or why there is none."""

    costs: dict[tuple[int, str], float]
    note: str = ""


def symbolic_costs(analysis: Analysis) -> Symbolic:
    """Read `explorer.alpa.symbolic_config_costs(analysis)` if that module exists."""
    try:
        from explorer.alpa import symbolic_config_costs
    except ImportError:
        return Symbolic({}, ALPA_MISSING)
    try:
        frame = symbolic_config_costs(analysis)
    except Exception as err:  # shown next to the bars, not swallowed
        return Symbolic({}, f"no symbolic cost markers: {type(err).__name__}: {err}")
    costs = {
        (int(row["segment"]), str(row["config"])): float(row["symbolic_cost"])
        for row in frame.to_dict("records")
    }
    return Symbolic(costs)


@dataclass(frozen=True, slots=True)
class BarsData:
    """Everything the bar chart shows for one segment type and one plan."""

    segment: int
    label: str
    configs: tuple[str, ...]  # sorted by total time
    t_comp_ms: tuple[float, ...]
    t_comm_ms: tuple[float, ...]
    memory: tuple[float, ...]  # in `unit`
    symbolic_ms: tuple[float | None, ...]
    chosen: tuple[int, ...]  # per config: how many instances of the type the plan gives it
    collectives: tuple[str, ...]  # per config: hover text
    note: str
    unit: style.MemoryUnit = style.MIB
    memory_bytes: tuple[int, ...] = ()
    filter: str = ""  # only configurations whose name contains it (any case), and the plan's

    @property
    def matching(self) -> tuple[int, ...]:
        needle = self.filter.strip().lower()
        return tuple(i for i, c in enumerate(self.configs) if needle in c.lower())

    @property
    def shown(self) -> tuple[int, ...]:
        """The configurations drawn, by rank: the `TOP` fastest of those the filter keeps,
        and every chosen one."""
        kept = set(self.matching[:TOP])
        return tuple(i for i in range(len(self.configs)) if i in kept or self.chosen[i])


def with_chosen(
    base: BarsData, configs: tuple[str, ...], instances: list[int], text: str = ""
) -> BarsData:
    """The bars of `base` with what the plan gives `instances` (its configuration per
    instance is `configs`) and the text filter."""
    used = used_configs(configs, instances)
    return dataclasses.replace(
        base, chosen=tuple(used.get(c, 0) for c in base.configs), filter=text
    )


def profiled_bars(
    analysis: Analysis, segment: int, symbolic: Symbolic, unit: style.MemoryUnit = style.MIB
) -> BarsData:
    """The plan-independent part of the bars of one segment type (nothing chosen)."""
    table = analysis.profiles
    rows = table[(table["kind"] == "segment") & (table["segment"] == segment)]
    ok = rows[rows["status"] == "ok"].sort_values("t_total", kind="stable")
    failed = rows[rows["status"] != "ok"]
    notes = []
    if len(failed):
        reasons = Counter(str(r).split(":", 1)[0] for r in failed["reason"])
        notes.append(
            f"{len(failed)} configuration(s) failed to profile and are not drawn ("
            + ", ".join(f"{n} x{c}" for n, c in reasons.items())
            + f"); first: {failed['config'].iloc[0]}: {failed['reason'].iloc[0]}"
        )
    if symbolic.note:
        notes.append(symbolic.note)
    configs = tuple(str(c) for c in ok["config"])
    label = analysis.segments.unique[segment].label
    return BarsData(
        segment=segment,
        label=label,
        configs=configs,
        t_comp_ms=tuple(1e3 * float(v) for v in ok["t_comp"]),
        t_comm_ms=tuple(1e3 * float(v) for v in ok["t_comm"]),
        memory=tuple(unit.of(float(v)) for v in ok["memory"]),
        symbolic_ms=tuple(
            None if (segment, c) not in symbolic.costs else 1e3 * symbolic.costs[(segment, c)]
            for c in configs
        ),
        chosen=tuple(0 for _ in configs),
        collectives=tuple(_collectives_text(v) for v in ok["collectives"]),
        note="; ".join(notes),
        unit=unit,
        memory_bytes=tuple(int(v) for v in ok["memory"]),
    )


def _collectives_text(raw: Any) -> str:
    items = json.loads(raw) if isinstance(raw, str) and raw else []
    if not items:
        return "no collectives"
    groups: dict[tuple[str, str], list[int]] = {}
    for c in items:
        axes = "+".join(c.get("axes", [])) or "?"
        groups.setdefault((c["kind"], axes), []).append(int(c["bytes"]))
    return "<br>".join(
        f"{kind} over {axes}: {len(sizes)} x, {style.mib(sum(sizes))} total"
        for (kind, axes), sizes in groups.items()
    )


def empty_bars(note: str) -> BarsData:
    return BarsData(-1, "", (), (), (), (), (), (), (), note)


def _hover(data: BarsData, i: int) -> str:
    tp, tc, n = data.t_comp_ms[i], data.t_comm_ms[i], data.chosen[i]
    total = tp + tc
    share = 100 * tc / total if total > 0 else 0.0
    exact = f" ({style.exact_bytes(data.memory_bytes[i])})" if data.memory_bytes else ""
    return (
        f"<b>{data.configs[i]}</b> (rank {i + 1} of {len(data.configs)})<br>"
        f"total {total:.4g} ms per instance<br>"
        f"computation {tp:.4g} ms ({_percent(100 - share if total > 0 else 0.0)} of the time)<br>"
        f"communication {tc:.4g} ms ({_percent(share)} of the time)<br>"
        f"peak memory {data.memory[i]:.4g} {data.unit.name}{exact}"
        + (f"<br>chosen by the plan on {n} instance(s)" if n else "")
        + f"<br><i>collectives emitted</i>:<br>{data.collectives[i]}"
    )


def _percent(value: float) -> str:
    """Whole percents, and two digits below one (a layer's computation beside its
    communication at scale is 0.1 %, not 0 %)."""
    return f"{value:.0f}%" if value >= 1 or value == 0 else f"{value:.2g}%"


class BarsView:
    """One figure; `show` replaces its data in place (the traces stay)."""

    def __init__(self) -> None:
        self.data = empty_bars("")
        self._drawn = False  # nothing sent yet
        self._title = ""
        self.figure = go.FigureWidget(
            data=[
                go.Bar(name="computation", yaxis="y", marker={"color": style.OKABE_ITO[4]}),
                go.Bar(
                    name="communication",
                    yaxis="y3",
                    marker={"color": style.OKABE_ITO[5], "pattern": {"shape": "/"}},
                ),
                go.Scatter(
                    name="peak memory",
                    yaxis="y2",
                    mode="lines+markers",
                    line={"color": style.OKABE_ITO[2], "width": 1},
                    marker={"size": 5},
                ),
                go.Scatter(
                    name="Alpa-style symbolic cost",
                    yaxis="y3",
                    mode="markers",
                    marker={"symbol": "x", "size": 8, "color": "#000000"},
                ),
            ],
            layout=go.Layout(
                **style.figure_layout(height=460, margin={"l": 60, "r": 80, "t": 60, "b": 90}),
                # two panels on one category axis: each time readable on its own scale
                yaxis={"title": {"text": "computation (ms)"}, "domain": COMPUTE_DOMAIN},
                yaxis3={
                    "title": {"text": "communication (ms)"},
                    "domain": COMM_DOMAIN,
                    "anchor": "x",
                },
                yaxis2={
                    "title": {"text": "peak memory (MiB)"},
                    "overlaying": "y3",
                    "side": "right",
                },
                xaxis={"tickangle": -60, "tickfont": {"size": 9}, "type": "category"},
            ),
        )

    def show(self, data: BarsData) -> None:
        """Draw `data`; for the same segment's bars and ranks only the highlight is re-sent,
        and nothing when the plan gives the type the same configurations."""
        previous, self.data = self.data, data
        if previous == data and self._drawn:
            return
        self._drawn = True
        shown = data.shown

        def drawn(d: BarsData) -> tuple[Any, ...]:
            return (d.segment, d.configs, d.t_comp_ms, d.symbolic_ms, d.shown, d.unit)

        same = drawn(previous) == drawn(data)
        configs = [data.configs[i] for i in shown]
        width = [3.0 if data.chosen[i] else 0.0 for i in shown]
        lit = any(data.chosen)
        opacity = [1.0 if data.chosen[i] or not lit else 0.55 for i in shown]
        hover = [_hover(data, i) for i in shown]
        title = _title(data, shown)
        fig = self.figure
        if same:  # a slider step: the highlight and the title, in one message
            highlight = {"hovertext": hover, "marker.line.width": width, "marker.opacity": opacity}
            relayout = {"title.text": title} if title != self._title else None
            style.send(fig, {0: highlight, 1: highlight}, relayout)
            self._title = title
            return
        has_symbolic = [i for i in shown if data.symbolic_ms[i] is not None]
        with fig.batch_update():
            for trace, values in ((fig.data[0], data.t_comp_ms), (fig.data[1], data.t_comm_ms)):
                trace.x = configs
                trace.y = [values[i] for i in shown]
                trace.hoverinfo = "text"
                trace.hovertext = hover
                trace.marker.line = {"color": style.CHOSEN, "width": width}
                trace.marker.opacity = opacity
            fig.data[2].x = configs
            fig.data[2].y = [data.memory[i] for i in shown]
            fig.data[2].hovertext = hover
            fig.data[2].hoverinfo = "text"
            fig.data[3].x = [data.configs[i] for i in has_symbolic]
            fig.data[3].y = [data.symbolic_ms[i] for i in has_symbolic]
            fig.layout.yaxis.range = _range([data.t_comp_ms[i] for i in shown])
            fig.layout.yaxis3.range = _range(
                [data.t_comm_ms[i] for i in shown]
                + [data.symbolic_ms[i] or 0.0 for i in has_symbolic]
            )
            fig.layout.yaxis2.title = {"text": f"peak memory ({data.unit.name})"}
            fig.layout.title = style.title(title)
        self._title = title


def _range(values: list[float]) -> list[float]:
    """An axis from zero to just above the largest value (its own values, not the other
    panel's), so the tallest bar fills its panel."""
    top = max(values, default=0.0)
    return [0.0, 1.08 * top if top > 0 else 1.0]


def _title(data: BarsData, shown: tuple[int, ...]) -> str:
    if not data.configs:
        return data.note or "select a segment"
    chosen = [c for c, n in zip(data.configs, data.chosen, strict=True) if n]
    matching = len(data.matching)
    among = (
        f"{matching} of {len(data.configs)} configurations matching “{data.filter}”"
        if data.filter.strip()
        else f"{len(data.configs)} configurations"
    )
    ranked = (f"the {TOP} fastest of {among}" if matching > TOP else among) + (
        " and the plan's" if len(shown) > min(TOP, matching) else ""
    )
    return f"{data.label}: {ranked}" + (f"; plan uses {', '.join(chosen)}" if chosen else "")


def used_configs(configs: tuple[str, ...], instances: list[int]) -> Counter[str]:
    """How many of `instances` the plan gives each configuration."""
    return Counter(configs[i] for i in instances) if configs else Counter()
