"""Applying a plan on the simulated GPU matches the prediction from characterized signatures."""

from __future__ import annotations

import math

import pytest

from frontier.compose import seq
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from measure import (
    PlanApplier,
    Protocol,
    ReadOnlyError,
    SimulatedGPU,
    UnsupportedSettingError,
    characterize,
    preset,
)
from measure.transitions import measure_transitions

PLAN = {
    "gemm_bf16_8192": OperatingPoint(sm_clock_mhz=1410, power_limit_w=700),
    "copy_2GiB": OperatingPoint(sm_clock_mhz=1980, power_limit_w=700),
    "axpy_triton_sm66": OperatingPoint(sm_clock_mhz=1200, power_limit_w=500),
}
COUNTS = {"gemm_bf16_8192": 120, "copy_2GiB": 150, "axpy_triton_sm66": 100}


def test_applied_plan_matches_composed_prediction():
    gpu = SimulatedGPU(seed=11)
    sigs = {}
    for name, op in PLAN.items():
        grid = {k: [v] for k, v in op.to_dict().items() if v is not None}
        res = characterize(preset(name), device=gpu, grid=grid, progress=None,
                           protocol=Protocol(target_rse=0.003, min_windows=8, max_windows=12))
        sigs[name] = res.signatures[0]
    # Switching ω_dev takes time on the device (the clock settles): transitions are elements,
    # priced from a settle-time probe on the same device.
    start = gpu.operating_set().default
    table = measure_transitions(gpu, [start, *PLAN.values()])
    parts, prev = [], start
    for n, op in PLAN.items():
        parts.append(table.element(prev, op, "gpu0", s_w=sigs[n].s_w))
        parts.extend([sigs[n]] * COUNTS[n])
        prev = op
    pred = seq(*parts, name="plan")
    assert 0 < table.cost(start, PLAN["gemm_bf16_8192"])[0] < 0.05

    times, energies = [], []
    # Back to back after one unrecorded run, so the die is near the steady temperature the
    # characterization windows ran at (leakage rises with temperature: a cold run reads low).
    for rep in range(6):
        with PlanApplier(gpu, PLAN) as ap:
            for name in PLAN:
                with ap.element(name):
                    gpu.run(preset(name), COUNTS[name])
        assert ap.transitions == 3
        if rep:
            times.append(ap.total_time_s)
            energies.append(ap.total_energy_j)
        assert gpu.get_operating_point() == gpu.operating_set().default   # restored on exit
    meas = Signature.from_runs("plan", times, energies, s_w=pred.s_w)
    z_e = (meas.energy_j - pred.energy_j) / math.sqrt(pred.var_energy_j2 + meas.var_energy_j2)
    z_t = (meas.time_s - pred.time_s) / math.sqrt(pred.var_time_s2 + meas.var_time_s2)
    assert abs(z_e) < 3, (meas.energy_j, pred.energy_j, z_e)
    assert abs(z_t) < 3, (meas.time_s, pred.time_s, z_t)
    assert meas.energy_j == pytest.approx(pred.energy_j, rel=0.01)


def test_applier_switches_only_on_change_and_reports_per_element():
    gpu = SimulatedGPU()
    plan = {"a": OperatingPoint(sm_clock_mhz=1500), "b": OperatingPoint(sm_clock_mhz=1500, sm_count=64),
            "c": OperatingPoint(sm_clock_mhz=1200)}
    with PlanApplier(gpu, plan, ready_power_w=100.0, per_element_energy=True) as ap:
        for name in ("a", "b", "a", "c"):
            with ap.element(name):
                gpu.run(preset("copy_2GiB"), 300)
    assert ap.transitions == 2        # a→b changes only the SM allocation; a→c changes the clock
    per = ap.per_element()
    assert per["a"]["executions"] == 2 and per["a"]["energy_j"] > 0 and per["c"]["energy_j"] > 0
    assert per["b"]["time_s"] > per["c"]["time_s"] * 0.5
    with pytest.raises(KeyError, match="not in the plan"):
        with PlanApplier(gpu, plan, ready_power_w=100.0) as ap2:
            with ap2.element("zzz"):
                pass
    assert gpu.get_operating_point() == gpu.operating_set().default


def test_bad_plans_rejected_before_any_change():
    gpu = SimulatedGPU()
    with pytest.raises(UnsupportedSettingError):
        PlanApplier(gpu, {"x": OperatingPoint(sm_clock_mhz=1234)})
    with pytest.raises(ReadOnlyError):
        PlanApplier(SimulatedGPU(read_only=True), {"x": OperatingPoint(sm_clock_mhz=1500)})
    assert gpu._set_calls == []
