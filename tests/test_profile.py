"""Profiling: HLO collectives, the compiled and measured backends, cache resume."""

from __future__ import annotations

import collections
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from helpers import SHARED_CACHE
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import explorer as ex
from explorer.blocks import build_blocks
from explorer.errors import ExplorerError
from explorer.ir import BlockAnalysis, Graph, Segmentation
from explorer.mesh import mesh_spec
from explorer.platforms import load_platform
from explorer.profile import backends, runner
from explorer.profile.accounting import MemoryAccounting
from explorer.profile.buffers import Schedule
from explorer.profile.cache import ProfileCache
from explorer.profile.compile_flags import FAST_COMPILE_FLAG
from explorer.profile.compile_workers import CompileWorkers
from explorer.profile.hlo import CollectiveKind, parse_collectives
from explorer.profile.profiles import Profiles, ReshardProfile, SegmentProfile
from explorer.profile.runner import COLUMNS, distinct_programs, profile_all
from explorer.segments import build_segments
from explorer.space import build_space

ROOT = Path(__file__).resolve().parents[1]


@cache
def _tiny_gpt(layers: int = 2) -> tuple[Graph, BlockAnalysis, Segmentation]:
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=layers), abstract=True)
    graph = ex.trace(step, *args)
    spec = mesh_spec((4,))
    analysis = build_space(build_blocks(graph, spec.size), spec)
    return graph, analysis, build_segments(graph, analysis)


_STORE = ProfileCache(SHARED_CACHE)  # compiled profiles are platform-free: compile once


def _tiny_gpt_programs_to_compile(cache: ProfileCache | None) -> int:
    """How many programs of `_tiny_gpt()`'s space on mesh 4 `cache` lacks."""
    graph, analysis, segmentation = _tiny_gpt()
    return runner.programs_to_compile(
        graph,
        analysis,
        segmentation,
        mesh_spec((4,)),
        platform=load_platform("a100-pcie-8"),
        cache=cache,
    )


def _profiles(platform: str = "a100-pcie-8", scale: float = 1.0) -> pd.DataFrame:
    return _typed_profiles(platform, scale).frame()


@cache
def _typed_profiles(platform: str = "a100-pcie-8", scale: float = 1.0) -> Profiles:
    graph, analysis, segmentation = _tiny_gpt()
    target = load_platform(platform)
    if scale != 1.0:
        target = target.scaled(scale)
    return profile_all(
        graph,
        analysis,
        segmentation,
        mesh_spec((4,)),
        platform=target,
        cache=_STORE,
        progress=False,
    )


# -- HLO parser on real compiled programs -----------------------------------------------------


def test_combined_all_reduce_is_one_collective_with_the_summed_bytes() -> None:
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    batch = NamedSharding(mesh, P("x"))

    def grads(w1: jax.Array, w2: jax.Array, x: jax.Array) -> Any:
        loss = lambda a, b: jnp.sum(jnp.tanh(x @ a) @ b)  # noqa: E731
        return jax.grad(loss, argnums=(0, 1))(w1, w2)

    replicated = NamedSharding(mesh, P())
    compiled = (
        jax.jit(grads, in_shardings=(replicated, replicated, batch), out_shardings=replicated)
        .lower(jnp.ones((16, 32)), jnp.ones((32, 8)), jnp.ones((8, 16)))
        .compile()
    )
    reduces = [
        c for c in parse_collectives(compiled.as_text(), mesh_spec((4,)))
        if c.kind is CollectiveKind.ALL_REDUCE
    ]  # fmt: skip
    combined = [c for c in reduces if len(c.shapes) > 1]
    assert combined, "XLA combines the two gradient all-reduces into one tuple all-reduce"
    (both,) = combined
    # the compiler may all-reduce a gradient in transposed form: compare sizes
    assert sorted(int(np.prod(dims)) for _, dims in both.shapes) == [32 * 8, 16 * 32]
    assert both.nbytes == 4 * (16 * 32 + 32 * 8)
    assert both.axes == ("x",) and both.group_size == 4


