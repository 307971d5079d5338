"""Frontier composition against brute force (spec §9.2; spec §14 vector 5)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frontier import (
    CompositionError,
    OperatingPoint,
    PruningWarning,
    Signature,
    compose_par,
    compose_par_multi,
    compose_seq,
    par,
    par_multi,
    pareto_frontier,
    seq,
)
from frontier.pareto import nondominated

W = [OperatingPoint(sm_clock_mhz=c) for c in (1980.0, 1410.0)]
S_OF = {W[0]: 120.0, W[1]: 90.0}  # static power is the device's, per ω_dev


def brute_front(combos):
    """Pareto set of (T, E) over all combinations, as a sorted array."""
    t = np.array([c[0] for c in combos], dtype=float)
    e = np.array([c[1] for c in combos], dtype=float)
    idx = nondominated(t, e)
    return np.array(sorted(zip(t[idx], e[idx])))


def front_arr(f):
    return np.array(sorted(zip(f.times_s, f.energies_j)))


def assert_same_front(f, combos):
    got, want = front_arr(f), brute_front(combos)
    assert got.shape == want.shape, (got, want)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def element(draw_pts, name, device="gpu0"):
    return [Signature(name, s_w=S_OF[W[w]] if s is None else s, time_s=t, d_j=d,
                      devices={device}, omega=W[w].with_(sm_count=sm) if sm else W[w])
            for (t, d, w, sm, s) in draw_pts]


# integer grids: sums are exact in floating point, so brute force and the DP agree exactly
pt = st.tuples(st.integers(1, 9).map(float), st.integers(0, 40).map(float), st.integers(0, 1),
               st.none(), st.none())
elems = st.lists(st.lists(pt, min_size=2, max_size=6), min_size=2, max_size=4)


# -- ⊗ ---------------------------------------------------------------------------------------------

def test_seq_hand_case():
    a = [Signature("a", s_w=0, time_s=1, d_j=10), Signature("a", s_w=0, time_s=2, d_j=5)]
    b = [Signature("b", s_w=0, time_s=1, d_j=4), Signature("b", s_w=0, time_s=3, d_j=1)]
    f = compose_seq(a, b)
    # (2,14) (3,9) (4,11)x (5,6) -> (4,11) dominated by (3,9)
    assert [(p.time_s, p.energy_j) for p in f] == [(2, 14), (3, 9), (5, 6)]
    assert f.name == "seq(a, b)" and f.criterion == "TE"
    assert f[0].meta["choice"] == ["default", "default"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elems)
def test_seq_equals_brute_force(raw):
    es = [element(r, f"e{i}") for i, r in enumerate(raw)]
    combos = [(sum(p.time_s for p in c), sum(p.energy_j for p in c)) for c in itertools.product(*es)]
    f = compose_seq(*es)
    assert_same_front(f, combos)
    # inputs given as frontiers give the same answer (pruning before ⊗ in (T, E) is safe)
    g = compose_seq(*[pareto_frontier(e) for e in es])
    np.testing.assert_allclose(front_arr(g), front_arr(f))


def test_seq_points_are_real_composites_with_propagated_variance():
    rng = np.random.default_rng(1)
    es = [[Signature(f"e{i}", s_w=100, time_s=float(rng.uniform(1, 2)), d_j=float(rng.uniform(5, 50)),
                     var_time_s2=1e-4, var_energy_j2=float(rng.uniform(0.1, 1.0)),
                     omega=W[j]) for j in range(2)] for i in range(3)]
    f = compose_seq(*es)
    for p in f:
        assert p.composed and p.meta["op"] == "seq"
        parts = [next(q for q in es[i] if q.omega.label() == lab) for i, lab in enumerate(p.meta["choice"])]
        ref = seq(*parts)
        assert p.energy_j == pytest.approx(ref.energy_j)
        assert p.var_energy_j2 == pytest.approx(ref.var_energy_j2)
        assert p.var_energy_j2 > 0


def test_seq_same_element_twice_counts_shared_error():
    g = [Signature("g", s_w=100, time_s=1.0, d_j=10, var_energy_j2=4.0)]
    f = compose_seq(g, g, g)
    assert f[0].sd_energy_j == pytest.approx(3 * 2.0)  # k·σ, not √k·σ


def test_seq_rejects_mixed_devices():
    a = [Signature("a", s_w=1, time_s=1, d_j=1, devices={"gpu0"})]
    b = [Signature("b", s_w=1, time_s=1, d_j=1, devices={"gpu1"})]
    with pytest.raises(CompositionError, match="device"):
        compose_seq(a, b)


def test_seq_max_points_thins_and_says_so():
    rng = np.random.default_rng(7)
    es = [[Signature(f"e{i}", s_w=0, time_s=t, d_j=100 / t)
           for t in rng.uniform(1, 3, 8)] for i in range(6)]
    exact = compose_seq(*es)
    capped = compose_seq(*es, max_points=12)
    assert len(exact) > 12 and len(capped) <= 12
    assert "ε-thinned" in capped.name and capped.meta["thinned"]
    factor = capped.meta["energy_bound_factor"]
    assert factor > 1
    for D in exact.times_s:
        e_exact = exact.energy_at(D).energy_j
        got = capped.energy_at(D)
        assert got is not None and got.energy_j <= factor * e_exact * (1 + 1e-12)
    assert capped.fastest.time_s == exact.fastest.time_s


def test_seq_single_input_and_errors():
    a = [Signature("a", s_w=0, time_s=1, d_j=10), Signature("a", s_w=0, time_s=2, d_j=12)]
    assert len(compose_seq(a)) == 1
    with pytest.raises(CompositionError):
        compose_seq()
    with pytest.raises(CompositionError, match="TransitionTable"):
        compose_seq(a, a, transitions={"x": 1})


# -- ⊕ ---------------------------------------------------------------------------------------------

par_pt = st.tuples(st.integers(1, 9).map(float), st.integers(0, 40).map(float), st.integers(0, 1),
                   st.integers(1, 4), st.none())
par_elems = st.lists(st.lists(par_pt, min_size=2, max_size=6), min_size=2, max_size=4)


def brute_par(es, sm_total):
    out = []
    for c in itertools.product(*es):
        if len({p.omega.dev for p in c}) != 1:
            continue
        if sm_total is not None and sum(p.omega.sm_count or 0 for p in c) > sm_total:
            continue
        t = max(p.time_s for p in c)
        s = c[max(range(len(c)), key=lambda i: c[i].time_s)].s_w
        out.append((t, s * t + sum(p.d_j for p in c)))
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(par_elems, st.sampled_from([None, 6, 9]))
def test_par_equals_brute_force(raw, sm_total):
    es = [element(r, f"e{i}") for i, r in enumerate(raw)]
    combos = brute_par(es, sm_total)
    if not combos:
        with pytest.raises(CompositionError, match="no feasible"):
            compose_par(*es, sm_total=sm_total)
        return
    f = compose_par(*es, sm_total=sm_total)
    assert_same_front(f, combos)
    for p in f:  # real composites, jointly feasible
        assert p.meta["op"] == "par"
        if sm_total is not None:
            assert p.omega.sm_count <= sm_total


def test_par_spec_counterexample_from_achievable_set_and_warning():
    s = 20.0
    e1 = [Signature("e1", s_w=s, time_s=5, d_j=100)]
    x = [Signature("x", s_w=s, time_s=1, d_j=80), Signature("x", s_w=s, time_s=2, d_j=61)]
    f = compose_par(e1, x)
    assert f.cheapest.energy_j == pytest.approx(261)
    with pytest.warns(PruningWarning, match="spec §7"):
        g = compose_par(e1, pareto_frontier(x, "TE"))
    assert g.cheapest.energy_j == pytest.approx(280)  # what (T, E) pruning costs
    assert g.meta["warnings"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = compose_par(e1, pareto_frontier(x, "Td"))
    assert h.cheapest.energy_j == pytest.approx(261)


def test_par_only_combines_equal_omega_dev():
    a = [Signature("a", s_w=100, time_s=1, d_j=1, omega=W[0])]
    b = [Signature("b", s_w=90, time_s=1, d_j=1, omega=W[1])]
    with pytest.raises(CompositionError, match="no ω_dev in common"):
        compose_par(a, b)
    b.append(Signature("b", s_w=100, time_s=3, d_j=1, omega=W[0]))
    f = compose_par(a, b)
    assert len(f) == 1 and f[0].time_s == 3 and f[0].omega.dev == W[0]


def test_par_sm_total_from_meta():
    a = [Signature("a", s_w=100, time_s=1, d_j=1, omega=W[0].with_(sm_count=100), meta={"sm_total": 108}),
         Signature("a", s_w=100, time_s=2, d_j=1, omega=W[0].with_(sm_count=50))]
    b = [Signature("b", s_w=100, time_s=1.5, d_j=1, omega=W[0].with_(sm_count=50))]
    f = compose_par(a, b)
    assert [p.omega.sm_count for p in f] == [100]  # 100 + 50 > 108 is infeasible
    assert f[0].time_s == 2


def test_par_matches_par_operator_values():
    a = [Signature("cmp", s_w=80, time_s=4e-3, d_j=0.78, var_energy_j2=1e-4)]
    b = [Signature("ar", s_w=80, time_s=2e-3, d_j=0.04, var_energy_j2=1e-6)]
    f = compose_par(a, b)
    ref = par(a[0], b[0])
    assert f[0].energy_j == pytest.approx(1.14) and f[0].var_energy_j2 == pytest.approx(ref.var_energy_j2)


# -- ⊕multi (spec vector 5) ---------------------------------------------------------------------------

multi_pt = st.tuples(st.integers(1, 9).map(float), st.integers(0, 40).map(float), st.integers(0, 1),
                     st.none(), st.integers(10, 150).map(float))
multi_elems = st.lists(st.lists(multi_pt, min_size=2, max_size=6), min_size=2, max_size=4)


def brute_multi(es):
    out = []
    for c in itertools.product(*es):
        t = max(p.time_s for p in c)
        out.append((t, sum(p.s_w for p in c) * t + sum(p.d_j for p in c)))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multi_elems)
def test_par_multi_decoupled_equals_brute_force(raw):
    es = [element(r, f"e{i}", device=f"gpu{i}") for i, r in enumerate(raw)]
    f = compose_par_multi(*es)
    assert_same_front(f, brute_multi(es))


def test_par_multi_200_random_trials_spec_vector_5():
    rng = np.random.default_rng(2024)
    for _ in range(200):
        k = int(rng.integers(2, 5))
        es = []
        for i in range(k):
            n = int(rng.integers(2, 7))
            es.append([Signature(f"e{i}", s_w=float(rng.uniform(50, 150)), time_s=float(rng.uniform(0.5, 3)),
                                 d_j=float(rng.uniform(0, 200)), devices={f"gpu{i}"}) for _ in range(n)])
        assert_same_front(compose_par_multi(*es), brute_multi(es))


def test_par_multi_slows_the_non_critical_branch():
    # Perseus: a short branch picks its cheapest point that still meets the makespan
    long = [Signature("long", s_w=100, time_s=5, d_j=300, devices={"gpu0"})]
    short = [Signature("short", s_w=100, time_s=1, d_j=100, devices={"gpu1"}, omega=W[0]),
             Signature("short", s_w=80, time_s=4, d_j=40, devices={"gpu1"}, omega=W[1])]
    f = compose_par_multi(long, short)
    assert len(f) == 1
    assert f[0].meta["choice"][1] == "1410MHz"
    ref = par_multi(long[0], short[1])
    assert f[0].energy_j == pytest.approx(ref.energy_j) == pytest.approx(180 * 5 + 340)


def test_par_multi_rejects_shared_devices_and_warns_on_te_inputs():
    a = [Signature("a", s_w=1, time_s=1, d_j=1, devices={"gpu0"})]
    with pytest.raises(CompositionError, match="disjoint"):
        compose_par_multi(a, a)
    b = [Signature("b", s_w=1, time_s=1, d_j=1, devices={"gpu1"})]
    with pytest.warns(PruningWarning):
        compose_par_multi(pareto_frontier(a), b)


def test_par_multi_max_points():
    rng = np.random.default_rng(3)
    es = [[Signature(f"e{i}", s_w=20.0, time_s=float(t), d_j=float(300 / t**2 + rng.uniform(0, 1)),
                     devices={f"gpu{i}"}) for t in rng.uniform(0.5, 3, 40)] for i in range(3)]
    exact = compose_par_multi(*es)
    capped = compose_par_multi(*es, max_points=5)
    assert len(capped) <= 5 < len(exact)
    assert capped.meta["thinned"]


def test_nested_composition_seq_of_pars():
    s = 50.0
    cmp = [Signature("cmp", s_w=s, time_s=t, d_j=d) for t, d in ((2, 100), (3, 70))]
    com = [Signature("com", s_w=s, time_s=t, d_j=d) for t, d in ((1, 20), (2.5, 10))]
    layer = compose_par(cmp, com)
    model = compose_seq(layer, layer)
    brute = []
    for c1, m1, c2, m2 in itertools.product(cmp, com, cmp, com):
        a, b = par(c1, m1), par(c2, m2)
        brute.append((a.time_s + b.time_s, a.energy_j + b.energy_j))
    assert_same_front(model, brute)
