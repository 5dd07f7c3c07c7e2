"""The profile cache: round trips, replacement, key digests, damaged files, kills, concurrency.

Every test uses real SQLite files under tmp_path; subprocesses run the real module and are
bounded by timeouts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from explorer.errors import ExplorerError
from explorer.profile.cache import (
    COLUMNS,
    SCHEMA_VERSION,
    CacheError,
    CacheWarning,
    ProfileCache,
    ProfileRecord,
    ProgramKey,
    default_cache_path,
)

REPO = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT_S = 60.0


def key(i: int, **changes: str) -> ProgramKey:
    base = ProgramKey(
        segment=f"seg{i:04d}",
        config="M@x,N@x,K@x,M@x",
        mesh="2x4(x,y)",
        platform="tpu-v5e:0123abcd",
        backend="compiled",
        jax_version="0.10.2",
    )
    return dataclasses.replace(base, **changes)


def record(i: int, **changes: object) -> ProfileRecord:
    base = ProfileRecord(
        key=key(i),
        status="ok",
        t_comm=1e-3 * i,
        t_comp=2.5e-3,
        memory=1 << 33,  # beyond 32 bits on purpose
        persistent_memory=1 << 32,
        transient_memory=12345,
        saved_memory=1 << 31,
        gradient_memory=4096,
        constant_memory=8192,
        collectives='[{"kind": "all-reduce", "bytes": 4096, "axes": ["x"], "group": 2}]',
        reason="",
        seconds=0.25,
        created=1_700_000_000.0 + i,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def fill(path: Path, n: int) -> None:
    with ProfileCache(path) as cache:
        for i in range(n):
            cache.put(record(i))


def corrupt_files(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.iterdir() if ".corrupt-" in p.name)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


# -- basics -------------------------------------------------------------------------------


def test_round_trip_persists_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    records = [record(i) for i in range(5)]
    records.append(record(5, status="infeasible", reason="out of memory: 17 GiB > 16 GiB"))
    with ProfileCache(path) as cache:
        for r in records:
            cache.put(r)
        assert len(cache) == 6
        assert cache.get(records[2].key) == records[2]
    with ProfileCache(path) as cache:
        assert len(cache) == 6
        assert cache.records() == records  # oldest first
        for r in records:
            assert cache.get(r.key) == r
            assert r.key in cache
        assert cache.get(key(99)) is None
        assert key(99) not in cache
        wanted = [key(1), key(5), key(99)]
        assert cache.get_many(wanted) == {key(1): records[1], key(5): records[5]}
        assert cache.get_many([]) == {}


def test_get_many_beyond_one_query_chunk() -> None:
    with ProfileCache(None) as cache:
        for i in range(1200):
            cache.put(record(i))
        found = cache.get_many(key(i) for i in range(0, 1300, 3))
        assert set(found) == {key(i) for i in range(0, 1200, 3)}


def test_memory_cache_persists_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with ProfileCache(None) as cache:
        cache.put(record(0))
        assert len(cache) == 1
        assert cache.path is None
    assert list(tmp_path.iterdir()) == []
    with ProfileCache(None) as cache:
        assert len(cache) == 0


def test_put_replaces_an_existing_key(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    with ProfileCache(path) as cache:
        cache.put(record(0))
        newer = record(0, t_comp=9.0, status="infeasible", reason="does not fit")
        cache.put(newer)
        assert len(cache) == 1
    with ProfileCache(path) as cache:
        assert cache.records() == [newer]


def test_invalid_status_is_refused() -> None:
    with pytest.raises(CacheError, match="status"):
        record(0, status="maybe")
    assert issubclass(CacheError, ExplorerError)


def test_closed_cache_raises(tmp_path: Path) -> None:
    cache = ProfileCache(tmp_path / "c.sqlite")
    cache.close()
    cache.close()  # idempotent
    with pytest.raises(CacheError, match="closed"):
        cache.get(key(0))


def test_key_digest_is_stable_and_sensitive_to_every_field() -> None:
    k = key(0)
    # Pinned: a change here silently invalidates every cache on disk.
    assert k.digest() == key(0).digest()
    assert len(k.digest()) == 64
    pinned = ProgramKey(
        "seg0000", "M@x,N@x,K@x,M@x", "2x4(x,y)", "tpu-v5e:0123abcd", "compiled", "0.10.2", ""
    )
    assert k.digest() == pinned.digest()
    # the digest every kept cache row of this key was written under (committed caches too)
    assert pinned.digest() == "63172c31a28f1f68e3abdbfad9596aa4a2e25a65b4ece4eb1b6f1ee8a12a6cfb"
    digests = {k.digest()}
    for field in dataclasses.fields(ProgramKey):
        changed = dataclasses.replace(k, **{field.name: getattr(k, field.name) + "'"})
        digests.add(changed.digest())
    assert len(digests) == 1 + len(dataclasses.fields(ProgramKey))
    # Moving text between fields must not alias.
    a = dataclasses.replace(k, config="ab", mesh="c")
    b = dataclasses.replace(k, config="a", mesh="bc")
    assert a.digest() != b.digest()


def test_digest_is_the_same_in_another_process() -> None:
    code = (
        "from explorer.profile.cache import ProgramKey\n"
        "print(ProgramKey('s', 'c', 'm', 'p', 'compiled', 'j', 'e').digest())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env(), "PYTHONHASHSEED": "123"},
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=True,
    )
    assert out.stdout.strip() == ProgramKey("s", "c", "m", "p", "compiled", "j", "e").digest()


def test_to_frame_columns(tmp_path: Path) -> None:
    with ProfileCache(tmp_path / "c.sqlite") as cache:
        empty = cache.to_frame()
        assert list(empty.columns) == list(COLUMNS)
        assert len(empty) == 0
        cache.put(record(0))
        cache.put(record(1, status="infeasible", reason="oom"))
        frame = cache.to_frame()
    assert list(frame.columns) == [
        "digest",
        "segment",
        "config",
        "mesh",
        "platform",
        "backend",
        "jax_version",
        "extra",
        "status",
        "t_comm",
        "t_comp",
        "memory",
        "persistent_memory",
        "transient_memory",
        "collectives",
        "reason",
        "seconds",
        "created",
        "flops",
        "bytes_accessed",
        "dot_flops",
        "saved_memory",
        "gradient_memory",
        "constant_memory",
    ]
    assert list(frame["status"]) == ["ok", "infeasible"]
    assert frame["memory"].iloc[0] == 1 << 33
    assert frame["digest"].iloc[0] == key(0).digest()


def test_paths_expand_home_and_create_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with ProfileCache("~/deep/er/profiles.sqlite") as cache:
        cache.put(record(0))
        assert cache.path == tmp_path / "deep" / "er" / "profiles.sqlite"
    assert (tmp_path / "deep" / "er" / "profiles.sqlite").is_file()


def test_default_cache_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "xdg" / "explorer" / "profiles.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_path() == tmp_path / ".cache" / "explorer" / "profiles.sqlite"


# -- damaged files ------------------------------------------------------------------------


def test_garbage_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    garbage = os.urandom(8192)
    path.write_bytes(garbage)
    with pytest.warns(CacheWarning, match="not a database") as caught:
        cache = ProfileCache(path)
    with cache:
        assert len(cache) == 0
        cache.put(record(0))
    (moved,) = corrupt_files(path)
    assert moved.read_bytes() == garbage
    message = str(caught[0].message)
    assert str(moved) in message and "fresh cache" in message
    with ProfileCache(path) as cache:  # the rebuilt file is healthy: no warning now
        assert cache.records() == [record(0)]


def test_truncated_database_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    fill(path, 400)
    size = path.stat().st_size
    assert size > 8 * 4096
    with path.open("r+b") as f:
        f.truncate(size // 2)
    with pytest.warns(CacheWarning, match="malformed|damaged") as caught:
        cache = ProfileCache(path)
    with cache:
        assert len(cache) == 0
        cache.put(record(1))
        assert cache.records() == [record(1)]
    (moved,) = corrupt_files(path)
    assert moved.stat().st_size == size // 2
    assert str(moved) in str(caught[0].message)


def test_foreign_schema_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE something_else (x INTEGER)")
    conn.close()
    with pytest.warns(CacheWarning, match="cannot migrate"), ProfileCache(path) as cache:
        assert len(cache) == 0
    assert len(corrupt_files(path)) == 1


def test_unknown_schema_version_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    fill(path, 3)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.warns(CacheWarning, match="schema version"), ProfileCache(path) as cache:
        assert len(cache) == 0
    assert len(corrupt_files(path)) == 1


def test_changed_columns_are_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    fill(path, 1)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE profiles ADD COLUMN surprise TEXT")
    conn.close()
    with pytest.warns(CacheWarning, match="surprise"), ProfileCache(path) as cache:
        assert len(cache) == 0


# -- kills and concurrency ----------------------------------------------------------------

_WRITER = """
import sys, time
sys.path.insert(0, {tests!r})
from test_cache import record
from explorer.profile.cache import ProfileCache

