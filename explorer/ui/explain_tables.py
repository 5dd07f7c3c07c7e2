"""Why this plan, as tables and markers: pure functions of what `explorer.explain` returns.

`explain_data` turns an attribution into table rows (slowest first) and one marker per block;
`counterfactual_rows` the per-block counterfactuals; the `*_html` functions draw them. Nothing
here computes a cost: every number is the engine's, only converted to the units shown.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from explorer.ui import style

if TYPE_CHECKING:
    from explorer.explain import Attribution, Counterfactuals, PlanDiff
    from explorer.pipeline import Analysis

COLLECTIVE_ROWS = 60  # the slowest collectives listed; the rest are counted


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    block: str  # "layer_3 · mlp out (#13)", a boundary "a -> b", or the op's segment
    kind: str
    nbytes: int
    axes: str
    time_us: float
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class BlockMarker:
    """The collectives one block makes the compiler emit (the graph's marker and hover)."""

    block: int
    count: int
    time_us: float
    hover: str


@dataclass(frozen=True, slots=True)
class CounterfactualRow:
    block: str
    current: str
    strategy: str
    time_delta_ms: float | None
    memory_delta: float | None  # in the unit
    memory_delta_bytes: int | None
    note: str


@dataclass(frozen=True, slots=True)
class ExplainData:
    """Everything the panel shows about one plan."""

    summary: str
    collectives: tuple[CollectiveRow, ...]  # slowest first
    more: int  # collectives beyond those listed
    markers: tuple[BlockMarker, ...]
    unit: style.MemoryUnit = style.MIB


def block_label(analysis: Analysis, names: tuple[str, ...], block: int | None) -> str:
    if block is None:
        return ""
    instance = analysis.segments.instances[
        analysis.segments.segment_of_op[analysis.blocks[block].head]
    ]
    return f"{instance.label} · {names[block]} (#{block})"


def explain_data(
    analysis: Analysis, attribution: Attribution, names: tuple[str, ...]
) -> ExplainData:
    """The attribution as table rows (slowest first) and one marker per block."""
    rows = []
    per_block: dict[int, list[Any]] = defaultdict(list)
    for c in sorted(attribution.collectives, key=lambda c: -c.time):
        if c.target.value == "boundary":
            where = (
                f"{block_label(analysis, names, c.source_block)} -> "
                f"{block_label(analysis, names, c.block)}"
            )
        elif c.block is not None:
            where = block_label(analysis, names, c.block)
        else:
            where = f"{c.segment_label or 'outside every segment'} (no block)"
        rows.append(
            CollectiveRow(
                where, c.kind, c.nbytes, ",".join(c.axes), 1e6 * c.time, c.source, c.target.value
            )
        )
        if c.block is not None:
            per_block[c.block].append(c)
    markers = []
    for block, found in sorted(per_block.items()):
        total = sum(c.time for c in found)
        lines = [
            f"<b>{html.escape(block_label(analysis, names, block))}</b>: {len(found)} "
            f"collective(s), {1e6 * total:.1f} us"
        ] + [
            f"{c.kind} {c.nbytes:,} B over {','.join(c.axes) or '-'}: {1e6 * c.time:.1f} us"
            + (" (resharding in)" if c.target.value == "boundary" else "")
            for c in found[:8]
        ]
        if len(found) > 8:
            lines.append(f"... and {len(found) - 8} more")
        markers.append(BlockMarker(block, len(found), 1e6 * total, "<br>".join(lines)))
    return ExplainData(
        summary=attribution.summary(),
        collectives=tuple(rows[:COLLECTIVE_ROWS]),
        more=max(len(rows) - COLLECTIVE_ROWS, 0),
        markers=tuple(markers),
    )


def counterfactual_rows(
    analysis: Analysis,
    table: Counterfactuals,
    names: tuple[str, ...],
    unit: style.MemoryUnit,
) -> tuple[CounterfactualRow, ...]:
    """One row per (block, other strategy); a block's twins (a scan) are one row."""
    rows = []
    seen: set[tuple[tuple[int, ...], str]] = set()
    for r in table.rows:
        if (r.blocks, r.strategy) in seen:
            continue
        seen.add((r.blocks, r.strategy))
        label = block_label(analysis, names, r.block)
        if len(r.blocks) > 1:
            label += f" and its {len(r.blocks) - 1} twins"
        rows.append(
            CounterfactualRow(
                block=label,
                current=r.current,
                strategy=r.strategy,
                time_delta_ms=None if r.time_delta is None else 1e3 * r.time_delta,
                memory_delta=None if r.memory_delta is None else unit.of(r.memory_delta),
                memory_delta_bytes=r.memory_delta,
                note=r.note,
            )
        )
    return tuple(rows)


# -- HTML ---------------------------------------------------------------------------------------

SCROLL = "max-height:320px;overflow:auto;border:1px solid #DDDDDD"
TABLE = "border-collapse:collapse;font-size:12px;width:100%"


def collectives_html(data: ExplainData) -> str:
    head = (
        "<tr><th>block</th><th>collective</th><th>bytes</th><th>mesh axes</th>"
        "<th>time (us)</th><th>source line</th><th>attributed to</th></tr>"
    )
    body = "".join(
        f"<tr><td>{html.escape(r.block)}</td><td>{r.kind}</td><td>{r.nbytes:,}</td>"
        f"<td>{html.escape(r.axes)}</td><td>{r.time_us:.2f}</td>"
        f"<td>{_source(r.source)}</td><td>{r.target}</td></tr>"
        for r in data.collectives
    )
    more = f"<i>... and {data.more} faster collectives</i>" if data.more else ""
    return (
        f"<div><b>Collectives of the compiled step</b>: {html.escape(data.summary)}</div>"
        f"<div style='{SCROLL}'><table class='explorer-collectives' style='{TABLE}'>{head}{body}"
        f"</table>{more}</div>"
    )


def _axes(spec: tuple[tuple[str, ...], ...]) -> str:
    """A parameter layout as mesh axes per dim: ("x", "-") for P('x', None)."""
    return "(" + ", ".join("+".join(a) if a else "-" for a in spec) + ")"


def _source(where: str) -> str:
    """`/long/path/to/file.py:12 (fn)` as `to/file.py:12 (fn)` (the full path in the hover)."""
    if ":" not in where:  # none recorded: say so rather than draw a bare colon
        return f"<i>{html.escape(where or 'no source line')}</i>"
    path, _, rest = where.partition(":")
    short = "/".join(path.split("/")[-2:])
    return f"<code title='{html.escape(where)}'>{html.escape(short)}:{html.escape(rest)}</code>"


def _note(note: str) -> str:
    """An unpriced alternative: why, in brief (the engine's full reason in the hover)."""
    if not note:
        return ""
    brief = "not profiled" if "no profiled configuration" in note else note
    return f"<span title='{html.escape(note)}'>{html.escape(brief)}</span>"


def counterfactuals_html(rows: tuple[CounterfactualRow, ...], unit: style.MemoryUnit) -> str:
    def ms(v: float | None) -> str:
        return "" if v is None else f"{v:+.4f}"

    def memory(r: CounterfactualRow) -> str:
        if r.memory_delta is None or r.memory_delta_bytes is None:
            return ""
        return f"<span title='{r.memory_delta_bytes:+,} bytes'>{r.memory_delta:+.4g}</span>"

    head = (
        "<tr><th>block</th><th>plan's strategy</th><th>instead</th><th>time (ms)</th>"
        f"<th>memory ({unit.name})</th><th>note</th></tr>"
    )
    body = "".join(
        f"<tr><td>{html.escape(r.block)}</td><td>{html.escape(r.current)}</td>"
        f"<td>{html.escape(r.strategy)}</td><td>{ms(r.time_delta_ms)}</td><td>{memory(r)}</td>"
        f"<td>{_note(r.note)}</td></tr>"
        for r in rows
    )
    return (
        "<div><b>What changing one block would do</b> (from the profiles: + is slower, "
        "- saves memory)</div>"
        f"<div style='{SCROLL}'><table class='explorer-counterfactuals' style='{TABLE}'>"
        f"{head}{body}</table></div>"
    )


def diff_html(
    diff: PlanDiff, against: str, unit: style.MemoryUnit, label: Callable[[int], str]
) -> str:
    """The engine's diff (`before` the plan compared with, `after` this plan); blocks by
    `label` (their role names), parameters by path, segments by instance."""
    if diff.empty:
        same = f"<b>Against {html.escape(against)}</b>: the same plan."
        return f"<div class='explorer-diff'>{same}</div>"
    changes = (
        [("block", label(c.block), c.before, c.after) for c in diff.blocks]
        + [("parameter", c.path, _axes(c.before), _axes(c.after)) for c in diff.parameters]
        + [("segment", c.label, c.before, c.after) for c in diff.segments]
    )
    rows = "".join(
        f"<tr><td>{what}</td><td>{html.escape(where)}</td><td>{html.escape(before)}</td>"
        f"<td>{html.escape(after)}</td></tr>"
        for what, where, before, after in changes
    )
    return (
        f"<div class='explorer-diff'><b>Against {html.escape(against)}</b>: this plan takes "
        f"{1e3 * diff.time_delta:+.4f} ms/step and "
        f"<span title='{diff.memory_delta:+,} bytes'>{unit.of(diff.memory_delta):+.4g} "
        f"{unit.name}</span> per device against it; {len(diff.blocks)} blocks, "
        f"{len(diff.parameters)} parameter layouts and {len(diff.segments)} segment "
        f"configurations differ.</div><div style='{SCROLL}'><table style='{TABLE}'>"
        f"<tr><th>what</th><th>where</th><th>{html.escape(against)}</th><th>this plan</th></tr>"
        f"{rows}</table></div>"
    )
