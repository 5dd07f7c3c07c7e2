"""Hostile inputs at every door: each is refused where it enters, before any profiling.

One table, one row per input a user (or a damaged file) may hand in: the Python API
(`analyze`, `Analysis.plan`, `apply_plan`, `evaluate`, `Plan.save`), plan files and platform
files. Every row asserts the `ExplorerError` subclass and that the message names the field,
and that nothing was profiled (no cache file was made); rows checked before tracing also
assert that the step was never traced. Then the cases that must *not* fail: budgets with
units, a mesh that only some blocks can use (a warning, then a plan), an unwritable cache
(a warning, then a plan).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import explorer as ex
from explorer.errors import (
    BackendError,
    BytesError,
    CacheWarning,
    ExplorerError,
    InputError,
    MeshError,
    MeshFitError,
    MeshFitWarning,
    PinError,
    PlanError,
    PlatformError,
)
from explorer.ir import Config
from explorer.plan import make_plan
from explorer.plan_document import plan_from_json, plan_to_json
from explorer.platforms import load_platform
from explorer.profile.cache import ProfileCache
from explorer.units import parse_bytes


@dataclass
class World:
    """What a row needs: a tiny GPT, its data-parallel programs profiled, a valid plan
    document and a platform document to spoil, and a folder for files."""

    tmp: Path
    step: Callable[..., Any]
    args: tuple[Any, ...]
    profiled: ex.Analysis  # tiny GPT's data-parallel programs profiled on mesh 4
    plan_document: dict[str, Any]
    platform_document: dict[str, Any]
    traced: list[int]

    @property
    def cache(self) -> Path:
        return self.tmp / "profiles.sqlite"

    def analyze(self, **changes: Any) -> Any:
        """`analyze` as a user calls it, with a cache file that exists only if profiling ran
        and a step that counts how often it is traced."""

        def counted(*args: Any) -> Any:
            self.traced.append(1)
            return self.step(*args)

        options: dict[str, Any] = {"mesh": (4,), "cache": self.cache, "progress": False}
        options.update(changes)
        return ex.analyze(counted, *self.args, **options)

    def plan_file(self, edit: Callable[[dict[str, Any]], Any]) -> Path:
        document = json.loads(json.dumps(self.plan_document))
        edit(document)
        return _write(self.tmp / "plan.json", json.dumps(document))

    def platform_file(self, edit: Callable[[dict[str, Any]], Any]) -> Path:
        document = json.loads(json.dumps(self.platform_document))
        edit(document)
        return _write(self.tmp / "platform.json", json.dumps(document))


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        path.write_text(text)
    else:
        path.write_bytes(text)
    return path


def _sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk (a hole): huge to a reader."""
    with path.open("wb") as f:
        f.truncate(size)
    return path


def _nested(depth: int) -> str:
    return '{"schema_version": 1, "x": ' + "[" * depth + "]" * depth + "}"


@pytest.fixture(scope="module")
def base() -> tuple[Any, ...]:
    step, args = ex.models.gpt()
    shape = ex.analyze(step, *args, mesh=(4,), cache=None, profile=False)
    profiled = ex.analyze(
        step, *args, mesh=(4,), cache=None, progress=False, only=_data_parallel_only
    )
    zero = Config((0,) * len(shape.blocks))
    plan = make_plan(
        source="dp",
        graph=shape.graph,
        blocks=shape.block_analysis,
        segments=[],
        config=zero,
        mesh=shape.mesh,
        platform="a100-pcie-8",
        backend="compiled",
        time=1e-3,
        memory=2**20,
        memory_eq9=2**20,
        budget=None,
    )
    return step, args, profiled, plan_to_json(plan), load_platform("a100-pcie-4").to_json()


@pytest.fixture
def world(base: tuple[Any, ...], tmp_path: Path) -> World:
    step, args, profiled, plan_document, platform_document = base
    return World(tmp_path, step, args, profiled, plan_document, platform_document, [])


