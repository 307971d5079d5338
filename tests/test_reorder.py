"""Reordering as a lever (issue 29): hand-worked orders with a thermal mechanism, the laws
(no mechanism: every order costs the same), the refusal of an order whose exit context is not
equivalent downstream (Property 5.1 (ii)), the ``reorderable`` workload key, the reordered
workload document, and ``ecal reorder``'s bad input (exit 2, nothing written)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ecal.cli import main
from execution.reorder import GroupReorder, reordered_document
from execution.workload import WORKLOAD_FORMAT, load_workload
from frontier.context import ContextualSignature, ThermalMechanism, ThermalObservation
from frontier.errors import FormatError, InputError
from frontier.io import save_signatures
from frontier.operating_point import OperatingPoint
from frontier.reorder import (
    c_alpha,
    evaluate_order,
    periodic_entry_c,
    reorder,
    saving_sd,
    temperature_sigma_c,
)
from frontier.signature import Signature

TH = ThermalMechanism(ambient_c=30.0, r_th_c_per_w=0.1, tau_s=2.0)


def el(name: str, e_cold: float, e_hot: float, t: float = 1.0, var: float = 0.0) -> ContextualSignature:
    """An element of time ``t`` whose energy is ``e_cold`` entered at 40 °C and ``e_hot`` at 80."""
    return ContextualSignature(name, {40.0: Signature(name, 0.0, t, e_cold, var_energy_j2=var),
                                      80.0: Signature(name, 0.0, t, e_hot, var_energy_j2=var)})


# -- hand-worked ------------------------------------------------------------------------------

def test_two_elements_hand_worked() -> None:
    hot, cold = el("hot", 600.0, 640.0), el("cold", 100.0, 140.0)
    # hot then cold from 40 °C: hot takes 600 J over 1 s (600 W, Θ∞ = 90 °C) and leaves
    # 90 − 50·e^{−1/2} = 59.673 °C; cold entered there is interpolated, w = 19.673/40
    t1 = 90.0 - 50.0 * math.exp(-0.5)
    e_cold_after = 100.0 + 40.0 * (t1 - 40.0) / 40.0
    given = evaluate_order([hot, cold], (0, 1), mechanism=TH, entry_c=40.0)
    assert given.energies_j == pytest.approx((600.0, e_cold_after), abs=1e-9)
    assert given.step.energy_j == pytest.approx(600.0 + e_cold_after, abs=1e-9)
    theta_c = 30.0 + 0.1 * e_cold_after                  # cold's steady temperature
    assert given.exit_temp_c == pytest.approx(theta_c + (t1 - theta_c) * math.exp(-0.5), abs=1e-9)
    # cold then hot: cold at 40 °C draws 100 W whose Θ∞ is exactly 40: the die stays at 40
    swapped = evaluate_order([hot, cold], (1, 0), mechanism=TH, entry_c=40.0)
    assert swapped.energies_j == pytest.approx((100.0, 600.0), abs=1e-9)
    assert swapped.exit_temp_c == pytest.approx(t1, abs=1e-9)
    # the swap saves 19.67 J in the group but leaves the die 6.7 °C hotter, and in a single
    # pass unknown work follows: refused, the given order kept
    r = reorder([hot, cold], mechanism=TH, entry_c=40.0, sigma_temp_c=0.5)
    assert not r.substituted and r.chosen.order == (0, 1) and r.best.order == (1, 0)
    (why,) = r.refused
    assert why.saving_j == pytest.approx(e_cold_after - 100.0, abs=1e-9)
    assert why.element is None and "not known" in why.reason
    assert why.exit_diff_c == pytest.approx(t1 - given.exit_temp_c, abs=1e-9)
    assert r.tolerance_c == pytest.approx(c_alpha(0.05) * 0.5)


def test_three_elements_exhaustive_and_best() -> None:
    # a temperature-sensitive element (b) between a hot and a cold one
    a, b, c = el("a", 500.0, 520.0), el("b", 200.0, 300.0, var=1e-2), el("c", 50.0, 55.0)
    r = reorder([a, b, c], mechanism=TH, entry_c=40.0, sigma_temp_c=0.5, periodic=True)
    assert r.orders_evaluated == 6 and r.exhaustive
    # the brute force over all 6 orders agrees with the search
    import itertools

    energies = {o: evaluate_order([a, b, c], o, mechanism=TH, periodic=True).step.energy_j
                for o in itertools.permutations(range(3))}
    assert r.best.step.energy_j == pytest.approx(min(energies.values()), abs=1e-6)
    # b after the cold element (entered cooler) is the cheaper cycle: a c b
    cheapest = min(energies, key=energies.get)
    names = [("a", "b", "c")[i] for i in cheapest]
    assert names[(names.index("b") - 1) % 3] == "c"
    assert r.substituted and r.saving_j > 0 and r.sd_saving_j > 0
    assert r.saving_j == pytest.approx(energies[(0, 1, 2)] - r.chosen.step.energy_j, abs=1e-9)


def test_periodic_fixed_point() -> None:
    # one constant-power element repeating: its steady temperature
    one = Signature("x", 0.0, 2.0, 800.0)                 # 400 W: Θ∞ = 70 °C
    assert periodic_entry_c([one], TH) == pytest.approx(70.0, abs=1e-6)
    # two elements: the entry is the exit of the cycle
    a, b = el("a", 600.0, 640.0), el("b", 100.0, 140.0)
    t = periodic_entry_c([a, b], TH)
    ev = evaluate_order([a, b], (0, 1), mechanism=TH, periodic=True)
    assert ev.entry_temp_c == pytest.approx(t) and ev.exit_temp_c == pytest.approx(t, abs=1e-6)


def test_downstream_insensitive_accepts_sensitive_refuses() -> None:
    hot, cold = el("hot", 600.0, 640.0), el("cold", 100.0, 140.0)
    # a long flat element after the group: the difference fades below the tolerance inside it
    flat = el("flat", 1000.0, 1000.0, t=40.0, var=1.0)
    r = reorder([hot, cold], mechanism=TH, entry_c=40.0, sigma_temp_c=0.5, after=[flat])
    assert r.substituted and r.chosen.order == (1, 0) and not r.refused
    # the same but sensitive (+40 J from 40 to 80 °C, σ 1 J): refused, the element named
    steep = el("steep", 1000.0, 1040.0, t=40.0, var=1.0)
    r = reorder([hot, cold], mechanism=TH, entry_c=40.0, sigma_temp_c=0.5, after=[steep])
    assert not r.substituted
    assert r.refused and r.refused[0].element == "steep"
    assert abs(r.refused[0].delta_energy_j) > r.refused[0].tolerance_j
    # a context-free downstream element counts as insensitive, but unknown work follows it
    plain = Signature("plain", 0.0, 0.01, 5.0)
    r = reorder([hot, cold], mechanism=TH, entry_c=40.0, sigma_temp_c=0.5, after=[plain])
    assert not r.substituted and r.refused[0].element is None


def test_periodic_saving_that_lives_downstream_is_refused() -> None:
    # group elements insensitive to entry; the order only changes the exit temperature, and the
    # downstream element gets cheaper when entered hot: the "saving" is all downstream
    hot, cold = el("hot", 600.0, 600.0), el("cold", 100.0, 100.0)
    down = el("down", 1000.0, 900.0, t=1.0, var=1.0)
    r = reorder([hot, cold], mechanism=TH, sigma_temp_c=0.5, after=[down], periodic=True)
    assert r.best.order == (1, 0) and r.best.step.energy_j < r.given.step.energy_j
    assert r.best.group.energy_j == pytest.approx(r.given.group.energy_j)
    assert not r.substituted and r.refused[0].element == "down"
    # with the downstream element flat, the orders cost the same: nothing to substitute
    flat = el("flat", 1000.0, 1000.0, t=1.0, var=1.0)
    r = reorder([hot, cold], mechanism=TH, sigma_temp_c=0.5, after=[flat], periodic=True)
    assert not r.substituted and not r.refused


def test_saving_within_sigma_is_not_substituted() -> None:
    hot, cold = el("hot", 600.0, 640.0, var=4e4), el("cold", 100.0, 140.0, var=4e4)
    flat = el("flat", 1000.0, 1000.0, t=40.0)
    r = reorder([hot, cold], mechanism=TH, entry_c=40.0, sigma_temp_c=0.5, after=[flat])
    assert not r.substituted and r.kept is not None and "within" in r.kept


def test_local_search_when_there_are_too_many_orders() -> None:
    elems = [el(f"e{i}", 100.0 + 50 * i, 110.0 + 70 * i) for i in range(6)]
    r = reorder(elems, mechanism=TH, entry_c=40.0, sigma_temp_c=0.5, periodic=True, max_orders=40)
    assert not r.exhaustive and r.orders_evaluated <= 40
    assert r.chosen.step.energy_j <= r.given.step.energy_j


def test_sigma_of_saving_cancels_shared_points() -> None:
    a, b = el("a", 600.0, 640.0, var=1.0), el("b", 100.0, 140.0, var=1.0)
    ev = evaluate_order([a, b], (0, 1), mechanism=TH, entry_c=40.0)
    assert saving_sd([a, b], ev, ev) == (0.0, 0.0)        # an order against itself


def test_temperature_sigma() -> None:
    obs = [ThermalObservation(40.0, 1.0, 600.0, TH.exit_temp_c(40.0, 1.0, 600.0) + d) for d in (0.3, -0.3)]
    assert temperature_sigma_c(TH, obs) == pytest.approx(0.3)
    with pytest.raises(InputError):
        temperature_sigma_c(TH, [])


# -- laws -----------------------------------------------------------------------------------

energies = st.floats(1.0, 1000.0)
pairs = st.tuples(energies, energies, st.floats(0.1, 5.0))


@settings(max_examples=40, deadline=None)
@given(st.lists(pairs, min_size=2, max_size=5), st.booleans())
def test_mechanism_off_every_order_costs_the_same(spec, periodic) -> None:
    # R_th = 0: nothing heats the die, every element enters at ambient (°C 30), whatever ran before
    off = ThermalMechanism(ambient_c=30.0, r_th_c_per_w=0.0, tau_s=2.0)
    elems = [el(f"e{i}", lo, hi, t) for i, (lo, hi, t) in enumerate(spec)]
    r = reorder(elems, mechanism=off, entry_c=30.0, sigma_temp_c=0.3, periodic=periodic)
    import itertools

    for o in itertools.islice(itertools.permutations(range(len(elems))), 24):
        ev = evaluate_order(elems, o, mechanism=off, entry_c=30.0, periodic=periodic)
        assert ev.step.energy_j == pytest.approx(r.given.step.energy_j, rel=1e-12)
    assert not r.substituted and r.saving_j == 0.0


@settings(max_examples=30, deadline=None)
@given(st.lists(pairs, min_size=2, max_size=4), st.floats(25.0, 90.0))
def test_no_entry_dependence_every_order_costs_the_same(spec, entry) -> None:
    # elements whose signature is the same at every entry temperature: ⊗ commutes
    elems = [el(f"e{i}", lo, lo, t) for i, (lo, _hi, t) in enumerate(spec)]
    r = reorder(elems, mechanism=TH, entry_c=entry, sigma_temp_c=0.3)
    assert r.best.step.energy_j == pytest.approx(r.given.step.energy_j, rel=1e-12)
    assert not r.substituted


# -- the workload key and the reordered document -------------------------------------------------

def _sig(name: str, omega: OperatingPoint) -> Signature:
    return Signature(name, s_w=120.0, time_s=0.01, d_j=3.0, var_time_s2=1e-10, var_energy_j2=1e-4,
                     n=3, omega=omega, meta={"simulated": True, "work": name})


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    (tmp_path / "sigs").mkdir()
    save_signatures(tmp_path / "sigs" / "g.json",
                    {"gemm_bf16_8192@700W": _sig("gemm_bf16_8192", OperatingPoint(power_limit_w=700.0))})
    save_signatures(tmp_path / "sigs" / "c.json",
                    {"copy_2GiB@700W": _sig("copy_2GiB", OperatingPoint(power_limit_w=700.0))})
    return tmp_path


def _wdoc(**over) -> dict:
    d = {"format": WORKLOAD_FORMAT, "name": "w",
         "elements": {"g": "sigs/g.json", "c": "sigs/c.json"},
         "shape": {"kind": "chain", "tasks": ["g", "c", "g", {"name": "last", "element": "c"}]},
         "idle_power_w": 80.0, "transitions": "free", "reorderable": [["g/0", "c", "g/1"]]}
    d.update(over)
    return d


def _write(proj: Path, doc, name="w.json") -> Path:
    p = proj / name
    p.write_text(json.dumps(doc))
    return p


def test_reorderable_is_read(proj) -> None:
    wl = load_workload(_write(proj, _wdoc()))
    assert [t.name for t in wl.problem.tasks] == ["g/0", "c", "g/1", "last"]
    assert wl.reorderable == (("g/0", "c", "g/1"),)


@pytest.mark.parametrize("groups, shape, match", [
    ([["g/0", "nope"]], None, "unknown task 'nope'"),
    ([["g/0", "g/1"]], None, "not consecutive"),
    ([["g/0", "c"], ["c", "g/1"]], None, "more than one group"),
    ([["a", "b"]], {"kind": "dag", "tasks": [{"name": "a", "element": "g", "device": "d0"},
                                             {"name": "b", "element": "c", "device": "d1"}]},
     "one device"),
    ([["a", "b"]], {"kind": "dag", "tasks": [{"name": "a", "element": "g", "device": "d0"},
                                             {"name": "x", "element": "c", "device": "d1"},
                                             {"name": "b", "element": "c", "device": "d0"}],
                    "edges": [["a", "x"], ["x", "b"]]}, "depends on"),
    ([["s0/forward/0", "s0/forward/1"]], {"kind": "1f1b", "stages": 2, "microbatches": 2,
                                          "forward": "g", "backward": "c"}, "chain and dag"),
])
def test_reorderable_refused(proj, groups, shape, match) -> None:
    doc = _wdoc(reorderable=groups)
    if shape is not None:
        doc["shape"] = shape
    with pytest.raises(FormatError, match=match):
        load_workload(_write(proj, doc))


def test_reordered_document_keeps_names_and_rebases_paths(proj) -> None:
    src = _write(proj, _wdoc())
    wl = load_workload(src)
    (proj / "out").mkdir()
    fake = GroupReorder("gpu0", ("g/0", "c", "g/1"), ("c", "g/0", "g/1"), None, ())  # type: ignore[arg-type]
    doc = reordered_document(json.loads(src.read_text()), src, [fake], wl, proj / "out" / "w2.json")
    assert [t["name"] for t in doc["shape"]["tasks"]] == ["c", "g/0", "g/1", "last"]
    assert doc["elements"]["g"] == "../sigs/g.json"
    assert doc["reorderable"] == [["c", "g/0", "g/1"]]
    out = _write(proj / "out", doc, "w2.json")
    wl2 = load_workload(out)
    assert [t.name for t in wl2.problem.tasks] == ["c", "g/0", "g/1", "last"]


# -- the CLI ------------------------------------------------------------------------------------

def _cli(capsys, *args):
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


@pytest.mark.parametrize("extra, doc_over, match", [
    ([], {"reorderable": None}, "no \"reorderable\" groups"),
    (["--entry", "tepid"], {}, "--entry 'tepid'"),
    (["--warm-c", "hot"], {}, "--warm-c 'hot'"),
    (["--repeats", "1"], {}, "--repeats must be >= 2"),
    (["--alpha", "1.5"], {}, "--alpha"),
    (["--device", "tpu"], {}, "--device 'tpu'"),
])
def test_cli_bad_input_exit_2_nothing_written(proj, capsys, extra, doc_over, match) -> None:
    doc = _wdoc(**doc_over)
    if doc.get("reorderable") is None:
        doc.pop("reorderable")
    path = _write(proj, doc)
    out = proj / "r.json"
    rc, _out, err = _cli(capsys, "reorder", str(path), "-o", str(out), *extra)
    assert rc == 2 and not out.exists()
    assert len(err) == 1 and match in err[0]


def test_cli_refuses_writing_over_its_input(proj, capsys) -> None:
    path = _write(proj, _wdoc())
    before = path.read_text()
    rc, _out, err = _cli(capsys, "reorder", str(path), "-o", str(path))
    assert rc == 2 and path.read_text() == before and "input file" in err[0]


def test_cli_reorders_on_the_simulator(proj, capsys, monkeypatch) -> None:
    # short kernels: no order can matter beyond σ, so the given order is kept; the file is
    # written, runnable, and every task is composed with its context
    path = _write(proj, _wdoc())
    monkeypatch.chdir(proj)
    rc, out, err = _cli(capsys, "reorder", str(path), "-o", "r.json", "--repeats", "2", "--json")
    assert rc == 0, err
    res = json.loads(out)
    (g,) = res["groups"]
    assert sorted(g["chosen"]) == sorted(["g/0", "c", "g/1"])
    assert [c["composed"] for c in g["composed"]] == ["context"] * 4
    th = res["thermal"]["gpu0"]
    assert 0.02 < th["r_th_c_per_w"] < 0.09 and 1.0 < th["tau_s"] < 10.0
    assert all(len(t) >= 2 for t in th["entry_temps_c"].values())
    wl = load_workload(proj / "r.json")
    assert [t.name for t in wl.problem.tasks][3] == "last"


def test_cli_refuses_operating_points_that_inherit_a_knob(proj, capsys) -> None:
    # copy sets the SM clock, gemm leaves it to whatever ran before: reordering would change
    # gemm's clock, so the tool refuses before measuring anything
    save_signatures(proj / "sigs" / "c.json", {"copy_2GiB@1005MHz/700W": _sig(
        "copy_2GiB", OperatingPoint(sm_clock_mhz=1005.0, power_limit_w=700.0))})
    path = _write(proj, _wdoc())
    rc, _out, err = _cli(capsys, "reorder", str(path), "-o", str(proj / "r.json"))
    assert rc == 2 and not (proj / "r.json").exists()
    assert len(err) == 1 and "set different knobs" in err[0]


def test_a_list_of_simulated_kernels_is_work() -> None:
    # ecal characterize takes module:attr giving a list of kernels; ecal run must run it too
    from execution.work import CallableWork, ExecutionError
    from measure.sim import SimulatedGPU, preset

    w = CallableWork([preset("copy_2GiB")] * 3, "copies")
    gpu = SimulatedGPU(seed=0)
    t0 = gpu.time_s()
    gpu.run(w.work, 1)
    one = SimulatedGPU(seed=0)
    one.run(preset("copy_2GiB"), 1)
    assert gpu.time_s() - t0 == pytest.approx(3 * one.time_s(), rel=0.01)
    with pytest.raises(ExecutionError, match="list of 2"):
        CallableWork([1, 2], "bad")  # type: ignore[arg-type]


def test_cli_saves_and_reads_contexts(proj, capsys, monkeypatch) -> None:
    path = _write(proj, _wdoc())
    monkeypatch.chdir(proj)
    rc, out, err = _cli(capsys, "reorder", str(path), "-o", "r.json", "--repeats", "2", "--json",
                        "--save-contexts", "ctx.json")
    assert rc == 0, err
    first = json.loads(out)["groups"][0]
    doc = json.loads((proj / "ctx.json").read_text())
    assert doc["format"] == "ecal.contexts/1" and set(doc["devices"]) == {"gpu0"}
    # read back: no characterization, the same prediction
    rc, out, err = _cli(capsys, "reorder", str(path), "-o", "r2.json", "--contexts", "ctx.json", "--json")
    assert rc == 0, err
    again = json.loads(out)["groups"][0]
    assert again["given_energy_j"] == pytest.approx(first["given_energy_j"], rel=1e-12)
    assert again["chosen"] == first["chosen"]
    # a contexts file lacking an element of the device: exit 2, nothing written
    del doc["devices"]["gpu0"]["elements"][next(iter(doc["devices"]["gpu0"]["elements"]))]
    (proj / "ctx2.json").write_text(json.dumps(doc))
    rc, _out, err = _cli(capsys, "reorder", str(path), "-o", "r3.json", "--contexts", "ctx2.json")
    assert rc == 2 and not (proj / "r3.json").exists() and "no element" in err[0]


def test_distinct_orders_are_multiset_permutations() -> None:
    import itertools

    from frontier.reorder import _distinct_orders

    keys = ["a", "b", "a", "c", "b"]
    got = _distinct_orders(keys)
    assert got[0] == (0, 1, 2, 3, 4) and len(got) == len(set(got)) == 30     # 5!/(2!·2!)
    want = {tuple(keys[i] for i in p) for p in itertools.permutations(range(5))}
    assert {tuple(keys[i] for i in o) for o in got} == want
    # twelve tasks of two kinds: 924 orders, found without walking 12! permutations
    assert len(_distinct_orders(["x"] * 6 + ["y"] * 6)) == 924
