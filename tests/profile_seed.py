"""The suite's profile seed: the compiled profiles of the tiny models that the tests profile
into the session's shared cache (`helpers.SHARED_CACHE`), committed so that a run starts
with them instead of compiling every one again (CI has two cores and 90 minutes).

A compiled profile is deterministic and keyed by its program's content, the program version
and JAX's version, so a seeded profile is the profile the run would compute; a program the
seed lacks (a new model, or every program after a key change) is profiled as before, only
slower. Cold profiling stays tested where a test brings its own cache (test_profile,
test_notebook, test_cluster, test_ui_cancel).

Programs of the meshes in `LEFT_OUT` stay out: the browser test cancels a 2x4 run while it
profiles, which a seeded run would finish first.

To write the seed again (after a change of program keys), run the suite with
`EXPLORER_TEST_SEED_OUT=tests/data/profiles-seed.sqlite`: at its end, the shared cache is
copied there, less those meshes.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

SEED = Path(__file__).resolve().parent / "data" / "profiles-seed.sqlite"
OUT_VARIABLE = "EXPLORER_TEST_SEED_OUT"
LEFT_OUT = ("2x4",)


def plant(cache: Path) -> None:
    """Start `cache` as a copy of the seed (where the seed exists and `cache` does not)."""
    if SEED.exists() and not cache.exists():
        shutil.copyfile(SEED, cache)


def programs(path: Path) -> int:
    """Profiles held by the cache at `path` (0 where there is none)."""
    if not path.exists():
        return 0
    db = sqlite3.connect(path, timeout=30)
    try:
        return int(db.execute("SELECT count(*) FROM profiles").fetchone()[0])
    finally:
        db.close()


def harvest(cache: Path) -> Path | None:
    """Write `cache`, less the meshes in `LEFT_OUT`, to `$EXPLORER_TEST_SEED_OUT` (None when
    the variable is not set or there is no cache)."""
    out = os.environ.get(OUT_VARIABLE)
    if not out or not cache.exists():
        return None
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    written = target.with_suffix(".partial")
    written.unlink(missing_ok=True)
    source, copy = sqlite3.connect(cache, timeout=30), sqlite3.connect(written)
    try:
        source.backup(copy)
        for mesh in LEFT_OUT:
            copy.execute("DELETE FROM profiles WHERE mesh LIKE ?", (f"{mesh}(%",))
        copy.commit()
        copy.execute("PRAGMA journal_mode=DELETE")  # one file, nothing beside it
        copy.execute("VACUUM")
    finally:
        source.close()
        copy.close()
    written.replace(target)
    return target
