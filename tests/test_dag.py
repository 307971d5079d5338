"""DAG composition: per-device static accounting, schedule, uncertainty (spec §4.4–§4.5, §9.4)."""

from __future__ import annotations

import json

import pytest

from frontier import CompositionError, OperatingPoint, Signature, idle, par_multi, seq
from frontier.dag import dag, dag_schedule


def el(name, t, d, s=80.0, dev="gpu0", sd_t=0.0, sd_e=0.0, **kw):
    return Signature(name, s_w=s, time_s=t, d_j=d, devices={dev} if isinstance(dev, str) else dev,
                     var_time_s2=sd_t**2, var_energy_j2=(sd_e**2 + (s * sd_t) ** 2), **kw)


def same(a: Signature, b: Signature) -> None:
    assert a.time_s == pytest.approx(b.time_s)
    assert a.energy_j == pytest.approx(b.energy_j)
    assert a.var_time_s2 == pytest.approx(b.var_time_s2, abs=1e-18)
    assert a.var_energy_j2 == pytest.approx(b.var_energy_j2, abs=1e-15)


def test_chain_equals_seq():
    a, b, c = el("a", 1.0, 10, sd_t=0.01, sd_e=1), el("b", 2.0, 20, s=70, sd_t=0.02, sd_e=2), el("c", 0.5, 5, sd_t=0.005, sd_e=0.5)
    chain = dag({"a": a, "b": b, "c": c}, [("a", "b"), ("b", "c")])
    ref = seq(a, b, c)
    same(chain, ref)
    assert chain.bias_sigma_j == pytest.approx(ref.bias_sigma_j)
    assert chain.head_sigma_j == pytest.approx(ref.head_sigma_j)


def test_same_device_tasks_without_edges_run_in_insertion_order():
    a, b = el("a", 1.0, 10), el("b", 2.0, 20)
    sch = dag_schedule({"b": b, "a": a})
    assert sch.device_order["gpu0"] == ("b", "a")
    assert (sch.start_s["b"], sch.start_s["a"]) == (0.0, 2.0)
    same(sch.signature, seq(b, a))
    # An edge overrides insertion order.
    sch2 = dag_schedule({"b": b, "a": a}, [("a", "b")])
    assert sch2.device_order["gpu0"] == ("a", "b") and sch2.start_s["b"] == 1.0


def test_independent_tasks_on_two_devices_equal_par_multi():
    a = el("a", 1.0, 10, dev="gpu0", sd_t=0.01, sd_e=1)
    b = el("b", 2.0, 20, s=70, dev="gpu1", sd_t=0.02, sd_e=2)
    d = dag({"a": a, "b": b})
    ref = par_multi(a, b)
    same(d, ref)
    assert d.s_w == pytest.approx(ref.s_w)
    assert d.bias_sigma_j == pytest.approx(ref.bias_sigma_j)
    assert d.devices == {"gpu0", "gpu1"}


def test_cross_device_dependency_equals_idle_element_identity():
    """(e1 ⊕multi ι_B(T1)) ⊗ (ι_A(T2) ⊕multi e2) = DAG e1 -> e2 (spec §4.4)."""
    sa, sb = 80.0, 60.0
    e1 = el("e1", 1.0, 10, s=sa, dev="A", sd_t=0.01, sd_e=1)
    e2 = el("e2", 2.0, 30, s=sb, dev="B", sd_t=0.02, sd_e=2)
    ref = seq(par_multi(e1, idle("B", e1.time_s, sb)), par_multi(idle("A", e2.time_s, sa), e2))
    d = dag({"e1": e1, "e2": e2}, [("e1", "e2")])
    assert d.time_s == pytest.approx(3.0)
    assert d.energy_j == pytest.approx(e1.energy_j + e2.energy_j + sb * 1.0 + sa * 2.0)
    assert d.energy_j == pytest.approx(ref.energy_j)
    assert d.var_time_s2 == pytest.approx(e1.var_time_s2 + e2.var_time_s2)


