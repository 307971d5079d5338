"""Composition check against real H200 measurements (``../shared/data/h200``).

What the physics gives, and a correct implementation must reproduce:
* ``seq_gemm8192_copy`` agrees in energy (+1.3 %, z ≈ 0.3) but runs ~5 % faster than predicted;
* the other three composites are flagged on both T and E (energy +4 % to +17 %): two same-device
  parallel runs interfere (the GEMM holds the card at its 700 W limit, so clocks drop), and even
  the GEMM→axpy sequence shows a context effect.
"""

from __future__ import annotations

import math

import pytest

from frontier import Signature, seq
from frontier.deviation import deviation
from frontier.h200 import (
    element_signatures,
    load_measurements,
    measured_signature,
    predict_composition,
    static_power_w,
)
from measure.replay import H200_MEASUREMENTS, shared_data_dir

PATH = shared_data_dir() / H200_MEASUREMENTS
pytestmark = pytest.mark.skipif(
    not PATH.exists(),
    reason=f"real H200 data not found at {PATH} (shared data folder ../shared/data is absent; "
           "set ECAL_SHARED_DATA to point at it)")


@pytest.fixture(scope="module")
def data():
    return load_measurements(PATH)


@pytest.fixture(scope="module")
def results(data):
    s = static_power_w(data)
    sigs = element_signatures(data)
    out = {}
    for comp in data["compositions"]:
        pred = predict_composition(data, comp, sigs)
        meas = measured_signature(comp, s)
        out[comp["name"]] = (pred, meas, deviation(pred, meas))
    return out


def test_static_power_is_ready_power_not_deep_idle(data):
    s = static_power_w(data)
    assert 122.0 < s < 125.0
    assert s > data["static_power_W"]["deep_idle_345MHz_no_context"] + 40


def test_element_signatures_from_windows(data):
    sigs = element_signatures(data)
    assert len(sigs) == 16
    g = sigs["gemm_bf16_8192"]
    el = next(e for e in data["elements"] if e["name"] == "gemm_bf16_8192")
    assert g.time_s == pytest.approx(el["T_s"], rel=1e-9)
    assert g.energy_j == pytest.approx(el["E_J"], rel=1e-9)
    # Variance of the mean over the 5 windows.
    assert g.sd_energy_j == pytest.approx(el["E_sd_J"] / math.sqrt(len(el["windows"])), rel=1e-6)
    assert sigs["axpy_triton_sm4"].omega.sm_count == 4 and g.omega.sm_count is None
    assert all(s.d_j > 0 for s in sigs.values())


def test_seq_gemm_copy_agrees_in_energy_but_runs_faster(results):
    pred, meas, r = results["seq_gemm8192_copy"]
    assert r.error_energy_pct == pytest.approx(1.3, abs=0.3)
    assert abs(r.z_energy) < 1.0 and not r.flagged_energy
    assert r.error_time_pct == pytest.approx(-5.1, abs=0.5)
    assert r.flagged_time and r.z_time < -10


@pytest.mark.parametrize("name, lo, hi", [
    ("par_gemm8192_copy", 9.0, 13.0),
    ("par_gemm8192_axpy_sm4", 15.0, 19.0),
    ("seq_gemm8192_axpy_sm4", 3.5, 5.0),
])
def test_other_composites_flagged_on_both(results, name, lo, hi):
    _, _, r = results[name]
    assert r.flagged_time and r.flagged_energy, r.summary()
    assert lo < r.error_energy_pct < hi and r.z_energy > 1.96


def test_parallel_runs_take_far_longer_than_the_max_rule(results):
    # Interference: the co-run makespan is ~1.7-1.9x the longer branch alone.
    for name in ("par_gemm8192_copy", "par_gemm8192_axpy_sm4"):
        pred, meas, r = results[name]
        assert 1.6 < meas.time_s / pred.time_s < 2.0


def test_bias_aware_check_still_flags_the_gemm_axpy_overlap(results):
    pred, meas, _ = results["par_gemm8192_axpy_sm4"]
    assert deviation(pred, meas, bias_aware=True).flagged_energy


def test_independent_repeats_would_shrink_sigma_sqrt_k(data, results):
    """245 uses of one measured GEMM share its estimation error: σ grows as 245, not √245.
    Treating them as independent makes σ ≈ 15.7x too small and would flag a correct prediction."""
    sigs = element_signatures(data)
    g, c = sigs["gemm_bf16_8192"], sigs["copy_2GiB"]
    k = 245
    shared = seq([g] * k + [c] * k)
    indep = seq([g.with_(name=f"g{i}") for i in range(k)] + [c.with_(name=f"c{i}") for i in range(k)])
    assert shared.energy_j == pytest.approx(indep.energy_j)
    ratio = shared.sd_energy_j / indep.sd_energy_j
    assert ratio == pytest.approx(math.sqrt(k), rel=1e-6)
    assert 15.0 < ratio < 16.0
    pred, meas, r = results["seq_gemm8192_copy"]
    assert pred.sd_energy_j == pytest.approx(shared.sd_energy_j)
    # With the (wrong) independent σ the energy check would be much tighter.
    wrong = deviation(Signature.from_point("indep", indep.time_s, indep.energy_j, s_w=indep.s_w,
                                           sd_time_s=indep.sd_time_s, sd_energy_j=indep.sd_energy_j), meas)
    assert abs(wrong.z_energy) > abs(r.z_energy)


def test_bundled_workbook_matches_direct_computation(results):
    from pathlib import Path

    from frontier.workbook import load_workbook

    wb = load_workbook(Path(__file__).resolve().parents[1] / "ecal" / "examples" / "h200_compositions.json")
    for e in wb.entries:
        pred, meas, r = results[e.name]
        assert e.predicted.time_s == pytest.approx(pred.time_s, rel=1e-9)
        assert e.predicted.energy_j == pytest.approx(pred.energy_j, rel=1e-9)
        assert e.predicted.sd_energy_j == pytest.approx(pred.sd_energy_j, rel=1e-9)
        assert e.measured.energy_j == pytest.approx(meas.energy_j, rel=1e-9)
        assert e.deviation().flagged_energy == r.flagged_energy
