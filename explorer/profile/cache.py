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

The store is here; what it keeps per program (`ProgramKey`, `ProfileRecord`) is
`profile.cache_record`, and its table (schema, migrations, rows read back checked)
`profile.cache_schema`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from explorer.errors import CacheError, CacheWarning
from explorer.profile.cache_record import ProfileRecord, ProgramKey, Status
from explorer.profile.cache_schema import (
    COLUMNS,
    CREATE_TABLE,
    INSERT,
    MIGRATIONS,
    SCHEMA_VERSION,
    SELECT,
    BadRow,
    from_row,
    to_row,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COLUMNS",
    "SCHEMA_VERSION",
    "CacheError",
    "CacheWarning",
    "ProfileCache",
    "ProfileRecord",
    "ProgramKey",
    "Status",
    "default_cache_path",
]

BUSY_TIMEOUT_S = 30.0
# Stay under SQLite's host-parameter limit (999 in old builds) in `get_many`.
_CHUNK = 500


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
                self._use_wal(conn)
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

    @staticmethod
    def _use_wal(conn: sqlite3.Connection) -> None:
        """Put the file in WAL mode, which the file keeps once set.

        Switching needs an exclusive lock, and SQLite answers a conflict with another
        process's open (two opening a fresh file at once) with "database is locked" at
        once, without waiting on the busy timeout. So wait here, up to the same timeout.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        pause_s = 0.005
        while True:
            try:
                if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                    conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                busy = exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not busy or time.monotonic() >= deadline:
                    raise
            time.sleep(pause_s)
            pause_s = min(2 * pause_s, 0.1)

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
                conn.execute(CREATE_TABLE)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                steps = range(version, SCHEMA_VERSION)
                if not 0 < version < SCHEMA_VERSION or not all(v in MIGRATIONS for v in steps):
                    raise _Unusable(
                        f"schema version {version} with tables {sorted(tables)}, which this "
                        f"version of explorer (schema {SCHEMA_VERSION}) cannot migrate"
                    )
                for v in steps:
                    MIGRATIONS[v](conn)
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
                    rows += db.execute(f"{SELECT} WHERE digest IN ({marks})", chunk).fetchall()
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
                    found = from_row(row)
                except BadRow as bad:
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
                db.execute(INSERT, to_row(record))
            except sqlite3.Error as exc:
                if self._in_memory_since is not None:
                    raise  # memory itself failed: nothing left to fall back on
                self._conn = self._fall_back(_explain(exc), source=db)
                db.close()
                self._conn.execute(INSERT, to_row(record))

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
            rows = self._db().execute(f"{SELECT} ORDER BY created, digest").fetchall()
        out = []
        for row in rows:
            with contextlib.suppress(BadRow):
                out.append(from_row(row))
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per record, columns `COLUMNS` (key fields flattened, `digest` first)."""
        import pandas as pd

        with self._lock:
            rows = self._db().execute(f"{SELECT} ORDER BY created, digest").fetchall()
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


def _explain(exc: BaseException) -> str:
    """What went wrong with the file, in a user's words (SQLite's own message kept)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {text}"
