"""The simulator's co-run model (``SimulatedGPU.run_parallel``) against the real H200 composites.

What is simulated and what is not (``docs/simulator.md``): the five co-run parameters are
fitted together on GEMM ∥ axpy@4SM (no partitions) and GEMM ∥ copy at the 64+64 and 120+8
green-context splits; GEMM ∥ copy without partitions and the 96+32 and 112+16 splits are checks
(``experiments/sim_corun_calibration.py``). Back-to-back GEMMs throttle at the power cap, which
acts on a moving average of power (``cap_window_s``), so a GEMM beside a copy in one stream
runs faster than ⊗ predicts, as on the card; the GEMM ⊗ axpy energy is still too high.
Overlapping contexts are unchecked. The tests below pin what agrees, what does not, and the
model's mechanisms.
"""

from __future__ import annotations

import pytest

from measure.calibration import (
    COMPOSITES,
    agreement,
    compare_composites_to_h200,
    simulate_composites,
)
from measure.protocol import Protocol, measure_point
from measure.replay import H200_MEASUREMENTS, shared_data_dir
from measure.sim import H200, SimulatedGPU, preset, with_spec

PATH = shared_data_dir() / H200_MEASUREMENTS
needs_data = pytest.mark.skipif(
    not PATH.exists(),
    reason=f"real H200 data not found at {PATH} (shared data folder ../shared/data is absent; "
           "set ECAL_SHARED_DATA to point at it); the fixed-number tests still run")

#: Real H200 deviations (%) of the measured composite from the prediction composed from the
#: elements characterized alone, copied from ../shared/data/h200/measurements.json
#: (``compositions`` vs ``elements`` through frontier.h200; experiments/h200_composition.py and
#: experiments/results/sim_corun_calibration.md print them). name → (ΔT %, ΔE %).
REAL_DEVIATION_PCT = {
    "par_gemm8192_copy": (93.6, 11.1),
    "par_gemm8192_axpy_sm4": (73.6, 17.0),
    "seq_gemm8192_copy": (-5.1, 1.3),
    "seq_gemm8192_axpy_sm4": (-1.0, 4.3),
}
#: The size band: simulated and real deviations agree within this factor (docs/simulator.md).
SIZE_FACTOR = 1.5
#: SM clocks at the end of the real gemm_bf16_8192 windows (same file): it throttles at 700 W.
REAL_GEMM_CLOCKS_MHZ = (1560, 1965, 1950, 1830, 1965)


@pytest.fixture(scope="module")
def sim():
    # with the cap as the card has it (a moving average; the simulator's default is off)
    from measure.sim import CAP_WINDOW_FITTED_S, with_spec

    return simulate_composites(seed=0, spec=with_spec(cap_window_s=CAP_WINDOW_FITTED_S))


def _dev(sim, name):
    c = sim["composites"][name]
    m, p = c["measured"], c["predicted"]
    return 100 * (m.time_s / p.time_s - 1), 100 * (m.energy_j / p.energy_j - 1)


@pytest.mark.parametrize("name", ["par_gemm8192_copy", "par_gemm8192_axpy_sm4"])
def test_parallel_time_deviation_has_the_real_sign_and_size(sim, name):
    dt, _ = _dev(sim, name)
    real_dt, _ = REAL_DEVIATION_PCT[name]
    assert dt > 0, f"simulated {name} ran faster than ⊕ ({dt:+.1f} %); the H200 took {real_dt:+.1f} %"
    assert real_dt / SIZE_FACTOR <= dt <= real_dt * SIZE_FACTOR, (name, dt, real_dt)


def test_gemm_copy_energy_deviation_has_the_real_sign_and_size(sim):
    _, de = _dev(sim, "par_gemm8192_copy")
    real = REAL_DEVIATION_PCT["par_gemm8192_copy"][1]
    assert real / SIZE_FACTOR <= de <= real * SIZE_FACTOR, de


def test_fitted_row_agrees_and_known_gaps_stay_documented(sim):
    """GEMM ∥ axpy@4SM is the fit (both deviations agree by construction); what the simulator
    does not reproduce (docs/simulator.md lists it): if it starts agreeing, update the doc's
    table and this test."""
    dt, de = _dev(sim, "par_gemm8192_axpy_sm4")
    real_dt, real_de = REAL_DEVIATION_PCT["par_gemm8192_axpy_sm4"]
    assert agreement(real_dt, dt, SIZE_FACTOR)["size"] and agreement(real_de, de, SIZE_FACTOR)["size"]
    dt, _ = _dev(sim, "seq_gemm8192_copy")
    # the cap on a moving average: the GEMM clocks up beside the copy, as on the H200 (−5.1 %);
    # with the instantaneous cap (cap_window_s = 0) ⊗ held within 0.1 %
    assert dt < -2.0
    assert agreement(REAL_DEVIATION_PCT["seq_gemm8192_copy"][0], dt, SIZE_FACTOR)["direction"]
    _, de = _dev(sim, "seq_gemm8192_axpy_sm4")
    assert not agreement(REAL_DEVIATION_PCT["seq_gemm8192_axpy_sm4"][1], de, SIZE_FACTOR)["size"]


