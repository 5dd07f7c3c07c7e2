"""Platform model: presets, validation errors, ring and hierarchical formulas, calibration."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from explorer.mesh import mesh_spec
from explorer.platforms import (
    KINDS,
    LinkLevel,
    LinkModel,
    Platform,
    PlatformError,
    calibrate,
    calibrate_main,
    list_platforms,
    load_platform,
    platform_from_json,
    ring_factor,
    save_platform,
)
from explorer.profile.hlo import Collective, CollectiveKind

PRESETS = ("a100-pcie-4", "a100-pcie-8", "v100-nvlink-4", "h100-sxm-8", "a100-ib-2x8", "cpu-local")
MiB = 2**20


def _doc(name: str = "a100-pcie-4") -> dict[str, Any]:
    return copy.deepcopy(load_platform(name).to_json())


def _write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "platform.json"
    path.write_text(json.dumps(doc))
    return path


def test_presets_load_validate_and_cite_sources() -> None:
    assert set(PRESETS) <= set(list_platforms())
    for name in list_platforms():
        platform = load_platform(name)
        assert platform.name == name
        assert platform.sources and all(s.strip() for s in platform.sources)
        assert platform.devices % platform.devices_per_node == 0
        for level in (platform.intra, platform.inter):
            if level is not None:
                assert [k for k, _ in level.per_kind] == list(KINDS)
        # the document written back reads as the same platform
        assert platform_from_json(platform.to_json()) == platform


def test_load_by_path_and_save_round_trip(tmp_path: Path) -> None:
    platform = load_platform("a100-ib-2x8")
    path = save_platform(platform, tmp_path / "sub" / "copy.json")
    assert load_platform(path) == platform
    assert load_platform(str(path)) == platform


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(PlatformError, match="a100-pcie-4"):
        load_platform("tpu-v9000")


def test_missing_field_names_its_path(tmp_path: Path) -> None:
    doc = _doc()
    del doc["intra"]["per_kind"]["all-reduce"]["bandwidth_Bps"]
    path = _write(tmp_path, doc)
    with pytest.raises(PlatformError) as err:
        load_platform(path)
    assert "missing field 'intra.per_kind.all-reduce.bandwidth_Bps'" in str(err.value)
    assert str(path) in str(err.value)


def test_missing_collective_kind_is_rejected(tmp_path: Path) -> None:
    doc = _doc()
    del doc["intra"]["per_kind"]["all-to-all"]
    with pytest.raises(PlatformError, match=r"missing field 'intra\.per_kind\.all-to-all'"):
        load_platform(_write(tmp_path, doc))


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (
            lambda d: d["intra"]["per_kind"]["all-gather"].update(bandwidth_Bps=-5.0),
            r"'intra\.per_kind\.all-gather\.bandwidth_Bps' must be > 0",
        ),
        (
            lambda d: d["intra"]["per_kind"]["all-gather"].update(bandwidth_Bps=0),
            r"'intra\.per_kind\.all-gather\.bandwidth_Bps' must be > 0",
        ),
        (
            lambda d: d["intra"]["per_kind"]["all-reduce"].update(latency_s=-1e-6),
            r"'intra\.per_kind\.all-reduce\.latency_s' must be >= 0",
        ),
        (
            lambda d: d["intra"]["per_kind"].update(allreduce=d["intra"]["per_kind"]["all-reduce"]),
            r"unknown collective kind 'intra\.per_kind\.allreduce'",
        ),
        (lambda d: d.update(devices=6), r"'devices' \(6\) must be a multiple"),
        (lambda d: d.update(devices="4"), r"'devices' must be a positive integer"),
        (
            lambda d: d["device"].update(peak_flops="fast"),
            r"'device\.peak_flops' must be a number",
        ),
        (lambda d: d.update(sources=[]), r"'sources' must be a non-empty list"),
        (lambda d: d.update(devices=8), r"'inter' is null"),
        (lambda d: d.update(extra=1), r"unknown field 'extra'"),
    ],
)
def test_invalid_values_name_the_field(tmp_path: Path, edit: Any, pattern: str) -> None:
    doc = _doc()
    edit(doc)
    with pytest.raises(PlatformError, match=pattern):
        load_platform(_write(tmp_path, doc))


def test_bad_json_reports_position(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"name": ')
    with pytest.raises(PlatformError, match="not valid JSON at line 1"):
        load_platform(path)


def test_ring_formulas() -> None:
    platform = load_platform("a100-pcie-8")
    nbytes = 64 * MiB
    group = [0, 1, 2, 3]
    ar = platform.intra[CollectiveKind.ALL_REDUCE]
    assert platform.collective_time("all-reduce", nbytes, group) == pytest.approx(
        ar.latency_s + 1.5 * nbytes / ar.bandwidth_Bps
    )
    ag = platform.intra["all-gather"]
    assert platform.collective_time("all-gather", nbytes, group) == pytest.approx(
        ag.latency_s + 0.75 * nbytes / ag.bandwidth_Bps
    )
    cp = platform.intra["collective-permute"]
    assert platform.collective_time("collective-permute", nbytes, [0, 1]) == pytest.approx(
        cp.latency_s + nbytes / cp.bandwidth_Bps
    )
    assert platform.collective_time("all-reduce", nbytes, [3]) == 0.0
    assert platform.collective_time("all-reduce", nbytes, []) == 0.0
    assert ring_factor(CollectiveKind.ALL_TO_ALL, 8) == pytest.approx(7 / 8)


def test_crossing_nodes_costs_more_and_is_hierarchical() -> None:
    platform = load_platform("a100-ib-2x8")
    nbytes = 16 * MiB
    inside = platform.collective_time("all-reduce", nbytes, [0, 1])
    across = platform.collective_time("all-reduce", nbytes, [0, 8])
    assert across > inside
    for kind in KINDS:
        assert platform.collective_time(kind, nbytes, list(range(16))) > (
            platform.collective_time(kind, nbytes, list(range(8)))
        )
    # all 16 devices: reduce-scatter on NVLink (8), all-reduce on IB (2 nodes, bytes / 8),
    # all-gather on NVLink (8)
    intra, inter = platform.intra, platform.inter
    assert inter is not None
    rs, ag, ar = intra["reduce-scatter"], intra["all-gather"], inter["all-reduce"]
    expected = (
        rs.latency_s
        + 7 / 8 * nbytes / rs.bandwidth_Bps
        + ar.latency_s
        + 1.0 * (nbytes / 8) / ar.bandwidth_Bps
        + ag.latency_s
        + 7 / 8 * nbytes / ag.bandwidth_Bps
    )
    assert platform.collective_time("all-reduce", nbytes, list(range(16))) == pytest.approx(
        expected
    )


def test_group_outside_platform_is_an_error() -> None:
    with pytest.raises(PlatformError, match=r"devices 0\.\.3"):
        load_platform("a100-pcie-4").collective_time("all-reduce", 1024, [0, 4])


def test_scaled_bandwidth_cuts_communication_not_compute() -> None:
    platform = load_platform("a100-ib-2x8")
    fast = platform.scaled(10)
    nbytes = 8192 * MiB  # big enough that latency is under 1% of every time
    for group in ([0, 1, 2, 3], list(range(16))):
        for kind in KINDS:
            slow_t = platform.collective_time(kind, nbytes, group)
            fast_t = fast.collective_time(kind, nbytes, group)
            assert slow_t / fast_t == pytest.approx(10, rel=0.02)
    assert fast.compute_time(1e12, 1e9) == platform.compute_time(1e12, 1e9)
    with pytest.raises(PlatformError):
        platform.scaled(0)


def test_compute_time_roofline() -> None:
    platform = load_platform("h100-sxm-8")
    d = platform.device
    assert platform.compute_time(1e15, 0) == pytest.approx(1e15 / d.peak_flops)
    assert platform.compute_time(1e12, 0, dtype_is_fp32=True) == pytest.approx(
        1e12 / d.peak_flops_fp32
    )
    assert platform.compute_time(1.0, 1e12) == pytest.approx(1e12 / d.memory_bandwidth_Bps)


def test_group_devices_and_price() -> None:
    platform = load_platform("a100-ib-2x8")
    mesh = mesh_spec((2, 4))
    assert platform.group_devices(("y",), mesh) == [0, 1, 2, 3]
    assert platform.group_devices(("x",), mesh) == [0, 4]
    assert platform.group_devices(("x", "y"), mesh) == list(range(8))
    assert platform.group_devices((), mesh) == [0]
    with pytest.raises(PlatformError, match="does not have"):
        platform.group_devices(("z",), mesh)

    wide = mesh_spec((2, 8))  # x crosses the two nodes, y stays inside one
    nbytes = 8 * MiB

    def coll(kind: CollectiveKind, axes: tuple[str, ...], size: int) -> Collective:
        return Collective(kind, "c", (("f32", (nbytes // 4,)),), nbytes, size, axes, ())

    y = platform.price(coll(CollectiveKind.ALL_REDUCE, ("y",), 8), wide)
    assert y == pytest.approx(platform.collective_time("all-reduce", nbytes, range(8)))
    x = platform.price(coll(CollectiveKind.ALL_REDUCE, ("x",), 2), wide)
    assert x == pytest.approx(platform.collective_time("all-reduce", nbytes, [0, 8]))
    assert x > y
    half = platform.price(coll(CollectiveKind.ALL_GATHER, ("y",), 4), wide)
    assert half == pytest.approx(platform.collective_time("all-gather", nbytes, [0, 1, 2, 3]))
    permute = platform.price(coll(CollectiveKind.COLLECTIVE_PERMUTE, ("x",), 2), wide)
    inter = platform.inter
    assert inter is not None
    assert permute == pytest.approx(
        inter["collective-permute"].latency_s + nbytes / inter["collective-permute"].bandwidth_Bps
    )


def test_direct_construction_checks() -> None:
    with pytest.raises(PlatformError):
        LinkModel(latency_s=0.0, bandwidth_Bps=0.0)
    with pytest.raises(PlatformError, match="missing"):
        LinkLevel.of("nvlink", {"all-reduce": LinkModel(1e-6, 1e9)})
    base = load_platform("a100-pcie-4")
    with pytest.raises(PlatformError, match="multiple"):
        Platform(**{**_fields(base), "devices": 6})


def _fields(platform: Platform) -> dict[str, Any]:
    return {f: getattr(platform, f) for f in Platform.__slots__}


SMALL = (2**10, 2**12, 2**14)


def test_calibrate_on_virtual_devices(tmp_path: Path) -> None:
    platform = calibrate(sizes=SMALL, repeats=2)
    assert platform.devices == 8
    assert platform.name == "calibrated-cpu-8"
    assert platform.inter is None
    for _, model in platform.intra.per_kind:
        assert model.latency_s > 0 and model.bandwidth_Bps > 0
    assert platform.device.peak_flops > 0 and platform.device.memory_bandwidth_Bps > 0
    assert platform.sources[0].startswith("measured by explorer calibrate on ")
    assert load_platform(save_platform(platform, tmp_path / "cal.json")) == platform


def test_calibrate_two_levels_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cal.json"
    code = calibrate_main(
        ["--out", str(out), "--sizes", "1024,4096", "--repeats", "1", "--devices-per-node", "4"]
    )
    assert code == 0
    platform = load_platform(out)
    assert (platform.devices, platform.devices_per_node) == (8, 4)
    assert platform.inter is not None
    for _, model in platform.inter.per_kind:
        assert model.latency_s > 0 and model.bandwidth_Bps > 0
    assert "busbw (GB/s)" in capsys.readouterr().out


def test_calibrate_rejects_bad_requests() -> None:
    with pytest.raises(PlatformError, match="needs 16 devices"):
        calibrate(mesh=mesh_spec((16,)), sizes=SMALL)
    with pytest.raises(PlatformError, match="at least 2 devices"):
        calibrate(mesh=mesh_spec((1,)), sizes=SMALL)
    with pytest.raises(PlatformError, match="do not split"):
        calibrate(sizes=SMALL, devices_per_node=3)
