"""Loaders of recorded tables and the replay device."""

from __future__ import annotations

from pathlib import Path

import pytest

from measure import Protocol, characterize
from measure.device import DeviceError
from measure.replay import (
    ReplayDevice,
    data_path,
    load_h200,
    load_nvdvfs,
    load_perseus,
    load_zeus_profile,
    load_zeus_trace,
    shared_data_dir,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "ecal" / "examples"


def _need(rel: str) -> Path:
    p = shared_data_dir() / rel
    if not p.exists():
        pytest.skip(f"shared data {p} not found (set ECAL_SHARED_DATA)")
    return p


def test_h200_loader():
    _need("h200/measurements.json")
    sigs = load_h200()
    assert len(sigs) == 16
    g = sigs["gemm_bf16_8192"][0]
    assert g.time_s == pytest.approx(1.6136e-3, rel=1e-3) and 120 < g.s_w < 126
    assert "ready power" in g.meta["static_power_assumption"]
    assert sigs["axpy_triton_sm4"][0].omega.sm_count == 4


def test_zeus_trace_loader():
    p = _need("zeus/nsdi23-traces/summary_power_v100.csv")
    sigs = load_zeus_trace(p, static_power_w=20.0)
    name = next(iter(sigs))
    pts = sigs[name]
    assert len(pts) > 3 and all(s.omega.power_limit_w for s in pts)
    assert pts[0].s_w == 20.0 and "given" in pts[0].meta["static_power_assumption"]
    s0 = load_zeus_trace(p)[name][0]
    assert s0.s_w == 0 and s0.d_j == pytest.approx(s0.energy_j)


def test_zeus_profile_loader_multi_gpu():
    p = _need("zeus/profile_data/V100+resnet18+gpu0,1.csv")
    sigs = load_zeus_profile(p, static_power_w=30.0)
    pts = sigs["V100+resnet18+gpu0,1"]
    assert pts[0].devices == frozenset({"gpu0", "gpu1"}) and pts[0].s_w == 60.0
    assert {s.omega.power_limit_w for s in pts} >= {250.0, 225.0}


def test_nvdvfs_loader_reads_in_place():
    p = _need("nv-dvfs/v100-dvfs-real.csv")
    sigs = load_nvdvfs(p)
    bs = sigs["BlackScholes/BlackScholesGPU/input000"]
    assert len(bs) == 10 and bs[0].omega.mem_clock_mhz == 877.0
    assert min(s.omega.sm_clock_mhz for s in bs) >= 405
    t = {s.omega.sm_clock_mhz: s.time_s for s in bs}
    assert t[min(t)] > t[max(t)]          # slower at lower clock
    assert bs[0].meta["source_file"].startswith(str(shared_data_dir()))


def test_perseus_loader():
    p = EXAMPLES / "pipeline_4x8.csv"
    if not p.exists():
        pytest.skip("example Perseus profile not present")
    sigs = load_perseus(p)
    fwd = sigs["stage0/forward"]
    assert fwd[0].devices == frozenset({"gpu0"}) and fwd[0].s_w == 75.0
    assert len({s.omega.sm_clock_mhz for s in fwd}) == len(fwd)


def test_missing_file_is_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("ECAL_SHARED_DATA", str(tmp_path))
    with pytest.raises(DeviceError, match="ECAL_SHARED_DATA"):
        data_path("zeus/nsdi23-traces/summary_power_a40.csv")
    with pytest.raises(DeviceError, match="not found"):
        load_h200()


def test_bad_csv_names_row_and_column(tmp_path):
    from frontier.errors import FormatError

    f = tmp_path / "p.csv"
    f.write_text("stage,instruction,frequency,time,energy\n0,forward,1980,abc,1.0\n")
    with pytest.raises(FormatError, match=r"line 2, column time"):
        load_perseus(f)
    f.write_text("stage,instruction\n0,forward\n")
    with pytest.raises(FormatError, match="missing column"):
        load_perseus(f)


def test_replay_device_characterizes_back_to_recorded_values():
    p = _need("nv-dvfs/v100-dvfs-real.csv")
    sigs = load_nvdvfs(p)
    name = "BlackScholes/BlackScholesGPU/input000"
    dev = ReplayDevice({name: sigs[name]}, name="v100")
    clocks = sorted({s.omega.sm_clock_mhz for s in sigs[name]}, reverse=True)[:3]
    res = characterize(name, device=dev, grid={"sm_clock_mhz": clocks}, progress=None,
                       protocol=Protocol(window_s=0.5, min_windows=2, max_windows=3, warmup_s=0.0,
                                         ready_windows=1))
    rec = {s.omega.sm_clock_mhz: s for s in sigs[name]}
    for s in res.signatures:
        r = rec[s.omega.sm_clock_mhz]
        assert s.time_s == pytest.approx(r.time_s, rel=1e-6)
        assert s.energy_j == pytest.approx(r.energy_j, rel=0.02)
    assert res.meta["simulated"] is True and res.meta.get("replay") is True