def test_spec_static_accounting_and_critical_path_variance():
    """E = Σ_k s_k·makespan + Σ d_i when every task's s equals its device's idle power;
    σ²_T sums along the critical path only."""
    a = el("a", 1.0, 10, dev="gpu0", sd_t=0.01, sd_e=1)
    b = el("b", 3.0, 20, dev="gpu1", sd_t=0.03, sd_e=2)
    c = el("c", 0.5, 5, dev="gpu0", sd_t=0.05, sd_e=0.5)
    sch = dag_schedule({"a": a, "b": b, "c": c}, [("a", "b"), ("a", "c")])
    assert sch.makespan_s == pytest.approx(4.0)
    assert sch.critical_path == ("a", "b")
    assert sch.energy_j == pytest.approx(2 * 80.0 * 4.0 + 10 + 20 + 5)
    sig = sch.signature
    assert sig.var_time_s2 == pytest.approx(0.01**2 + 0.03**2)   # c is off the critical path
    # σ²_E ≈ (Σ s)²σ²_T + Σ σ²_d
    assert sig.var_energy_j2 == pytest.approx(160.0**2 * (0.01**2 + 0.03**2) + 1 + 4 + 0.25)
    assert sig.meta["critical_path"] == ["a", "b"]
    assert sch.idle_energy_j["gpu0"] == pytest.approx(80.0 * 2.5)
    assert sch.idle_energy_j["gpu1"] == pytest.approx(80.0 * 1.0)


def test_idle_power_differing_from_task_static_power():
    # Busy time is charged at the task's s, idle time at the device's idle power.
    a = el("a", 1.0, 10, s=120.0, dev="gpu0")
    b = el("b", 3.0, 20, s=100.0, dev="gpu1")
    d = dag({"a": a, "b": b}, idle_power_w={"gpu0": 50.0, "gpu1": 40.0})
    assert d.energy_j == pytest.approx(a.energy_j + b.energy_j + 50.0 * 2.0)
    # A device that runs nothing idles for the whole makespan.
    d2 = dag({"a": a, "b": b}, idle_power_w={"gpu2": 30.0})
    assert d2.energy_j == pytest.approx(a.energy_j + b.energy_j + 120.0 * 2.0 + 30.0 * 3.0)
    assert "gpu2" in d2.devices


def test_default_idle_power_holds_last_tasks_static_power():
    # gpu0 runs a (s=100), waits for b on gpu1, then runs c (s=60): the gap costs 100 W.
    a = el("a", 1.0, 1, s=100.0, dev="gpu0")
    b = el("b", 2.0, 1, s=70.0, dev="gpu1")
    c = el("c", 1.0, 1, s=60.0, dev="gpu0")
    sch = dag_schedule({"a": a, "b": b, "c": c}, [("a", "b"), ("b", "c")])
    assert sch.makespan_s == pytest.approx(4.0)
    assert sch.idle_energy_j["gpu0"] == pytest.approx(100.0 * 2.0)
    assert sch.idle_energy_j["gpu1"] == pytest.approx(70.0 * 1.0 + 70.0 * 1.0)   # before b (at b's), after b


def test_offsets_and_multi_device_task():
    ar = el("ar", 1.0, 4, s=160.0, dev={"gpu0", "gpu1"}, sd_t=0.01, sd_e=0.1)
    a = el("a", 2.0, 10, dev="gpu0")
    b = el("b", 1.0, 10, dev="gpu1")
    sch = dag_schedule({"a": a, "b": b, "ar": ar}, [("a", "ar"), ("b", "ar")], offsets_s={"b": 0.5})
    assert sch.start_s["b"] == 0.5 and sch.start_s["ar"] == 2.0 and sch.makespan_s == 3.0
    # gpu1 idles 0.5 s before b and 0.5 s after it, at b's static power (80 W)
    assert sch.energy_j == pytest.approx(a.energy_j + b.energy_j + ar.energy_j + 80 * 1.0)
    assert sch.critical_path == ("a", "ar")