def test_a_gradient_kept_as_each_devices_slice_is_priced_as_a_reduce_scatter() -> None:
    # FSDP in miniature: batch split, weights sharded, each device updating its own slice.
    # The CPU pipeline all-reduces the whole gradient and slices it; a GPU pipeline makes
    # that a reduce-scatter (half a ring all-reduce's traffic), and so does our pricing.
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    batch, sharded = NamedSharding(mesh, P("x")), NamedSharding(mesh, P("x"))

    def update(w1: jax.Array, w2: jax.Array, x: jax.Array) -> Any:
        loss = lambda a, b: jnp.sum(jnp.tanh(x @ a) @ b)  # noqa: E731
        g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - 0.1 * g1, w2 - 0.1 * g2, loss(w1, w2)

    def compiled(weights: NamedSharding) -> Any:
        return (
            jax.jit(
                update,
                in_shardings=(weights, weights, batch),
                out_shardings=(weights, weights, None),
            )
            .lower(jnp.ones((16, 32)), jnp.ones((32, 8)), jnp.ones((8, 16)))
            .compile()
        )

    spec = mesh_spec((4,))
    found = parse_collectives(compiled(sharded).as_text(), spec)
    scattered = [c for c in found if c.scattered_bytes]
    assert scattered, "the sharded weights' gradients are read only as each device's slice"
    for c in scattered:  # the loss's sum is wanted whole everywhere: still all-reduced
        assert not any(s for s, (_, dims) in zip(c.scattered, c.shapes, strict=True) if not dims)
    platform = load_platform("a100-pcie-8")
    for c in scattered:
        group = platform.group_devices(c.axes, spec)
        kept = c.nbytes - c.scattered_bytes
        expected = platform.collective_time(CollectiveKind.REDUCE_SCATTER, c.scattered_bytes, group)
        if kept:
            expected += platform.collective_time(CollectiveKind.ALL_REDUCE, kept, group)
        assert platform.price(c, spec) == pytest.approx(expected, rel=1e-12)
    # replicated weights need the whole gradient on every device: a true all-reduce
    replicated = NamedSharding(mesh, P())
    assert not any(
        c.scattered_bytes for c in parse_collectives(compiled(replicated).as_text(), spec)
    )


def test_fsdp_reduce_scatters_every_gradient_and_all_reduces_only_the_loss() -> None:
    # a real step: Adam, a tied embedding whose gradient is summed whole before it is sliced
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    analysis = ex.analyze(step, *args, mesh=(4,), profile=False, progress=False)
    for name, scatters in (("fsdp", True), ("dp", False), ("megatron", False)):
        compiled = ex.apply_plan(analysis.baseline(name), step).lower(*args).compile()
        reduces = [
            c
            for c in parse_collectives(compiled.as_text(), analysis.mesh)
            if c.kind is CollectiveKind.ALL_REDUCE and c.is_backward
        ]
        gradients = [
            (scattered, dims)
            for c in reduces
            for scattered, (_, dims) in zip(
                c.scattered or (False,) * len(c.shapes), c.shapes, strict=True
            )
        ]
        assert gradients, name
        if scatters:  # every gradient is a reduce-scatter; the loss (a scalar) is summed whole
            assert all(scattered == bool(dims) for scattered, dims in gradients), gradients
        else:
            assert not any(scattered for scattered, _ in gradients), name


def test_replica_groups_on_a_two_by_four_mesh_map_to_their_axes() -> None:
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))

    def f(a: jax.Array) -> Any:
        over_x = jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P(None, "y")))
        over_y = jax.lax.with_sharding_constraint(a * 2, NamedSharding(mesh, P("x", None)))
        return over_x, over_y

    compiled = (
        jax.jit(f, in_shardings=NamedSharding(mesh, P("x", "y"))).lower(jnp.ones((8, 16))).compile()
    )
    found = parse_collectives(compiled.as_text(), mesh_spec((2, 4)))
    gathers = {(c.axes, c.group_size) for c in found if c.kind is CollectiveKind.ALL_GATHER}
    assert (("x",), 2) in gathers  # un-splitting rows gathers over x
    assert (("y",), 4) in gathers  # un-splitting columns gathers over y


def _segment(*flat: jax.Array) -> Any:
    """A segment's program in miniature: its forward part, and a backward part that waits for
    the cotangent `ct` the next segment sends back; the weight `w` is updated."""
    w, v, x, ct = flat
    h = jnp.tanh(x @ w)
    dh = (ct @ v.T) * (1 - h * h)
    return h @ v, dh @ w.T, w - 0.1 * (x.T @ dh)