path, start, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cache = ProfileCache(path)
for i in range(start, start + count):
    cache.put(record(i))
    print(i, flush=True)
cache.close()
"""


def writer(path: Path, start: int, count: int) -> list[str]:
    code = _WRITER.format(tests=str(REPO / "tests"))
    return [sys.executable, "-c", code, str(path), str(start), str(count)]


def test_killed_writer_loses_nothing_it_committed(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    proc = subprocess.Popen(
        writer(path, 0, 1_000_000), env=env(), stdout=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(SUBPROCESS_TIMEOUT_S, proc.kill)  # a hung child cannot hang us
    watchdog.start()
    try:
        assert proc.stdout is not None
        reported = [int(proc.stdout.readline()) for _ in range(5)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=SUBPROCESS_TIMEOUT_S)
        # Lines printed before the kill but not read yet were committed too.
        reported += [int(line) for line in proc.stdout.read().split()]
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT_S)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert reported[:5] == [0, 1, 2, 3, 4]
    with ProfileCache(path) as cache:  # no CacheWarning: the killed file is healthy
        stored = cache.get_many(key(i) for i in reported)
        assert set(stored) == {key(i) for i in reported}
        assert all(stored[key(i)] == record(i) for i in reported)


def test_two_processes_write_at_once(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "profiles.sqlite"  # both race to create it, too
    n = 150
    procs = [
        subprocess.Popen(
            writer(path, start, n),
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for start in (0, 10_000)
    ]
    try:
        errors = [p.communicate(timeout=SUBPROCESS_TIMEOUT_S)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=SUBPROCESS_TIMEOUT_S)
    assert [p.returncode for p in procs] == [0, 0], errors
    assert not any("CacheWarning" in e for e in errors), errors  # neither fell back to memory
    with ProfileCache(path) as cache:
        assert len(cache) == 2 * n
        assert cache.get(key(10_000 + n - 1)) == record(10_000 + n - 1)
    assert corrupt_files(path) == []


def test_opening_waits_for_another_writer_instead_of_giving_up_on_the_file(
    tmp_path: Path,
) -> None:
    """Switching a fresh file to WAL needs the write lock. SQLite refuses at once, without
    its busy timeout, when another connection holds it (as when two processes open a new
    cache together); the cache must wait for it, not lose the file to memory."""
    path = tmp_path / "profiles.sqlite"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process's write lock, on a file not in WAL
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            with ProfileCache(path) as cache:
                assert cache.in_memory_since is None
                cache.put(record(0))
    finally:
        release.join(timeout=SUBPROCESS_TIMEOUT_S)
        holder.close()
    with ProfileCache(path) as reopened:
        assert reopened.get(key(0)) == record(0)


def test_threads_share_one_cache(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    errors: list[BaseException] = []
    with ProfileCache(path) as cache:

        def work(start: int) -> None:
            try:
                for i in range(start, start + 50):
                    cache.put(record(i))
                    assert cache.get(key(i)) == record(i)
                    len(cache)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(0, 400, 50)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert len(cache) == 400


# The `profiles` columns of cache schema 1; later schemas added columns at the end.
_SCHEMA_1_COLUMNS = (
    "digest TEXT PRIMARY KEY NOT NULL, segment TEXT NOT NULL, config TEXT NOT NULL, mesh TEXT "
    "NOT NULL, platform TEXT NOT NULL, backend TEXT NOT NULL, jax_version TEXT NOT NULL, extra "
    "TEXT NOT NULL, status TEXT NOT NULL, t_comm REAL NOT NULL, t_comp REAL NOT NULL, memory "
    "INTEGER NOT NULL, persistent_memory INTEGER NOT NULL, transient_memory INTEGER NOT NULL, "
    "collectives TEXT NOT NULL, reason TEXT NOT NULL, seconds REAL NOT NULL, created REAL NOT "
    "NULL"
)


def test_a_version_three_cache_is_profiled_again_not_composed_the_old_way(
    tmp_path: Path,
) -> None:
    """Schema 3 counted saved activations in the persistent memory: its rows survive the
    upgrade, but as misses (with a warning), never composed as if nothing were saved."""
    path = tmp_path / "three.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(
            f"CREATE TABLE profiles ({_SCHEMA_1_COLUMNS}, flops REAL NOT NULL DEFAULT 0, "
            "bytes_accessed REAL NOT NULL DEFAULT 0, dot_flops TEXT NOT NULL DEFAULT '') "
            "WITHOUT ROWID"
        )
        old = record(0, flops=2.0e6, bytes_accessed=1.0e6, dot_flops='{"f32": 2.0e6}')
        db.execute(
            "INSERT INTO profiles VALUES (" + ",".join("?" * 21) + ")",
            (old.key.digest(), *dataclasses.astuple(old.key), *dataclasses.astuple(old)[1:14]),
        )
        db.execute("PRAGMA user_version = 3")
    with ProfileCache(path) as store:
        assert len(store) == 1
        with pytest.warns(CacheWarning, match="1 cached profile.*held memory"):
            assert store.get_many([old.key]) == {}
        store.put(old)
        assert store.get(old.key) == old


def test_a_version_one_cache_is_migrated_in_place(tmp_path: Path) -> None:
    """Schema 1 had no cost-analysis columns: its rows survive the upgrade as misses."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE profiles ({_SCHEMA_1_COLUMNS}) WITHOUT ROWID")
        old = record(0)
        db.execute(
            "INSERT INTO profiles VALUES (" + ",".join("?" * 18) + ")",
            (old.key.digest(), *dataclasses.astuple(old.key), *dataclasses.astuple(old)[1:11]),
        )
        db.execute("PRAGMA user_version = 1")
    with ProfileCache(path) as store:
        assert len(store) == 1  # the row survives the upgrade...
        with pytest.warns(CacheWarning, match="1 cached profile"):
            found = store.get_many([old.key])
        # ...but without cost analysis it is never priced as free compute: a miss
        assert found == {}
        fresh = dataclasses.replace(old, flops=2.0e6, bytes_accessed=1.0e6)
        store.put(fresh)
        assert store.get(old.key) == fresh


