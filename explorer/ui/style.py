"""Colours and number formats shared by the views.

Block colours are Okabe & Ito's colour-blind-safe palette, extended by Paul Tol's "muted"
set; strategies are told apart by marker symbol and outline (Tol's "bright" set) as well as
by their name, so nothing is encoded by colour alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
TOL_MUTED = (
    "#CC6677", "#332288", "#DDCC77", "#117733", "#88CCEE", "#882255", "#44AA99", "#999933",
    "#AA4499",
)  # fmt: skip
BLOCK_COLOURS = OKABE_ITO + TOL_MUTED
STRATEGY_COLOURS = ("#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#000000")
OUTSIDE = "#BBBBBB"  # ops outside every ParallelBlock
NO_PLAN = "#777777"  # outline when no plan is chosen
CHOSEN = "#000000"

# Marker symbol by the role split over the innermost mesh axis (see ir.DimRole).
ROLE_SYMBOLS = {"M": "circle", "N": "square", "K": "diamond", "E": "triangle-up"}


def block_colour(index: int) -> str:
    return BLOCK_COLOURS[index % len(BLOCK_COLOURS)]


def block_cue(index: int) -> str:
    """A second cue for block classes beyond the palette: every other repeat of the palette
    draws its markers with a centre dot (`circle-dot`, `square-dot`...)."""
    return "-dot" if (index // len(BLOCK_COLOURS)) % 2 else ""


def strategy_colour(index: int) -> str:
    return STRATEGY_COLOURS[index % len(STRATEGY_COLOURS)]


def strategy_symbol(name: str) -> str:
    """`"M@x,N@y"` -> the symbol of N (the innermost axis's role); replicated -> cross."""
    last = name.rsplit(",", maxsplit=1)[-1].split("@", maxsplit=1)[0]
    return ROLE_SYMBOLS.get(last, "x")


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.4g} ms"


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.4g} MiB"


@dataclass(frozen=True, slots=True)
class MemoryUnit:
    """The one unit every view of an analysis shows memory in (exact bytes go in hovers)."""

    name: str  # "MiB" or "GiB"
    size: int  # bytes per unit

    def of(self, nbytes: float) -> float:
        return nbytes / self.size

    def text(self, nbytes: float) -> str:
        return f"{nbytes / self.size:.4g} {self.name}"


MIB = MemoryUnit("MiB", 2**20)
GIB = MemoryUnit("GiB", 2**30)


def memory_unit(largest: float) -> MemoryUnit:
    """GiB once the largest amount shown reaches 1 GiB, MiB below."""
    return GIB if largest >= GIB.size else MIB


def exact_bytes(nbytes: float) -> str:
    return f"{int(nbytes):,} bytes"


# What the views call things, in users' words (the engine's names stay in hovers).
PLAN_NAMES = {
    "cfp": "this plan (CFP search)",
    "dp": "data parallel",
    "megatron": "Megatron tensor parallel",
    "fsdp": "FSDP / ZeRO-3",
    "alpa": "Alpa-style ILP",
}
GLOSSARY = (
    "<b>Terms.</b> <i>block</i>: a contraction (matmul) and the ops that follow its sharding; "
    "<i>strategy</i> <code>M@x</code> / <code>N@x</code> / <code>K@x</code> / "
    "<code>E@x</code>: split the block's batch rows / output columns / contracted dim / "
    "experts over mesh axis <code>x</code>; <i>segment</i>: a run of blocks (a layer), "
    "profiled once per type; <i>configuration</i>: one strategy per block of a segment; "
    "<i>frontier</i>: the plans no other beats on both time and memory; <i>budget</i>: the "
    "most memory per device a plan may use."
)


def plan_name(name: str) -> str:
    return PLAN_NAMES.get(name, name)


def partition_spec_text(spec: Any) -> str:
    """A plan's JSON PartitionSpec (`[["x"], null]`) as `P('x', None)`."""
    if spec is None:
        return "replicated"
    parts = []
    for axes in spec:
        if not axes:
            parts.append("None")
        elif len(axes) == 1:
            parts.append(repr(axes[0]))
        else:
            parts.append("(" + ", ".join(repr(a) for a in axes) + ")")
    while parts and parts[-1] == "None":
        parts.pop()
    return f"P({', '.join(parts)})"


def figure_layout(height: int, margin: dict[str, int]) -> dict[str, Any]:
    """What every figure shares: the width follows its container (autosize), the mode bar
    stands vertically at the right edge so it never covers the title (left-aligned), and
    the legend sits under the title."""
    return {
        "height": height,
        "autosize": True,
        "margin": margin,
        "modebar": {"orientation": "v"},
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
        "template": "plotly_white",
    }


def title(text: str, size: int = 12) -> dict[str, Any]:
    return {
        "text": text,
        "font": {"size": size},
        "x": 0.0,
        "xref": "paper",
        "xanchor": "left",
        "y": 0.99,
        "yanchor": "top",
    }


def send(
    figure: Any,
    restyle: dict[int, dict[str, Any]],
    relayout: dict[str, Any] | None = None,
) -> None:
    """A re-solve's changes to one figure as one `plotly_update` message.

    Setting trace properties one by one runs plotly's validators on every array and sends a
    message per property; on a slider step that is most of the kernel's time. The views send
    here only values they built from closed sets (colours, symbols, numbers, text), per trace
    the same keys (`restyle[trace][key]`), so one unvalidated update is safe.
    """
    traces = sorted(t for t, props in restyle.items() if props)
    keys = sorted({k for t in traces for k in restyle[t]})
    if any(set(restyle[t]) != set(keys) for t in traces):
        raise ValueError(f"send: every trace needs the same keys {keys}")
    data = {k: [list(restyle[t][k]) for t in traces] for k in keys}
    if not data and not relayout:
        return
    figure.plotly_update(
        restyle_data=data or None, relayout_data=relayout or None, trace_indexes=traces or None
    )
