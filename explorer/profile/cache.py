"""Persistent cache of profiling results, one SQLite row per profiled program.

Profiling is the slow stage (every program is compiled, and with the `measured` backend run),
so its results outlive the process: a re-run, an edited model that shares segments with the
old one, or a run killed half-way reuses every program already priced. A row is keyed by
everything that changes the program or its price (segment fingerprint, configuration, mesh,
platform file hash, backend, JAX version, `extra`), stored as columns plus a sha256 digest
that is the primary key.

Each `put` is its own committed transaction, so a killed run loses at most the program it was
profiling. The file is a cache, never the only copy of anything, so nothing about it fails an
analysis; each problem is one `CacheWarning`:
- a file that is not a database, is damaged, or has a schema this version does not know is
  moved aside and a fresh cache is built in its place;
- a cache that cannot be written (a read-only file or folder, a folder given as the path, a
  full disk, a lock held past the busy timeout) is copied into memory as far as it can be
  read, and the run keeps its results there: it finishes, and what it profiled is lost only
  when the process ends;
- a row that does not read back as a record (edited by hand, or by another tool) is a miss,
  so its program is profiled again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from explorer.errors import CacheError, CacheWarning
from explorer.profile.hlo import CollectiveKind

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "SCHEMA_VERSION",
    "CacheError",
    "CacheWarning",
    "ProfileCache",
    "ProfileRecord",
    "ProgramKey",
    "Status",
    "default_cache_path",
]

# Bump when the table changes; add a step to `_MIGRATIONS` when old rows can be carried over.
SCHEMA_VERSION = 5
BUSY_TIMEOUT_S = 30.0
# Stay under SQLite's host-parameter limit (999 in old builds) in `get_many`.
_CHUNK = 500

Status = Literal["ok", "infeasible"]
_STATUSES: frozenset[str] = frozenset({"ok", "infeasible"})


@dataclass(frozen=True, slots=True)
class ProgramKey:
    """Everything that changes a profiled program or its price."""

    segment: str  # segment fingerprint, or "reshard:<fp_before>-><fp_after>"
    config: str  # e.g. "M@x,N@x,K@x,M@x"
    mesh: str  # e.g. "2x4(x,y)"
    platform: str  # platform name plus a content hash of its file
    backend: str  # "compiled" | "measured"
    jax_version: str
    extra: str = ""  # anything else that changes the program, e.g. a model hash

    def digest(self) -> str:
        """Stable sha256 hex of every field (field names included, so fields cannot alias)."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class ProfileRecord:
    """The profiling result of one program."""

    key: ProgramKey
    status: Status
    t_comm: float  # seconds
    t_comp: float  # seconds
    memory: int  # peak bytes per device
    persistent_memory: int
    transient_memory: int
    collectives: str  # JSON text listing the collectives
    reason: str  # why infeasible; "" if ok
    seconds: float  # how long profiling this program took
    created: float  # unix time
    # The compiler's cost analysis, kept so a compiled profile can be re-priced on another
    # platform without compiling again.
    flops: float = 0.0
    bytes_accessed: float = 0.0
    # FLOPs of the dots and convolutions per dtype (JSON object, see profile.compute), so
    # compute is priced at each dtype's peak; "" in rows from before it was recorded
    dot_flops: str = "{}"
    # what the step holds for the program beyond `persistent_memory` (whole step) and
    # `transient_memory` (while it runs): from its forward part to its backward part, and
    # gradients from its backward part to another instance's optimizer (accounting.HeldMemory);
    # -1 in rows from before they were recorded
    saved_memory: int = dataclasses.field(kw_only=True)
    gradient_memory: int = dataclasses.field(kw_only=True)
    # values made from constants alone, held once per segment type (accounting.HeldMemory);
    # -1 in rows from before it was recorded
    constant_memory: int = dataclasses.field(kw_only=True)

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise CacheError(
                f"a profile record's status must be one of {sorted(_STATUSES)}, found "
                f"{self.status!r} for segment {self.key.segment!r} config {self.key.config!r}"
            )


_KEY_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ProgramKey))
_VALUE_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(ProfileRecord) if f.name != "key"
)
COLUMNS: tuple[str, ...] = ("digest", *_KEY_COLUMNS, *_VALUE_COLUMNS)

_CREATE = """
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
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM profiles"
_INSERT = (
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


_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _add_cost_columns,
    2: _mark_unknown_costs,
    3: _add_held_columns,
    4: _add_constant_column,
}


def default_cache_path() -> Path:
    """`$XDG_CACHE_HOME/explorer/profiles.sqlite`, by default under `~/.cache`."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base).expanduser() if base else Path.home() / ".cache"
    return root / "explorer" / "profiles.sqlite"


