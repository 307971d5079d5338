"""The measurement protocol: tick alignment, repetitions to a target, metadata."""

from __future__ import annotations

import numpy as np
import pytest

from measure import NAIVE_5S, Protocol, SimulatedGPU, measure_point, preset
from measure.protocol import measure_window, relative_se, wait_for_tick


def _spread(window: str, seed: int, n_windows: int = 8) -> float:
    gpu = SimulatedGPU(seed=seed)
    k = preset("gemm_bf16_8192")
    gpu.run(k, 200)
    n = int(0.6 / gpu.kernel_state(k).time_s)
    p = Protocol(window=window)
    es = [measure_window(gpu, k, n, p, ready_w=gpu.static_power_w()).energy_j for _ in range(n_windows)]
    return float(np.std(es, ddof=1) / np.mean(es))


def test_tick_aligned_windows_are_much_tighter_than_naive():
    aligned = np.mean([_spread("tick_aligned", s) for s in range(3)])
    naive = np.mean([_spread("naive", s) for s in range(3)])
    assert aligned < 0.012                 # H200: 0.5-1 % at 0.6 s
    assert naive > 0.025                   # H200: 5-7 % at 0.6 s
    assert naive > 4 * aligned


def test_window_starts_on_a_tick():
    gpu = SimulatedGPU(seed=2)
    t, e = wait_for_tick(gpu)
    # the next read (4 ms later) still shows the same value: we are right after a change
    assert gpu.energy_j() == e
    assert gpu.time_s() - t < 0.01


def test_tail_is_subtracted_at_ready_power():
    gpu = SimulatedGPU(seed=4)
    k = preset("copy_2GiB")
    e_true0 = gpu.true_energy_j()
    w = measure_window(gpu, k, 500, Protocol(), ready_w=gpu.static_power_w())
    assert w.tail_s > 0
    work_energy = gpu.kernel_state(k).power_w * gpu.kernel_state(k).time_s * 500
    assert w.energy_j == pytest.approx(work_energy, rel=0.02)
    assert gpu.true_energy_j() - e_true0 > w.energy_j   # the idle tail/head were not counted


def test_repeats_until_target_rse_or_cap():
    gpu = SimulatedGPU(seed=5)
    k = preset("gemm_bf16_8192")
    tight = measure_point(gpu, k, "g", Protocol(target_rse=0.002, min_windows=2, max_windows=30))
    assert tight.meta["rse_energy"] <= 0.002 or tight.meta["windows"] == 30
    capped = measure_point(gpu, k, "g", Protocol(target_rse=1e-9, max_windows=4))
    assert capped.meta["windows"] == 4
    loose = measure_point(gpu, k, "g", Protocol(target_rse=0.5, min_windows=3))
    assert loose.meta["windows"] == 3


def test_point_metadata_and_variance_of_mean():
    gpu = SimulatedGPU(seed=6)
    sig = measure_point(gpu, preset("gemm_bf16_8192"), "gemm", Protocol(cooldown_s=1.0))
    m = sig.meta
    for key in ("protocol", "invocations_per_window", "windows", "sm_clocks_seen_mhz", "temperatures_c",
                "throttle_reasons", "ready_power_w", "cooldowns_s", "device_time_s"):
        assert key in m, key
    assert m["protocol"] == "tick_aligned" and "SwPowerCap" in m["throttle_reasons"]
    assert all(c < 1980 for c in m["sm_clocks_seen_mhz"])
    assert m["cooldowns_s"][0] == 1.0
    # variance is of the mean: run spread² / n
    assert sig.var_energy_j2 == pytest.approx(m["run_sd_energy_j"] ** 2 / sig.n)
    assert 0.5 < m["invocations_per_window"] * sig.time_s / 0.6 < 1.5


def test_baseline_temperature_null_context():
    gpu = SimulatedGPU(seed=7)
    gpu.run(preset("gemm_bf16_8192"), 5000)
    hot = gpu.temperature_c()
    sig = measure_point(gpu, preset("copy_2GiB"), "copy", Protocol(baseline_temp_c=40.0, max_windows=3))
    assert hot > 50
    starts = [t0 for t0, _ in sig.meta["temperatures_c"]]
    assert all(s <= 42 for s in starts)


def test_relative_se_and_protocol_validation():
    assert relative_se([1.0]) == float("inf")
    assert relative_se([1.0, 1.0, 1.0]) == 0.0
    with pytest.raises(ValueError, match="window"):
        Protocol(window="weird")
    with pytest.raises(ValueError, match="min_windows"):
        Protocol(min_windows=5, max_windows=2)
    assert NAIVE_5S.window_s == 5.0 and NAIVE_5S.cooldown_s == 5.0


