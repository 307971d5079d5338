"""SM allocation as the hardware grants it (issue 30), against fake torch / CUDA-driver modules
that round requests up to multiples of 8 and overlap consecutively created contexts."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from frontier.operating_point import OperatingPoint
from measure import (
    FeatureUnavailableError,
    Grid,
    Protocol,
    SimulatedGPU,
    characterize,
    default_grid,
    preset,
    sm_alloc,
)
from measure.protocol import measure_point
from measure.sm_alloc import (
    check_green_context_support,
    granted_sm_count,
    run_on_sms,
    split_sms,
)
from tests.fake_pynvml import FakeGPU, make_fake_pynvml
from tests.fake_torch import make_fake_driver, make_fake_torch

FAST = Protocol(warmup_s=0.0, min_windows=2, max_windows=3, window_s=0.3, ready_windows=1,
                ready_window_s=0.3)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Fresh device-state folder, an empty green-context cache, and no real cuda-python."""
    monkeypatch.setenv("ECAL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(sm_alloc, "_CACHE", {})
    monkeypatch.setattr(sm_alloc, "cuda_driver", lambda: None)


# -- granted counts recorded ---------------------------------------------------------------

def test_grid_granted_maps_requests_to_grants():
    opset = SimulatedGPU().operating_set()
    g, changed = Grid.parse("sm_count=66,72,100,132").granted(opset.granted_sm_count)
    assert g.axes["sm_count"] == (72.0, 104.0, 132.0)      # 66 and 72 are one point
    assert changed == {66: 72, 100: 104}
    same, none = Grid.parse("sm_count=64,132").granted(opset.granted_sm_count)
    assert none == {} and same.axes["sm_count"] == (64.0, 132.0)


def test_default_read_only_grid_is_made_of_granted_counts():
    opset = SimulatedGPU().operating_set()
    counts = default_grid(opset, read_only=True).axes["sm_count"]
    assert len(counts) == 9 and counts[0] == 132
    assert all(opset.granted_sm_count(int(c)) == c for c in counts)
    assert all(c % 8 == 0 for c in counts[1:])


def test_characterization_asking_66_records_72_and_says_so_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="measure.sweep")
    results = tmp_path / "gemm.jsonl"
    res = characterize(preset("gemm_bf16_8192"), device=SimulatedGPU(read_only=True),
                       grid="sm_count=66,132", protocol=FAST, progress=None,
                       results_path=str(results))
    assert [s.omega.sm_count for s in res.signatures] == [72, 132]
    assert res.meta["sm_granted"] == {"66": 72} and res.meta["grid"] == {"sm_count": [72.0, 132.0]}
    notes = [r.getMessage() for r in caplog.records if "grants SMs" in r.getMessage()]
    assert len(notes) == 1 and "66 as 72" in notes[0]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    header = records[0]
    assert header["grid"] == {"sm_count": [72.0, 132.0]} and header["sm_granted"] == {"66": 72}
    assert '"sm_count": 66' not in results.read_text()


def test_measure_point_records_the_granted_count():
    dev = SimulatedGPU(read_only=True)
    sig = measure_point(dev, preset("gemm_bf16_8192"), "g", FAST, sm_count=66,
                        omega=OperatingPoint(sm_count=66))
    assert sig.omega.sm_count == 72 and sig.meta["sm_requested"] == 66
    whole = measure_point(dev, preset("gemm_bf16_8192"), "g", FAST)
    assert whole.omega.sm_count is None and "sm_requested" not in whole.meta


def test_nvml_sweep_reads_the_grant_back_and_runs_on_a_context_stream(monkeypatch):
    torch = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    from measure.nvml import NVMLDevice

    fake = make_fake_pynvml(FakeGPU())
    dev = NVMLDevice(nvml=fake, read_only=True, clock=fake.time, sleep=fake.sleep,
                     synchronize=lambda: None, cuda_index=0)
    assert granted_sm_count(dev, 66) == 72 and granted_sm_count(dev, 200) == 132
    res = characterize(lambda: fake.busy(0.002, 400.0), device=dev, grid="sm_count=66",
                       protocol=FAST, progress=None, name="busy")
    assert [s.omega.sm_count for s in res.signatures] == [72]
    names = [c[0] for c in torch.calls]
    assert ("create", 66, 0, 72) in torch.calls                 # asked 66, read back 72
    assert "Stream" in names and "enter_stream" in names and "set_context" not in names
    dev.close()


# -- the stream path and its fallback ---------------------------------------------------------

