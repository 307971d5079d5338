"""The simulated H200: physics sanity and calibration against data/h200 (default point)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from frontier.operating_point import OperatingPoint
from measure import Protocol, SimKernel, SimulatedGPU, measure_point, preset
from measure.protocol import measure_ready_power_w
from measure.replay import H200_MEASUREMENTS, shared_data_dir


def _h200():
    p = shared_data_dir() / H200_MEASUREMENTS
    if not p.exists():
        pytest.skip(f"shared H200 data not found at {p} (set ECAL_SHARED_DATA)")
    return json.loads(p.read_text())


def test_counter_ticks_about_every_100ms_and_time_is_virtual():
    gpu = SimulatedGPU(seed=3)
    changes, last, t_last = [], gpu.energy_j(), gpu.time_s()
    while gpu.time_s() < 5.0:
        e = gpu.energy_j()
        if e != last:
            changes.append(gpu.time_s() - t_last)
            last, t_last = e, gpu.time_s()
    gaps = np.diff(changes[1:]) if len(changes) > 2 else np.array(changes)
    assert 0.09 < np.median(changes) < 0.11
    assert min(changes) >= 0.07 and max(changes) <= 0.135
    assert gaps.size > 0


def test_static_power_ready_and_deep_idle():
    gpu = SimulatedGPU()
    ready = gpu.static_power_w(temperature_c=40)
    assert 121 <= ready <= 126          # data: 122-126 W ready at 1980 MHz
    assert 75 <= gpu.deep_idle_power_w() <= 82   # data: 79.1 W deep idle
    # static power rises with clock and with temperature
    lo = gpu.static_power_w(OperatingPoint(sm_clock_mhz=900), temperature_c=40)
    hot = gpu.static_power_w(temperature_c=80)
    assert lo < ready < hot


def test_measured_ready_power_by_protocol():
    gpu = SimulatedGPU(seed=1)
    assert abs(measure_ready_power_w(gpu) - gpu.static_power_w()) < 2.0


def test_power_cap_lowers_gemm_clock_and_lower_cap_slows_it():
    gpu = SimulatedGPU()
    g = preset("gemm_bf16_8192")
    st = gpu.kernel_state(g, temperature_c=60)
    assert st.capped and st.sm_clock_mhz < 1980 and st.power_w == pytest.approx(700, rel=1e-3)
    st400 = gpu.kernel_state(g, OperatingPoint(power_limit_w=400), temperature_c=60)
    assert st400.sm_clock_mhz < st.sm_clock_mhz and st400.time_s > st.time_s
    assert st400.power_w == pytest.approx(400, rel=1e-3)
    copy = gpu.kernel_state(preset("copy_2GiB"), temperature_c=50)
    assert not copy.capped and copy.sm_clock_mhz == 1980


def test_roofline_knobs():
    gpu = SimulatedGPU()
    g, c = preset("gemm_bf16_8192"), preset("copy_2GiB")
    op_lo = OperatingPoint(sm_clock_mhz=900)
    # compute-bound: time ~ 1/clock and ~ 1/SMs; memory-bound: much less sensitive to SM clock
    assert gpu.kernel_state(g, op_lo, 40).time_s > 1.5 * gpu.kernel_state(g, temperature_c=40).time_s
    t16 = gpu.kernel_state(g, temperature_c=40, sm_count=16).time_s
    t32 = gpu.kernel_state(g, temperature_c=40, sm_count=32).time_s
    assert t16 == pytest.approx(2 * t32, rel=0.02)
    assert gpu.kernel_state(c, op_lo, 40).time_s < 1.5 * gpu.kernel_state(c, temperature_c=40).time_s
    # memory clock slows copies; bandwidth saturates with SMs
    assert gpu.kernel_state(c, OperatingPoint(mem_clock_mhz=2201), 40).time_s > 1.3 * gpu.kernel_state(c, temperature_c=40).time_s
    a = [gpu.kernel_state(preset(f"axpy_triton_sm{n}"), temperature_c=40).time_s for n in (4, 16, 66, 132)]
    assert a[0] / a[1] > 3.5 and a[2] / a[3] < 1.4
    # Hopper grants SMs in multiples of 8
    assert gpu.kernel_state(g, temperature_c=40, sm_count=33).sm_used == 40


def test_thermal_state_heats_under_load_and_cools_idle():
    gpu = SimulatedGPU()
    t0 = gpu.temperature_c()
    gpu.run(preset("gemm_bf16_8192"), 3000)
    hot = gpu.temperature_c()
    gpu.idle(30)
    assert hot > t0 + 15 and gpu.temperature_c() < hot - 10


def test_run_advances_virtual_time_and_energy_fast():
    gpu = SimulatedGPU()
    t, e = gpu.time_s(), gpu.true_energy_j()
    gpu.run(preset("copy_2GiB"), 1000)
    assert gpu.time_s() - t == pytest.approx(1000 * 1.005e-3, rel=0.01)
    assert gpu.true_energy_j() - e == pytest.approx(1000 * 0.61, rel=0.03)


def test_labels_say_simulated():
    gpu = SimulatedGPU()
    assert gpu.simulated and gpu.describe()["simulated"] is True
    assert gpu.describe()["device"] == "simulated H200"
    sig = measure_point(gpu, preset("copy_2GiB"), "copy", Protocol(min_windows=2, max_windows=2))
    assert sig.meta["simulated"] is True and sig.meta["device"] == "simulated H200"


def test_simkernel_validation_and_unknown_preset():
    with pytest.raises(ValueError, match="does no work"):
        SimKernel("nothing")
    with pytest.raises(KeyError, match="known"):
        preset("nope")


# Tolerances: the data's per-window spread (naive 0.6 s windows: 5-7 % in E) or 3 % in time,
# whichever is larger. Green-context GEMMs at 66/132 SMs read 732/747 W in the data, above the
# 700 W cap the plain GEMM respects (698 W): the model cannot match both, so those two get 6 %.
_LOOSE = {"gemm_bf16_8192_green_sm66": 0.06, "gemm_bf16_8192_green_sm132": 0.06}


def test_sim_reproduces_h200_default_point_elements():
    from measure.calibration import calibration_table, compare_to_h200

    data = _h200()
    rows = compare_to_h200(data)
    by = {r["element"]: r for r in rows}
    assert abs(by["ready power (W)"]["energy_err_pct"]) < 2
    for el in data["elements"]:
        r = by[el["name"]]
        tol = _LOOSE.get(el["name"])
        t_tol = tol or max(el["T_sd_s"] / el["T_s"], 0.03)
        e_tol = tol or max(el["E_sd_J"] / el["E_J"], 0.05)
        assert abs(r["time_err_pct"]) <= 100 * t_tol, el["name"]
        assert abs(r["energy_err_pct"]) <= 100 * e_tol, el["name"]
    g = by["gemm_bf16_8192"]
    # 0.6 s tick-aligned windows on the card: 1.587-1.599 ms (the cap is a time average, so
    # short windows after idle run faster than the 3 s windows' 1.639 ms)
    assert 1.58e-3 <= g["sim_time_s"] <= 1.64e-3 and 1.1 <= g["sim_energy_j"] <= 1.2
    c = by["copy_2GiB"]
    assert c["sim_time_s"] == pytest.approx(1.004e-3, rel=0.01) and c["sim_energy_j"] == pytest.approx(0.61, rel=0.03)
    assert "gemm_bf16_8192" in calibration_table(rows)


def test_wave_quantization_of_tiled_kernels():
    gpu = SimulatedGPU()
    g = preset("gemm_bf16_8192")            # 2048 tiles: 16 SMs -> 128 full waves; 132 -> 15.5
    t16 = gpu.kernel_state(g, OperatingPoint(power_limit_w=700), 40, sm_count=16).time_s
    t128 = gpu.kernel_state(g, OperatingPoint(sm_clock_mhz=1005), 40, sm_count=128).time_s
    t16_slow = gpu.kernel_state(g, OperatingPoint(sm_clock_mhz=1005), 40, sm_count=16).time_s
    assert t16_slow == pytest.approx(8 * t128, rel=0.01)   # 2048/128 = 16 full waves too
    assert t16 < t16_slow


def test_ready_power_matches_h200():
    data = _h200()
    ready = np.mean(data["static_power_W"]["ready_idle_context_alive_1980MHz"])
    gpu = SimulatedGPU()
    assert measure_ready_power_w(gpu) == pytest.approx(ready, abs=3.0)
    assert gpu.deep_idle_power_w() == pytest.approx(data["static_power_W"]["deep_idle_345MHz_no_context"], abs=3.0)


def test_parallel_run_shares_power_and_finishes_both():
    gpu = SimulatedGPU()
    g, c = preset("gemm_bf16_8192"), preset("copy_2GiB")
    t0, e0 = gpu.time_s(), gpu.true_energy_j()
    gpu.run_parallel([(g, 300, 96), (c, 300, 32)])
    t_par = gpu.time_s() - t0
    e_par = gpu.true_energy_j() - e0
    # both finish: no sooner than the longer stream alone in its partition, no later than the
    # two in their partitions back to back (the copy's traffic stalls the GEMM while both run:
    # docs/simulator.md; at this split the co-run is no faster than the two full-device kernels
    # back to back, a case where partitioning does not pay)
    g96, c32 = gpu.kernel_state(g, sm_count=96).time_s, gpu.kernel_state(c, sm_count=32).time_s
    assert 300 * max(g96, c32) < t_par < 300 * (g96 + c32)
    assert math.isfinite(e_par) and e_par > 0


def test_state_is_reported_only_while_work_runs():
    g = preset("gemm_bf16_8192")
    gpu = SimulatedGPU(seed=1)
    gpu.set_operating_point(OperatingPoint(power_limit_w=400))
    r = gpu.run_and_read(g, 400)
    assert "SwPowerCap" in r.throttle_reasons and "GpuIdle" not in r.throttle_reasons
    capped = gpu.kernel_state(g).sm_clock_mhz
    assert r.sm_clock_mhz < 1900 and abs(r.sm_clock_mhz - capped) < 0.1 * capped
    # after the run the GPU is idle: no stale cap, the top clock
    idle = gpu.reading()
    assert idle.throttle_reasons == ("GpuIdle",) and idle.sm_clock_mhz == 1980.0
    gpu.run(g, 100)
    assert gpu.throttle_reasons() == ("GpuIdle",) and gpu.clocks_mhz()["sm"] == 1980.0
    # locked clocks: the locked clock when idle, the capped one under load
    gpu.set_operating_point(OperatingPoint(sm_clock_mhz=1500, power_limit_w=700))
    assert gpu.reading().sm_clock_mhz == 1500.0
    assert set(gpu.reading().throttle_reasons) == {"GpuIdle", "ApplicationsClocksSetting"}
    # a copy is not capped: no SwPowerCap while it runs either
    r = gpu.run_and_read(preset("copy_2GiB"), 200)
    assert "SwPowerCap" not in r.throttle_reasons and r.sm_clock_mhz == 1500.0


def test_run_and_read_reads_mid_run_without_changing_the_work():
    g = preset("gemm_bf16_8192")
    a, b = SimulatedGPU(seed=4), SimulatedGPU(seed=4)
    t0 = b.time_s()
    a.run(g, 777)
    r = b.run_and_read(g, 777)
    assert (a.time_s(), a.energy_j(), a.true_energy_j()) == (b.time_s(), b.energy_j(), b.true_energy_j())
    assert t0 < r.time_s < b.time_s()       # taken during the run, about halfway
    assert r.time_s - t0 == pytest.approx((b.time_s() - t0) / 2, rel=0.1)
    # a callable that drives the device itself is read while it works too
    c = SimulatedGPU(seed=4)
    c.set_operating_point(OperatingPoint(power_limit_w=400))
    r = c.run_and_read(lambda: c.run(g, 50), 6)
    assert "SwPowerCap" in r.throttle_reasons and c.reading().throttle_reasons == ("GpuIdle",)
    assert c.run_and_read(g, 0).throttle_reasons == ("GpuIdle",)


def test_seed_point_makes_a_point_a_function_of_seed_and_key_alone():
    g = preset("gemm_bf16_8192")

    def point(gpu, key):
        gpu.seed_point(key)
        t0, e0, temp0 = gpu.time_s(), gpu.energy_j(), gpu.temperature_c()
        gpu.run(g, 500)
        return gpu.time_s() - t0, gpu.energy_j() - e0, temp0, gpu.temperature_c()

    fresh = point(SimulatedGPU(seed=9), "k")
    busy = SimulatedGPU(seed=9)
    busy.run(preset("copy_2GiB"), 3000)      # a different history: hot, later, more energy
    busy.idle(0.37)
    assert busy.temperature_c() > fresh[2] + 5
    assert point(busy, "k") == fresh        # exactly
    assert point(SimulatedGPU(seed=9), "other") != fresh
    assert point(SimulatedGPU(seed=10), "k") != fresh
    # the null context: idle at the steady ready temperature of the settings in force
    gpu = SimulatedGPU()
    gpu.set_operating_point(OperatingPoint(sm_clock_mhz=1200))
    gpu.run(g, 1000)
    gpu.seed_point("x")
    theta = gpu.ready_temperature_c()
    s = gpu.spec
    assert theta == pytest.approx(s.ambient_c + s.thermal_r_c_per_w * gpu.static_power_w(temperature_c=theta))
    assert gpu._temp == theta and gpu.throttle_reasons() == ("GpuIdle", "ApplicationsClocksSetting")
    # counter readings stay monotonic across a new epoch
    e = gpu.energy_j()
    gpu.seed_point("y")
    assert gpu.energy_j() >= e


def test_describe_identifies_the_simulator():
    d = SimulatedGPU(seed=7).describe()
    assert d["seed"] == 7 and d["uuid"] == "SIM-H200" and d["driver"] == "simulator"
    assert d["simulated"] is True and d["device"] == "simulated H200"


# -- the power cap as a time average (issue 30) -----------------------------------------------

def _window_power_w(gpu, k, seconds, piece=20):
    """Average board power (true energy) over ``seconds`` of ``k`` (or a list, in turn)."""
    t0, e0 = gpu.time_s(), gpu.true_energy_j()
    while gpu.time_s() - t0 < seconds:
        gpu.run(k, piece)
    return (gpu.true_energy_j() - e0) / (gpu.time_s() - t0)


def test_allowed_power_is_the_cap_on_a_moving_average():
    from measure.sim import with_spec

    gpu = SimulatedGPU(spec=with_spec(cap_window_s=0.04))
    gpu._p_avg = 700.0                      # the average sits at the limit: the limit itself
    assert gpu.allowed_power_w(0.01) == pytest.approx(700.0)
    gpu._p_avg = 0.0                        # over one time constant from 0 W: 700 / (1 - 1/e)
    assert gpu.allowed_power_w(0.04) == pytest.approx(700.0 / (1 - math.exp(-1)))
    gpu._p_avg = 800.0                      # after an overshoot: below the limit
    assert gpu.allowed_power_w(0.04) < 700.0
    assert SimulatedGPU(spec=with_spec(cap_window_s=0.0)).allowed_power_w(0.01) == 700.0
    # idle (and seed_point's null context) leaves the average at ready power
    gpu.seed_point("x")
    assert gpu.power_average_w() == pytest.approx(gpu.static_power_w())


def test_short_capped_window_after_idle_averages_above_the_cap():
    """As on the H200 (experiments/results/sim_cap_window.md: +17 to +27 % over the first
    0.1 s of a GEMM after idle, +5 to +8 % over 0.5 s): the cap limits a moving average."""
    from measure.sim import CAP_WINDOW_FITTED_S, with_spec

    g = preset("gemm_bf16_8192")
    gpu = SimulatedGPU(seed=2, spec=with_spec(cap_window_s=CAP_WINDOW_FITTED_S))
    gpu.seed_point("short")
    gpu.idle(5.0)
    p = _window_power_w(gpu, g, 0.1, piece=5)
    assert p > 1.1 * 700.0
    gpu.idle(5.0)
    assert _window_power_w(gpu, g, 0.5, piece=5) > 1.02 * 700.0
    # the instantaneous cap (the default): the same window sits at the limit
    old = SimulatedGPU(seed=2, spec=with_spec(cap_window_s=0.0))
    old.seed_point("short")
    old.idle(5.0)
    assert _window_power_w(old, g, 0.1, piece=5) == pytest.approx(700.0, rel=0.02)


def test_long_capped_window_sits_at_the_cap():
    g = preset("gemm_bf16_8192")
    gpu = SimulatedGPU(seed=2)
    gpu.seed_point("long")
    gpu.idle(5.0)
    assert _window_power_w(gpu, g, 5.0) == pytest.approx(700.0, rel=0.01)   # from idle
    assert _window_power_w(gpu, g, 3.0) == pytest.approx(700.0, rel=0.005)  # once running
    assert "SwPowerCap" in gpu.run_and_read(g, 200).throttle_reasons


def test_capped_gemm_beside_a_copy_runs_faster_than_its_sequential_prediction():
    """The selftest's pair on the H200 (a 4096 GEMM then a 256 MiB copy, in turn): T −4.8 %,
    E +1.6 to +2.3 % against ⊗ of the two alone; the cap on a moving average lets the GEMM
    clock up beside the low-power copy. With the instantaneous cap the effect is gone."""
    from frontier.compose import seq
    from measure.sim import with_spec

    copy = SimKernel("copy_256MiB", bytes=2 * 2**28, activity=0.0)
    g = preset("gemm_bf16_4096")
    proto = Protocol(window_s=0.6, min_windows=3, max_windows=3)

    def devs(spec):
        gpu = SimulatedGPU(seed=0, spec=spec)
        gpu.seed_point("ready")
        ready = measure_ready_power_w(gpu, proto)
        pts = []
        for name, work in (("g", g), ("c", copy), ("gc", [g, copy])):
            gpu.seed_point(name)
            pts.append(measure_point(gpu, work, name, proto, ready_w=ready))
        pred = seq(pts[0], pts[1])
        return pts[2].time_s / pred.time_s - 1, pts[2].energy_j / pred.energy_j - 1

    dt, de = devs(with_spec(cap_window_s=0.04))
    assert dt < -0.025 and de > 0.01
    dt0, de0 = devs(with_spec(cap_window_s=0.0))
    assert dt < dt0 - 0.015 and de0 < 0.0