class _Unusable(Exception):
    """Internal: the file on disk cannot serve as this cache; says what was found."""


class ProfileCache:
    """SQLite store of `ProfileRecord`s, safe across threads and processes.

    `path=None` keeps the database in memory (nothing is persisted). Every `put` commits at
    once. One connection serves all threads, behind a lock; other processes are kept apart
    by SQLite's own file locking, waiting up to `BUSY_TIMEOUT_S` for a busy database.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        if path is not None and not isinstance(path, (str, Path)):
            raise CacheError(
                f"cache: expected the path of a cache file or None (in memory), found "
                f"{type(path).__name__} {path!r}"
            )
        self._path: Path | None = None if path is None else Path(path).expanduser()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._in_memory_since: str | None = None  # why a file cache fell back to memory
        if self._path is None:
            self._conn = self._memory()
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = self._open_file(self._path)
        except (OSError, sqlite3.Error) as exc:
            # cannot open, create or write it (read-only file or folder, a folder as the
            # path, locked): a cache must never cost the run
            self._conn = self._fall_back(_explain(exc))

    # -- opening ------------------------------------------------------------------------

    @staticmethod
    def _connect(target: str) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a lone INSERT commits.
        conn = sqlite3.connect(
            target, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        return conn

    def _open_file(self, path: Path) -> sqlite3.Connection:
        # Later passes cover a file replaced under us by another process's rebuild.
        for attempt in range(3):
            inode = _inode(path)
            conn = self._connect(str(path))
            try:
                # WAL: readers never block the writer; NORMAL sync is durable against process
                # kills (only an OS crash can lose the last commits).
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                self._prepare(conn)
                # a write, so a read-only file shows here, before profiling, not at a put
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                return conn
            except sqlite3.OperationalError:
                # Locked past the busy timeout, unreadable, disk full: not the file's content,
                # so moving it aside would not help (and could discard a good cache).
                conn.close()
                raise
            except (_Unusable, sqlite3.DatabaseError) as exc:
                conn.close()
                found = str(exc) if isinstance(exc, _Unusable) else f"SQLite error: {exc}"
                self._move_aside(path, inode, found, last=attempt == 2)
        raise AssertionError("unreachable")  # pragma: no cover

    def _memory(self) -> sqlite3.Connection:
        conn = self._connect(":memory:")
        self._prepare(conn)
        return conn

    def _fall_back(
        self, reason: str, source: sqlite3.Connection | None = None
    ) -> sqlite3.Connection:
        """An in-memory cache holding what can still be read of the file (from `source`, the
        connection in use, else a read-only snapshot of the file), with one warning."""
        memory = self._connect(":memory:")
        copied = False
        try:
            if source is None and self._path is not None and self._path.is_file():
                # immutable: read without the locks and journal files a read-only place denies
                uri = f"{self._path.resolve().as_uri()}?mode=ro&immutable=1"
                source = sqlite3.connect(uri, uri=True, check_same_thread=False)
                with contextlib.closing(source):
                    source.backup(memory)
            elif source is not None:
                source.backup(memory)
            self._prepare(memory)  # a copy of another schema, or of no database, is refused
            copied = True
        except (sqlite3.Error, _Unusable):
            memory.close()
            memory = self._memory()
        self._in_memory_since = reason
        kept = len(memory.execute("SELECT digest FROM profiles").fetchall()) if copied else 0
        warnings.warn(
            f"profile cache {self._path} cannot be written ({reason}). This run keeps its "
            f"profiles in memory ({kept} cached rows read from the file) and finishes, but "
            "what it profiles is lost when the process ends: make the file and its folder "
            "writable, or pass another cache path (cache=None for no file).",
            CacheWarning,
            stacklevel=3,
        )
        return memory

    @staticmethod
    def _prepare(conn: sqlite3.Connection) -> None:
        """Check the database and create or migrate the table, all in one write transaction.

        IMMEDIATE takes the write lock up front, so two processes opening a fresh file do not
        both decide to create (or migrate) it.
        """
        conn.execute("BEGIN IMMEDIATE")
        try:
            problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                raise _Unusable(f"a damaged database (quick_check: {'; '.join(problems[:3])})")
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            tables = {
                str(r[0])
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%'"
                )
            }
            if version == 0 and not tables:
                conn.execute(_CREATE)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                steps = range(version, SCHEMA_VERSION)
                if not 0 < version < SCHEMA_VERSION or not all(v in _MIGRATIONS for v in steps):
                    raise _Unusable(
                        f"schema version {version} with tables {sorted(tables)}, which this "
                        f"version of explorer (schema {SCHEMA_VERSION}) cannot migrate"
                    )
                for v in steps:
                    _MIGRATIONS[v](conn)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            columns = tuple(str(r[1]) for r in conn.execute("PRAGMA table_info(profiles)"))
            if columns != COLUMNS:
                raise _Unusable(
                    f"a `profiles` table with columns {list(columns)}, expected {list(COLUMNS)}"
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _move_aside(path: Path, inode: int | None, found: str, *, last: bool) -> None:
        if _inode(path) != inode:
            return  # another process already rebuilt it; the next pass checks the new file
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = path.with_name(f"{path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
            n += 1
        try:
            os.replace(path, target)
        except FileNotFoundError:
            return  # moved by another process just now, as above
        # The WAL and shared-memory files belong to the old database; a stale WAL must not be
        # replayed into the fresh one.
        for suffix in ("-wal", "-shm"):
            side = path.with_name(path.name + suffix)
            with contextlib.suppress(FileNotFoundError):
                os.replace(side, target.with_name(target.name + suffix))
        warnings.warn(
            f"profile cache {path} could not be used: found {found}. Moved it to {target}; "
            "building a fresh cache (programs will be profiled again)."
            + (" Giving up after repeated failures." if last else ""),
            CacheWarning,
            stacklevel=4,
        )
        if last:
            raise CacheError(f"could not build a usable profile cache at {path}: {found}")

    # -- access -------------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        """The database file, or None for an in-memory cache."""
        return self._path

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise CacheError("the profile cache is closed; open a new ProfileCache")
        return self._conn

    def get(self, key: ProgramKey) -> ProfileRecord | None:
        """The cached record of `key`, or None (see `get_many` for stale records)."""
        return self.get_many([key]).get(key)

    def get_many(self, keys: Iterable[ProgramKey]) -> dict[ProgramKey, ProfileRecord]:
        """The cached records among `keys` (missing keys are simply absent).

        A record from an older schema that lacks the compiler's cost analysis is a miss (so
        it is profiled again), with one `CacheWarning` giving the count.
        """
        by_digest = {k.digest(): k for k in keys}
        digests = list(by_digest)
        out: dict[ProgramKey, ProfileRecord] = {}
        stale = 0
        unreadable: list[str] = []
        with self._lock:
            db = self._db()
            rows = []
            try:
                for i in range(0, len(digests), _CHUNK):
                    chunk = digests[i : i + _CHUNK]
                    marks = ", ".join("?" * len(chunk))
                    rows += db.execute(f"{_SELECT} WHERE digest IN ({marks})", chunk).fetchall()
            except sqlite3.Error as exc:  # locked past the timeout, or the disk failed
                warnings.warn(
                    f"profile cache {self._path}: could not be read ({_explain(exc)}); "
                    "every program is profiled again",
                    CacheWarning,
                    stacklevel=2,
                )
                return {}
            for row in rows:
                try:
                    found = _from_row(row)
                except _BadRow as bad:
                    unreadable.append(str(bad))
                    continue
                unknown = (
                    found.flops < 0
                    or found.bytes_accessed < 0
                    or not found.dot_flops
                    or found.saved_memory < 0
                    or found.gradient_memory < 0
                    or found.constant_memory < 0
                )
                if found.status == "ok" and unknown:
                    stale += 1
                    continue
                out[by_digest[row[0]]] = found
        if unreadable:
            warnings.warn(
                f"{len(unreadable)} cached profile(s) in {self._path or 'the in-memory cache'} "
                f"do not read back as profiles (edited by hand or by another tool?), e.g. "
                f"{unreadable[0]}; they are cache misses and profiled again",
                CacheWarning,
                stacklevel=2,
            )
        if stale:
            warnings.warn(
                f"{stale} cached profile(s) in {self._path or 'the in-memory cache'} come from "
                "an older cache schema without the compiler's cost analysis or the held "
                "memory by duration; they are profiled again (never priced as free compute "
                "or free memory)",
                CacheWarning,
                stacklevel=2,
            )
        return out

    def put(self, record: ProfileRecord) -> None:
        """Store `record`, replacing any row with the same key, and commit at once. A file
        that cannot take it (read-only now, disk full, locked) hands over to memory, once."""
        with self._lock:
            db = self._db()
            try:
                # Autocommit mode: this one statement is its own committed transaction.
                db.execute(_INSERT, _to_row(record))
            except sqlite3.Error as exc:
                if self._in_memory_since is not None:
                    raise  # memory itself failed: nothing left to fall back on
                self._conn = self._fall_back(_explain(exc), source=db)
                db.close()
                self._conn.execute(_INSERT, _to_row(record))

    @property
    def in_memory_since(self) -> str | None:
        """Why a file cache keeps its rows in memory (it could not be written), else None."""
        return self._in_memory_since

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, ProgramKey):
            return False
        with self._lock:
            sql = "SELECT 1 FROM profiles WHERE digest = ?"
            return self._db().execute(sql, (key.digest(),)).fetchone() is not None

    def __len__(self) -> int:
        with self._lock:
            return int(self._db().execute("SELECT COUNT(*) FROM profiles").fetchone()[0])

    def __iter__(self) -> Iterator[ProfileRecord]:
        return iter(self.records())

    def records(self) -> list[ProfileRecord]:
        """Every record that reads back, oldest first (see `get_many` for the others)."""
        with self._lock:
            rows = self._db().execute(f"{_SELECT} ORDER BY created, digest").fetchall()
        out = []
        for row in rows:
            with contextlib.suppress(_BadRow):
                out.append(_from_row(row))
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per record, columns `COLUMNS` (key fields flattened, `digest` first)."""
        import pandas as pd

        with self._lock:
            rows = self._db().execute(f"{_SELECT} ORDER BY created, digest").fetchall()
        return pd.DataFrame.from_records(rows, columns=list(COLUMNS))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "memory" if self._path is None else str(self._path)
        state = "closed" if self._conn is None else "open"
        return f"ProfileCache({where}, {state})"


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def _to_row(record: ProfileRecord) -> tuple[Any, ...]:
    key = record.key
    return (
        key.digest(),
        *(getattr(key, c) for c in _KEY_COLUMNS),
        *(getattr(record, c) for c in _VALUE_COLUMNS),
    )


