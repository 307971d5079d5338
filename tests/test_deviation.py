"""Eq. 23 deviation checks and prefix-scan localisation (spec §8.2–§8.4)."""

from __future__ import annotations

import json
import math

import pytest

from frontier import CompositionError, Signature, seq
from frontier.deviation import DeviationResult, critical_value, deviation, prefix_scan


def sig(name="x", t=1.0, d=50.0, s=100.0, sd_t=0.0, sd_e=0.0, **kw):
    return Signature(name, s_w=s, time_s=t, d_j=d, var_time_s2=sd_t**2, var_energy_j2=sd_e**2, **kw)


def test_z_scores_errors_and_flags():
    p = sig("p", t=1.0, d=50.0, sd_t=0.01, sd_e=3.0)
    m = sig("m", t=1.05, d=45.0, sd_t=0.01, sd_e=4.0)        # slower, same energy (150 J)
    r = deviation(p, m)
    assert r.error_time_s == pytest.approx(0.05)
    assert r.error_energy_j == pytest.approx(m.energy_j - p.energy_j)
    assert r.error_time_pct == pytest.approx(5.0)
    assert r.z_time == pytest.approx(0.05 / math.hypot(0.01, 0.01))
    assert r.z_energy == pytest.approx(r.error_energy_j / 5.0)
    assert r.c_alpha == pytest.approx(1.959964, abs=1e-5)
    assert r.flagged_time and not r.flagged_energy and r.flagged
    assert r.name == "p"


def test_bonferroni_critical_value():
    assert critical_value(0.05, 1) == pytest.approx(1.959964, abs=1e-5)
    assert critical_value(0.05, 10) == pytest.approx(2.807034, abs=1e-5)   # z_{1-0.0025}
    r = deviation(sig(), sig(), n_tests=10)
    assert r.c_alpha == pytest.approx(2.807034, abs=1e-5) and r.n_tests == 10
    with pytest.raises(ValueError, match="alpha"):
        critical_value(1.5)
    with pytest.raises(ValueError, match="n_tests"):
        critical_value(0.05, 0)


def test_bias_aware_widens_energy_tolerance_only():
    a = sig("a", t=1.0, d=50.0, sd_e=1.0)
    b = sig("b", t=1.0, d=60.0, sd_e=1.0)
    pred = seq(a, b)                      # b takes a substituted entry context: B = c·σ_E(b)
    assert pred.bias_bound_j(1.96) == pytest.approx(1.96)
    meas = Signature.from_point("m", pred.time_s, pred.energy_j + 3.5, s_w=100.0, sd_energy_j=1.0)
    plain = deviation(pred, meas)
    aware = deviation(pred, meas, bias_aware=True)
    assert plain.flagged_energy and not aware.flagged_energy
    assert aware.threshold_energy_j == pytest.approx(plain.threshold_energy_j + aware.bias_bound_j)
    assert aware.threshold_time_s == plain.threshold_time_s
    assert "+B=" in aware.summary()


def test_zero_sigma_gives_infinite_z_and_json_safe_dict():
    r = deviation(sig("p"), sig("m", d=51.0))
    assert math.isinf(r.z_energy) and r.flagged_energy and r.z_time == 0.0
    d = r.to_dict()
    assert d["z_energy"] is None and d["flagged"] is True
    json.dumps(d, allow_nan=False)
    same = deviation(sig("p"), sig("p"))
    assert not same.flagged and same.z_energy == 0.0


def test_summary_and_dataclass_frozen():
    r = deviation(sig("p", sd_e=1.0), sig("m", d=60.0, sd_e=1.0))
    assert isinstance(r, DeviationResult)
    line = r.summary()
    assert line.startswith("p: ") and "FLAGGED on E" in line and "\n" not in line
    with pytest.raises(AttributeError):
        r.flagged_energy = False   # type: ignore[misc]


def test_rejects_non_signatures():
    with pytest.raises(CompositionError):
        deviation(sig(), {"time_s": 1.0})   # type: ignore[arg-type]


# -- prefix scan ----------------------------------------------------------------------------------

def _chain(n=16):
    return [sig(f"e{i}", t=0.1, d=5.0, sd_t=1e-4, sd_e=0.05) for i in range(n)]


def _measure(elems, bad_from=None, extra_j=2.0):
    """A 'measurement' of each prefix: the prediction, plus extra energy from the first bad element on."""
    def m(k):
        p = seq(elems[:k])
        extra = extra_j if bad_from is not None and k >= bad_from else 0.0
        return Signature.from_point(f"P{k}", p.time_s, p.energy_j + extra, s_w=100.0,
                                    sd_time_s=p.sd_time_s, sd_energy_j=p.sd_energy_j)
    return m


def test_prefix_scan_finds_first_failing_element_in_log_n_tests():
    elems = _chain(16)
    calls = []
    meas = _measure(elems, bad_from=11)

    def counted(k):
        calls.append(k)
        return meas(k)

    res = prefix_scan(elems, counted, alpha=0.05)
    assert res.found and res.first_failing_prefix == 11
    assert res.element == "e10" and res.suspects == ("e10",)
    assert res.last_passing_prefix == 10
    assert len(calls) <= 1 + math.ceil(math.log2(16))
    assert [k for k, _ in res.tested] == calls and calls[0] == 16
    assert res.c_alpha == pytest.approx(critical_value(0.05, res.n_tests))
    assert "e10" in res.summary()
    json.dumps(res.to_dict(), allow_nan=False)


def test_prefix_scan_first_element_and_clean_chain():
    elems = _chain(8)
    assert prefix_scan(elems, _measure(elems, bad_from=1)).suspects == ("e0",)
    clean = prefix_scan(elems, _measure(elems))
    assert not clean.found and clean.element is None and len(clean.tested) == 1
    assert "no deviation" in clean.summary()


def test_prefix_scan_with_a_subset_of_measured_prefixes():
    elems = _chain(12)
    m = _measure(elems, bad_from=7)
    table = {k: m(k) for k in (3, 6, 9, 12)}
    res = prefix_scan(elems, table)
    assert res.first_failing_prefix == 9 and res.last_passing_prefix == 6
    assert res.suspects == ("e6", "e7", "e8")


def test_prefix_scan_errors():
    elems = _chain(4)
    with pytest.raises(CompositionError, match="outside"):
        prefix_scan(elems, {5: elems[0]})
    with pytest.raises(CompositionError, match="at least one"):
        prefix_scan([], {})
    with pytest.raises(CompositionError, match="not a Signature"):
        prefix_scan(elems, lambda k: 1.0)   # type: ignore[arg-type,return-value]
