"""Every verified test vector of spec §14 and the worked-example table of §11.3."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from frontier import Signature, clark_max, par, par_multi, seq
from frontier.deviation import critical_value, deviation

S = 80.0  # W: 1 ms costs 80 mJ (spec §11.3)
MS = 1e-3
MJ = 1e-3


def _el(name, t_ms, d_mj, device="gpu0"):
    return Signature(name, s_w=S, time_s=t_ms * MS, d_j=d_mj * MJ, devices={device})


@pytest.fixture
def layer():
    """The §11.3 elements on one GPU."""
    names = {"rmsnorm": (0.2, 20), "linear1": (1.5, 300), "rope": (0.2, 20), "attn": (3.0, 600),
             "linear2": (0.8, 160), "ar3": (2.0, 40), "ar16": (1.0, 50)}
    return {k: _el(k, *v) for k, v in names.items()}


def _per_gpu(e, device="gpu0"):
    mv = {k: v.with_(devices={device}) for k, v in e.items()}
    return seq(mv["rmsnorm"], mv["linear1"], par(seq(mv["rope"], mv["attn"], mv["linear2"]), mv["ar3"]))


def test_worked_example_prefix_and_compute_path(layer):
    pre = seq(layer["rmsnorm"], layer["linear1"])
    cmp_ = seq(layer["rope"], layer["attn"], layer["linear2"])
    assert pre.time_s == pytest.approx(1.7 * MS) and pre.energy_j == pytest.approx(456 * MJ)
    assert cmp_.time_s == pytest.approx(4.0 * MS) and cmp_.energy_j == pytest.approx(1100 * MJ)


def test_worked_example_parallel_region_and_saving(layer):
    cmp_ = seq(layer["rope"], layer["attn"], layer["linear2"])
    region = par(cmp_, layer["ar3"])
    serial = seq(cmp_, layer["ar3"])
    assert region.time_s == pytest.approx(4.0 * MS)
    assert region.energy_j == pytest.approx((320 + 780 + 40) * MJ)
    assert serial.energy_j == pytest.approx(1300 * MJ)
    # Vector 4: the ⊕ saving is the static energy of the shorter branch.
    saving = serial.energy_j - region.energy_j
    assert saving == pytest.approx(160 * MJ)
    assert saving == pytest.approx(S * min(cmp_.time_s, layer["ar3"].time_s))


def test_worked_example_per_gpu_and_serial_variant(layer):
    g = _per_gpu(layer)
    assert g.time_s == pytest.approx(5.7 * MS) and g.energy_j == pytest.approx(1596 * MJ)
    serial = seq(layer["rmsnorm"], layer["linear1"], layer["rope"], layer["attn"], layer["linear2"],
                 layer["ar16"])
    assert serial.time_s == pytest.approx(6.7 * MS) and serial.energy_j == pytest.approx(1686 * MJ)


def test_worked_example_two_gpus_and_imbalance(layer):
    g0, g1 = _per_gpu(layer, "gpu0"), _per_gpu(layer, "gpu1")
    both = par_multi(g0, g1)
    assert both.energy_j == pytest.approx(3192 * MJ)
    slow = g1.with_(time_s=g1.time_s + 0.2 * MS)   # same d, 0.2 ms longer
    imb = par_multi(g0, slow)
    assert imb.energy_j - g0.energy_j - slow.energy_j == pytest.approx(16 * MJ)   # 80 W x 0.2 ms


def test_bundled_attention_example_matches_table():
    from pathlib import Path

    from frontier.workbook import load_workbook

    wb = load_workbook(Path(__file__).resolve().parents[1] / "ecal" / "examples" / "attention_tp2.json")
    expect = {"prefix": (1.7, 456), "compute_path": (4.0, 1100), "parallel_region": (4.0, 1140),
              "serial_region": (6.0, 1300), "layer_gpu0": (5.7, 1596),
              "layer_gpu0_serial_ar16": (6.7, 1686), "layer_tp2": (5.7, 3192)}
    for name, (t_ms, e_mj) in expect.items():
        p = wb[name].predicted
        assert p.time_s == pytest.approx(t_ms * MS), name
        assert p.energy_j == pytest.approx(e_mj * MJ), name
    imb = wb["layer_tp2_imbalanced"].predicted.energy_j
    parts = wb["layer_gpu0"].predicted.energy_j + wb["layer_gpu1_slow"].predicted.energy_j
    assert imb - parts == pytest.approx(16 * MJ)
    assert wb["serial_region"].predicted.energy_j - wb["parallel_region"].predicted.energy_j == pytest.approx(160 * MJ)


# -- vector 1: σ²_d = σ²_E − s²σ²_T -----------------------------------------------------------------

def test_var_d_formula_on_a_signature():
    sig = Signature("x", s_w=100.0, time_s=1.0, d_j=50.0, var_time_s2=1e-6, var_energy_j2=2e-2)
    assert sig.var_d_j2 == pytest.approx(2e-2 - 100.0**2 * 1e-6)


def test_var_d_formula_monte_carlo():
    rng = np.random.default_rng(12345)
    s, n = 120.0, 400_000
    t = rng.normal(1.0e-3, 5.0e-5, n)           # time jitter (s·σ_T = 6 mJ)
    d = rng.normal(0.5, 1.0e-2, n)              # dynamic-energy noise, independent of T (M1)
    e = s * t + d
    direct = np.var(e - s * t, ddof=1)
    formula = np.var(e, ddof=1) - s**2 * np.var(t, ddof=1)
    assert formula == pytest.approx(direct, rel=0.01)
    assert formula == pytest.approx(1.0e-4, rel=0.01)
    # The "+" version double counts the static-times-jitter part.
    assert np.var(e, ddof=1) + s**2 * np.var(t, ddof=1) > direct * 1.05
    # Through the Signature: from_runs stores the variance of the mean, and its leaf term
    # carries σ²_d = σ²_E − s²σ²_T, matching the directly estimated one in meta.
    sig = Signature.from_runs("mc", t[:2000], e[:2000], s_w=s)
    assert sig.var_d_j2 == pytest.approx(sig.meta["var_d_direct_j2"], rel=0.1)


def test_var_d_clamped_when_negative():
    sig = Signature("x", s_w=100.0, time_s=1.0, d_j=50.0, var_time_s2=1e-2, var_energy_j2=1.0)
    assert sig.var_d_j2 == 0.0
    assert sig.meta["var_d_clamped"] == pytest.approx(1.0 - 100.0)


# -- vectors 2, 3: non-distributivity, unsafe (T, E) pruning under ⊕ --------------------------------

def test_non_distributivity_vector():
    e1, e2, e3 = (Signature(n, s_w=50.0, time_s=t, d_j=d) for n, t, d in
                  (("e1", 1, 100), ("e2", 2, 150), ("e3", 3, 200)))
    left, right = seq(e1, par(e2, e3)), par(seq(e1, e2), seq(e1, e3))
    assert (left.time_s, right.time_s) == (4.0, 4.0)
    assert left.energy_j == pytest.approx(650.0) and right.energy_j == pytest.approx(750.0)


def test_unsafe_TE_pruning_vector():
    s = 20.0
    e1 = Signature("e1", s_w=s, time_s=5.0, d_j=100.0)
    a = Signature.from_point("a", time_s=1.0, energy_j=100.0, s_w=s)   # d = 80
    b = Signature.from_point("b", time_s=2.0, energy_j=101.0, s_w=s)   # d = 61
    assert a.time_s < b.time_s and a.energy_j < b.energy_j             # a dominates b in (T, E)
    assert par(e1, a).energy_j == pytest.approx(280.0)
    assert par(e1, b).energy_j == pytest.approx(261.0)                 # yet b is cheaper under ⊕


# -- vector 5: ⊕multi decoupled frontier = brute-force Pareto ----------------------------------------

def _pareto(points):
    pts = sorted(set(points))
    out, best = [], float("inf")
    for t, e in pts:
        if e < best - 1e-9:
            out.append((t, e))
            best = e
    return out


def test_par_multi_decoupled_frontier_equals_brute_force():
    rng = np.random.default_rng(7)
    for _ in range(200):
        sets = []
        for dev in ("gpu0", "gpu1"):
            pts = []
            for j in range(int(rng.integers(2, 6))):
                s = float(rng.uniform(50, 150))
                pts.append(Signature(f"{dev}_{j}", s_w=s, time_s=float(rng.uniform(0.5, 3.0)),
                                     d_j=float(rng.uniform(10, 300)), devices={dev}))
            sets.append(pts)
        brute = _pareto([(round(c.time_s, 12), round(c.energy_j, 9))
                         for p0, p1 in itertools.product(*sets) for c in [par_multi(p0, p1)]])
        taus = sorted({p.time_s for pts in sets for p in pts})
        dec = []
        for tau in taus:
            parts = [min((p.s_w * tau + p.d_j for p in pts if p.time_s <= tau), default=None) for pts in sets]
            if None not in parts:
                dec.append((round(tau, 12), round(sum(parts), 9)))
        dec = _pareto(dec)
        assert len(brute) == len(dec)
        for (tb, eb), (td, ed) in zip(brute, dec):
            assert tb == pytest.approx(td) and eb == pytest.approx(ed)


# -- vector 6: Clark ---------------------------------------------------------------------------------

def test_clark_moments_vector():
    m, v, p = clark_max(4.0, 0.1**2, 3.95, 0.1**2)
    assert m == pytest.approx(4.0349, abs=5e-5)
    assert v == pytest.approx(0.00704, abs=5e-6)
    assert 0.5 < p < 1.0


def test_clark_against_monte_carlo():
    rng = np.random.default_rng(3)
    x = np.maximum(rng.normal(4.0, 0.1, 400_000), rng.normal(3.95, 0.1, 400_000))
    m, v, _ = clark_max(4.0, 0.01, 3.95, 0.01)
    assert x.mean() == pytest.approx(m, abs=1e-3)
    assert x.var() == pytest.approx(v, rel=0.02)


# -- §6.1 / §8.2 ---------------------------------------------------------------------------------------

def test_critical_value_and_eq23_threshold():
    assert critical_value(0.05) == pytest.approx(1.95996, abs=1e-4)
    pred = Signature("p", s_w=S, time_s=5.7 * MS, d_j=1.14, var_energy_j2=(5 * MJ) ** 2)
    meas = Signature("m", s_w=S, time_s=5.7 * MS, d_j=1.14 + 0.0140, var_energy_j2=(5 * MJ) ** 2)
    r = deviation(pred, meas)
    assert r.threshold_energy_j == pytest.approx(1.95996 * np.sqrt(2) * 5 * MJ, rel=1e-4)
    assert r.flagged_energy and not r.flagged_time   # 14.0 mJ > 13.86 mJ
    meas_ok = meas.with_(d_j=1.14 + 0.0135)
    assert not deviation(pred, meas_ok).flagged
