"""Cancelling a profiling run (the explorer's Cancel button): no program starts once the event
is set, the programs already finished stay in the cache, and a re-run continues from there."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

import explorer as ex
from explorer.blocks import build_blocks
from explorer.errors import ProfilingCancelled
from explorer.mesh import mesh_spec
from explorer.platforms import load_platform
from explorer.profile.cache import ProfileCache
from explorer.profile.runner import profile_all
from explorer.segments import build_segments
from explorer.space import build_space


def _layers(
    cache: ProfileCache,
    cancel: threading.Event | None,
    tick: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny(), abstract=True)
    graph = ex.trace(step, *args)
    spec = mesh_spec((4,))
    blocks = build_space(build_blocks(graph, spec.size), spec)
    return profile_all(
        graph,
        blocks,
        build_segments(graph, blocks),
        spec,
        platform=load_platform("a100-pcie-8"),
        cache=cache,
        progress=False,
        workers=1,
        only=lambda kind, label, config: label == "layer" and config.startswith("M@x,M@x,"),
        on_program=tick,
        cancel=cancel,
    ).frame()


def test_a_cancelled_run_keeps_what_it_finished_and_a_rerun_continues(tmp_path: Path) -> None:
    cancel = threading.Event()
    with ProfileCache(tmp_path / "profiles.sqlite") as store:
        with pytest.raises(ProfilingCancelled) as stopped:
            _layers(store, cancel, tick=lambda n: cancel.set())
        finished, total = stopped.value.finished, stopped.value.total
        # the window of compiles (two programs for one thread) may finish after the click
        assert 1 <= finished <= 3 < total == 9, (finished, total)
        assert len(store) == finished
        assert f"{finished} of {total} programs" in str(stopped.value)
        assert isinstance(stopped.value, ex.ExplorerError)
        table = _layers(store, None)
    again = table[table["program"] != ""]
    assert again["program"].nunique() == total
    cached = again.drop_duplicates("program")["cached"]
    assert int(cached.sum()) == finished, "the finished programs were not reused"


def test_a_cancel_through_analyze_stops_before_any_compile(tmp_path: Path) -> None:
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny(), abstract=True)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(ProfilingCancelled, match="0 of"):
        ex.analyze(
            step, *args, mesh=(4,), cache=tmp_path / "p.sqlite", progress=False, cancel=cancel
        )
    with ProfileCache(tmp_path / "p.sqlite") as store:
        assert len(store) == 0