def test_back_to_back_gemms_throttle_at_the_cap_like_the_h200():
    """GEMM ⊗ GEMM (the element measured alone, back to back) holds the board at 700 W: every
    window reports SwPowerCap and a clock below the top one, as the real windows did."""
    assert min(REAL_GEMM_CLOCKS_MHZ) < H200.sm_clock_max_mhz
    gpu = SimulatedGPU(seed=3)
    gpu.seed_point("gemm")
    sig = measure_point(gpu, preset("gemm_bf16_8192"), "gemm", Protocol(), ready_w=123.0)
    assert "SwPowerCap" in sig.meta["throttle_reasons"]
    assert all(1300 < f < H200.sm_clock_max_mhz for f in sig.meta["sm_clocks_seen_mhz"])
    assert sig.power_w == pytest.approx(H200.power_limit_default_w, rel=0.03)
    # the same through the co-run model: one stream of GEMMs, and GEMM ∥ GEMM
    for streams in ([(preset("gemm_bf16_8192"), 400, None)],
                    [(preset("gemm_bf16_8192"), 200, None), (preset("gemm_bf16_4096"), 800, None)]):
        r = gpu.run_and_read(lambda s=streams: gpu.run_parallel(s), 1)
        assert "SwPowerCap" in r.throttle_reasons and r.sm_clock_mhz < H200.sm_clock_max_mhz


def test_copy_alone_is_not_capped_and_neither_is_its_corun_with_axpy():
    gpu = SimulatedGPU(seed=1)
    _t, p, f, capped = gpu.corun_state([(preset("copy_2GiB"), None), (preset("axpy_triton_sm4"), None)])
    assert not capped and f == H200.sm_clock_max_mhz and p < H200.power_limit_default_w


@pytest.mark.parametrize("name, sm", [("gemm_bf16_8192", None), ("gemm_bf16_8192", 64),
                                      ("copy_2GiB", None), ("axpy_triton_sm4", None),
                                      ("p2p_send", 16), ("attention_flash", None)])
def test_one_stream_corun_is_the_kernel_alone(name, sm):
    gpu = SimulatedGPU()
    st = gpu.kernel_state(preset(name), sm_count=sm)
    (t,), p, f, capped = gpu.corun_state([(preset(name), sm)])
    assert (t, p, f, capped) == pytest.approx((st.time_s, st.power_w, st.sm_clock_mhz, st.capped), rel=1e-12)


def test_two_full_grid_kernels_take_turns_and_the_cap_is_shared():
    gpu = SimulatedGPU()
    g, c = preset("gemm_bf16_8192"), preset("copy_2GiB")
    (tg, tc), p, _f, capped = gpu.corun_state([(g, None), (c, None)])
    alone = gpu.kernel_state(g).time_s + gpu.kernel_state(c).time_s
    # each advances one kernel per round; the round is about the two alone (a little shorter:
    # the averaged power lets the GEMM clock up between copies)
    assert tg == tc and 0.85 * alone < tg <= alone
    assert capped and p == pytest.approx(H200.power_limit_default_w, rel=1e-6)


def test_hbm_is_shared_between_partitioned_copies():
    gpu = SimulatedGPU()
    c = preset("copy_2GiB")
    (t1, t2), *_ = gpu.corun_state([(c, 64), (c, 64)])
    assert 2 * c.bytes / min(t1, t2) <= H200.mem_bw_bps * (1 + 1e-9)
    assert t1 > gpu.kernel_state(c, sm_count=64).time_s


def test_l2_interference_is_what_slows_the_resident_axpy():
    a, g = preset("axpy_triton_sm4"), preset("gemm_bf16_8192")
    on = SimulatedGPU().corun_state([(g, None), (a, None)])[0][1]
    no_sm = SimulatedGPU(spec=with_spec(corun_l2_interference=0.0)).corun_state([(g, None), (a, None)])[0][1]
    off = SimulatedGPU(spec=with_spec(corun_l2_interference=0.0, corun_mem_interference=0.0,
                                      corun_shared_mem_interference=0.0, corun_l2_pressure=0.0)
                       ).corun_state([(g, None), (a, None)])[0][1]
    alone = SimulatedGPU().kernel_state(a).time_s
    assert off < 1.1 * alone and on > 3 * alone and no_sm < 0.5 * on
    # a green-context partition does not share SMs: no such slowdown, only the memory system's
    part = SimulatedGPU().corun_state([(g, 120), (a, 8)])[0][1]
    part_no_sm = SimulatedGPU(spec=with_spec(corun_l2_interference=0.0)).corun_state([(g, 120), (a, 8)])[0][1]
    assert part == part_no_sm and part < 1.5 * alone


def _pinned_clock(mhz):
    from frontier.operating_point import OperatingPoint

    def gpu(**spec):
        d = SimulatedGPU(spec=with_spec(**spec))
        d.set_operating_point(OperatingPoint(sm_clock_mhz=mhz, power_limit_w=700))
        return d
    return gpu