def test_windows_record_the_cap_seen_during_the_work():
    from frontier.operating_point import OperatingPoint

    gpu = SimulatedGPU(seed=8)
    gpu.set_operating_point(OperatingPoint(power_limit_w=450))
    k = preset("gemm_bf16_8192")
    capped_clock = gpu.kernel_state(k).sm_clock_mhz
    w = measure_window(gpu, k, 300, Protocol(), ready_w=gpu.static_power_w())
    assert "SwPowerCap" in w.throttle_reasons and "GpuIdle" not in w.throttle_reasons
    assert w.sm_clock_mhz < 1800 and abs(w.sm_clock_mhz - capped_clock) < 0.1 * capped_clock
    # the same device read when idle (what a read after synchronize sees) shows no cap
    assert gpu.reading().throttle_reasons == ("GpuIdle",) and gpu.reading().sm_clock_mhz == 1980
    sig = measure_point(gpu, k, "g", Protocol(min_windows=2, max_windows=3))
    assert sig.meta["throttle_reasons"] == ["SwPowerCap"]
    assert all(c < 1800 for c in sig.meta["sm_clocks_seen_mhz"])
    # an uncapped copy (it draws ~610 W): no SwPowerCap in any window
    gpu.set_operating_point(OperatingPoint(power_limit_w=700))
    copy = measure_point(gpu, preset("copy_2GiB"), "c", Protocol(min_windows=2, max_windows=3))
    assert copy.meta["throttle_reasons"] == [] and set(copy.meta["sm_clocks_seen_mhz"]) == {1980.0}


def test_measure_window_reads_through_run_and_read():
    calls = []

    class Spy(SimulatedGPU):
        def run_and_read(self, work, n=1, sm_count=None):
            calls.append(n)
            return super().run_and_read(work, n, sm_count)

    gpu = Spy(seed=1)
    measure_window(gpu, preset("copy_2GiB"), 123, Protocol(), ready_w=120.0)
    measure_window(gpu, preset("copy_2GiB"), 45, Protocol(window="naive"), ready_w=120.0)
    assert calls == [123, 45]


def test_in_context_protocol_preheats_the_die_before_the_windows():
    """context_temp_c: the windows start on a die at the run's temperature, not cool; a GEMM
    at the top clock under a 450 W cap then throttles harder (static power rises with
    temperature), so it measures slower than at the null context."""
    from frontier.operating_point import OperatingPoint
    from measure.protocol import Protocol, measure_point
    from measure.sim import SimulatedGPU, preset, with_spec

    def point(proto):
        # the instantaneous cap: the cap window's bursts after each tick wait (±0.5 % with the
        # tick phase) would hide the ~0.5 % this test is about
        gpu = SimulatedGPU(seed=3, spec=with_spec(cap_window_s=0.0))
        gpu.set_operating_point(OperatingPoint(sm_clock_mhz=1980, power_limit_w=450))
        gpu.seed_point("gemm")
        return measure_point(gpu, preset("gemm_bf16_8192"), "gemm", proto), gpu

    cool, _ = point(Protocol())
    hot_target = cool.meta["temperatures_c"][0][0] + 15.0
    hot, gpu = point(Protocol(context_temp_c=hot_target))
    assert hot.meta["temperatures_c"][0][0] >= hot_target - 1.0
    assert cool.meta["temperatures_c"][0][0] < hot_target - 10.0
    assert hot.time_s > cool.time_s * 1.001
    assert hot.meta["protocol_settings"]["context_temp_c"] == hot_target
    # a target it cannot reach stops after preheat_max_s of device time
    t0 = gpu.time_s()
    from measure.protocol import preheat

    spent = preheat(gpu, preset("copy_2GiB"), Protocol(context_temp_c=500.0, preheat_max_s=2.0))
    assert 2.0 <= spent <= 3.0 and gpu.time_s() - t0 == spent


def test_capped_points_measured_too_briefly_are_flagged():
    """The power limit is a time average (docs/simulator.md): a capped point that ran for less
    than Protocol.cap_settle_s (warm-up and back-to-back windows) is flagged in its metadata."""
    from frontier.errors import InputError
    from measure.sim import preset

    gpu = SimulatedGPU(seed=1)
    gpu.seed_point("gemm")
    sig = measure_point(gpu, preset("gemm_bf16_8192"), "gemm", Protocol(), ready_w=123.0)
    ran = sig.meta["capped_run_s"]
    assert "SwPowerCap" in sig.meta["throttle_reasons"] and 0.2 < ran < 3.0
    assert sig.meta["cap_window_short"] is True
    gpu.seed_point("gemm2")
    sig2 = measure_point(gpu, preset("gemm_bf16_8192"), "gemm", Protocol(cap_settle_s=ran / 2),
                         ready_w=123.0)
    assert sig2.meta["cap_window_short"] is False
    gpu.seed_point("copy")
    copy = measure_point(gpu, preset("copy_2GiB"), "copy", Protocol(), ready_w=123.0)
    assert "capped_run_s" not in copy.meta and "cap_window_short" not in copy.meta
    with pytest.raises(InputError, match="cap_settle_s"):
        Protocol(cap_settle_s=-1.0)
