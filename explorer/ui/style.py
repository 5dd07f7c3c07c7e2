"""Colours and number formats shared by the views.

Block colours are Okabe & Ito's colour-blind-safe palette, extended by Paul Tol's "muted"
set; strategies are told apart by marker symbol and outline (Tol's "bright" set) as well as
by their name, so nothing is encoded by colour alone.
"""

from __future__ import annotations

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