def test_work_runs_on_a_stream_of_the_context_ordered_both_ways():
    torch = make_fake_torch()
    seen = []
    granted = run_on_sms(lambda: seen.append(torch.cuda.current_stream().sm_ids), 2, 66, torch=torch)
    assert granted == 72 and seen and all(ids == frozenset(range(72)) for ids in seen)
    waits = [c for c in torch.calls if c[0] == "wait_stream"]
    assert len(waits) == 2 and waits[0][1] == waits[1][2]       # ours waits, then the parent waits on ours
    assert torch.state["current"] is None                        # back on the default stream


def test_set_pop_fallback_when_the_context_has_no_stream():
    torch = make_fake_torch(stream_api=False)
    with pytest.raises(RuntimeError):
        with sm_alloc.allocate_sms(16, torch=torch):
            raise RuntimeError("work failed")
    assert [c[0] for c in torch.calls][-2:] == ["set_context", "pop_context"]


# -- disjoint partitions ------------------------------------------------------------------

def test_driver_split_gives_disjoint_partitions_with_granted_counts():
    drv = make_fake_driver()
    torch = make_fake_torch()
    split = split_sms([66, 50], torch=torch, driver=drv, sm_total=132)
    assert split.disjoint and not split.overlapping and split.method == "driver_split"
    assert split.granted == (72, 56)
    a, b = (p.context.sm_ids for p in split.partitions)
    assert len(a) == 72 and len(b) == 56 and not a & b
    assert all(getattr(p.stream, "external", False) for p in split.partitions)   # torch streams
    assert split.to_dict()["partitions"] == [{"requested": 66, "granted": 72},
                                             {"requested": 50, "granted": 56}]


def test_driver_split_without_torch_returns_driver_streams(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    split = split_sms([8, 8, 8], driver=make_fake_driver())
    ids = [p.stream.sm_ids for p in split.partitions]
    assert split.granted == (8, 8, 8) and len(frozenset().union(*ids)) == 24


def test_a_split_over_the_device_is_refused_before_anything_is_created():
    drv = make_fake_driver()
    with pytest.raises(FeatureUnavailableError, match="72\\+72 = 144 SMs, more than the device's 132"):
        split_sms([66, 66], driver=drv, sm_total=132)
    assert drv.calls == []
    with pytest.raises(FeatureUnavailableError, match="CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"):
        split_sms([66, 66], driver=drv)       # the driver refuses it too


def test_torch_contexts_alone_are_labelled_overlapping(caplog):
    torch = make_fake_torch()
    caplog.set_level(logging.WARNING, logger="measure.sm_alloc")
    split = split_sms([66, 50], torch=torch)
    assert not split.disjoint and split.overlapping and split.method == "torch_contexts"
    assert split.granted == (72, 56)
    a, b = (p.context.sm_ids for p in split.partitions)
    assert a & b                                   # the fake overlaps them, as the hardware does
    assert split.to_dict()["overlapping"] is True and "may share SMs" in split.note
    assert any("may share SMs" in r.getMessage() for r in caplog.records)


def test_torch_split_api_is_disjoint():
    torch = make_fake_torch(split_api=True)
    split = split_sms([66, 50], torch=torch)
    assert split.disjoint and split.method == "torch_split" and split.granted == (72, 56)
    a, b = (p.context.sm_ids for p in split.partitions)
    assert not a & b
    assert ("split", (72, 56)) in torch.calls       # asked in granted counts (torch does not round)


# -- the torch / CUDA gate --------------------------------------------------------------------

@pytest.mark.parametrize("version, cuda, match", [
    ("2.5.1+cu124", "12.4", "torch 2.5.1\\+cu124 is too old.*torch >= 2.9 built with CUDA >= 12.8"),
    ("2.9.0+cu124", "12.4", "built with CUDA 12.4: green contexts need torch >= 2.9 built with CUDA >= 12.8"),
    ("2.9.0+cpu", None, "built without CUDA"),
])
def test_gate_messages(version, cuda, match):
    torch = make_fake_torch(version=version, cuda=cuda)
    with pytest.raises(FeatureUnavailableError, match=match):
        check_green_context_support(torch)
    assert not sm_alloc.available(torch)
    with pytest.raises(FeatureUnavailableError, match=match):
        split_sms([16, 16], torch=torch)


def test_gate_passes_new_torch_and_names_a_missing_module():
    check_green_context_support(make_fake_torch(version="2.10.0+cu130", cuda="13.0"))
    with pytest.raises(FeatureUnavailableError, match="has no torch.cuda.green_contexts.*2.9.*12.8"):
        sm_alloc.green_context_class(make_fake_torch(green_contexts=False))


def test_gate_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(FeatureUnavailableError, match="torch is not installed"):
        split_sms([16, 16])
    dev = SimulatedGPU()
    assert granted_sm_count(dev, 66) == 72           # computed from the granularity
