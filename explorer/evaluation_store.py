"""Whole-step evaluations kept across runs, by plan digest.

Compiling a paper-scale step under a plan takes about a minute on a CPU core; a benchmark
evaluates the same plans again on every run. A store keeps each evaluation under a digest of
what decides the compiled program (the plan's layouts, model fingerprint and mesh, not its
predictions or platform), how programs are built (`PROGRAM_VERSION`), the JAX version and the
platform that priced it, by its content (`platform_key`): a scaled or calibrated platform
never reads the evaluations of the platform it was made from. `evaluate_on(..., store=)` and
`Analysis.baseline(..., evaluations=)` consult the store they are given; without one they
compile every time.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from explorer.kept_rows import KeptRows
from explorer.units import MEMORY_LIMIT_MARGIN, limit_raised

# what a plan document holds about its pricing, not about the program it compiles to
PRICING_FIELDS = frozenset(
    {"source", "platform", "platform_spec", "backend", "predicted", "segments", "ilp", "versions"}
)


def layout_digest(document: dict[str, Any]) -> str:
    """A digest of what decides a plan's compiled program: its layouts, not its pricing."""
    kept = {k: v for k, v in document.items() if k not in PRICING_FIELDS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def platform_key(platform_json: dict[str, Any]) -> str:
    """A platform as the store knows it: its name (to read) and a digest of its figures (what
    decides the pricing; a platform renamed or rescaled is another platform)."""
    digest = hashlib.sha256(json.dumps(platform_json, sort_keys=True).encode()).hexdigest()
    return f"{platform_json.get('name', '?')}@{digest[:16]}"


class EvaluationStore(KeptRows):
    """An SQLite table of evaluations: (program digest, platform) -> Evaluation fields; and
    beside it (`stops`) the steps whose compile a worker's memory limit stopped: program
    digest -> the limit and the message (`stopped_compile`, `keep_stopped_compile`)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, "evaluations", ("program", "platform"))
        self.stops = KeptRows(path, "stopped_compiles", ("program",))

    def stopped_compile(self, program: str, limit: int) -> str | None:
        """Why the compile of `program` was stopped in an earlier run, where it ran into a
        memory limit that `limit` exceeds by no more than `units.MEMORY_LIMIT_MARGIN` of it
        (compiling it again under such a limit would take as long to end the same way); None
        where none was, or where the limit now is higher than that."""
        kept = self.stops.get((program,), lambda f: (int(f["limit"]), str(f["message"])))
        if kept is None or limit_raised(limit, kept[0], margin=MEMORY_LIMIT_MARGIN):
            return None
        return kept[1]

    def keep_stopped_compile(self, program: str, limit: int, message: str) -> None:
        """`program`'s compile was stopped at `limit` bytes per worker, saying `message`."""
        self.stops.put((program,), {"limit": limit, "message": message})

    def close(self) -> None:
        self.stops.close()
        super().close()