def test_a_program_holds_what_its_backward_part_reads_and_the_weight_it_updates_late() -> None:
    args = (jnp.ones((32, 128)), jnp.ones((128, 16)), jnp.ones((64, 32)), jnp.ones((64, 16)))
    hlo = jax.jit(_segment).lower(*args).compile().as_text()
    saved = MemoryAccounting(0, backward_inputs=frozenset({3})).held(hlo)
    assert saved.saved == 64 * 128 * 4  # tanh(x @ w), made forward, read backward
    assert saved.persistent == 0  # held until its backward part, not the whole step
    kept = MemoryAccounting(0, frozenset({3}), forward_inputs=frozenset({2})).held(hlo)
    assert kept.saved - saved.saved == 64 * 32 * 4  # the input x, read backward for w's grad
    # dh @ w.T reads w and the update does not wait for it: the step copies w
    copied = MemoryAccounting(0, frozenset({3}), donated=((0, 2),)).held(hlo)
    assert copied.persistent == 32 * 128 * 4
    assert copied.saved == saved.saved


def test_an_update_after_a_combined_gradient_all_reduce_copies_nothing() -> None:
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    batch, replicated = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
    args = (jnp.ones((32, 128)), jnp.ones((128, 16)), jnp.ones((64, 32)), jnp.ones((64, 16)))
    shardings = (replicated, replicated, batch, batch)
    hlo = jax.jit(_segment, in_shardings=shardings).lower(*args).compile().as_text()
    reduces = parse_collectives(hlo, mesh_spec((4,)), terminal_outputs=frozenset({2}))
    combined = frozenset(c.name for c in reduces if any(c.combinable))
    assert combined, "w's gradient is all-reduced over the batch, and reaches only w's update"
    accounting = MemoryAccounting(0, frozenset({3}), donated=((0, 2),))
    assert accounting.held(hlo, combined).persistent < accounting.held(hlo).persistent


def _loss_segment(logits: jax.Array, labels: jax.Array) -> Any:
    """A loss in a segment of its own: it receives the head's logits and sends their
    cotangent back."""
    probabilities = jax.nn.softmax(logits)
    return (jnp.log(probabilities) * labels).sum(), probabilities - labels


def _loss_sending_reversed(logits: jax.Array, labels: jax.Array) -> Any:
    """A loss segment whose cotangent is not elementwise in the probabilities (reversed), so
    XLA cannot write it over them."""
    probabilities = jax.nn.softmax(logits)
    return (jnp.log(probabilities) * labels).sum(), (probabilities - labels)[:, ::-1]


def _loss_reading_late(logits: jax.Array, labels: jax.Array) -> Any:
    """A loss that reads the logits it receives again at the end."""
    probabilities = jax.nn.softmax(logits)
    return (jnp.log(probabilities) * labels).sum() + (logits * labels).sum()


def test_a_working_set_holds_the_tensors_passed_between_instances() -> None:
    """The logits a separate loss segment receives are the program's argument and the
    cotangent it sends back its result, not temporaries; in the step they are alive while it
    runs, and nothing else counts them (a Flax decoder's memory was 8 % low without them)."""
    args = (jnp.ones((64, 512)), jnp.ones((64, 512)))
    nbytes = 64 * 512 * 4
    receives, sends = MemoryAccounting(0, forward_inputs=frozenset({0})), frozenset({1})
    hlo = jax.jit(_loss_sending_reversed).lower(*args).compile().as_text()
    alone = MemoryAccounting(0).held(hlo).transient
    # the logits are read first and dead before the peak, where the cotangent is made
    assert receives.held(hlo).transient == alone
    assert replace(receives, passed=sends).held(hlo).transient == alone + nbytes
    hlo = jax.jit(_loss_reading_late).lower(*args).compile().as_text()
    alone = MemoryAccounting(0).held(hlo).transient
    # read again at the end, the logits are alive at the peak
    assert receives.held(hlo).transient > alone


