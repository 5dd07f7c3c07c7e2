"""The profile cache's SQLite table: its schema, the migrations from older schemas, and the
conversion between a record and a row, every column of a row read back checked as the runner
will use it (a row edited by hand is a miss, never a crash later in pricing)."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from explorer.profile.cache_record import STATUSES, ProfileRecord, ProgramKey
from explorer.profile.hlo import CollectiveKind

# Bump when the table changes; add a step to `MIGRATIONS` when old rows can be carried over.
SCHEMA_VERSION = 5

_KEY_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ProgramKey))
_VALUE_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(ProfileRecord) if f.name != "key"
)
COLUMNS: tuple[str, ...] = ("digest", *_KEY_COLUMNS, *_VALUE_COLUMNS)

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS profiles (
    digest TEXT PRIMARY KEY NOT NULL,
    segment TEXT NOT NULL,
    config TEXT NOT NULL,
    mesh TEXT NOT NULL,
    platform TEXT NOT NULL,
    backend TEXT NOT NULL,
    jax_version TEXT NOT NULL,
    extra TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'infeasible')),
    t_comm REAL NOT NULL,
    t_comp REAL NOT NULL,
    memory INTEGER NOT NULL,
    persistent_memory INTEGER NOT NULL,
    transient_memory INTEGER NOT NULL,
    collectives TEXT NOT NULL,
    reason TEXT NOT NULL,
    seconds REAL NOT NULL,
    created REAL NOT NULL,
    flops REAL NOT NULL DEFAULT 0,
    bytes_accessed REAL NOT NULL DEFAULT 0,
    dot_flops TEXT NOT NULL DEFAULT '',
    saved_memory INTEGER NOT NULL DEFAULT -1,
    gradient_memory INTEGER NOT NULL DEFAULT -1,
    constant_memory INTEGER NOT NULL DEFAULT -1
) WITHOUT ROWID
"""
SELECT = f"SELECT {', '.join(COLUMNS)} FROM profiles"
INSERT = (
    f"INSERT OR REPLACE INTO profiles ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(COLUMNS))})"
)


# from_version -> step that upgrades a database in place to from_version + 1. Versions with no
# path to SCHEMA_VERSION are rebuilt (moved aside) instead.
def _add_cost_columns(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE profiles ADD COLUMN flops REAL NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE profiles ADD COLUMN bytes_accessed REAL NOT NULL DEFAULT 0")


def _mark_unknown_costs(conn: sqlite3.Connection) -> None:
    # Rows carried over from schema 1 got 0 FLOPs and 0 bytes: not a measurement. Mark them
    # unknown (-1) so they are re-profiled instead of being priced as free compute. Rows of
    # schema 2 have no FLOPs per dtype: "" marks them for profiling again too.
    conn.execute("ALTER TABLE profiles ADD COLUMN dot_flops TEXT NOT NULL DEFAULT ''")
    conn.execute(
        "UPDATE profiles SET flops = -1, bytes_accessed = -1 "
        "WHERE status = 'ok' AND flops = 0 AND bytes_accessed = 0"
    )


def _add_held_columns(conn: sqlite3.Connection) -> None:
    # Rows of schema 3 counted saved activations in their persistent memory: -1 marks the
    # split unknown, so they are profiled again rather than composed the old way.
    conn.execute("ALTER TABLE profiles ADD COLUMN saved_memory INTEGER NOT NULL DEFAULT -1")
    conn.execute("ALTER TABLE profiles ADD COLUMN gradient_memory INTEGER NOT NULL DEFAULT -1")


def _add_constant_column(conn: sqlite3.Connection) -> None:
    # Rows of schema 4 counted values made from constants in every instance's saved memory:
    # -1 marks the split unknown, so they are profiled again.
    conn.execute("ALTER TABLE profiles ADD COLUMN constant_memory INTEGER NOT NULL DEFAULT -1")


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _add_cost_columns,
    2: _mark_unknown_costs,
    3: _add_held_columns,
    4: _add_constant_column,
}


def to_row(record: ProfileRecord) -> tuple[Any, ...]:
    key = record.key
    return (
        key.digest(),
        *(getattr(key, c) for c in _KEY_COLUMNS),
        *(getattr(record, c) for c in _VALUE_COLUMNS),
    )


class BadRow(ValueError):
    """Internal: a row that does not read back as a record; says which column and why."""