def test_shared_leaf_counts_k_squared():
    g = el("g", 1.0, 10, sd_t=0.01, sd_e=1.0)
    d = dag({f"t{i}": g for i in range(4)}, [(f"t{i}", f"t{i+1}") for i in range(3)])
    assert d.sd_time_s == pytest.approx(4 * g.sd_time_s)
    assert d.sd_energy_j == pytest.approx(4 * g.sd_energy_j)


class Table:
    """Duck-typed transition costs: (time_s, energy_j) to switch ω_dev."""

    def __init__(self, tau=0.1, eps=30.0):
        self.tau, self.eps, self.calls = tau, eps, []

    def cost(self, frm, to):
        self.calls.append((frm, to))
        return self.tau, self.eps


def test_transitions_are_elements_between_tasks():
    hi, lo = OperatingPoint(sm_clock_mhz=1980), OperatingPoint(sm_clock_mhz=1200)
    a = el("a", 1.0, 10, omega=hi)
    b = el("b", 2.0, 20, omega=lo)
    c = el("c", 1.0, 5, omega=lo)
    tab = Table()
    sch = dag_schedule({"a": a, "b": b, "c": c}, [("a", "b"), ("b", "c")], transitions=tab)
    assert tab.calls == [(hi, lo)]      # b -> c keeps ω_dev: no switch, no call
    assert len(sch.transitions) == 1 and sch.transitions[0].after == "a"
    assert sch.makespan_s == pytest.approx(4.1)
    tr = Signature.from_point("switch", 0.1, 30.0, s_w=80.0, omega=lo)
    assert sch.energy_j == pytest.approx(seq(a, tr, b, c).energy_j)
    assert sch.transition_energy_j == pytest.approx(30.0)
    json.dumps(sch.to_dict(), allow_nan=False)


@pytest.mark.parametrize("deps, match", [
    ([("a", "b"), ("b", "a")], "cycle"),
    ([("b", "c"), ("c", "b"), ("c", "a")], "cycle 'b' -> 'c' -> 'b'"),   # 'a' only follows it
    ([("a", "zz")], "unknown task 'zz'"),
    ([("a", "a")], "depends on itself"),
    ([("a",)], "pair"),
])
def test_bad_dependencies(deps, match):
    with pytest.raises(CompositionError, match=match):
        dag({"a": el("a", 1, 1), "b": el("b", 1, 1), "c": el("c", 1, 1)}, deps)


def test_bad_inputs_name_the_task():
    a = el("a", 1, 1)
    with pytest.raises(CompositionError, match="'a'.*>= 0"):
        dag({"a": a}, offsets_s={"a": -1.0})
    with pytest.raises(CompositionError, match="unknown task 'q'"):
        dag({"a": a}, offsets_s={"q": 1.0})
    with pytest.raises(CompositionError, match="'gpu0'"):
        dag({"a": a}, idle_power_w={"gpu0": float("nan")})
    with pytest.raises(CompositionError, match="task 'x'"):
        dag({"a": a, "x": 3.0})   # type: ignore[dict-item]
    with pytest.raises(CompositionError, match="at least one"):
        dag({})
    with pytest.raises(CompositionError, match="cost"):
        dag({"a": a, "b": el("b", 1, 1, omega=OperatingPoint(sm_clock_mhz=900))}, [("a", "b")],
            transitions=object())


def test_cheap_switch_still_costs_its_static_energy():
    hi, lo = OperatingPoint(sm_clock_mhz=1980), OperatingPoint(sm_clock_mhz=1200)
    a, b = el("a", 1.0, 10, omega=hi), el("b", 1.0, 10, omega=lo)
    sch = dag_schedule({"a": a, "b": b}, [("a", "b")], transitions=Table(tau=0.5, eps=1.0))
    assert sch.transition_energy_j == pytest.approx(80.0 * 0.5)      # max(1 J, 80 W x 0.5 s)
    assert sch.energy_j == pytest.approx(a.energy_j + b.energy_j + 40.0)


