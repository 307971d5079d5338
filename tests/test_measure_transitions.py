"""Transition elements measured with a settle-time probe."""

from __future__ import annotations

import pytest

from frontier.operating_point import OperatingPoint
from measure import NVMLDevice, SimulatedGPU, UnsupportedSettingError
from measure.transitions import measure_transitions, settle_time_s
from tests.fake_pynvml import FakeGPU, make_fake_pynvml


def test_sim_switch_latency_grows_with_the_step_and_costs_ready_energy():
    gpu = SimulatedGPU()
    a, b, c = OperatingPoint(sm_clock_mhz=1980), OperatingPoint(sm_clock_mhz=1800), OperatingPoint(sm_clock_mhz=900)
    table = measure_transitions(gpu, [a, b, c], repeats=2)
    t_small, e_small = table.cost(a, b)
    t_big, _ = table.cost(a, c)
    assert 0 < t_small < t_big < 0.05
    assert e_small == pytest.approx(gpu.static_power_w(b, 40) * t_small, rel=0.1)
    assert table.cost(a, a) == (0.0, 0.0)
    assert gpu.get_operating_point() == gpu.operating_set().default
    el = table.element(a, c, "gpu0", s_w=100.0)
    assert el.time_s == t_big and "measured settle time" in el.meta["table_source"]


def test_memory_clock_switch_is_slower_and_bad_points_rejected():
    gpu = SimulatedGPU()
    t_mem = settle_time_s(gpu, OperatingPoint(), OperatingPoint(mem_clock_mhz=2201))
    t_pl = settle_time_s(gpu, OperatingPoint(), OperatingPoint(power_limit_w=500))
    assert t_mem > t_pl > 0
    with pytest.raises(UnsupportedSettingError):
        measure_transitions(gpu, [OperatingPoint(sm_clock_mhz=1234)])


def test_probe_on_fake_nvml_restores():
    fake = make_fake_pynvml(FakeGPU())
    dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
    table = measure_transitions(dev, [OperatingPoint(sm_clock_mhz=1980), OperatingPoint(sm_clock_mhz=1410)],
                                repeats=1)
    t, e = table.cost(OperatingPoint(sm_clock_mhz=1980), OperatingPoint(sm_clock_mhz=1410))
    assert 0 <= t < 0.01 and e >= 0
    assert fake.gpu.locked_sm is None and fake.gpu.limit_mw == 700_000
