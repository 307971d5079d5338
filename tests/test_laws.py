"""Algebraic laws of the context-independent algebra (spec §7, Table 4), property-based."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from frontier import Signature, par, par_multi, seq
from frontier.deviation import critical_value, deviation

SETTINGS = settings(max_examples=40, deadline=None)
_counter = iter(range(10**9))


@st.composite
def sigs(draw, s_w=None, device="gpu0"):
    """A valid measured signature (fresh name, so a distinct leaf)."""
    s = draw(st.floats(0.0, 400.0)) if s_w is None else s_w
    t = draw(st.floats(1e-4, 10.0))
    d = draw(st.floats(0.0, 2000.0))
    rel_t = draw(st.floats(0.0, 0.05))
    rel_d = draw(st.floats(0.0, 0.05))
    var_t = (rel_t * t) ** 2
    # M1: σ²_E = s²σ²_T + σ²_d, so a valid leaf has σ²_E >= s²σ²_T.
    var_e = s * s * var_t + (rel_d * (d + 1.0)) ** 2
    return Signature(f"e{next(_counter)}", s_w=s, time_s=t, d_j=d, var_time_s2=var_t,
                     var_energy_j2=var_e, devices={device})


S_SAME = 80.0
same = sigs(s_w=S_SAME)


def close(a: Signature, b: Signature, variances: bool = True) -> None:
    assert a.time_s == pytest.approx(b.time_s, rel=1e-9, abs=1e-12)
    assert a.energy_j == pytest.approx(b.energy_j, rel=1e-9, abs=1e-9)
    assert a.d_j == pytest.approx(b.d_j, rel=1e-9, abs=1e-9)
    if variances:
        assert a.var_time_s2 == pytest.approx(b.var_time_s2, rel=1e-7, abs=1e-18)
        assert a.var_energy_j2 == pytest.approx(b.var_energy_j2, rel=1e-7, abs=1e-12)


def distinct_times(*xs: Signature) -> bool:
    # The dominant-branch rule picks one branch; exact ties make it depend on grouping.
    ts = sorted(x.time_s for x in xs)
    return all(b - a > 1e-9 * max(1.0, b) for a, b in zip(ts, ts[1:]))


# -- closure and associativity ------------------------------------------------------------------------

@SETTINGS
@given(sigs(), sigs(), sigs())
def test_seq_associative_and_closed(a, b, c):
    left, right, flat = seq(seq(a, b), c), seq(a, seq(b, c)), seq(a, b, c)
    close(left, right)
    close(left, flat)
    for x in (left, right):
        assert isinstance(x, Signature) and x.d_j >= 0
        assert x.energy_j == pytest.approx(x.s_w * x.time_s + x.d_j)


@SETTINGS
@given(same, same, same)
def test_par_associative_and_closed(a, b, c):
    assume(distinct_times(a, b, c))
    left, right, flat = par(par(a, b), c), par(a, par(b, c)), par(a, b, c)
    close(left, right)
    close(left, flat)
    assert left.d_j >= 0 and left.var_energy_j2 >= 0


@SETTINGS
@given(sigs(device="gpu0"), sigs(device="gpu1"), sigs(device="gpu2"))
def test_par_multi_associative_and_closed(a, b, c):
    assume(distinct_times(a, b, c))
    left, right, flat = par_multi(par_multi(a, b), c), par_multi(a, par_multi(b, c)), par_multi(a, b, c)
    close(left, right)
    close(left, flat)
    assert left.s_w == pytest.approx(a.s_w + b.s_w + c.s_w)
    assert left.devices == {"gpu0", "gpu1", "gpu2"}


# -- commutativity ----------------------------------------------------------------------------------

@SETTINGS
@given(same, same)
def test_par_commutative(a, b):
    assume(distinct_times(a, b))
    close(par(a, b), par(b, a))


@SETTINGS
@given(sigs(device="gpu0"), sigs(device="gpu1"))
def test_par_multi_commutative(a, b):
    assume(distinct_times(a, b))
    close(par_multi(a, b), par_multi(b, a))


@SETTINGS
@given(sigs(), sigs())
def test_seq_commutes_in_context_independent_algebra(a, b):
    close(seq(a, b), seq(b, a))


# -- non-distributivity ---------------------------------------------------------------------------------

@SETTINGS
@given(same, same, same)
def test_seq_does_not_distribute_over_par(a, b, c):
    left = seq(a, par(b, c))
    right = par(seq(a, b), seq(a, c))
    assert left.time_s == pytest.approx(right.time_s)
    # The right side runs a twice: it costs exactly d_a more.
    assert right.energy_j - left.energy_j == pytest.approx(a.d_j, rel=1e-9, abs=1e-9)


# -- monotonicity in (T, d) ---------------------------------------------------------------------------

@SETTINGS
@given(same, same, sigs(device="gpu1"), st.floats(0.0, 5.0), st.floats(0.0, 500.0))
def test_monotone_in_T_and_d(x, b, c, dt, dd):
    y = x.with_(name=x.name + "'", time_s=x.time_s + dt, d_j=x.d_j + dd)
    contexts = [lambda e: seq(e, b), lambda e: par(e, b), lambda e: par_multi(e, c),
                lambda e: seq(b, par(e, b.with_(name="b2")))]
    for ctx in contexts:
        lo, hi = ctx(x), ctx(y)
        assert hi.time_s >= lo.time_s - 1e-12
        assert hi.energy_j >= lo.energy_j - 1e-9


# -- identity -----------------------------------------------------------------------------------------

@SETTINGS
@given(same)
def test_empty_element_is_identity(a):
    eps = Signature("eps", s_w=S_SAME, time_s=0.0, d_j=0.0)
    close(seq(a, eps), a)
    close(seq(eps, a), a)
    close(par(a, eps), a)


# -- overlap sub-additivity and cross-device super-additivity ---------------------------------------------

@SETTINGS
@given(same, same)
def test_overlap_subadditive(a, b):
    p = par(a, b)
    assert p.energy_j == pytest.approx(a.energy_j + b.energy_j - S_SAME * min(a.time_s, b.time_s))
    assert p.energy_j <= seq(a, b).energy_j + 1e-9


@SETTINGS
@given(sigs(device="gpu0"), sigs(device="gpu1"))
def test_cross_device_superadditive(a, b):
    m = par_multi(a, b)
    t = m.time_s
    assert m.energy_j == pytest.approx(a.energy_j + b.energy_j + a.s_w * (t - a.time_s) + b.s_w * (t - b.time_s))
    assert m.energy_j >= a.energy_j + b.energy_j - 1e-9


# -- Property 5.7: refinement–coarsening consistency ------------------------------------------------------

def _composite(a, b, c):
    return seq(a, par(b, c))


@SETTINGS
@given(same, same, same, st.floats(-1.0, 1.0), st.floats(-1.0, 1.0), st.floats(-1.0, 1.0),
       st.floats(0.001, 0.05))
def test_coarse_measurement_within_noise_and_bias_passes(a, b, c, u_e, u_t, u_b, rel_sd):
    """A directly characterized coarse signature whose offset from the composed value is within
    its noise band plus the Eq. 13 bias passes the bias-aware Eq. 23 test."""
    pred = _composite(a, b, c)
    cz = critical_value(0.05)
    sd_e, sd_t = rel_sd * pred.energy_j, rel_sd * pred.time_s
    e_hat = pred.energy_j + u_e * cz * sd_e * 0.999 + u_b * pred.bias_bound_j(cz) * 0.999
    t_hat = pred.time_s + u_t * cz * sd_t * 0.999
    assume(e_hat >= 0 and t_hat >= 0)
    coarse = Signature.from_point("coarse", t_hat, e_hat, s_w=min(S_SAME, e_hat / t_hat if t_hat else S_SAME),
                                  sd_time_s=sd_t, sd_energy_j=sd_e)
    r = deviation(pred, coarse, bias_aware=True)
    assert not r.flagged, r.summary()


def test_coarse_measurement_false_alarm_rate_is_alpha():
    """Gaussian noise around the prediction flags about α of the time (fixed seed)."""
    rng = np.random.default_rng(2024)
    a, b, c = (Signature(n, s_w=80.0, time_s=t, d_j=d, var_time_s2=(0.01 * t) ** 2,
                         var_energy_j2=(0.02 * (80 * t + d)) ** 2)
               for n, t, d in (("a", 1.0, 50.0), ("b", 2.0, 30.0), ("c", 1.0, 40.0)))
    pred = _composite(a, b, c)
    sd_e, sd_t = 0.01 * pred.energy_j, 0.01 * pred.time_s
    tot_e = math.hypot(sd_e, pred.sd_energy_j)
    tot_t = math.hypot(sd_t, pred.sd_time_s)
    n, flagged = 4000, 0
    for _ in range(n):
        e_hat = pred.energy_j + rng.normal(0, tot_e)
        t_hat = pred.time_s + rng.normal(0, tot_t)
        coarse = Signature.from_point("coarse", t_hat, e_hat, s_w=0.0, sd_time_s=sd_t, sd_energy_j=sd_e)
        flagged += deviation(pred, coarse, alpha=0.05).flagged_energy
    assert flagged / n == pytest.approx(0.05, abs=0.012)


@SETTINGS
@given(same, same, same, sigs(s_w=60.0, device="gpu1"), st.floats(-0.5, 0.5), st.floats(-50.0, 50.0))
def test_substituting_a_coarse_signature_moves_outer_prediction_within_bounds(a, b, x, y, dt, de):
    """§5.7: replacing C by ĉ (ΔE, ΔT) moves ⊗ by exactly ΔE, ⊕ by ≤ |ΔE| + 2s|ΔT|, ⊕multi by
    ≤ |ΔE| + (s_outer + s_C)|ΔT|."""
    inner = seq(a, b)
    t2 = inner.time_s + dt
    e2 = inner.energy_j + de
    assume(t2 >= 0 and e2 - S_SAME * t2 >= 0)
    hat = Signature.from_point("hat", t2, e2, s_w=S_SAME)
    d_e, d_t = hat.energy_j - inner.energy_j, hat.time_s - inner.time_s
    assert seq(x, hat).energy_j - seq(x, inner).energy_j == pytest.approx(d_e, abs=1e-7)
    moved = abs(par(x, hat).energy_j - par(x, inner).energy_j)
    assert moved <= abs(d_e) + 2 * S_SAME * abs(d_t) + 1e-7
    moved = abs(par_multi(y, hat).energy_j - par_multi(y, inner).energy_j)
    assert moved <= abs(d_e) + (y.s_w + S_SAME) * abs(d_t) + 1e-7


# -- shared estimation error ---------------------------------------------------------------------------

@pytest.mark.parametrize("k", [2, 10, 245])
def test_sigma_of_repeats_grows_as_k(k):
    g = Signature("g", s_w=123.0, time_s=1.6e-3, d_j=1.0, var_time_s2=(1e-5) ** 2, var_energy_j2=0.03**2)
    rep = seq([g] * k)
    assert rep.sd_energy_j == pytest.approx(k * g.sd_energy_j)
    assert rep.sd_time_s == pytest.approx(k * g.sd_time_s)
    # k independently measured copies would only grow as sqrt(k).
    indep = seq([g.with_(name=f"g{i}") for i in range(k)])
    assert indep.sd_energy_j == pytest.approx(math.sqrt(k) * g.sd_energy_j)
