"""The entry context in the algebra (issue 29): the thermal mechanism's update rule against
hand-worked values, interpolation between characterized entry temperatures, the fit recovering
a known model, and context-carrying composition reducing to null-context ⊗ when it is off."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frontier.compose import seq
from frontier.context import (
    ContextualSignature,
    ThermalMechanism,
    ThermalObservation,
    fit_thermal,
    seq_in_context,
)
from frontier.errors import InputError
from frontier.signature import Signature

TH = ThermalMechanism(ambient_c=30.0, r_th_c_per_w=0.1, tau_s=20.0)


def test_update_rule_hand_worked() -> None:
    # P = 10 kJ / 20 s = 500 W; Θ∞ = 30 + 0.1·500 = 80 °C; Θ' = 80 + (30 − 80)·e^{−1} = 61.606
    assert TH.exit_temp_c(30.0, 20.0, 10_000.0) == pytest.approx(80 - 50 * math.exp(-1), abs=1e-12)
    assert TH.exit_temp_c(30.0, 20.0, 10_000.0) == pytest.approx(61.6060, abs=1e-4)
    # cooling: 70 °C entry, 10 s at 100 W: Θ∞ = 40; Θ' = 40 + 30·e^{−0.5} = 58.196
    assert TH.idle_temp_c(70.0, 10.0, 100.0) == pytest.approx(40 + 30 * math.exp(-0.5), abs=1e-12)
    assert TH.exit_temp_c(55.0, 0.0, 0.0) == 55.0            # nothing ran: nothing changed
    assert TH.steady_temp_c(700.0) == pytest.approx(100.0)


def test_update_rule_superposes_in_time() -> None:
    # one 20 s window at 500 W equals two 10 s windows at 500 W back to back (RC is linear)
    one = TH.exit_temp_c(35.0, 20.0, 10_000.0)
    two = TH.exit_temp_c(TH.exit_temp_c(35.0, 10.0, 5_000.0), 10.0, 5_000.0)
    assert one == pytest.approx(two, abs=1e-12)


@pytest.mark.parametrize("bad", [dict(tau_s=0.0), dict(r_th_c_per_w=-1.0), dict(ambient_c=math.nan)])
def test_bad_mechanism_is_refused(bad: dict) -> None:
    args = dict(ambient_c=30.0, r_th_c_per_w=0.1, tau_s=20.0) | bad
    with pytest.raises(InputError):
        ThermalMechanism(**args)


def _sig(name: str, t: float, d: float, s: float = 120.0, var: float = 1e-4) -> Signature:
    return Signature(name, s_w=s, time_s=t, d_j=d, var_time_s2=var * 1e-4, var_energy_j2=var)


def test_interpolation_between_entry_temperatures() -> None:
    cold, hot = _sig("gemm", 1.0, 400.0, s=120.0), _sig("gemm", 1.1, 420.0, s=140.0)
    cs = ContextualSignature("gemm", {40.0: cold, 80.0: hot})
    mid = cs.at(50.0)                                      # w = 0.25
    assert mid.time_s == pytest.approx(1.025)
    assert mid.s_w == pytest.approx(125.0)
    assert mid.d_j == pytest.approx(405.0)
    assert mid.var_energy_j2 == pytest.approx((0.75**2 + 0.25**2) * 1e-4)
    assert cs.at(40.0) is cold and cs.at(80.0) is hot
    clamped = cs.at(95.0)                                  # outside: held, and said so
    assert clamped.time_s == hot.time_s and clamped.meta["entry_temp_clamped_c"] == 80.0


def test_fit_recovers_a_known_model() -> None:
    truth = ThermalMechanism(ambient_c=32.0, r_th_c_per_w=0.07, tau_s=45.0)
    obs, temp = [], 32.0
    for t, p in [(5, 600), (10, 300), (3, 120), (20, 650), (8, 90), (15, 450), (30, 120)]:
        nxt = truth.exit_temp_c(temp, t, p * t)
        obs.append(ThermalObservation(temp, t, p, nxt))
        temp = nxt
    fit = fit_thermal(obs)
    assert fit.ambient_c == pytest.approx(32.0, abs=0.05)
    assert fit.r_th_c_per_w == pytest.approx(0.07, rel=1e-3)
    assert fit.tau_s == pytest.approx(45.0, rel=1e-2)


def test_fit_refuses_what_it_cannot_tell_apart() -> None:
    same = [ThermalObservation(30.0, 5.0, 300.0, 40.0)] * 4
    with pytest.raises(InputError, match="two powers"):
        fit_thermal(same)
    with pytest.raises(InputError, match="at least 3"):
        fit_thermal(same[:2])


def test_sequence_carries_temperature() -> None:
    cold, hot = _sig("a", 1.0, 400.0), _sig("a", 1.2, 480.0)
    cs = ContextualSignature("a", {30.0: cold, 90.0: hot})
    run = seq_in_context([cs, cs, cs], entry_c=30.0, mechanism=TH)
    # each element enters where the previous one left the die
    t1 = TH.exit_temp_c(30.0, cold.time_s, cold.energy_j)
    assert run.entry_temps_c[0] == 30.0 and run.entry_temps_c[1] == pytest.approx(t1)
    assert run.entry_temps_c[2] > run.entry_temps_c[1] > 30.0
    assert run.signature.time_s > 3 * cold.time_s          # warmer entries are slower here
    assert run.exit_temp_c is not None and run.exit_temp_c > run.entry_temps_c[2]


sigs = st.builds(_sig, st.sampled_from(["a", "b"]), st.floats(1e-3, 10.0),
                 st.floats(0.0, 1e3), st.floats(0.0, 700.0), st.floats(0.0, 1e-2))


@settings(max_examples=60, deadline=None)
@given(st.lists(sigs, min_size=1, max_size=6), st.floats(20.0, 90.0))
def test_null_context_elements_reduce_to_seq(elems: list[Signature], entry_c: float) -> None:
    ref = seq(*elems)
    for mech in (None, TH):
        got = seq_in_context(elems, entry_c=entry_c, mechanism=mech).signature
        assert got.time_s == ref.time_s and got.energy_j == ref.energy_j
        assert got.var_energy_j2 == ref.var_energy_j2 and got.var_time_s2 == ref.var_time_s2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(sigs, sigs), min_size=1, max_size=5))
def test_mechanism_off_is_null_context_seq(pairs: list[tuple[Signature, Signature]]) -> None:
    # with the mechanism switched off a contextual element is its coolest (φ_null) signature
    cs = [ContextualSignature("x", {25.0: a, 85.0: b.with_(devices=a.devices)}) for a, b in pairs]
    got = seq_in_context(cs, mechanism=None).signature
    ref = seq(*[a for a, _ in pairs])
    assert got.time_s == ref.time_s and got.energy_j == ref.energy_j
