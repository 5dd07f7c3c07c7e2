"""Platform model: presets, validation errors, ring and hierarchical formulas, calibration."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from explorer.mesh import mesh_spec
from explorer.platforms import (
    KINDS,
    DeviceModel,
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
            r"'intra\.per_kind\.all-gather\.bandwidth_Bps': expected a number > 0",
        ),
        (
            lambda d: d["intra"]["per_kind"]["all-gather"].update(bandwidth_Bps=0),
            r"'intra\.per_kind\.all-gather\.bandwidth_Bps': expected a number > 0",
        ),
        (
            lambda d: d["intra"]["per_kind"]["all-reduce"].update(latency_s=-1e-6),
            r"'intra\.per_kind\.all-reduce\.latency_s': expected a number >= 0",
        ),
        (
            lambda d: d["intra"]["per_kind"].update(allreduce=d["intra"]["per_kind"]["all-reduce"]),
            r"unknown collective kind 'intra\.per_kind\.allreduce'",
        ),
        (
            lambda d: d.update(devices=6),
            r"'devices': expected a multiple of 'devices_per_node' \(4\), found 6",
        ),
        (lambda d: d.update(devices="4"), r"'devices': expected a positive integer"),
        (
            lambda d: d["device"]["peak_flops_by_dtype"].update(bf16="fast"),
            r"'device\.peak_flops_by_dtype\.bf16': expected a number \(FLOP/s\)",
        ),
        (
            lambda d: d["device"]["peak_flops_by_dtype"].update(s8=-1),
            r"'device\.peak_flops_by_dtype\.s8': expected a number > 0 \(OP/s\)",
        ),
        (
            lambda d: d["device"]["peak_flops_by_dtype"].update(fp16=1e12),
            r"unknown dtype 'device\.peak_flops_by_dtype\.fp16': .* did you mean 'f16'\?",
        ),
        (
            lambda d: d["device"]["peak_flops_by_dtype"].pop("f32"),
            r"missing field 'device\.peak_flops_by_dtype\.f32'",
        ),
        (
            lambda d: d["device"].update(peak_flops_by_dtype=[312e12]),
            r"'device\.peak_flops_by_dtype': expected a non-empty object of dtype",
        ),
        (
            lambda d: d["device"].pop("peak_flops_by_dtype"),
            r"missing field 'device\.peak_flops_by_dtype'",
        ),
        (
            lambda d: d["device"].update(peak_flops=312e12),
            r"'device\.peak_flops_by_dtype' and the older \['peak_flops'\] both give peaks",
        ),
        (lambda d: d.update(sources=[]), r"'sources': expected a non-empty list"),
        (
            lambda d: d.update(devices=8),
            r"'inter': expected the network between the 2 nodes.*found null",
        ),
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
    with pytest.raises(
        PlatformError, match=r"broken\.json: expected JSON, found a syntax error at line 1"
    ):
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
    work = ({"bf16": 1e12}, 1e9, 1e9)
    assert fast.compute_time(*work) == platform.compute_time(*work)
    with pytest.raises(PlatformError):
        platform.scaled(0)


def test_presets_give_datasheet_peaks_per_dtype() -> None:
    a100, h100 = load_platform("a100-pcie-4").device, load_platform("h100-sxm-8").device
    assert (a100.peak("f32"), a100.peak("tf32"), a100.peak("bf16")) == (19.5e12, 156e12, 312e12)
    assert a100.peak("f16") == 312e12 and a100.peak("f8e4m3fn") is None
    assert (h100.peak("f32"), h100.peak("bf16"), h100.peak("f8e4m3fn")) == (67e12, 989e12, 1979e12)
    v100 = load_platform("v100-nvlink-4").device
    assert (v100.peak("f32"), v100.peak("f16"), v100.peak("bf16")) == (15.7e12, 125e12, None)
    cpu = load_platform("cpu-local").device
    assert {cpu.peak(d) for d in ("f32", "tf32", "bf16", "f16", "f8e4m3fn", "f8e5m2")} == {11e9}


def test_compute_time_is_an_additive_roofline_per_dtype() -> None:
    platform = load_platform("a100-pcie-4")
    expected = 4e12 / 312e12 + 2e12 / 19.5e12 + 3e12 / 156e12 + 1e9 / 19.5e12 + 5e9 / 1555e9
    dots = {"bf16": 4e12, "f32": 2e12, "tf32": 3e12}
    assert platform.compute_time(dots, 1e9, 5e9) == pytest.approx(expected)
    # pairs (what dot_flops returns) and a mapping are the same
    assert platform.compute_time(tuple(sorted(dots.items())), 1e9, 5e9) == pytest.approx(expected)
    assert platform.compute_time((), 0, 0) == 0.0
    assert platform.compute_time({"s8": 624e12}, 0, 0) == pytest.approx(1.0)


@given(
    st.dictionaries(
        st.sampled_from(("f32", "tf32", "bf16", "f16", "s8")),
        st.floats(0, 1e15),
        max_size=5,
    ),
    st.floats(0, 1e12),
    st.floats(0, 1e12),
    st.floats(0, 1),
)
def test_compute_time_of_pieces_adds_up(
    dots: dict[str, float], other: float, accessed: float, share: float
) -> None:
    platform = load_platform("a100-pcie-8")
    first = {d: f * share for d, f in dots.items()}
    second = {d: f - first[d] for d, f in dots.items()}
    whole = platform.compute_time(dots, other, accessed)
    pieces = platform.compute_time(first, other * share, accessed * share) + (
        platform.compute_time(second, other * (1 - share), accessed * (1 - share))
    )
    assert pieces == pytest.approx(whole, rel=1e-9, abs=1e-15)


def test_missing_dtype_names_file_field_and_fix() -> None:
    v100 = load_platform("v100-nvlink-4")
    with pytest.raises(PlatformError) as err:
        v100.compute_time({"bf16": 1e12}, 0, 0)
    message = str(err.value)
    assert "v100-nvlink-4.json" in message and "'device.peak_flops_by_dtype'" in message
    assert "bf16" in message and "add the device's dense bf16 FLOP/s" in message
    with pytest.raises(PlatformError, match=r"no 's8' entry.*dense s8 OP/s"):
        v100.compute_time({"s8": 1.0}, 0, 0)
    # built in memory: the error names the platform instead of a file
    in_memory = platform_from_json(_doc("v100-nvlink-4"))
    assert in_memory.path is None and in_memory == v100
    with pytest.raises(PlatformError, match=r"^platform 'v100-nvlink-4': .*'bf16'"):
        in_memory.peak_flops("bf16")
    # a scaled copy still points at the file its peaks came from
    with pytest.raises(PlatformError, match=r"v100-nvlink-4\.json"):
        v100.scaled(2).compute_time({"f8e4m3fn": 1.0}, 0, 0)


def test_compute_time_rejects_negative_work() -> None:
    platform = load_platform("h100-sxm-8")
    with pytest.raises(PlatformError, match=r"expected bf16 dot FLOPs >= 0, found -1"):
        platform.compute_time({"bf16": -1.0}, 0, 0)
    with pytest.raises(PlatformError, match=r"expected bytes_accessed >= 0, found nan"):
        platform.compute_time({}, 0, float("nan"))


def test_older_files_with_two_peaks_still_load(tmp_path: Path) -> None:
    doc = _doc()
    doc["device"].pop("peak_flops_by_dtype")
    doc["device"].update(peak_flops=312e12, peak_flops_fp32=19.5e12)
    platform = load_platform(_write(tmp_path, doc))
    assert platform.device.peak_flops_by_dtype == (
        ("bf16", 312e12),
        ("f16", 312e12),
        ("f32", 19.5e12),
    )
    assert "peak_flops_by_dtype" in platform.to_json()["device"]
    assert "peak_flops" not in platform.to_json()["device"]
    del doc["device"]["peak_flops_fp32"]
    with pytest.raises(PlatformError, match=r"missing field 'device\.peak_flops_fp32'"):
        load_platform(_write(tmp_path, doc))


def test_device_model_checks_its_table() -> None:
    with pytest.raises(PlatformError, match=r"unknown dtype 'bfloat16'.*did you mean 'bf16'"):
        DeviceModel.of("gpu", {"f32": 1e12, "bfloat16": 1e12}, 1e9, 1)
    with pytest.raises(PlatformError, match="must give 'f32'"):
        DeviceModel.of("gpu", {"bf16": 1e12}, 1e9, 1)
    with pytest.raises(PlatformError, match=r"expected the bf16 peak > 0"):
        DeviceModel.of("gpu", {"f32": 1e12, "bf16": 0.0}, 1e9, 1)
    with pytest.raises(PlatformError, match="one peak per dtype"):
        DeviceModel("gpu", (("f32", 1e12), ("f32", 2e12)), 1e9, 1)
    device = DeviceModel.of("gpu", {"f32": 1e12, "bf16": 8e12}, 1e9, 1)
    assert device.peak_flops_by_dtype == (("bf16", 8e12), ("f32", 1e12))


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
    assert [d for d, _ in platform.device.peak_flops_by_dtype] == ["bf16", "f32", "tf32"]
    assert platform.device.memory_bandwidth_Bps > 0
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
