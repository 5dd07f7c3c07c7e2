"""Answers kept across runs: an SQLite table from a key of text columns to JSON fields.

Whole-step evaluations (`evaluation_store`) and the Alpa ILP's answers (`alpa.kept`) cost
minutes each at paper scale and are asked again on every run of a benchmark. Both are kept
the same way: a row per key, its fields as JSON. A row that no longer reads is a miss, with a
warning: the answer is computed again, never guessed. A store is passed to what uses it and
closed by its owner (`with`), so nothing in the package holds one between calls.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

T = TypeVar("T")


class KeptRows:
    """`table` in the SQLite file `path`: text columns `keys` -> a JSON object."""

    def __init__(self, path: str | Path, table: str, keys: tuple[str, ...]) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._table = table
        self._keys = keys
        # one connection, used from the thread that asks (a UI worker may): a lock serialises
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._lock = threading.Lock()
        columns = ", ".join(f"{k} TEXT" for k in keys)
        self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {table} "
            f"({columns}, fields TEXT, PRIMARY KEY ({', '.join(keys)}))"
        )
        self._db.commit()
        self.hits = 0  # rows read back, for a report of what a run did not recompute
        self.written = 0  # rows put: answers this run computed

    def get(self, key: tuple[str, ...], read: Callable[[dict[str, Any]], T]) -> T | None:
        """`read` of the fields kept under `key`; None when none are kept or they do not read
        (`read` raised KeyError, TypeError or ValueError: a row of another shape)."""
        where = " AND ".join(f"{k} = ?" for k in self._keys)
        with self._lock:
            row = self._db.execute(
                f"SELECT fields FROM {self._table} WHERE {where}", key
            ).fetchone()
        if row is None:
            return None
        try:
            found = read(json.loads(row[0]))
        except (KeyError, TypeError, ValueError):
            warnings.warn(
                f"{self.path}: an unreadable row in {self._table!r}: computing it again",
                stacklevel=3,
            )
            return None
        self.hits += 1
        return found

    def put(self, key: tuple[str, ...], fields: dict[str, Any]) -> None:
        marks = ", ".join("?" for _ in (*self._keys, "fields"))
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO {self._table} VALUES ({marks})",
                (*key, json.dumps(fields)),
            )
            self._db.commit()
            self.written += 1

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