@dataclass(frozen=True)
class Row:
    name: str
    call: Callable[[World], Any]
    error: type[ExplorerError]
    field: str  # the message must name it
    before_trace: bool = False  # refused before the step is traced


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit setting the field at dotted `path` (list indices as ints)."""

    def edit(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return edit


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for key in parents:
            node = node[key]
        del node[last]

    return edit


def _plan_text(text: str | bytes) -> Callable[[World], Any]:
    return lambda w: ex.load_plan(_write(w.tmp / "plan.json", text))


def _platform_text(text: str | bytes) -> Callable[[World], Any]:
    return lambda w: w.analyze(platform=_write(w.tmp / "platform.json", text))


def _budget(value: Any) -> Row:
    return Row(
        f"budget={value!r}",
        lambda w: w.profiled.plan(memory_budget=value),
        BytesError,
        "memory_budget",
    )


def _mesh(value: Any, error: type[ExplorerError] = MeshError, before: bool = True) -> Row:
    return Row(f"mesh={value!r}", lambda w: w.analyze(mesh=value), error, "mesh", before)


def _pins(value: Any, field: str = "pins") -> Row:
    return Row(f"pins={value!r}", lambda w: w.profiled.plan(pins=value), PinError, field)


ROWS: tuple[Row, ...] = (
    # -- memory budgets (Analysis.plan): bytes or a string with a unit, nothing else -------
    _budget(float("nan")),
    _budget(float("inf")),
    _budget(-1),
    _budget(True),
    _budget("nan"),
    _budget("inf"),
    _budget("-64MiB"),
    _budget("64 XB"),
    _budget(""),
    _budget("MiB"),
    _budget("1e400"),
    _budget([2**30]),
    # -- meshes: positive int sizes, ASCII identifier names, devices that exist -----------
    _mesh((0,)),
    _mesh((-2,)),
    _mesh((2.5,)),
    _mesh((True,)),
    _mesh("2x"),
    _mesh("four"),
    _mesh(None),
    _mesh(()),
    _mesh((1, 2, 1, 2, 1)),
    _mesh({"données": 4}),  # aborted the process inside XLA before it was checked here
    _mesh({"data model": 4}),
    _mesh({1: 4}),
    _mesh({"data": 2, "model": "2"}),
    _mesh({"x": 2, "y": 0}),
    _mesh((16,)),  # more devices than JAX sees
    # -- a mesh no block can split over: refused after tracing, before profiling -----------
    _mesh((5,), MeshFitError, before=False),
    _mesh((7,), MeshFitError, before=False),
    _mesh((3, 2), MeshFitError, before=False),
    # -- backends, platforms and the other arguments of analyze ----------------------------
    Row("backend='gpu'", lambda w: w.analyze(backend="gpu"), BackendError, "backend", True),
    Row("backend=''", lambda w: w.analyze(backend=""), BackendError, "backend", True),
    Row("backend=None", lambda w: w.analyze(backend=None), BackendError, "backend", True),
    Row("platform=None", lambda w: w.analyze(platform=None), PlatformError, "platform", True),
    Row("platform=3", lambda w: w.analyze(platform=3), PlatformError, "platform", True),
    Row(
        "platform=unknown name",
        lambda w: w.analyze(platform="a100-pcie-9"),
        PlatformError,
        "platform",
        True,
    ),
    Row(
        "platform smaller than the mesh",
        lambda w: w.analyze(mesh=(8,), platform="a100-pcie-4"),
        PlatformError,
        "a100-pcie-4",
        True,
    ),
    Row("profiling cap 0", lambda w: w.analyze(config_cap=0), InputError, "config_cap", True),
    Row("profiling cap True", lambda w: w.analyze(config_cap=True), InputError, "config_cap", True),
    Row(
        "profiling cap as bytes",
        lambda w: w.analyze(config_cap="8GiB"),
        InputError,
        "memory_budget",  # the message points to where a memory budget goes
        True,
    ),
    Row("workers=0", lambda w: w.analyze(workers=0), InputError, "workers", True),
    Row("workers='2'", lambda w: w.analyze(workers="2"), InputError, "workers", True),
    Row("cache=3", lambda w: w.analyze(cache=3), InputError, "cache", True),
    Row("profile='yes'", lambda w: w.analyze(profile="yes"), InputError, "profile", True),
    Row("free_axes=1", lambda w: w.analyze(free_axes=1), InputError, "free_axes", True),
    Row("whole_mesh=None", lambda w: w.analyze(whole_mesh=None), InputError, "whole_mesh", True),
    Row("batch_outer='x'", lambda w: w.analyze(batch_outer="x"), InputError, "batch_outer", True),
    Row("batch_inner='x'", lambda w: w.analyze(batch_inner="x"), InputError, "batch_inner", True),
    Row(
        "contract_last=1",
        lambda w: w.analyze(contract_last=1),
        InputError,
        "contract_last",
        True,
    ),
    Row(
        "batch_outer and batch_inner",
        lambda w: w.analyze(batch_outer=True, batch_inner=True),
        InputError,
        "pinned to one mesh axis",
        True,
    ),
    Row(
        "memory_resolution='fine'",
        lambda w: w.analyze(memory_resolution="fine"),
        BytesError,
        "memory_resolution",
        True,
    ),
    Row(
        "memory_resolution=-1",
        lambda w: w.analyze(memory_resolution=-1),
        BytesError,
        "memory_resolution",
        True,
    ),
    Row(
        "shard_parameters='yes'",
        lambda w: w.analyze(shard_parameters="yes"),
        InputError,
        "shard_parameters",
        True,
    ),
    Row("only=5", lambda w: w.analyze(only=5), InputError, "only", True),
    Row("cancel=True", lambda w: w.analyze(cancel=True), InputError, "cancel", True),
    Row("step=None", lambda w: ex.analyze(None, mesh=(4,)), InputError, "step", True),
    # -- pins (Analysis.plan), checked before anything is solved -------------------------
    _pins([1, 2]),
    _pins({True: "N@x"}),
    _pins({1.5: "N@x"}),
    _pins({99: "N@x"}, "pins[99]"),
    _pins({0: "Z@x"}, "Z@x"),
    _pins({0: 5}, "pins[0]"),
    _pins({"no_such_type": {0: "N@x"}}, "no_such_type"),
    _pins({"layer": "N@x"}, "pins['layer']"),
    _pins({"layer": {99: "N@x"}}, "pins['layer'][99]"),
    _pins({"layer": {"0": "N@x"}}, "pins['layer']"),
    Row("uniform='yes'", lambda w: w.profiled.plan(uniform="yes"), InputError, "uniform"),
    # -- plan files: readable, bounded, UTF-8, JSON, finite, complete, consistent ----------
    Row("plan file missing", lambda w: ex.load_plan(w.tmp / "none.json"), PlanError, "none.json"),
    Row("plan file is a folder", lambda w: ex.load_plan(w.tmp), PlanError, "directory"),
    Row("plan path not a path", lambda w: ex.load_plan(123), PlanError, "load_plan"),
    Row("plan file not UTF-8", _plan_text(b'{"source": "\xff\xfe"}'), PlanError, "UTF-8"),
    Row("plan file not JSON", _plan_text("{'source': 1}"), PlanError, "line 1 column 2"),
    Row("plan file nested deeper", _plan_text(_nested(40)), PlanError, "nested"),
    Row("plan file nested past the parser", _plan_text(_nested(100_000)), PlanError, "nested"),
    Row(
        "plan file huge",
        lambda w: ex.load_plan(_sparse(w.tmp / "plan.json", 65 * 2**20)),
        PlanError,
        "MiB",
    ),
    Row("plan file a JSON list", _plan_text("[1, 2]"), PlanError, "JSON object"),
    Row(
        "plan time NaN",
        lambda w: ex.load_plan(
            _write(
                w.tmp / "plan.json",
                json.dumps(w.plan_document).replace('"time": 0.001', '"time": NaN'),
            )
        ),
        PlanError,
        "NaN",
    ),
    Row(
        "plan memory Infinity",
        lambda w: ex.load_plan(
            _write(
                w.tmp / "plan.json",
                json.dumps(w.plan_document).replace('"memory": 1048576', '"memory": Infinity'),
            )
        ),
        PlanError,
        "Infinity",
    ),
    Row(
        "plan number past a double",
        lambda w: ex.load_plan(
            _write(
                w.tmp / "plan.json",
                json.dumps(w.plan_document).replace('"time": 0.001', '"time": 1e400'),
            )
        ),
        PlanError,
        "1e400",
    ),
    Row(
        "plan memory negative",
        lambda w: ex.load_plan(w.plan_file(_set("predicted.memory", -5))),
        PlanError,
        "predicted.memory",
    ),
    Row(
        "plan schema version",
        lambda w: ex.load_plan(w.plan_file(_set("schema_version", 2))),
        PlanError,
        "schema_version",
    ),
    Row(
        "plan without blocks",
        lambda w: ex.load_plan(w.plan_file(_drop("blocks"))),
        PlanError,
        "blocks",
    ),
    Row(
        "plan mesh axes vs shape",
        lambda w: ex.load_plan(w.plan_file(_set("mesh.axes", ["x", "y"]))),
        PlanError,
        "mesh",
    ),
    Row(
        "plan mesh axis not ASCII",
        lambda w: ex.load_plan(w.plan_file(_set("mesh.axes", ["données"]))),
        PlanError,
        "mesh",
    ),
    Row(
        "plan device_count inconsistent",
        lambda w: ex.load_plan(w.plan_file(_set("device_count", 8))),
        PlanError,
        "device_count",
    ),
    Row(
        "plan layout names an unknown axis",
        lambda w: ex.load_plan(w.plan_file(_set("blocks.0.values", {"1": [["q"]]}))),
        PlanError,
        "blocks.0.values.1",
    ),
    Row(
        "apply_plan given a path",
        lambda w: ex.apply_plan(w.plan_file(lambda d: d), w.step),  # type: ignore[arg-type]
        PlanError,
        "plan",
    ),
    Row(
        "evaluate without a step",
        lambda w: ex.evaluate(plan_from_json(w.plan_document), None, *w.args),  # type: ignore[arg-type]
        PlanError,
        "step",
    ),
    Row(
        "plan saved onto a folder",
        lambda w: plan_from_json(w.plan_document).save(w.tmp),
        PlanError,
        "directory",
    ),
    # -- platform files (given to analyze): checked before the step is traced ---------------
    Row(
        "platform file missing",
        lambda w: w.analyze(platform=w.tmp / "none.json"),
        PlatformError,
        "none.json",
        True,
    ),
    Row(
        "platform file is a folder",
        lambda w: w.analyze(platform=w.tmp),
        PlatformError,
        "directory",
        True,
    ),
    Row(
        "platform not UTF-8", _platform_text(b'{"name": "\xc3\x28"}'), PlatformError, "UTF-8", True
    ),
    Row("platform not JSON", _platform_text('{"name": '), PlatformError, "line 1", True),
    Row("platform nested", _platform_text(_nested(30)), PlatformError, "nested", True),
    Row(
        "platform huge",
        lambda w: w.analyze(platform=_sparse(w.tmp / "platform.json", 2 * 2**20)),
        PlatformError,
        "MiB",
        True,
    ),
    Row(
        "platform latency NaN",
        lambda w: w.analyze(
            platform=_write(
                w.tmp / "platform.json",
                json.dumps(w.platform_document).replace('"latency_s": 1.5e-05', '"latency_s": NaN'),
            )
        ),
        PlatformError,
        "NaN",
        True,
    ),
    Row(
        "platform bandwidth negative",
        lambda w: w.analyze(
            platform=w.platform_file(_set("intra.per_kind.all-gather.bandwidth_Bps", -1.0))
        ),
        PlatformError,
        "intra.per_kind.all-gather.bandwidth_Bps",
        True,
    ),
    Row(
        "platform memory infinite",
        lambda w: w.analyze(
            platform=_write(
                w.tmp / "platform.json",
                json.dumps(w.platform_document).replace(
                    '"memory_bandwidth_Bps": 1555000000000.0', '"memory_bandwidth_Bps": 1e999'
                ),
            )
        ),
        PlatformError,
        "1e999",
        True,
    ),
    Row(
        "platform devices not whole nodes",
        lambda w: w.analyze(platform=w.platform_file(_set("devices_per_node", 3))),
        PlatformError,
        "devices_per_node",
        True,
    ),
    Row(
        "platform without intra",
        lambda w: w.analyze(platform=w.platform_file(_drop("intra"))),
        PlatformError,
        "intra",
        True,
    ),
    Row(
        "platform devices a string",
        lambda w: w.analyze(platform=w.platform_file(_set("devices", "4"))),
        PlatformError,
        "devices",
        True,
    ),
)


def test_the_table_covers_the_issue() -> None:
    assert len(ROWS) >= 60
    assert len({row.name for row in ROWS}) == len(ROWS)  # ids stay unique


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_a_hostile_input_is_refused_at_the_door(world: World, row: Row) -> None:
    with pytest.raises(row.error) as caught:
        row.call(world)
    message = str(caught.value)
    assert row.field in message, f"the message does not name {row.field!r}: {message}"
    assert "expected" in message and "found" in message, message  # what was wanted, and got
    assert not world.cache.exists(), "profiling started before the input was refused"
    if row.before_trace:
        assert not world.traced, "the step was traced before the input was refused"


def test_a_mesh_no_block_can_use_is_refused_in_under_five_seconds(world: World) -> None:
    """The issue's acceptance: a mesh that divides no block's dims errs before profiling,
    in seconds (it profiled everything and then died with a KeyError)."""
    start = time.perf_counter()
    with pytest.raises(MeshFitError, match=r"mesh 5 \(x\).*block 0.*M=8.*\[2, 4, 8\]"):
        world.analyze(mesh=(5,))
    assert time.perf_counter() - start < 5.0
    assert not world.cache.exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64MB", 64 * 10**6),
        ("64MiB", 64 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("1.5GB", 1_500_000_000),
        (" 2 kib ", 2048),
        ("8e9", 8 * 10**9),
        (12 * 2**30, 12 * 2**30),
        (1.5 * 2**30, 3 * 2**29),
        (1234.75, 1234.75),  # a number is kept exactly (the UI's budget between two plans)
    ],
)
def test_budgets_with_units_are_bytes(text: Any, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_mesh_three_warns_before_profiling_then_gives_a_plan(world: World) -> None:
    """On mesh 3 only the fused QKV projection (N = 3 * hidden) can split: the other block
    stays replicated. That is a warning naming it, before profiling, and a plan after: the
    mesh-3 run used to profile everything and die with a KeyError on a rank-0 layout."""
    start = time.perf_counter()
    with pytest.warns(MeshFitWarning, match=r"mesh 3 \(x\): 1 of 2 blocks.*block 1 "):
        shape = world.analyze(mesh=(3,), profile=False)
    assert time.perf_counter() - start < 5.0
    with pytest.warns(MeshFitWarning):
        analysis = world.analyze(mesh=(3,), cache=None)
    plan = analysis.plan()
    assert plan.strategies == ("N@x", "replicated")
    assert len(shape.blocks) == 2 and plan.time > 0


# -- an unwritable cache: a warning, and the run finishes with a plan -------------------------


def _data_parallel_only(kind: str, label: str, config: str) -> bool:
    """A quick run: only the data-parallel programs (8 on tiny GPT, seconds)."""
    return not any(role in config for role in ("N@", "K@", "E@"))


@pytest.mark.parametrize("where", ["read-only file", "read-only folder", "folder as path"])
def test_an_unwritable_cache_warns_once_and_the_run_finishes_with_a_plan(
    world: World, where: str, make_read_only: Callable[[Path], Path]
) -> None:
    folder = world.tmp / "cache"
    folder.mkdir()
    path = folder / "profiles.sqlite"
    if where == "read-only file":
        ProfileCache(path).close()  # a good, empty cache that cannot be written
        make_read_only(path)
    elif where == "read-only folder":
        make_read_only(folder)
    else:
        path = folder  # the path names a folder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        analysis = world.analyze(mesh=(2,), cache=path, only=_data_parallel_only)
    cache_warnings = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(cache_warnings) == 1, [str(w.message) for w in caught]
    assert "cannot be written" in str(cache_warnings[0].message)
    assert str(path) in str(cache_warnings[0].message)
    plan = analysis.plan()
    assert plan.strategies and plan.time > 0
    assert not (folder / "profiles.sqlite").exists() or where == "read-only file"