# -- a cache that cannot be written, rows that do not read back ---------------------------


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("t_comm", "'fast'", "column 't_comm' holds str 'fast'"),
        ("t_comp", "-1.0", "column 't_comp' holds -1.0"),
        ("memory", "-3", "column 'memory' holds -3"),
        ("memory", "'lots'", "column 'memory' holds 'lots'"),
        ("collectives", "'not json'", "column 'collectives' is not JSON"),
        ("collectives", "'{\"kind\": 1}'", "holds dict, expected a list"),
        ("collectives", '\'[{"kind": "gossip"}]\'', "expected a collective with kind"),
        (
            "collectives",
            '\'[{"kind": "all-reduce", "bytes": 8, "axes": ["q"], "group": 2}]\'',
            "axes among ['x', 'y']",
        ),
        ("dot_flops", "'[1, 2]'", "column 'dot_flops' holds"),
        ("dot_flops", "'{\"bf16\": -5}'", "column 'dot_flops' holds"),
        ("created", "'yesterday'", "column 'created' holds str"),
        ("saved_memory", "-7", "column 'saved_memory' holds -7"),
    ],
)
def test_a_hand_edited_row_is_a_miss_with_one_warning(
    tmp_path: Path, column: str, value: str, why: str
) -> None:
    path = tmp_path / "profiles.sqlite"
    fill(path, 3)
    with sqlite3.connect(path) as db:  # as a user with the sqlite3 shell would
        db.execute(f"UPDATE profiles SET {column} = {value} WHERE segment = 'seg0001'")
    with ProfileCache(path) as cache:
        with pytest.warns(CacheWarning, match="do not read back") as caught:
            found = cache.get_many([key(0), key(1), key(2)])
        assert set(found) == {key(0), key(2)}  # the edited row is a miss, the others stay
        assert len(caught) == 1 and why in str(caught[0].message)
        assert [r.key for r in cache.records()] == [key(0), key(2)]
        cache.put(record(1))  # profiled again, it replaces the bad row
        assert cache.get(key(1)) == record(1)