def test_a_result_written_over_an_operand_is_not_counted_beside_it() -> None:
    """`probabilities - labels` is elementwise in the probabilities, which die there: XLA's
    buffer assignment writes the cotangent over them (one allocation holds both), so the
    working set holds them once; reversed, it cannot, and holds both."""
    args = (jnp.ones((64, 512)), jnp.ones((64, 512)))
    nbytes = 64 * 512 * 4
    accounting = MemoryAccounting(0, forward_inputs=frozenset({0}), passed=frozenset({1}))
    sent = {}
    for step in (_loss_segment, _loss_sending_reversed):
        compiled = jax.jit(step).lower(*args).compile()
        sent[step] = accounting.held(compiled.as_text()).transient
        # XLA's own count: its temporaries and the cotangent's buffer (in the first program
        # the probabilities live in it before the cotangent does)
        assert sent[step] == compiled.memory_analysis().temp_size_in_bytes + nbytes
    assert sent[_loss_sending_reversed] == sent[_loss_segment] + nbytes


# A library fusion as XLA:CPU prints it (a YNNPACK fusion of the LLaMA-7B head's backward):
# it reduces its first operand and only multiplies and adds its last one.
_LIBRARY_FUSION = """HloModule m, is_scheduled=true

%fused (p0: f32[64,512], p1: f32[64,512]) -> f32[64,512] {
  %p0 = f32[64,512]{1,0} parameter(0)
  %zero = f32[] constant(0)
  %sum = f32[64]{0} reduce(%p0, %zero), dimensions={1}, to_apply=%add
  %wide = f32[64,512]{1,0} broadcast(%sum), dimensions={0}
  %p1 = f32[64,512]{1,0} parameter(1)
  %scaled = f32[64,512]{1,0} multiply(%wide, %p1)
  ROOT %out = f32[64,512]{1,0} add(%p0, %scaled)
}

ENTRY %main (a: f32[64,512], b: f32[64,512]) -> f32[64,512] {
  %a = f32[64,512]{1,0} parameter(0)
  %b = f32[64,512]{1,0} parameter(1)
  %ea = f32[64,512]{1,0} exponential(%a)
  %eb = f32[64,512]{1,0} exponential(%b)
  %f = f32[64,512]{1,0} fusion(%ea, %eb), kind=kCustom, calls=%fused
  ROOT %r = f32[64,512]{1,0} transpose(%f), dimensions={1,0}
}
"""


def test_a_fusion_writes_over_the_operands_it_only_uses_elementwise() -> None:
    """XLA's buffer assignment lets a fusion of any kind write its result over an operand
    its fused computation only uses elementwise (`eb`), not over one it reduces (`ea`)."""
    schedule = Schedule.parse(_LIBRARY_FUSION)
    names = [i.name for i in schedule.instructions]
    fusion = schedule.instructions[names.index("f")]
    buffer_of = {schedule.instructions[b.defined].name: n for n, b in enumerate(schedule.buffers)}
    assert fusion.overwritable == {buffer_of["eb"]}
    nbytes = 64 * 512 * 4
    # ea, eb and f: eb's buffer becomes f's, so two at once, not three
    assert schedule.peak([buffer_of["ea"], buffer_of["eb"], buffer_of["f"]]) == 2 * nbytes


# A segment's schedule as XLA:CPU wrote GPT-2.6B's layer: a constant broadcast to the scores'
# shape (the dropout scale a library fusion cannot take in) is made in the forward part, beside
# the forward value `h`, and read only by the backward part, which waits for the cotangent `ct`.
_CONSTANT_MADE_EARLY = """HloModule m, is_scheduled=true

ENTRY %main (x: f32[64,512], ct: f32[64,512]) -> (f32[64,512], f32[64,512]) {
  %x = f32[64,512]{1,0} parameter(0)
  %ct = f32[64,512]{1,0} parameter(1)
  %scale = f32[] constant(1.1)
  %wide = f32[64,512]{1,0} broadcast(%scale), dimensions={}
  %h = f32[64,512]{1,0} exponential(%x)
  %y = f32[64,512]{1,0} negate(%h)
  %g = f32[64,512]{1,0} multiply(%ct, %h)
  %d = f32[64,512]{1,0} multiply(%g, %wide)
  ROOT %out = (f32[64,512]{1,0}, f32[64,512]{1,0}) tuple(%y, %d)
}
"""


def test_a_value_made_from_constants_alone_is_held_apart_from_the_saved_activations() -> None:
    """`h` is saved by every instance; the broadcast constant is held too, but the step's
    compiler merges the equal ones of every instance of a type into one buffer, so it is
    counted apart (once per type, `cost.CostModel.memory`)."""
    held = MemoryAccounting(0, backward_inputs=frozenset({1})).held(_CONSTANT_MADE_EARLY)
    nbytes = 64 * 512 * 4
    assert (held.saved, held.constants) == (nbytes, nbytes)
    free = Schedule.parse(_CONSTANT_MADE_EARLY).argument_free()
    assert free == [False, False, True, True, False, False, False, False, False]


