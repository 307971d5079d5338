"""Smoke tests of the core types (the detailed suites live in their own files)."""

import pytest

import frontier as f


def test_non_distributivity_spec_vector():
    s = 50.0
    e1, e2, e3 = (f.Signature(n, s_w=s, time_s=t, d_j=d) for n, t, d in
                  (("e1", 1, 100), ("e2", 2, 150), ("e3", 3, 200)))
    assert f.seq(e1, f.par(e2, e3)).energy_j == pytest.approx(650.0)
    assert f.par(f.seq(e1, e2), f.seq(e1, e3)).energy_j == pytest.approx(750.0)


def test_repeats_grow_linearly():
    g = f.Signature("g", s_w=123, time_s=1.6e-3, d_j=1.0, var_time_s2=1e-10, var_energy_j2=1e-4)
    assert f.seq([g] * 245).sd_energy_j == pytest.approx(245 * g.sd_energy_j)