class _BadRow(ValueError):
    """Internal: a row that does not read back as a record; says which column and why."""


def _explain(exc: BaseException) -> str:
    """What went wrong with the file, in a user's words (SQLite's own message kept)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {text}"


def _number(row: Mapping[str, Any], column: str, *, low: float, finite: bool = True) -> float:
    value = row[column]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _BadRow(f"column {column!r} holds {type(value).__name__} {value!r}, not a number")
    if (finite and not math.isfinite(value)) or math.isnan(value) or value < low:
        raise _BadRow(f"column {column!r} holds {value!r}, expected a number >= {low}")
    return float(value)


def _whole(row: Mapping[str, Any], column: str, *, low: int) -> int:
    value = row[column]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _BadRow(f"column {column!r} holds {value!r}, expected an integer >= {low}")
    return value


def _text(row: Mapping[str, Any], column: str) -> str:
    value = row[column]
    if not isinstance(value, str):
        raise _BadRow(f"column {column!r} holds {type(value).__name__} {value!r}, not text")
    return value


_KINDS = frozenset(k.value for k in CollectiveKind)


def _check_collectives(text: str, mesh: str) -> None:
    """The collectives JSON as the runner prices it: kinds, sizes and axes of the key's mesh."""
    names = set(mesh.partition("(")[2].rstrip(")").split(","))
    try:
        entries = json.loads(text)
    except ValueError:
        raise _BadRow(f"column 'collectives' is not JSON: {text[:60]!r}") from None
    if not isinstance(entries, list):
        raise _BadRow(f"column 'collectives' holds {type(entries).__name__}, expected a list")
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
            raise _BadRow(
                f"column 'collectives' holds {str(entry)[:80]}, expected a collective with "
                f"kind in {sorted(_KINDS)}, int bytes >= 0 and group, axes among {sorted(names)}"
            )


def _check_dot_flops(text: str) -> None:
    if not text:
        return  # rows from before it was recorded: stale, a miss (see get_many)
    try:
        flops = json.loads(text)
    except ValueError:
        raise _BadRow(f"column 'dot_flops' is not JSON: {text[:60]!r}") from None
    if not isinstance(flops, dict) or not all(
        isinstance(k, str)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and v >= 0
        for k, v in flops.items()
    ):
        raise _BadRow(f"column 'dot_flops' holds {text[:60]!r}, expected dtype -> FLOPs >= 0")


def _from_row(row: Sequence[Any]) -> ProfileRecord:
    """The record of a row, every column checked as the runner will use it (a `_BadRow`
    otherwise): a row edited by hand must be a miss, never a crash later in pricing."""
    named = dict(zip(COLUMNS, row, strict=True))
    key = ProgramKey(*(_text(named, c) for c in _KEY_COLUMNS))
    status = named["status"]
    if status not in _STATUSES:
        raise _BadRow(f"column 'status' holds {status!r}, expected one of {sorted(_STATUSES)}")
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