# -- compiled backend -------------------------------------------------------------------------


def test_compiled_profiles_cover_every_layer_configuration_and_boundary() -> None:
    table = _profiles()
    segments = table[table["kind"] == "segment"]
    # the embedding reads wte, tied to the LM head: one program per head strategy
    assert (segments.groupby("label").size().to_dict()) == {"embed": 3, "layer": 81, "head": 3}
    reshards = table[table["kind"] == "reshard"]
    assert len(reshards) == 3 + 9 + 9
    assert (table["status"] == "ok").all(), table[table["status"] != "ok"]["reason"].tolist()
    no_move = reshards[reshards["config"].isin(["M@x->M@x"])]
    assert (no_move["t_comm"] == 0).all()


def test_programs_to_compile_are_the_distinct_programs_the_cache_lacks(tmp_path: Path) -> None:
    profiled = _typed_profiles()  # every program of the space, in the shared store
    to_compile = _tiny_gpt_programs_to_compile
    programs = {p.program for p in profiled.entries if p.program}
    assert to_compile(None) == len(programs) == profiled.programs < len(profiled.entries)
    assert to_compile(_STORE) == 0
    left_out = set(sorted(programs)[:2])
    with ProfileCache(tmp_path / "partial.sqlite") as partial:
        for record in _STORE:
            digest = record.key.digest()[:16]
            if digest in programs and digest not in left_out:
                partial.put(record)
        assert to_compile(partial) == 2
        assert len(partial) == len(programs) - 2  # asking compiled and stored nothing


def test_profiles_compiled_under_other_xla_flags_are_never_read_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """XLA reads `XLA_FLAGS` once and a flag there can change the optimised HLO
    (`compile_flags`): every program of the space cached under this suite's flags is a miss
    under `--fast-compile`'s, and flags the compile options override change no key."""
    _typed_profiles()  # every program of the space, in the shared store
    every = _tiny_gpt_programs_to_compile(None)
    flags = os.environ.get("XLA_FLAGS", "")
    assert _tiny_gpt_programs_to_compile(_STORE) == 0
    monkeypatch.setenv("XLA_FLAGS", f"{flags} --xla_backend_optimization_level=3")
    # overridden by `backends.FAST_COMPILE`: the same programs
    assert _tiny_gpt_programs_to_compile(_STORE) == 0
    monkeypatch.setenv("XLA_FLAGS", f"{flags} {FAST_COMPILE_FLAG}")
    assert runner.program_version(mesh_spec((4,))).endswith(f"+xla({FAST_COMPILE_FLAG})")
    assert _tiny_gpt_programs_to_compile(_STORE) == every > 0


def test_profiles_are_typed_records_and_their_frame_is_the_table_shown() -> None:
    """`profile_all` hands on typed profiles; `.frame()` shows one row each, in order, with
    the columns and dtypes the UI, the benches and these tests read."""
    profiles = _typed_profiles()
    table = profiles.frame()
    assert list(table.columns) == COLUMNS and len(table) == len(profiles.entries)
    assert len(profiles.segments) + len(profiles.reshards) == len(profiles.entries)
    for row, profile in zip(table.to_dict("records"), profiles.entries, strict=True):
        assert row == profile.row()
        if isinstance(profile, ReshardProfile):
            assert row["segment"] == (profile.before, profile.after)
            assert row["choices"] == (profile.last, profile.first)
        else:
            assert isinstance(profile, SegmentProfile) and row["kind"] == "segment"
    kinds = table.dtypes.to_dict()
    assert kinds["t_comm"] == kinds["t_total"] == kinds["seconds"] == "float64"
    assert kinds["memory"] == kinds["saved_memory"] == "int64" and kinds["cached"] == "bool"
    assert profiles.programs == distinct_programs(table)


def test_all_batch_layer_communicates_gradients_only() -> None:
    table = _profiles()
    row = table[(table["label"] == "layer") & (table["config"] == "M@x,M@x,M@x,M@x")].iloc[0]
    collectives = json.loads(row["collectives"])
    assert collectives and row["t_comm"] > 0
    for collective in collectives:
        assert collective["kind"] == "all-reduce"
        assert "transpose(" in collective["op"] or collective["bytes"] <= 8


