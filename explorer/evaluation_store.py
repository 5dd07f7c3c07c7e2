"""Whole-step evaluations kept across runs, by plan digest.

Compiling a paper-scale step under a plan takes about a minute on a CPU core; a benchmark
evaluates the same plans again on every run. A store keeps each evaluation under a digest of
what decides the compiled program (the plan's layouts, model fingerprint and mesh, not its
predictions or platform), how programs are built (`PROGRAM_VERSION`), the JAX version and the
platform that priced it, by its content (`platform_key`): a scaled or calibrated platform
never reads the evaluations of the platform it was made from. `evaluate_on` consults the
store `evaluations_kept_in` made active; without one it compiles every time, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import threading
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypeVar

# what a plan document holds about its pricing, not about the program it compiles to
PRICING_FIELDS = frozenset(
    {"source", "platform", "platform_spec", "backend", "predicted", "segments", "ilp", "versions"}
)

_ACTIVE: dict[str, Any] = {"store": None}


class _Closable(Protocol):
    def close(self) -> None: ...


Store = TypeVar("Store", bound=_Closable)
_LOCK = threading.Lock()


def layout_digest(document: dict[str, Any]) -> str:
    """A digest of what decides a plan's compiled program: its layouts, not its pricing."""
    kept = {k: v for k, v in document.items() if k not in PRICING_FIELDS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def platform_key(platform_json: dict[str, Any]) -> str:
    """A platform as the store knows it: its name (to read) and a digest of its figures (what
    decides the pricing; a platform renamed or rescaled is another platform)."""
    digest = hashlib.sha256(json.dumps(platform_json, sort_keys=True).encode()).hexdigest()
    return f"{platform_json.get('name', '?')}@{digest[:16]}"


class EvaluationStore:
    """An SQLite table of evaluations: (program digest, platform) -> Evaluation fields."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS evaluations "
            "(program TEXT, platform TEXT, fields TEXT, PRIMARY KEY (program, platform))"
        )
        self._db.commit()
        self.hits = 0

    def get(self, program: str, platform: str) -> dict[str, Any] | None:
        with _LOCK:
            row = self._db.execute(
                "SELECT fields FROM evaluations WHERE program = ? AND platform = ?",
                (program, platform),
            ).fetchone()
        if row is None:
            return None
        try:
            fields = json.loads(row[0])
        except ValueError:  # a damaged row is a miss: the step is compiled again
            warnings.warn(f"{self.path}: unreadable evaluation row, compiling", stacklevel=2)
            return None
        self.hits += 1
        return dict(fields)

    def put(self, program: str, platform: str, evaluation: Any) -> None:
        fields = json.dumps(asdict(evaluation))
        with _LOCK:
            self._db.execute(
                "INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?)", (program, platform, fields)
            )
            self._db.commit()

    def close(self) -> None:
        self._db.close()


@contextlib.contextmanager
def active_while_inside(slot: dict[str, Any], store: Store) -> Iterator[Store]:
    """`store` in `slot["store"]` while inside (the one before it back after), then closed."""
    previous = slot["store"]
    slot["store"] = store
    try:
        yield store
    finally:
        slot["store"] = previous
        store.close()


def evaluations_kept_in(path: str | Path) -> contextlib.AbstractContextManager[EvaluationStore]:
    """While inside, `evaluate_on` reads and writes compiled evaluations in `path`."""
    return active_while_inside(_ACTIVE, EvaluationStore(path))


def active_store() -> EvaluationStore | None:
    store: EvaluationStore | None = _ACTIVE["store"]
    return store
