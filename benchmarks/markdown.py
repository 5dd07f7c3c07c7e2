"""Tables as Markdown, and the README's generated sections replaced between their markers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from explorer.errors import ExplorerError


def markdown(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "_(no rows)_\n"
    columns = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(map(_cell, columns)) + " |", "|" + "---|" * len(columns)]
    for record in frame.to_dict("records"):
        lines.append("| " + " | ".join(_cell(record[c]) for c in frame.columns) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value).replace("|", "\\|")  # a bar would end the Markdown cell


def replace_section(readme: Path, start: str, end: str, lines: Sequence[str]) -> None:
    """Replace the part of `readme` from marker `start` to marker `end` by `lines` (which
    begin and end with the markers)."""
    text = readme.read_text()
    if start not in text or end not in text:
        raise ExplorerError(
            f"{readme}: expected the markers {start!r} and {end!r} around the results "
            "section; found none. Add them where the results should go."
        )
    before = text[: text.index(start)]
    after = text[text.index(end) + len(end) :]
    readme.write_text(before + "\n".join(lines) + after)
