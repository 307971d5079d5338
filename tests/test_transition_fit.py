"""Transitions are never free by accident (issue 20): measured pairs are used as measured, other
pairs come from a rule fitted to them, and what the rule cannot price raises."""

import json

import numpy as np
import pytest

from frontier.errors import EnergyCalculusError, FormatError
from frontier.operating_point import OperatingPoint
from frontier.transition import (
    FittedRule,
    TransitionRuleError,
    TransitionTable,
    fit_transition_rule,
)


def W(sm, pl=None, mem=None) -> OperatingPoint:
    return OperatingPoint(sm_clock_mhz=sm, power_limit_w=pl, mem_clock_mhz=mem)


def _synthetic(clocks, limits, c0=0.004, c_sm=0.02, c_pl=0.03, noise=0.0, seed=0):
    """Pairs with τ = c0 + c_sm·|Δ SM| (GHz) + c_pl·[PL changes], ε = 100 W × τ."""
    rng = np.random.default_rng(seed)
    omegas = [W(s, p) for s in clocks for p in limits]
    pairs = {}
    for a in omegas:
        for b in omegas:
            if a == b:
                continue
            t = (c0 + c_sm * abs(a.sm_clock_mhz - b.sm_clock_mhz) / 1000
                 + c_pl * (a.power_limit_w != b.power_limit_w) + noise * rng.standard_normal())
            pairs[(a, b)] = (max(t, 0.0), 100.0 * max(t, 0.0))
    return pairs


def test_measured_pairs_as_measured_and_others_from_the_fitted_rule():
    pairs = _synthetic([1980, 1410], [700, 500])
    table = TransitionTable.fitted(pairs, source="synthetic")
    a, b = W(1980, 700), W(1410, 500)
    assert table.cost(a, b) == pairs[(a, b)]                    # measured: as measured
    # the pairs: 1260/500 and 1620/700 were never measured
    c, d = W(1260, 500), W(1620, 700)
    t, e = table.cost(c, d)
    assert t == pytest.approx(0.004 + 0.02 * 0.36 + 0.03, rel=1e-6)   # the exact law comes back
    assert e == pytest.approx(100.0 * t, rel=1e-6)     # ε = ready power × τ (highest measured)
    assert t > 0 and e > 0
    assert table.cost(c, c) == (0.0, 0.0)
    r = table.rule
    assert r.n_pairs == len(pairs) and r.rms_residual_s < 1e-9
    assert "NNLS" in r.describe() and "residual" in r.describe()


def test_noisy_fit_is_close_and_reports_its_residual():
    pairs = _synthetic([1980, 1620, 1410, 990], [700, 500], noise=0.001, seed=3)
    rule = fit_transition_rule(pairs)
    coef = dict(zip(rule.features, rule.coef_s))
    assert coef["d_sm_clock_ghz"] == pytest.approx(0.02, abs=0.003)
    assert coef["power_limit_changes"] == pytest.approx(0.03, abs=0.002)
    assert 0.0003 < rule.rms_residual_s < 0.002
    assert rule.max_abs_residual_s >= rule.rms_residual_s
    # the rule's own predictions have that residual against the pairs it was fitted to
    res = [rule.time_s(a, b) - t for (a, b), (t, _) in pairs.items()]
    assert float(np.sqrt(np.mean(np.square(res)))) == pytest.approx(rule.rms_residual_s, rel=1e-6)


def test_a_knob_no_measured_pair_changes_raises_not_free():
    pairs = _synthetic([1980, 1410, 990], [700])       # no measured power-limit change
    table = TransitionTable.fitted(pairs)
    assert dict(table.rule.held)["power_limit_changes"] == 0.0
    t, _ = table.cost(W(1620, 700), W(1260, 700))      # covered: same limit, a clock step
    assert t > 0
    with pytest.raises(TransitionRuleError, match="power_limit_changes"):
        table.cost(W(1260, 500), W(1620, 700))
    with pytest.raises(TransitionRuleError, match="one side only"):
        table.cost(W(1980, 700), OperatingPoint(power_limit_w=700))
    assert issubclass(TransitionRuleError, EnergyCalculusError)


