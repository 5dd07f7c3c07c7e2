"""Bytes as users write them: one parser for every memory budget that enters the explorer.

`BytesLike` is what a user may pass where bytes are meant: an int or float of bytes, or a
string with a unit (`"64MB"`, `"64 MiB"`, `"1.5GiB"`, `"1.5 gb"`; case does not matter).
Decimal units are powers of 1000 (`MB` = 10**6 bytes, as disks and datasheets count) and
binary units powers of 1024 (`MiB` = 2**20, as memory is sized and reported here). A bare
number is bytes. `parse_bytes` is the one place that reads them; what it returns is a number
of bytes, so `memory_budget` means bytes and only bytes everywhere past the door.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from typing import TypeAlias

from explorer.errors import BytesError

BytesLike: TypeAlias = int | float | str

UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_AMOUNT = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
EXAMPLES = "an int of bytes, or a string such as '64MiB', '1.5GiB', '512 MB' or '8e9'"


def parse_bytes(value: object, field: str = "memory_budget") -> float:
    """`value` as bytes; a `BytesError` naming `field` otherwise: NaN, infinities, negative
    amounts, bools, unknown units and other types. A number is kept as given (an int stays an
    int, and a float is not rounded: a budget set between two plans' memories is kept
    exactly); a string with a unit gives whole bytes, rounded down."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise BytesError(f"{field}: expected {EXAMPLES}, found {type(value).__name__} {value!r}")
    amount: float
    if isinstance(value, str):
        match = _AMOUNT.match(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in UNITS:
            known = ", ".join(u for u in UNITS if u)
            raise BytesError(
                f"{field}: expected {EXAMPLES} (units: {known}; case does not matter), "
                f"found {value!r}"
            )
        amount = float(match.group(1)) * UNITS[unit]
    else:
        amount = int(value) if isinstance(value, numbers.Integral) else float(value)
    if not math.isfinite(amount) or amount < 0:
        raise BytesError(
            f"{field}: expected a finite number of bytes >= 0 ({EXAMPLES}), found {value!r}"
        )
    return int(amount) if isinstance(value, str) else amount


def format_bytes(amount: float, digits: int = 3) -> str:
    """`amount` bytes in the largest binary unit that keeps it >= 1 (`1.5 GiB`), to `digits`
    significant digits."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(amount) >= scale:
            return f"{amount / scale:.{digits}g} {unit}"
    return f"{amount:.0f} B"


# The default memory limit is half of the machine's memory, which differs by a fraction of a
# percent between machines of one size (what the kernel keeps back: 12,637,986,816 and
# 12,637,995,008 bytes in two sessions of this one): a refusal kept under one limit stands
# under another this close, not tried again for many minutes to end the same way.
MEMORY_LIMIT_MARGIN = 0.05


def limit_raised(now: float | None, then: float | None, *, margin: float = 0.0) -> bool:
    """Whether a limit (None: none) allows more now than it did then, by more than `margin`
    of it."""
    if now is None:
        return then is not None
    return then is not None and now > then * (1 + margin)


def memory_limit(variable: str) -> int | None:
    """Bytes a memory-hungry stage may hold: $`variable` when set ("16GiB", or bytes), else
    half of this machine's memory; None where neither is known."""
    given = os.environ.get(variable, "").strip()
    if given:
        return int(parse_bytes(given, variable))
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):  # a platform that does not say
        return None
