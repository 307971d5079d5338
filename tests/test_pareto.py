"""Pareto pruning, the Frontier object, its files and ε-thinning (spec §7, §9.1; solver-notes §5.3)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frontier import (
    EnergyCalculusError,
    FormatError,
    Frontier,
    OperatingPoint,
    Signature,
    achievable_set,
    par,
    pareto_frontier,
    seq,
    signature_from_dict,
    signature_to_dict,
    thin,
)
from frontier.pareto import nondominated

W1 = OperatingPoint(sm_clock_mhz=1980)
W2 = OperatingPoint(sm_clock_mhz=1410)


def sig(t, e=None, s=0.0, d=None, name="k", omega=W1, **kw):
    if d is None:
        d = e - s * t
    return Signature(name, s_w=s, time_s=t, d_j=d, omega=omega, **kw)


# -- hand-worked cases ------------------------------------------------------------------------

def test_te_pruning_hand_case():
    pts = [sig(1, 10), sig(2, 8), sig(2, 9), sig(3, 8), sig(4, 5), sig(0.5, 20), sig(5, 5)]
    f = pareto_frontier(pts)
    assert [(p.time_s, p.energy_j) for p in f] == [(0.5, 20), (1, 10), (2, 8), (4, 5)]
    assert f.criterion == "TE"
    assert list(f.times_s) == [0.5, 1, 2, 4]
    assert list(f.energies_j) == [20, 10, 8, 5]


def test_exact_ties_keep_one_the_first():
    a, b = sig(1, 10, name="first"), sig(1, 10, name="second")
    f = pareto_frontier([a, b, sig(2, 10)])
    assert len(f) == 1 and f[0].name == "first"


def test_spec_section7_counterexample_te_unsafe_for_par():
    """s = 20 W, e1 = (T=5, d=100); a = (1 s, 100 J) dominates b = (2 s, 101 J) in (T, E), yet
    e1 ⊕ b = 261 J < e1 ⊕ a = 280 J. (T, E) pruning drops b; (T, d) pruning keeps it."""
    s = 20.0
    e1 = Signature("e1", s_w=s, time_s=5, d_j=100)
    a = Signature("x", s_w=s, time_s=1, d_j=100 - s * 1)
    b = Signature("x", s_w=s, time_s=2, d_j=101 - s * 2)
    assert (a.d_j, b.d_j) == (80, 61)
    assert par(e1, a).energy_j == pytest.approx(280)
    assert par(e1, b).energy_j == pytest.approx(261)
    te = pareto_frontier([a, b], "TE")
    td = pareto_frontier([a, b], "Td")
    assert list(te.points) == [a]
    assert set(td.points) == {a, b}
    # the better composite is only reachable from the (T, d) frontier
    best_te = min(par(e1, p).energy_j for p in te)
    best_td = min(par(e1, p).energy_j for p in td)
    assert best_te == pytest.approx(280) and best_td == pytest.approx(261)


def test_td_prunes_within_each_omega_dev_only():
    s = 20.0
    # c at W2 is better than a at W1 in (T, d) but cannot replace it inside a ⊕ at W1
    a = sig(2, d=50, s=s, omega=W1)
    c = sig(1, d=10, s=s, omega=W2)
    a2 = sig(3, d=60, s=s, omega=W1)  # dominated by a within W1
    f = pareto_frontier([a, c, a2], "Td")
    assert set(f.points) == {a, c}
    # sm_count is ω_elem: points differing only in SMs are one group
    g = pareto_frontier([sig(1, d=10, s=s, omega=W1.with_(sm_count=4)),
                         sig(2, d=20, s=s, omega=W1.with_(sm_count=8))], "Td")
    assert len(g) == 1


def test_td_with_differing_s_in_a_group_keeps_lower_s():
    p = sig(1, d=10, s=100)
    q = sig(2, d=20, s=50)  # worse in T and d, better in s
    assert len(pareto_frontier([p, q], "Td")) == 2
    assert len(pareto_frontier([p, q, sig(3, d=30, s=100)], "Td")) == 2


def test_tsd_across_omega_dev():
    # ⊕multi: omega_dev is free per device, so pruning may compare across ω_dev, in (T, s, d)
    p = sig(1, d=10, s=100, omega=W1)
    q = sig(2, d=5, s=40, omega=W2)
    r = sig(2, d=12, s=100, omega=W2)  # dominated by p in (T, s, d)
    f = pareto_frontier([p, q, r], "Tsd")
    assert set(f.points) == {p, q}


def test_unknown_criterion_and_empty_input():
    with pytest.raises(EnergyCalculusError, match="criterion"):
        pareto_frontier([sig(1, 1)], "TX")
    with pytest.raises(EnergyCalculusError, match="no signatures"):
        pareto_frontier([])
    with pytest.raises(EnergyCalculusError, match="no points"):
        Frontier(())


# -- the Frontier object ------------------------------------------------------------------------

def test_frontier_queries():
    pts = [sig(1, 10), sig(2, 8), sig(4, 5)]
    f = pareto_frontier(reversed(pts), name="gemm")
    assert f.name == "gemm" and len(f) == 3 and list(f) == pts
    assert f.fastest is pts[0] and f.cheapest is pts[2]
    assert f.energy_at(0.5) is None
    assert f.energy_at(1) is pts[0]
    assert f.energy_at(3.9) is pts[1]
    assert f.energy_at(100) is pts[2]
    with pytest.raises(ValueError):
        f.times_s[0] = 3.0  # read-only view


def test_energy_at_on_td_frontier_is_cheapest_not_last():
    s = 20.0
    a = sig(1, d=80, s=s)    # E = 100
    b = sig(2, d=61, s=s)    # E = 101
    f = pareto_frontier([a, b], "Td")
    assert f.energy_at(10) is a
    assert f.cheapest is a


def test_default_name_and_table():
    pts = [sig(1e-3, 0.5, kappa="cublas"), sig(2e-3, 0.4, omega=W2, var_energy_j2=1e-4)]
    f = pareto_frontier(pts)
    assert f.name == "k"
    tab = f.to_table()
    assert "T (ms)" in tab and "E (J)" in tab
    assert "cublas @ 1980MHz" in tab and "1410MHz" in tab
    assert "0.4000 ± 0.0100" in tab     # σ at the value's precision (frontier.units.pm)
    mixed = pareto_frontier([sig(1, 1, name="a"), sig(2, 0.5, name="b")])
    assert mixed.name == "frontier"


def test_achievable_set():
    t, e = achievable_set([sig(1, 10), sig(2, 12)])
    assert t.tolist() == [1, 2] and e.tolist() == [10, 12]


# -- serialization --------------------------------------------------------------------------------

def _rich_leaf():
    return Signature("gemm", s_w=123.4, time_s=1.6e-3, d_j=0.98, var_time_s2=1.3e-11,
                     var_energy_j2=1.7e-5, n=5, devices={"gpu1"},
                     omega=OperatingPoint(sm_clock_mhz=1410, power_limit_w=500, sm_count=66),
                     kappa="cuBLAS", theta="bf16 8192^3",
                     meta={"clocks_seen": (1410, 1395), "temp_c": np.float64(55.5)})


def test_signature_round_trip_keeps_identity():
    a = _rich_leaf()
    d = json.loads(json.dumps(signature_to_dict(a)))
    assert d["omega"]["sm_count"] == 66 and d["devices"] == ["gpu1"] and d["kappa"] == "cuBLAS"
    assert d["meta"]["clocks_seen"] == [1410, 1395]
    back = signature_from_dict(d, "f.json", "x")
    assert back.key == a.key and back == a  # same leaf: shared error is recognised
    assert back.var_energy_j2 == a.var_energy_j2 and back.theta == a.theta


def test_composite_round_trip_keeps_propagation():
    a = _rich_leaf()
    c = seq([a] * 3)
    back = signature_from_dict(json.loads(json.dumps(signature_to_dict(c))))
    assert back.composed and back.var_energy_j2 == c.var_energy_j2
    # composing the loaded composite with the same leaf still counts the error as shared
    assert seq(back, a).sd_energy_j == pytest.approx(seq(c, a).sd_energy_j)
    assert seq(back, a).sd_energy_j == pytest.approx(4 * a.sd_energy_j)


def test_frontier_round_trip():
    f = pareto_frontier([_rich_leaf(), sig(2e-3, 0.1, s=10, devices={"gpu1"})], name="g")
    d = json.loads(json.dumps(f.to_dict()))
    assert d["format"] == "ecal.frontier/1" and d["criterion"] == "TE"
    g = Frontier.from_dict(d, "g.json")
    assert g == f and g.name == "g"
    assert all(p.key == q.key for p, q in zip(g, f))


@pytest.mark.parametrize("mutate, where, what", [
    (lambda d: d["points"][1].__setitem__("time_s", "fast"), "points[1].time_s", "number"),
    (lambda d: d["points"][0].pop("s_w"), "points[0].s_w", "missing"),
    (lambda d: d["points"][0].__setitem__("energy_j", 99.0), "points[0].energy_j", "disagrees"),
    (lambda d: d["points"][0].__setitem__("sd_energy_j", 1.0), "points[0].sd_energy_j", "disagrees"),
    (lambda d: d["points"][0].__setitem__("omega", {"clock": 5}), "points[0].omega", "knob"),
    (lambda d: d["points"][0].__setitem__("tim_s", 5), "points[0].tim_s", "unknown field"),
    (lambda d: d["points"][0].__setitem__("composed", "yes"), "points[0].composed", "true or false"),
    (lambda d: d["points"][0].__setitem__("terms", {}), "points[0].terms", "only a composed"),
    (lambda d: d.__setitem__("points", []), "points", "at least one"),
    (lambda d: d.__setitem__("criterion", "XY"), "criterion", "must be one of"),
    (lambda d: d.__setitem__("format", "other"), "format", "expected"),
    (lambda d: d.__setitem__("format", "ecal.frontier/2"), "format", "unsupported"),
    (lambda d: d["units"].__setitem__("time", "ms"), "units.time", "SI"),
])
def test_frontier_file_errors_name_the_path(mutate, where, what):
    d = json.loads(json.dumps(pareto_frontier([sig(1, 10, s=2), sig(2, 8, s=2)]).to_dict()))
    mutate(d)
    with pytest.raises(FormatError) as ei:
        Frontier.from_dict(d, "front.json")
    msg = str(ei.value)
    assert msg.startswith(f"front.json: {where}:"), msg
    assert what in msg


def test_frontier_from_dict_rejects_non_object():
    with pytest.raises(FormatError, match="x.json"):
        Frontier.from_dict([1, 2], "x.json")


def test_signature_from_dict_reads_hand_written_points():
    s = signature_from_dict({"name": "k", "s_w": 100, "time_s": 0.002, "energy_j": 0.5,
                             "sd_energy_j": 0.01, "omega": {"sm_clock_mhz": 1200}})
    assert s.d_j == pytest.approx(0.3) and s.var_energy_j2 == pytest.approx(1e-4)
    assert s.omega.sm_clock_mhz == 1200


# -- hypothesis properties of pruning -------------------------------------------------------------

coord = st.one_of(st.integers(0, 6).map(float), st.floats(0, 100, allow_nan=False))
pts3 = st.lists(st.tuples(coord, coord, coord), min_size=1, max_size=40)


def _weakly_dominates(q, p):
    return all(a <= b for a, b in zip(q, p))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pts3, st.sampled_from([2, 3]))
def test_nondominated_properties(raw, dims):
    cols = [np.array([r[k] for r in raw]) for k in range(dims)]
    kept = nondominated(*cols, block=7)  # small blocks exercise the blockwise path
    P = [tuple(c[i] for c in cols) for i in range(len(raw))]
    K = [P[i] for i in kept]
    assert len(set(kept.tolist())) == len(kept)
    # no kept point is weakly dominated by another kept point (ties: only one kept)
    for i, p in enumerate(K):
        for j, q in enumerate(K):
            if i != j:
                assert not _weakly_dominates(q, p), (q, p)
    # every input point is weakly dominated by (or equal to) some kept point
    for p in P:
        assert any(_weakly_dominates(q, p) for q in K)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 8), st.integers(0, 60),
                          st.sampled_from([1980.0, 1410.0])), min_size=1, max_size=25),
       st.sampled_from(["TE", "Td", "Tsd"]))
def test_pareto_frontier_properties(raw, criterion):
    sigs = [Signature(f"p{i}", s_w=s, time_s=t, d_j=d, omega=OperatingPoint(sm_clock_mhz=w))
            for i, (t, s, d, w) in enumerate(raw)]
    f = pareto_frontier(sigs, criterion)
    kept = list(f.points)
    assert all(any(k is s for s in sigs) for k in kept)  # subset of the input
    assert list(f.times_s) == sorted(f.times_s)

    def key(p):
        if criterion == "TE":
            return (p.time_s, p.energy_j)
        if criterion == "Tsd":
            return (p.time_s, p.s_w, p.d_j)
        return (p.time_s, p.s_w, p.d_j)  # within a group

    def comparable(p, q):
        return criterion != "Td" or (p.omega.dev == q.omega.dev and p.devices == q.devices)

    for p in kept:
        for q in kept:
            if p is not q and comparable(p, q):
                assert not _weakly_dominates(key(q), key(p))
    for p in sigs:
        assert any(comparable(p, q) and _weakly_dominates(key(q), key(p)) for q in kept)


# -- ε-thinning -------------------------------------------------------------------------------------

def test_thin_hand_case_and_errors():
    f = pareto_frontier([sig(1, 100), sig(2, 99.5), sig(3, 99.2), sig(4, 50), sig(5, 49.9)])
    g = thin(f, 0.01)
    assert [p.time_s for p in g] == [1, 4, 5]  # fastest and cheapest always kept
    assert g.meta["thinned"] and g.meta["energy_bound_factor"] == pytest.approx(1.01)
    assert thin(f, 0.0).points == f.points
    with pytest.raises(EnergyCalculusError, match="eps"):
        thin(f, -1)
    with pytest.raises(EnergyCalculusError, match="Td"):
        thin(pareto_frontier(f.points, "Td"), 0.1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-4, 10), st.floats(0, 1e3)), min_size=1, max_size=60),
       st.floats(0, 2))
def test_thin_bound_at_every_deadline(raw, eps):
    f = pareto_frontier([sig(t, e) for t, e in raw])
    g = thin(f, eps)
    assert set(g.points) <= set(f.points)
    deadlines = list(f.times_s) + [float(x) for x in np.linspace(0, 11, 23)]
    for D in deadlines:
        orig, th = f.energy_at(D), g.energy_at(D)
        if orig is None:
            assert th is None
            continue
        assert th is not None  # still feasible wherever the original was
        assert th.energy_j <= (1 + eps) * orig.energy_j * (1 + 1e-12) + 1e-12


def test_thin_reduces_a_dense_frontier():
    t = np.linspace(1, 2, 2000)
    f = pareto_frontier([sig(float(x), float(100 / x)) for x in t])
    g = thin(f, 0.01)
    assert len(g) < 80
    assert math.log(2) / math.log(1.01) - 2 <= len(g)


def test_frontier_rejects_bad_points():
    with pytest.raises(EnergyCalculusError, match="Signature"):
        Frontier((1, 2))
    with pytest.raises(EnergyCalculusError, match="criterion"):
        Frontier((sig(1, 1),), criterion="XY")


def test_td_keeps_the_few_sm_point_that_makes_par_fit():
    """Kareus' "few SMs for communication": slower and costlier in (T, d), yet the only point
    that leaves room for the other branch."""
    s = 50.0
    fast = sig(1, d=10, s=s, omega=W1.with_(sm_count=132))
    small = sig(2, d=12, s=s, omega=W1.with_(sm_count=8))
    assert set(pareto_frontier([fast, small], "Td").points) == {fast, small}
    assert list(pareto_frontier([fast, small, sig(3, d=13, s=s, omega=W1.with_(sm_count=8))],
                                "Td").points) == [fast, small]