def test_pairs_without_a_rule_raise_and_the_empty_table_stays_free():
    a, b, c = W(1980), W(1410), W(990)
    table = TransitionTable.from_pairs({(a, b): (0.01, 1.0)})
    assert table.cost(a, b) == (0.01, 1.0)
    with pytest.raises(TransitionRuleError, match="not measured"):
        table.cost(b, c)
    # an old (version 1) file of pairs only reads, and its unmeasured pairs raise too
    old = {"format": "energy-calculus/transitions", "version": 1, "constant": None, "knobs": {},
           "pairs": [{"from": a.to_dict(), "to": b.to_dict(), "time_s": 0.01, "energy_j": 1.0}]}
    back = TransitionTable.from_dict(old)
    assert back.cost(a, b) == (0.01, 1.0)
    with pytest.raises(TransitionRuleError):
        back.cost(b, a)
    # explicit defaults keep working
    assert TransitionTable.from_pairs({(a, b): (0.01, 1.0)}, default=(0.5, 2.0)).cost(b, c) == (0.5, 2.0)
    assert TransitionTable.zero().cost(a, b) == (0.0, 0.0)
    assert TransitionTable(pairs=(((a, b), (0.01, 1.0)),), on_unpriced="free").cost(b, c) == (0.0, 0.0)
    with pytest.raises(EnergyCalculusError):
        TransitionTable(on_unpriced="maybe")


def test_round_trip_keeps_the_rule_and_versions_compatibly():
    pairs = _synthetic([1980, 1410], [700, 500], noise=0.0005)
    table = TransitionTable.fitted(pairs, power_w={W(1980, 700): 130.0, W(1410, 500): 110.0},
                                   device="gpu0")
    d = json.loads(json.dumps(table.to_dict()))
    assert d["format"] == "ecal.transitions/2" and d["rule"]["kind"] == "nnls-linear/1"
    back = TransitionTable.from_dict(d)
    assert back == table
    for frm, to in [(W(1260, 500), W(1620, 700)), (W(1980, 700), W(1410, 500))]:
        assert back.cost(frm, to) == table.cost(frm, to)
    # a target with measured ready power uses it; another one the highest measured
    t, e = back.cost(W(1620, 700), W(1410, 500))
    assert e == pytest.approx(110.0 * t)
    t, e = back.cost(W(1410, 500), W(1620, 700))
    assert e == pytest.approx(130.0 * t)
    # tables without a rule still write version 1 (older readers read them)
    assert TransitionTable.constant(0.01, 0.5).to_dict()["format"] == "ecal.transitions/1"
    bad = dict(d, rule=dict(d["rule"], coef_s={"intercept": -1.0}))
    with pytest.raises(FormatError, match="rule"):
        TransitionTable.from_dict(bad, "t.json")
    with pytest.raises(FormatError, match="version"):
        TransitionTable.from_dict(dict(d, version=3), "t.json")


def test_no_fittable_pair_gives_no_rule():
    assert fit_transition_rule({}) is None
    assert fit_transition_rule({(W(1980), OperatingPoint(power_limit_w=500)): (0.01, 1.0)}) is None
    with pytest.raises(EnergyCalculusError):
        FittedRule(("intercept",), (-0.1,))


def test_solver_problem_with_an_unpriced_switch_is_a_clear_error():
    from solvers import Problem
    from solvers.model import ProblemError

    a, b, c = W(1980), W(1410), W(990)
    table = TransitionTable.from_pairs({(a, b): (0.01, 1.0), (b, a): (0.01, 1.0)})
    opts = [dict(time_s=1.0, energy_j=5.0, omega=a), dict(time_s=1.2, energy_j=4.0, omega=c)]
    with pytest.raises(ProblemError, match="not measured"):
        Problem.build([("x", "g", opts), ("y", "g", opts)], [("x", "y")], {"g": 1.0}, table)


def test_measure_transitions_fits_a_rule_on_the_simulator():
    pytest.importorskip("measure")
    try:
        from measure import SimulatedGPU
        from measure.transitions import measure_transitions
    except ImportError as exc:                           # pragma: no cover
        pytest.skip(f"measure does not import: {exc}")
    gpu = SimulatedGPU()
    omegas = [W(1980), W(1620), W(1410), W(990)]
    table = measure_transitions(gpu, omegas, repeats=1)
    assert table.rule is not None and table.rule.n_pairs == 12
    measured = table.cost(W(1980), W(990))
    assert measured == dict(table.pairs)[(W(1980), W(990))]
    t, e = table.cost(W(1260), W(1800))                   # never measured
    assert t > 0 and e > 0
    assert table.rule.rms_residual_s >= 0.0
    back = TransitionTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert back.cost(W(1260), W(1800)) == (t, e)
