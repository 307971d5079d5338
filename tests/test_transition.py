"""Transition elements e_{ω→ω'} and the ω_dev-state DP of compose_seq (spec §9.2, §9.5)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frontier import (
    EnergyCalculusError,
    FormatError,
    OperatingPoint,
    Signature,
    TransitionTable,
    compose_seq,
    seq,
)
from frontier.pareto import nondominated
from frontier.transition import ASSUMED_SWITCH_TIME_S

A = OperatingPoint(sm_clock_mhz=1980)
B = OperatingPoint(sm_clock_mhz=1410)
C = OperatingPoint(sm_clock_mhz=1410, power_limit_w=500)
S_OF = {A: 120.0, B: 90.0, C: 80.0}


# -- the table --------------------------------------------------------------------------------------

def test_constant_cost_and_zero_when_unchanged():
    tt = TransitionTable.constant(0.01, 0.5)
    assert tt.cost(A, B) == (0.01, 0.5)
    assert tt.cost(A, A) == (0.0, 0.0)
    # only ω_dev matters: a different SM allocation is not a device switch
    assert tt.cost(A.with_(sm_count=8), A.with_(sm_count=100)) == (0.0, 0.0)
    assert tt.cost(None, B) == (0.0, 0.0)


def test_per_knob_costs_add_and_pairs_win():
    tt = TransitionTable.per_knob(sm_clock_mhz=(0.01, 1.0), power_limit_w=(0.1, 2.0))
    assert tt.cost(A, B) == (0.01, 1.0)
    assert tt.cost(A, C) == pytest.approx((0.11, 3.0))
    assert tt.cost(B, C) == (0.1, 2.0)
    assert tt.cost(A, OperatingPoint(sm_clock_mhz=1980, mem_clock_mhz=2201)) == (0.0, 0.0)  # unlisted knob
    both = TransitionTable(knobs=(("sm_clock_mhz", (0.01, 1.0)),), constant_cost=(0.5, 5.0))
    assert both.cost(A, OperatingPoint(sm_clock_mhz=1980, mem_clock_mhz=2201)) == (0.5, 5.0)
    pairs = TransitionTable.from_pairs({(A, B): (0.02, 0.3)}, default=(0.05, 1.0))
    assert pairs.cost(A, B) == (0.02, 0.3)
    assert pairs.cost(B, A) == (0.05, 1.0)


def test_assumed_default_is_labelled_an_assumption():
    tt = TransitionTable.assumed_default("gpu0")
    assert tt.cost(A, B) == (ASSUMED_SWITCH_TIME_S, 0.0)
    assert tt.cost(A, C) == pytest.approx((2 * ASSUMED_SWITCH_TIME_S, 0.0))
    assert "assumed" in tt.source


def test_element_energy_is_at_least_static_during_the_stall():
    tt = TransitionTable.constant(0.01, 0.5)
    e = tt.element(A, B, "gpu0", s_w=120.0)
    assert e.time_s == 0.01 and e.d_j == 0.0 and e.energy_j == pytest.approx(1.2)
    assert e.devices == frozenset({"gpu0"}) and e.omega == B and e.meta["source"] == "transition"
    e2 = TransitionTable.constant(0.01, 5.0).element(A, B, "gpu0", s_w=120.0)
    assert e2.d_j == pytest.approx(5.0 - 1.2) and e2.energy_j == pytest.approx(5.0)
    # composes with ⊗ like any element
    k = Signature("k", s_w=120.0, time_s=1.0, d_j=10.0)
    assert seq(k, e2, k).energy_j == pytest.approx(2 * 130 + 5)


def test_bad_costs_are_rejected():
    with pytest.raises(EnergyCalculusError, match=">= 0"):
        TransitionTable.constant(-1, 0)
    with pytest.raises(EnergyCalculusError, match="device knob"):
        TransitionTable.per_knob(sm_count=(0.1, 0))


def test_table_round_trip_and_errors():
    tt = TransitionTable(pairs=(((A, B), (0.02, 0.3)),), knobs=(("power_limit_w", (0.1, 0.0)),),
                         constant_cost=(0.05, 1.0), device="gpu0", source="measured 2026-01")
    d = json.loads(json.dumps(tt.to_dict()))
    back = TransitionTable.from_dict(d, "t.json")
    assert back == tt
    for a, b in itertools.product([A, B, C], repeat=2):
        assert back.cost(a, b) == tt.cost(a, b)
    bad = json.loads(json.dumps(d))
    bad["pairs"][0]["time_s"] = "slow"
    with pytest.raises(FormatError, match=r"t.json: pairs\[0\].time_s: must be a number"):
        TransitionTable.from_dict(bad, "t.json")
    bad = json.loads(json.dumps(d))
    bad["knobs"]["sm_count"] = {"time_s": 1}
    with pytest.raises(FormatError, match="knobs.sm_count"):
        TransitionTable.from_dict(bad, "t.json")
    bad = json.loads(json.dumps(d))
    bad["pairs"][0]["from"] = {"clock": 1}
    with pytest.raises(FormatError, match=r"pairs\[0\].from"):
        TransitionTable.from_dict(bad, "t.json")


# -- DP over ω_dev states ---------------------------------------------------------------------------

def el(name, pts):
    return [Signature(name, s_w=S_OF[w], time_s=t, d_j=d, omega=w) for t, d, w in pts]


def brute_seq_with_transitions(es, tt, initial=None):
    out = []
    for c in itertools.product(*es):
        t = sum(p.time_s for p in c)
        e = sum(p.energy_j for p in c)
        prev_w, prev_s = initial, None
        for p in c:
            if prev_w is not None:
                tau, eps = tt.cost(prev_w, p.omega.dev)
                if tau or eps:
                    t += tau
                    e += max(eps, (p.s_w if prev_s is None else prev_s) * tau)
            prev_w, prev_s = p.omega.dev, p.s_w
        out.append((t, e))
    t = np.array([x[0] for x in out])
    e = np.array([x[1] for x in out])
    idx = nondominated(t, e)
    return np.array(sorted(zip(t[idx], e[idx])))


def front(f):
    return np.array(sorted(zip(f.times_s, f.energies_j)))


def test_zero_transitions_equal_plain_compose_seq():
    rng = np.random.default_rng(5)
    es = [el(f"e{i}", [(float(rng.uniform(1, 3)), float(rng.uniform(0, 100)), w) for w in (A, B, C)])
          for i in range(4)]
    plain = compose_seq(*es)
    zero = compose_seq(*es, transitions=TransitionTable.zero())
    assert len(plain) == len(zero)
    for p, q in zip(plain, zero):
        assert p.time_s == pytest.approx(q.time_s) and p.energy_j == pytest.approx(q.energy_j)
        assert p.var_energy_j2 == pytest.approx(q.var_energy_j2)
        assert p.meta["choice"] == q.meta["choice"] and q.meta["switches"] == 0


def test_expensive_transitions_keep_one_omega_dev():
    # Without switching costs the cheapest plan mixes clocks; with costly switches it keeps one.
    a = [Signature("a", s_w=0, time_s=1, d_j=10, omega=A), Signature("a", s_w=0, time_s=2, d_j=5, omega=B)]
    b = [Signature("b", s_w=0, time_s=1, d_j=5, omega=A), Signature("b", s_w=0, time_s=2, d_j=8, omega=B)]
    free = compose_seq(a, b, transitions=TransitionTable.zero())
    assert free.cheapest.meta["choice"] == ["1410MHz", "1980MHz"] and free.cheapest.energy_j == 10
    dear = compose_seq(a, b, transitions=TransitionTable.constant(0.5, 100.0))
    for p in dear:
        assert len(set(p.meta["choice"])) == 1 and p.meta["switches"] == 0
    assert dear.cheapest.energy_j == 13 and dear.cheapest.meta["choice"] == ["1410MHz", "1410MHz"]


def test_moderate_transitions_are_inserted_as_elements():
    a = [Signature("a", s_w=100, time_s=1, d_j=100, omega=A), Signature("a", s_w=50, time_s=1.2, d_j=10, omega=B)]
    b = [Signature("b", s_w=100, time_s=1, d_j=10, omega=A), Signature("b", s_w=50, time_s=3, d_j=100, omega=B)]
    tt = TransitionTable.constant(0.01, 2.0)
    f = compose_seq(a, b, transitions=tt)
    mixed = [p for p in f if p.meta["switches"] == 1]
    assert mixed, f.to_table()
    p = mixed[0]
    # T = 1.2 + 0.01 + 1, E = 70 + max(2, 50·0.01) + 110
    assert p.time_s == pytest.approx(2.21) and p.energy_j == pytest.approx(182.0)
    assert any("switch" in name for name in p.meta["parts"])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.integers(1, 9).map(float), st.integers(0, 40).map(float),
                                   st.sampled_from([A, B, C])), min_size=2, max_size=6),
                min_size=2, max_size=4),
       st.sampled_from([(0.0, 0.0), (0.5, 0.0), (1.0, 30.0), (0.0, 7.0)]),
       st.sampled_from([None, A]))
def test_dp_equals_brute_force(raw, cost, initial):
    es = [el(f"e{i}", r) for i, r in enumerate(raw)]
    tt = TransitionTable.per_knob(sm_clock_mhz=cost, power_limit_w=(cost[0] / 2, cost[1] / 2))
    f = compose_seq(*es, transitions=tt, initial_dev=initial)
    want = brute_seq_with_transitions(es, tt, initial)
    got = front(f)
    assert got.shape == want.shape, (got, want)
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_initial_dev_charges_the_first_switch():
    a = [Signature("a", s_w=90, time_s=1, d_j=10, omega=B)]
    tt = TransitionTable.constant(0.1, 50.0)
    f = compose_seq(a, a, transitions=tt, initial_dev=A)
    assert f[0].time_s == pytest.approx(2.1) and f[0].energy_j == pytest.approx(2 * 100 + 50)
    assert f[0].meta["switches"] == 1


def test_dp_max_points_reports_thinning():
    rng = np.random.default_rng(11)
    es = [el(f"e{i}", [(float(t), float(200 / t), w) for t in rng.uniform(1, 3, 6) for w in (A, B)])
          for i in range(8)]
    tt = TransitionTable.constant(0.01, 0.1)
    exact = compose_seq(*es, transitions=tt)
    capped = compose_seq(*es, transitions=tt, max_points=8)
    assert len(capped) <= 8 < len(exact)
    fac = capped.meta["energy_bound_factor"]
    for D in exact.times_s:
        assert capped.energy_at(D).energy_j <= fac * exact.energy_at(D).energy_j * (1 + 1e-12)


def test_te_frontier_input_with_transitions_warns():
    from frontier import PruningWarning, pareto_frontier

    # (T, E) pruning drops b@B (dominated by b@A), yet with costly switches a@B + b@B is best
    a = [Signature("a", s_w=0, time_s=1, d_j=20, omega=A), Signature("a", s_w=0, time_s=2, d_j=5, omega=B)]
    b = [Signature("b", s_w=0, time_s=1, d_j=5, omega=A), Signature("b", s_w=0, time_s=2, d_j=8, omega=B)]
    tt = TransitionTable.constant(0.0, 100.0)
    with pytest.warns(PruningWarning, match="switching"):
        lossy = compose_seq(a, pareto_frontier(b, "TE"), transitions=tt)
    exact = compose_seq(a, pareto_frontier(b, "Td"), transitions=tt)
    assert exact.cheapest.energy_j == 13 and lossy.cheapest.energy_j == 25