def _number(row: Mapping[str, Any], column: str, *, low: float, finite: bool = True) -> float:
    value = row[column]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRow(f"column {column!r} holds {type(value).__name__} {value!r}, not a number")
    if (finite and not math.isfinite(value)) or math.isnan(value) or value < low:
        raise BadRow(f"column {column!r} holds {value!r}, expected a number >= {low}")
    return float(value)


def _whole(row: Mapping[str, Any], column: str, *, low: int) -> int:
    value = row[column]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadRow(f"column {column!r} holds {value!r}, expected an integer >= {low}")
    return value


def _text(row: Mapping[str, Any], column: str) -> str:
    value = row[column]
    if not isinstance(value, str):
        raise BadRow(f"column {column!r} holds {type(value).__name__} {value!r}, not text")
    return value


_KINDS = frozenset(k.value for k in CollectiveKind)


def _check_collectives(text: str, mesh: str) -> None:
    """The collectives JSON as the runner prices it: kinds, sizes and axes of the key's mesh."""
    names = set(mesh.partition("(")[2].rstrip(")").split(","))
    try:
        entries = json.loads(text)
    except ValueError:
        raise BadRow(f"column 'collectives' is not JSON: {text[:60]!r}") from None
    if not isinstance(entries, list):
        raise BadRow(f"column 'collectives' holds {type(entries).__name__}, expected a list")
    for entry in entries:
        ok = (
            isinstance(entry, dict)
            and entry.get("kind") in _KINDS
            and all(
                isinstance(entry.get(f), int) and not isinstance(entry.get(f), bool)
                for f in ("bytes", "group")
            )
            and entry["bytes"] >= 0
            and isinstance(entry.get("axes"), list)
            and all(isinstance(a, str) and a in names for a in entry["axes"])
            and isinstance(entry.get("elements", 1), int)
        )
        if not ok:
            raise BadRow(
                f"column 'collectives' holds {str(entry)[:80]}, expected a collective with "
                f"kind in {sorted(_KINDS)}, int bytes >= 0 and group, axes among {sorted(names)}"
            )


def _check_dot_flops(text: str) -> None:
    if not text:
        return  # rows from before it was recorded: stale, a miss (see get_many)
    try:
        flops = json.loads(text)
    except ValueError:
        raise BadRow(f"column 'dot_flops' is not JSON: {text[:60]!r}") from None
    if not isinstance(flops, dict) or not all(
        isinstance(k, str)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and v >= 0
        for k, v in flops.items()
    ):
        raise BadRow(f"column 'dot_flops' holds {text[:60]!r}, expected dtype -> FLOPs >= 0")


def from_row(row: Sequence[Any]) -> ProfileRecord:
    """The record of a row, every column checked as the runner will use it (a `BadRow`
    otherwise): a row edited by hand must be a miss, never a crash later in pricing."""
    named = dict(zip(COLUMNS, row, strict=True))
    key = ProgramKey(*(_text(named, c) for c in _KEY_COLUMNS))
    status = named["status"]
    if status not in STATUSES:
        raise BadRow(f"column 'status' holds {status!r}, expected one of {sorted(STATUSES)}")
    ok = status == "ok"
    collectives = _text(named, "collectives")
    dot_flops = _text(named, "dot_flops")
    if ok:
        _check_collectives(collectives, key.mesh)
        _check_dot_flops(dot_flops)
    return ProfileRecord(
        key=key,
        status="ok" if ok else "infeasible",
        # an infeasible program's times are infinite by construction
        t_comm=_number(named, "t_comm", low=0, finite=ok),
        t_comp=_number(named, "t_comp", low=0, finite=ok),
        memory=_whole(named, "memory", low=0),
        persistent_memory=_whole(named, "persistent_memory", low=0),
        transient_memory=_whole(named, "transient_memory", low=0),
        collectives=collectives,
        reason=_text(named, "reason"),
        seconds=_number(named, "seconds", low=0),
        created=_number(named, "created", low=0),
        flops=_number(named, "flops", low=-1),
        bytes_accessed=_number(named, "bytes_accessed", low=-1),
        dot_flops=dot_flops,
        saved_memory=_whole(named, "saved_memory", low=-1),
        gradient_memory=_whole(named, "gradient_memory", low=-1),
        constant_memory=_whole(named, "constant_memory", low=-1),
    )