def test_with_the_projects_transition_table():
    tt_mod = pytest.importorskip("frontier.transition")
    hi, lo = OperatingPoint(sm_clock_mhz=1980), OperatingPoint(sm_clock_mhz=1200)
    a, b = el("a", 1.0, 10, omega=hi), el("b", 1.0, 10, omega=lo)
    table = tt_mod.TransitionTable.constant(0.01, 2.0)
    sch = dag_schedule({"a": a, "b": b}, [("a", "b")], transitions=table)
    elem = table.element(hi, lo, "gpu0", s_w=80.0)
    assert sch.makespan_s == pytest.approx(2.01)
    assert sch.energy_j == pytest.approx(seq(a, elem.with_(omega=lo), b).energy_j)


def _random_dag(rng, n, with_idle):
    devs = ["gpu0", "gpu1", "gpu2"]
    tasks = {}
    for i in range(n):
        k = int(rng.integers(1, 3)) if i % 4 == 3 else 1
        dv = frozenset(rng.choice(devs, size=k, replace=False).tolist())
        tasks[f"t{i}"] = el(f"t{i}", float(rng.uniform(0.1, 2.0)), float(rng.uniform(0, 50)),
                            s=float(rng.uniform(40, 120)) * len(dv), dev=dv,
                            sd_t=float(rng.uniform(0, 0.02)), sd_e=float(rng.uniform(0, 2)))
    deps = [(f"t{i}", f"t{j}") for i in range(n) for j in range(i + 1, n) if rng.random() < 0.3]
    offs = {f"t{i}": float(rng.uniform(0, 1)) for i in range(n) if rng.random() < 0.2}
    idle_w = {d: float(rng.uniform(30, 90)) for d in devs} if with_idle else None
    return tasks, deps, offs, idle_w


@pytest.mark.parametrize("with_idle", [False, True])
def test_sensitivities_match_finite_differences(with_idle):
    """The delta-method terms of a DAG are the derivatives of its schedule's T and E."""
    import numpy as np

    rng = np.random.default_rng(11 + with_idle)
    h = 1e-7
    for _ in range(25):
        tasks, deps, offs, idle_w = _random_dag(rng, int(rng.integers(2, 8)), with_idle)
        base = dag(tasks, deps, idle_power_w=idle_w, offsets_s=offs)
        for name, sig in tasks.items():
            term = base.terms[sig.key]
            bumped = dict(tasks, **{name: sig.with_(time_s=sig.time_s + h)})
            up = dag(bumped, deps, idle_power_w=idle_w, offsets_s=offs)
            assert (up.time_s - base.time_s) / h == pytest.approx(term.dT_dT, abs=1e-4)
            assert (up.energy_j - base.energy_j) / h == pytest.approx(term.dE_dT, rel=1e-4, abs=1e-3)
            bumped_d = dict(tasks, **{name: sig.with_(d_j=sig.d_j + 1e-3)})
            up_d = dag(bumped_d, deps, idle_power_w=idle_w, offsets_s=offs)
            assert (up_d.energy_j - base.energy_j) / 1e-3 == pytest.approx(term.dE_dd, rel=1e-6)


def test_constant_idle_power_accounting_identity():
    """With constant idle power: E = Σ_k idle_k·makespan + Σ_i (s_i − Σ_{k∈D_i} idle_k)·T_i + Σ d_i."""
    import numpy as np

    rng = np.random.default_rng(5)
    for _ in range(25):
        tasks, deps, offs, idle_w = _random_dag(rng, int(rng.integers(2, 8)), True)
        sch = dag_schedule(tasks, deps, idle_power_w=idle_w, offsets_s=offs)
        expect = sum(idle_w.values()) * sch.makespan_s + sum(
            (t.s_w - sum(idle_w[d] for d in t.devices)) * t.time_s + t.d_j for t in tasks.values())
        assert sch.energy_j == pytest.approx(expect)
        # Tasks sharing a device never overlap.
        for order in sch.device_order.values():
            for a, b in zip(order, order[1:]):
                assert sch.start_s[b] >= sch.end_s[a] - 1e-12
        for a, b in deps:
            assert sch.start_s[b] >= sch.end_s[a] - 1e-12