def test_ten_times_the_bandwidth_cuts_communication_not_computation() -> None:
    """The bandwidth term of every T_C shrinks 10x; latency stays; T_P does not move.

    Tiny GPT moves kilobytes, so per-message latency dominates its T_C; the latency-only
    price (bandwidth made effectively infinite) is subtracted to see the bandwidth term.
    """
    base, fast, latency = _profiles(), _profiles(scale=10.0), _profiles(scale=1e9)
    merged = base.merge(fast, on=["kind", "label", "config"], suffixes=("", "_fast")).merge(
        latency[["kind", "label", "config", "t_comm"]].rename(columns={"t_comm": "t_lat"}),
        on=["kind", "label", "config"],
    )
    busy = merged[merged["t_comm"] > merged["t_lat"] * 1.01]
    assert len(busy) > 80
    ratio = (busy["t_comm"] - busy["t_lat"]) / (busy["t_comm_fast"] - busy["t_lat"])
    np.testing.assert_allclose(ratio, 10.0, rtol=1e-3)
    assert (merged["t_comm_fast"] <= merged["t_comm"]).all()
    np.testing.assert_allclose(merged["t_comp"], merged["t_comp_fast"])
    print(
        f"\nT_C base / 10x-bandwidth, median over configurations: "
        f"{(busy['t_comm'] / busy['t_comm_fast']).median():.2f}x (latency-bound tiny model)"
    )


def _profile_layer_to_head(
    selected: Callable[[str], bool],
    on_program: Callable[[int], None] | None = None,
    cache: ProfileCache | None = None,
) -> pd.DataFrame:
    """Tiny GPT's layer->head boundaries whose configuration `selected` accepts, profiled
    on mesh 4 by two threads (cold, unless `cache` holds them)."""
    graph, analysis, segmentation = _tiny_gpt()
    return profile_all(
        graph,
        analysis,
        segmentation,
        mesh_spec((4,)),
        platform=load_platform("a100-pcie-8"),
        cache=ProfileCache(None) if cache is None else cache,
        progress=False,
        workers=2,
        only=lambda kind, label, config: label == "layer->head" and selected(config),
        on_program=on_program,
    ).frame()


def test_priced_executables_are_released_and_progress_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long run must not keep what it compiled (its memory maps once ran out after ~300
    programs): no executable outlives the run, and the periodic release runs between
    programs. Compiled here, as the measured backend does (compile-only profiling compiles in
    worker processes, see the next test). benchmarks/profile_memory_bench.py measures a run
    of 1,000."""
    monkeypatch.setattr(backends, "COMPILE_IN_WORKERS", False)
    compiled: list[weakref.ref[Any]] = []
    original = backends.compile_program

    def tracked(lowered: Any, backend: Any) -> Any:
        executable = original(lowered, backend)
        compiled.append(weakref.ref(executable))
        return executable

    monkeypatch.setattr(backends, "compile_program", tracked)
    monkeypatch.setattr(runner, "RELEASE_EVERY", 2)
    counted: list[int] = []
    table = _profile_layer_to_head(
        lambda config: config.endswith("->M@x"), on_program=counted.append
    )
    assert len(table) >= 3 and (table["status"] == "ok").all()
    programs = distinct_programs(table)
    assert programs >= 2
    assert counted == list(range(1, programs + 1))
    assert len(compiled) == programs
    assert all(ref() is None for ref in compiled)


def test_profiles_compiled_in_recycled_workers_equal_profiles_compiled_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Compile-only profiling compiles in worker processes that exit every few programs
    (here after each): every row is the row the same program gives compiled in this
    process."""
    workers = CompileWorkers(processes=2, device_count=jax.device_count(), programs_per_worker=1)
    monkeypatch.setattr(runner, "compile_workers", lambda backend, threads: workers)
    try:
        there = _profile_layer_to_head(lambda config: True)
    finally:
        workers.close()
    monkeypatch.setattr(runner, "compile_workers", lambda backend, threads: None)
    here = _profile_layer_to_head(lambda config: True)
    programs = distinct_programs(there)
    assert programs >= 3 and (there["status"] == "ok").all()
    assert workers.started == programs  # a fresh worker for every program
    priced = [c for c in COLUMNS if c not in ("seconds", "cached")]
    pd.testing.assert_frame_equal(there[priced], here[priced])