@pytest.mark.parametrize(
    "where", ["read-only file", "read-only folder", "folder as path", "file as folder"]
)
def test_an_unwritable_cache_warns_once_and_keeps_rows_in_memory(
    tmp_path: Path, where: str, make_read_only: Callable[[Path], Path]
) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    path = folder / "profiles.sqlite"
    kept = 0
    if where == "read-only file":
        fill(path, 2)  # what it holds is still read
        kept = 2
        make_read_only(path)
    elif where == "read-only folder":
        make_read_only(folder)
    elif where == "folder as path":
        path = folder
    else:
        (folder / "plain").write_text("a file, not a folder")
        path = folder / "plain" / "profiles.sqlite"
    with pytest.warns(CacheWarning, match="cannot be written") as caught:
        cache = ProfileCache(path)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert str(path) in message and f"({kept} cached rows read from the file)" in message
    with cache:
        assert cache.in_memory_since is not None
        assert len(cache) == kept
        cache.put(record(5))  # no second warning (warnings are errors in this suite)
        assert cache.get(key(5)) == record(5) and len(cache) == kept + 1


def test_a_cache_locked_past_the_timeout_hands_over_to_memory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put that cannot get the write lock (another process holds it past the busy timeout,
    shortened here) keeps going in memory, with what the file held copied over."""
    import explorer.profile.cache as cache_module

    monkeypatch.setattr(cache_module, "BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "profiles.sqlite"
    fill(path, 2)
    cache = ProfileCache(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # a real lock, held by another connection
    try:
        with pytest.warns(CacheWarning, match="cannot be written.*database is locked"):
            cache.put(record(2))
        cache.put(record(3))  # in memory now: no wait, no second warning
        assert cache.in_memory_since is not None
        assert [r.key for r in cache.records()] == [key(0), key(1), key(2), key(3)]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        cache.close()
    with ProfileCache(path) as reopened:  # the file kept what was committed before
        assert [r.key for r in reopened.records()] == [key(0), key(1)]


# -- keys do not depend on where the package is checked out ---------------------------------

_PROFILE_FROM_A_CHECKOUT = """
import json, os, sys
import jax, jax.numpy as jnp
import explorer as ex