def test_disjoint_partitions_interfere_through_the_memory_system():
    """stage_forward on 112 SMs ∥ p2p_send on 16 (the demo's split, disjoint as granted), at a
    clock where the cap does not bind: without the memory-pressure terms the forward runs as
    alone; with them the send's HBM traffic stalls it a little and the forward's L2 traffic
    slows the send, by at most a doubling. The HBM term grows steeply with the co-runner's
    bandwidth (fitted exponent ≈ 3): a copy on 64 SMs stalls a GEMM far more than one on 8."""
    gpu = _pinned_clock(1440)
    f, p = preset("stage_forward"), preset("p2p_send")
    alone = gpu().kernel_state(f, sm_count=112)
    send_alone = gpu().kernel_state(p, sm_count=16)
    assert not alone.capped
    off = {"corun_mem_interference": 0.0, "corun_l2_pressure": 0.0}
    (t_off, s_off), _, _, capped = gpu(**off).corun_state([(f, 112), (p, 16)])
    assert not capped and t_off == pytest.approx(alone.time_s, rel=1e-12)
    assert s_off == pytest.approx(send_alone.time_s, rel=1e-12)
    (t_on, t_send), p_on, _, _ = gpu().corun_state([(f, 112), (p, 16)])
    assert alone.time_s < t_on < 1.05 * alone.time_s
    # the send feels the forward's L2 traffic, and it is still far shorter than the forward
    assert send_alone.time_s < t_send < 0.1 * t_on
    # stalled compute draws no compute power: the co-run draws less than the two alone
    p_alone = alone.power_w + send_alone.power_w - gpu().static_power_w()
    assert p_on < p_alone
    g, c = preset("gemm_bf16_8192"), preset("copy_2GiB")
    slow = [gpu().corun_state([(g, n), (c, k)])[0][0] / gpu().kernel_state(g, sm_count=n).time_s
            for n, k in ((120, 8), (64, 64))]
    assert 1.0 < slow[0] < 1.02 and 1.2 < slow[1] < 2.0


def test_green_context_splits_keep_the_card_s_energy_sign():
    """GEMM ∥ copy at the four real splits (experiments/results/corun_splits_h200.json, fixed
    copies below): where the card saves energy against ⊕ (flagged at 64+64, 96+32, 112+16) the
    simulator saves too; time within ×1.5 everywhere. 64+64 and 120+8 are fitted, 96+32 and
    112+16 are held out."""
    from measure.calibration import simulate_real_splits

    real = {(64, 64): ((98, 215), 43.9, -12.2), (96, 32): ((126, 132), 26.0, -11.5),
            (112, 16): ((136, 72), 28.2, -4.3), (120, 8): ((142, 38), 29.0, -0.3)}
    rows = simulate_real_splits([
        {"split": list(sp), "k": list(k), "deviation": {"error_time_pct": dt, "error_energy_pct": de},
         "measured": {"energy_j": 1.0, "time_s": 1.0}} for sp, (k, dt, de) in real.items()])
    for r in rows:
        _k, dt, de = real[tuple(r["split"])]
        assert dt / SIZE_FACTOR <= r["sim_dev_time_pct"] <= dt * SIZE_FACTOR, r
        if de < -1.0:
            assert r["sim_dev_energy_pct"] < 0.0, r
        else:   # the card's −0.3 % at 120+8 is within its noise (z = −1.9, not flagged)
            assert abs(r["sim_dev_energy_pct"]) < 3.0, r


def test_corun_is_a_function_of_seed_and_key():
    def once():
        gpu = SimulatedGPU(seed=7)
        gpu.seed_point("x")
        t0, e0 = gpu.time_s(), gpu.energy_j()
        gpu.run_parallel([(preset("gemm_bf16_8192"), 50, None), (preset("copy_2GiB"), 80, None)])
        return gpu.time_s() - t0, gpu.energy_j() - e0
    assert once() == once()


@needs_data
def test_fixed_numbers_are_the_data_s():
    rows = compare_composites_to_h200(seed=0, size_factor=SIZE_FACTOR)
    assert [r["composite"] for r in rows] == [c[0] for c in COMPOSITES]
    for r in rows:
        dt, de = REAL_DEVIATION_PCT[r["composite"]]
        assert r["real_dev_time_pct"] == pytest.approx(dt, abs=0.05)
        assert r["real_dev_energy_pct"] == pytest.approx(de, abs=0.05)
    par = {r["composite"]: r for r in rows if r["rule"] == "⊕"}
    assert all(r["time_agrees"] == {"direction": True, "size": True} for r in par.values())
    assert par["par_gemm8192_copy"]["energy_agrees"]["size"]


@needs_data
def test_composite_parts_match_the_data():
    from frontier.h200 import is_parallel, load_measurements

    data = load_measurements(PATH)
    got = {c["name"]: (is_parallel(c), tuple((k, int(v)) for k, v in c["parts"].items()))
           for c in data["compositions"]}
    assert got == {n: (par, parts) for n, par, parts in COMPOSITES}
    clocks = next(e for e in data["elements"] if e["name"] == "gemm_bf16_8192")["windows"]
    assert tuple(w["sm_clock_MHz_at_end"] for w in clocks) == REAL_GEMM_CLOCKS_MHZ