def test_a_compile_stopped_at_the_memory_limit_is_infeasible_here_and_not_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A worker stopped for memory says something of this machine, not of the program: the
    run records it as infeasible with the reason, and the cache keeps nothing, so a run with
    more memory (here: workers without the limit) profiles it."""
    starved = CompileWorkers(processes=2, device_count=jax.device_count(), memory_limit=2**26)
    monkeypatch.setattr(runner, "compile_workers", lambda backend, threads: starved)
    with ProfileCache(tmp_path / "profiles.sqlite") as cache:
        try:
            stopped = _profile_layer_to_head(lambda config: True, cache=cache)
        finally:
            starved.close()
        compiled = stopped[stopped["program"] != ""]  # a boundary where nothing moves has none
        assert len(compiled) >= 3 and (compiled["status"] == "infeasible").all()
        said = "CompileOutOfMemory: compiling this program, the compiler grew past"
        assert compiled["reason"].str.startswith(said).all()
        assert len(cache) == 0
        monkeypatch.setattr(runner, "compile_workers", lambda backend, threads: None)
        profiled = _profile_layer_to_head(lambda config: True, cache=cache)
        assert (profiled["status"] == "ok").all() and not profiled["cached"].any()
        assert len(cache) == distinct_programs(profiled)


def test_measured_mode_refuses_a_mesh_larger_than_the_devices() -> None:
    graph, analysis, segmentation = _tiny_gpt()
    with pytest.raises(ExplorerError, match=r"JAX sees 8 .*xla_force_host_platform_device_count"):
        profile_all(
            graph,
            analysis,
            segmentation,
            mesh_spec((4,)),
            platform=load_platform("cpu-local"),
            backend="measured",
            progress=False,
        )


def _measured_tiny_gpt(**options: Any) -> Profiles:
    """A one-layer tiny GPT profiled on the eight virtual CPU devices with the measured
    backend; `options` go to `profile_all` (which programs, how many threads)."""
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=1), abstract=True)
    graph = ex.trace(step, *args)
    spec = mesh_spec((8,))
    analysis = build_space(build_blocks(graph, spec.size), spec)
    return profile_all(
        graph,
        analysis,
        build_segments(graph, analysis),
        spec,
        platform=load_platform("cpu-local"),
        backend="measured",
        progress=False,
        **options,
    )


def test_measured_runs_on_the_devices_and_abandons_hopeless_programs(tmp_path: Path) -> None:
    """Eight virtual CPU devices: real runs, and the dynamic limit records what it cut. A
    resharding is never cut: its neighbours' strategies force it, it does not compete.
    Measured profiles are kept under the measured backend's version (what they hold: times
    less the launch), so profiles timed the old way are not read back as new ones, and under
    the XLA flags only a measured compile obeys."""
    chosen = ("M@x,M@x,M@x,M@x", "K@x,K@x,K@x,K@x", "N@x,K@x,N@x,K@x")
    with ProfileCache(tmp_path / "profiles.sqlite") as cache:
        profiles = _measured_tiny_gpt(
            workers=1,
            only=lambda kind, label, config: (
                (label == "layer" and config in chosen) or label == "layer->head"
            ),
            time_limit_factor=1e-9,  # anything after the first is "hopeless"
            cache=cache,
        )
    with sqlite3.connect(tmp_path / "profiles.sqlite") as db:
        extras = [row[0] for row in db.execute("select extra from profiles")]
    assert extras and all(e.endswith(f":{backends.MEASURED_VERSION}") for e in extras)
    # the suite's optimisation level, which the compiled backend's options override, is what
    # a measured program runs at: its key says so
    suite_level = "--xla_backend_optimization_level=0"
    assert all(f"+xla({suite_level} " in e for e in extras), extras[:2]
    assert backends.launch_time(tuple(jax.devices())) > 0
    assert sorted(p.config for p in profiles.segments) == sorted(chosen)
    first, *rest = profiles.segments
    assert first.ok and first.t_total > 0
    for profile in rest:
        assert profile.status == "infeasible" and "dynamic limit" in profile.reason
    reshards = profiles.reshards
    assert len({r.program for r in reshards if r.program}) >= 2
    assert all(r.ok for r in reshards), [r.reason for r in reshards]


def test_measured_timing_never_overlaps_building_or_compiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Preparing a program disturbs a timing beside it: building and lowering are Python and
    hold the GIL (a timed run waits to dispatch), and a GPU compile autotunes on the device
    being timed. Recorded on four threads compiling ahead of the timing: the spans of every
    build, every compile and every timed measurement are disjoint (without the gate, 17 of
    them overlapped)."""
    spans: list[tuple[str, float, float]] = []

    def timed(kind: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spans.append((kind, start, time.perf_counter()))

        return wrapper

    compile_job = runner._compile

    def compile_timing_build(job: Any, *rest: Any) -> Any:
        return compile_job(replace(job, build=timed("build", job.build)), *rest)

    monkeypatch.setattr(runner, "_compile", compile_timing_build)
    monkeypatch.setattr(runner, "compile_program", timed("compile", runner.compile_program))
    monkeypatch.setattr(runner, "measure", timed("measure", runner.measure))
    profiles = _measured_tiny_gpt(
        workers=4,
        only=lambda kind, label, config: (
            kind == "segment" and "K@x" not in config and config.count("N@x") <= 1
        ),
        time_limit_factor=1e9,  # every program timed to the end
    )
    measured = [s for s in spans if s[0] == "measure"]
    prepared = [s for s in spans if s[0] != "measure"]
    kinds = collections.Counter(kind for kind, _, _ in spans)
    assert kinds["measure"] >= 6 and kinds["build"] == kinds["compile"] >= kinds["measure"]
    assert all(p.ok for p in profiles.segments)
    overlaps = [(p, m) for p in prepared for m in measured if p[1] < m[2] and m[1] < p[2]]
    assert not overlaps, f"{len(overlaps)} builds or compiles ran while a program was timed"


# -- cache: a killed run resumes ----------------------------------------------------------------

_PROFILER = r"""
import os, sys
sys.path.insert(0, {root!r})
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import explorer as ex
step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=1), abstract=True)
ex.analyze(
    step, *args, mesh=(4,), platform="a100-pcie-8", cache={cache!r}, progress=False,
    config_cap={cap},
)
"""
# the layer cut at 27 configurations: 51 programs to profile instead of 90 (what is resumed
# does not depend on how the step is cut, so long as both runs cut it alike)
_CAP = 27


def _rows(path: Path) -> int:
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(path, timeout=30) as db:
            return int(db.execute("select count(*) from profiles").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


@pytest.mark.slow
def test_a_killed_run_resumes_without_reprofiling(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    child = subprocess.Popen(
        [sys.executable, "-c", _PROFILER.format(root=str(ROOT), cache=str(path), cap=_CAP)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 300
    try:
        while _rows(path) < 12 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
    finally:
        child.kill()
        child.wait(timeout=30)
    before = _rows(path)
    assert before >= 12, "the child committed programs one at a time before it was killed"
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=1), abstract=True)

    def resume() -> ex.Analysis:
        return ex.analyze(
            step, *args, mesh=(4,), platform="a100-pcie-8", cache=path, progress=False,
            config_cap=_CAP,
        )  # fmt: skip

    analysis = resume()
    table = analysis.profiles
    assert table.loc[table["cached"], "program"].nunique() == before
    assert table.loc[~table["cached"] & (table["program"] != ""), "program"].nunique() == (
        distinct_programs(table) - before
    )
    with ProfileCache(path) as store:
        assert len(store) == distinct_programs(table)
    rerun = resume()
    compiled_rows = rerun.profiles[rerun.profiles["program"] != ""]
    assert compiled_rows["cached"].all()


# -- measured backend across processes ----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_measured_profiling_across_two_processes_over_loopback(tmp_path: Path) -> None:
    out = tmp_path / "measured.json"
    port = str(_free_port())
    script = ROOT / "tests" / "scripts" / "measured_worker.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), port, str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:
        logs = [w.communicate(timeout=300)[0] for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    assert all(w.returncode == 0 for w in workers), "\n".join(logs)[-3000:]
    result = json.loads(out.read_text())
    assert result["processes"] == 2 and result["devices"] == 4
    rows = {r["config"]: r for r in result["rows"]}
    assert set(rows) == {"M@x,M@x,M@x,M@x", "N@x,K@x,N@x,K@x"}
    for row in rows.values():
        assert row["status"] == "ok", row["reason"]
        assert row["t_comm"] + row["t_comp"] > 0