def step(params, x):
    def loss(p):
        return jnp.sum(jnp.tanh(x @ p["w1"]) @ p["w2"])
    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda a, b: a - 0.1 * b, params, grads)

params = {"w1": jnp.ones((16, 32)), "w2": jnp.ones((32, 8))}
analysis = ex.analyze(step, params, jnp.ones((8, 16)), mesh=(2,), platform="a100-pcie-8",
                      cache=sys.argv[1], progress=False)
table = analysis.profiles
print(json.dumps({
    "package": os.path.dirname(ex.__file__),
    "rows": len(table),
    "cached": int(table["cached"].sum()),
    # jobs that move nothing are never compiled, so never cached either
    "priced": int((table["program"] != "").sum()),
}))
"""


@pytest.mark.slow
def test_profiles_made_in_one_checkout_are_cache_hits_in_another(tmp_path: Path) -> None:
    """The same model profiled from a copy of the package at another path (a second
    checkout, a git worktree) is served from the cache: no key holds a source path."""
    other = tmp_path / "elsewhere" / "checkout"
    for part in ("explorer", "assets"):
        shutil.copytree(REPO / part, other / part, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "profiles.sqlite"
    script = tmp_path / "profile.py"
    script.write_text(_PROFILE_FROM_A_CHECKOUT)
    flags = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    runs = []
    for root in (REPO, other):
        out = subprocess.run(
            [sys.executable, str(script), str(path)],
            env={**os.environ, **flags, "PYTHONPATH": str(root)},
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
            cwd=root,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["package"] == str(REPO / "explorer")
    assert second["package"] == str(other / "explorer")
    assert first["rows"] == second["rows"] and first["priced"] > 0
    assert first["cached"] == 0
    assert second["cached"] == second["priced"], second
