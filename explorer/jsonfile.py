"""Reading a JSON document a user hands in (a plan, a platform): bounded, UTF-8, finite.

Files come from other machines, other versions and text editors, so before a loader looks
at a single field the file must be: a readable regular file, no larger than the loader
allows, UTF-8 text, JSON, with every number finite (Python's `json` accepts `NaN` and
`Infinity`, which no plan or platform means) and nested no deeper than the loader allows
(a deep document would otherwise exhaust the recursion of the parser or the validator).
Each failure is the loader's own error class, naming the file and what was found.
"""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path
from typing import Any

from explorer.errors import InputError


def read_json_file(
    path: str | Path,
    *,
    what: str,
    error: type[InputError],
    max_bytes: int,
    max_depth: int,
) -> Any:
    """The parsed document of `path`; `error(...)` naming the file otherwise. `what` names
    the kind of file in messages ("plan file")."""
    target = Path(path).expanduser()
    where = f"{what} {target}"
    try:
        status = target.stat()
        size = status.st_size
        if stat.S_ISDIR(status.st_mode):
            raise error(f"{where}: expected a JSON file, found a directory")
        if not stat.S_ISREG(status.st_mode):  # a pipe or a device could be read forever
            raise error(f"{where}: expected a regular JSON file, found a special file")
        if size > max_bytes:
            raise error(
                f"{where}: expected at most {max_bytes / 2**20:.0f} MiB, found "
                f"{size / 2**20:.1f} MiB; this is not a {what} the explorer wrote"
            )
        raw = target.read_bytes()[: max_bytes + 1]  # a file that grew since stat stays bounded
    except FileNotFoundError:
        raise error(f"{where}: expected an existing file, found no such file") from None
    except OSError as err:
        raise error(
            f"{where}: expected a readable file, found it cannot be read ({err.strerror or err})"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(
            f"{where}: expected UTF-8 text, found byte 0x{raw[err.start]:02x} at offset "
            f"{err.start} that is not UTF-8; save the file as UTF-8 JSON"
        ) from None
    try:
        document = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    except _NonFinite as err:
        raise error(
            f"{where}: expected finite numbers, found {err.args[0]}; JSON has no NaN or "
            "infinity, give a measured or computed figure"
        ) from None
    except json.JSONDecodeError as err:
        raise error(
            f"{where}: expected JSON, found a syntax error at line {err.lineno} column "
            f"{err.colno}: {err.msg}"
        ) from None
    except ValueError as err:  # an integer of thousands of digits, beyond Python's limit
        raise error(f"{where}: expected JSON with numbers of sensible size, found: {err}") from None
    except RecursionError:
        raise error(
            f"{where}: expected a JSON document nested at most {max_depth} levels deep, found "
            "one nested deeper than the parser can follow"
        ) from None
    depth = _depth(document)
    if depth > max_depth:
        raise error(
            f"{where}: expected a JSON document nested at most {max_depth} levels deep, found "
            f"{depth} levels"
        )
    return document


class _NonFinite(ValueError):
    """Internal: the document spells NaN or an infinity."""


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to infinity
        raise _NonFinite(f"{text} (beyond the range of a double)")
    return value


def _depth(document: Any) -> int:
    """How deeply containers nest in `document` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest
