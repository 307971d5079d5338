"""Workload files (ecal.workload/1): reading, strict validation, every shape, and the CLI route
``ecal plan workload.json --schedule schedule.json`` with contract B's optional keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ecal.cli import main
from execution.workload import WORKLOAD_FORMAT, load_workload, workload_from_dict
from frontier.errors import FormatError
from frontier.io import save_signatures, signature_to_dict
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from frontier.transition import TransitionTable

EXAMPLES = Path(__file__).resolve().parent.parent / "ecal" / "examples"
CLOCKS = (1980, 1680, 1380)


def _sigs(name: str, t0: float, ready: bool = True, kappa: str | None = None) -> list[Signature]:
    """Three operating points: slower and cheaper as the clock drops."""
    out = []
    for k, f in enumerate(CLOCKS):
        t = t0 * (1 + 0.1 * k)
        meta = {"ready_power_w": 120.0 - 10 * k} if ready else {}
        out.append(Signature(name, s_w=100.0, time_s=t, d_j=(5.0 - k) * t * 100, var_time_s2=1e-10,
                             var_energy_j2=1e-4, n=3, omega=OperatingPoint(sm_clock_mhz=f),
                             kappa=kappa, meta=meta))
    return out


def _save(path: Path, sigs: list[Signature]) -> None:
    save_signatures(path, {f"{s.name}@{s.omega.label()}": s for s in sigs})


@pytest.fixture
def proj(tmp_path):
    """A user's folder: two characterization outputs and a workload naming them."""
    _save(tmp_path / "fwd.json", _sigs("stage_forward", 0.010))
    _save(tmp_path / "bwd.json", _sigs("stage_backward", 0.020))
    return tmp_path


def _doc(**over):
    """A workload whose switches are free, said explicitly (these tests are about shapes and
    reading; tests/test_deadline_kept.py is about a workload that gives no transitions)."""
    d = {"format": WORKLOAD_FORMAT, "name": "w",
         "elements": {"fwd": {"source": "fwd.json", "element": "stage_forward"}, "bwd": "bwd.json"},
         "shape": {"kind": "1f1b", "stages": 2, "microbatches": 3, "forward": "fwd", "backward": "bwd"},
         "idle_power_w": 60.0, "transitions": "free"}
    d.update(over)
    return d


def _write(proj: Path, doc, name="w.json") -> Path:
    p = proj / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return p


# -- reading -------------------------------------------------------------------------------

def test_1f1b_workload_builds_the_pipeline(proj):
    wl = load_workload(_write(proj, _doc()))
    p = wl.problem
    assert wl.kind == "1f1b" and wl.ranks == ("stage0", "stage1")
    assert p.n_tasks == 2 * 3 * 2
    assert [t.name for t in p.tasks[:3]] == ["s0/forward/0", "s0/forward/1", "s0/backward/0"]
    assert len(p.tasks[0].options) == len(CLOCKS)
    assert wl.steady_state is True and getattr(p, "steady_state", True) is True
    assert dict(p.idle_power_w) == {"stage0": 60.0, "stage1": 60.0}
    # ready power at the top operating point (1980 MHz) of the device's signatures
    assert wl.ready_power_w == {"stage0": 120.0, "stage1": 120.0}


def test_per_stage_elements_and_one_measurement_shared(proj):
    _save(proj / "fwd_last.json", _sigs("head_forward", 0.015))
    doc = _doc(elements={"fwd": "fwd.json", "head": "fwd_last.json", "bwd": "bwd.json"})
    doc["shape"]["forward"] = ["fwd", "head"]
    p = load_workload(_write(proj, doc)).problem
    t0 = {t.name: t for t in p.tasks}
    assert t0["s1/forward/0"].options[0].time_s == pytest.approx(0.015)
    assert t0["s0/forward/0"].options[0].time_s == pytest.approx(0.010)
    # every microbatch uses the same measurement: one key, so its error counts as shared
    assert t0["s0/forward/0"].options[1].key == t0["s0/forward/2"].options[1].key


def test_gpipe_interleaved_chain_and_dag(proj):
    g = load_workload(_write(proj, _doc(shape={"kind": "gpipe", "stages": 2, "microbatches": 2,
                                               "forward": "fwd", "backward": "bwd"}))).problem
    assert [t.name for t in g.tasks[:4]] == ["s0/forward/0", "s0/forward/1", "s0/backward/0", "s0/backward/1"]
    iv = load_workload(_write(proj, _doc(shape={
        "kind": "interleaved-1f1b", "stages": 2, "microbatches": 4, "chunks": 2,
        "forward": [["fwd", "fwd"], "fwd"], "backward": "bwd"}))).problem
    assert iv.n_tasks == 2 * 4 * 2 * 2 and iv.tasks[0].name == "s0v0/forward/0"
    ch = load_workload(_write(proj, _doc(shape={"kind": "chain", "tasks": ["fwd", "bwd", "fwd"]})))
    assert [t.name for t in ch.problem.tasks] == ["fwd/0", "bwd", "fwd/1"]
    assert ch.steady_state is False and ch.ranks is None
    dag = load_workload(_write(proj, _doc(shape={
        "kind": "dag", "tasks": [{"name": "a", "element": "fwd", "device": "g0"},
                                 {"name": "b", "element": "bwd", "device": "g1"}],
        "edges": [["a", "b"]]}, idle_power_w={"g0": 10.0, "g1": 20.0}, steady_state=True)))
    assert dag.problem.edges == (("a", "b"),) and dict(dag.problem.idle_power_w) == {"g0": 10.0, "g1": 20.0}
    assert dag.steady_state is True


def test_transitions_constant_file_and_per_device(proj):
    table = TransitionTable.constant(0.003, 0.5)
    (proj / "t.json").write_text(json.dumps(table.to_dict()))
    doc = _doc(transitions={"file": "t.json"},
               devices={"stage1": {"transitions": {"constant": {"time_s": 0.001}}}})
    p = load_workload(_write(proj, doc)).problem
    a, b = OperatingPoint(sm_clock_mhz=1980), OperatingPoint(sm_clock_mhz=1380)
    assert p.rule("stage0").cost(a, b) == (0.003, 0.5)
    assert p.rule("stage1").cost(a, b) == (0.001, 0.0)


def test_relative_paths_resolve_against_the_workload_folder(proj, tmp_path, monkeypatch):
    sub = proj / "sub"
    sub.mkdir()
    shutil.move(proj / "fwd.json", sub / "fwd.json")
    doc = _doc(elements={"fwd": "sub/fwd.json", "bwd": "bwd.json"})
    path = _write(proj, doc)
    monkeypatch.chdir(sub)
    assert load_workload(path).problem.n_tasks == 12


def test_characterization_json_with_ready_power_meta(proj):
    # the JSON `ecal characterize --json` prints (CharacterizationResult.to_dict), contract C meta
    sigs = _sigs("stage_forward", 0.010, ready=False)
    doc = {"format": "energy-calculus/characterization", "element": "stage_forward",
           "simulated": True, "meta": {"ready_power_w": {"1980MHz": 111.0, "1680MHz": 99.0}},
           "signatures": [signature_to_dict(s) for s in sigs], "frontier": [0], "skipped": []}
    (proj / "fwd.json").write_text(json.dumps(doc))
    _save(proj / "bwd.json", _sigs("stage_backward", 0.020, ready=False))
    wl = load_workload(_write(proj, _doc()))
    assert len(wl.problem.tasks[0].options) == 3
    assert wl.ready_power_w["stage0"] == 111.0


def test_signature_file_top_level_meta_ready_power(proj):
    # `ecal characterize -o` writes a signature file whose top-level meta maps ω_dev → W
    sigs = _sigs("stage_forward", 0.010, ready=False)
    doc = json.loads((proj / "fwd.json").read_text())
    doc["signatures"] = {f"stage_forward@{s.omega.label()}": signature_to_dict(s) for s in sigs}
    doc["meta"] = {"elements": ["stage_forward"], "ready_power_w": {"1980MHz": 133.0}}
    (proj / "fwd.json").write_text(json.dumps(doc))
    _save(proj / "bwd.json", _sigs("stage_backward", 0.020, ready=False))
    assert load_workload(_write(proj, _doc())).ready_power_w == {"stage0": 133.0, "stage1": 133.0}


def test_store_source_is_read_lazily_through_contract_d(proj, monkeypatch):
    store = pytest.importorskip("measure.store")
    calls = []

    def fake(path, element=None, gpu_model=None):
        calls.append((Path(path).name, element, gpu_model))
        return {"stage_forward": _sigs("stage_forward", 0.01), "x": _sigs("x", 1.0)}

    monkeypatch.setattr(store, "read_signatures", fake)
    (proj / "campaign.sqlite").write_bytes(b"")
    doc = _doc(elements={"fwd": {"source": "campaign.sqlite", "element": "stage_forward",
                                 "gpu_model": "H200"}, "bwd": "bwd.json"})
    wl = load_workload(_write(proj, doc))
    assert calls == [("campaign.sqlite", "stage_forward", "H200")]
    assert len(wl.problem.tasks[0].options) == 3


def test_microbatches_idle_and_transition_overrides(proj):
    from solvers.model import ConstantTransition

    wl = load_workload(_write(proj, _doc()), microbatches=5, idle_power_w=7.0,
                       transitions=ConstantTransition(0.01))
    assert wl.problem.n_tasks == 2 * 5 * 2
    assert set(wl.problem.idle_power_w.values()) == {7.0}
    assert wl.problem.has_transitions


# -- strict validation ---------------------------------------------------------------------

BAD = [
    (lambda d: d.update(extra=1), "extra", "unknown key"),
    (lambda d: d["shape"].update(stagez=2), "shape.stagez", "unknown key"),
    (lambda d: d["elements"]["fwd"].update(file="x"), "elements.fwd.file", "unknown key"),
    (lambda d: d["elements"].update(fwd="nope.json"), "elements.fwd.source", "no such file"),
    (lambda d: d["elements"]["fwd"].update(element="gemm"), "elements.fwd.element", "no element 'gemm'"),
    (lambda d: d["elements"]["fwd"].update(kappa="cudnn"), "elements.fwd.kappa", "no implementation"),
    (lambda d: d["elements"]["fwd"].update(gpu_model="H200"), "elements.fwd.gpu_model", "stores"),
    (lambda d: d["shape"].update(forward="fwdd"), "shape.forward", "not in elements"),
    (lambda d: d["shape"].update(forward=["fwd"]), "shape.forward", "list of 2"),
    (lambda d: d["shape"].update(stages=0), "shape.stages", "integer >= 1"),
    (lambda d: d["shape"].update(microbatches=2.5), "shape.microbatches", "integer >= 1"),
    (lambda d: d["shape"].update(kind="zb"), "shape.kind", "one of"),
    (lambda d: d.update(idle_power_w=-1.0), "idle_power_w", "non-negative"),
    (lambda d: d.pop("idle_power_w"), "idle_power_w", "missing"),
    (lambda d: d.update(idle_power_w={"stage0": 1.0}), "idle_power_w.stage1", "missing"),
    (lambda d: d.update(devices={"stage9": {}}), "devices.stage9", "not a device"),
    (lambda d: d.update(steady_state="yes"), "steady_state", "true or false"),
    (lambda d: d.update(ranks=["stage0", "gpu7"]), "ranks[1]", "not a device"),
    (lambda d: d.update(transitions={"constant": {"time_s": -0.1}}), "transitions.constant.time_s",
     "non-negative"),
    (lambda d: d.update(format="ecal.workload/2"), "format", "expected"),
    (lambda d: d.pop("shape"), "shape", "missing"),
]


@pytest.mark.parametrize("edit,key,words", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_workloads_are_one_line_errors_naming_file_and_key(proj, edit, key, words):
    doc = _doc()
    edit(doc)
    path = _write(proj, doc)
    with pytest.raises(FormatError) as ei:
        load_workload(path)
    msg = str(ei.value)
    assert "\n" not in msg and str(path) in msg and key in msg and words in msg, msg


def test_nan_in_a_workload_names_the_key(proj):
    text = json.dumps(_doc()).replace('"idle_power_w": 60.0', '"idle_power_w": NaN')
    with pytest.raises(FormatError, match="idle_power_w"):
        load_workload(_write(proj, text))


def test_file_with_two_elements_needs_element(proj):
    _save(proj / "both.json", _sigs("a", 0.01) + _sigs("b", 0.02))
    doc = _doc(elements={"fwd": "both.json", "bwd": "bwd.json"})
    with pytest.raises(FormatError, match=r"elements\.fwd\.element.*2 elements"):
        load_workload(_write(proj, doc))


def test_interleaved_shape_errors(proj):
    doc = _doc(shape={"kind": "interleaved-1f1b", "stages": 2, "microbatches": 5, "chunks": 2,
                      "group_size": 4, "forward": "fwd", "backward": "bwd"})
    with pytest.raises(FormatError, match="mod group size"):
        load_workload(_write(proj, doc))
    doc["shape"].update(microbatches=4, group_size=None, forward=[["fwd"], "fwd"])
    with pytest.raises(FormatError, match=r"shape\.forward\[0\].*list of 2"):
        load_workload(_write(proj, doc))


def test_workload_from_dict_without_a_file(proj):
    wl = workload_from_dict(_doc(), "<memory>", base_dir=proj)
    assert wl.problem.n_tasks == 12


# -- the CLI route -------------------------------------------------------------------------

def _cli(capsys, *args):
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


def test_plan_writes_schedule_with_contract_b_keys(proj, capsys, monkeypatch):
    path = _write(proj, _doc(transitions={"constant": {"time_s": 0.001, "energy_j": 0.0}}))
    monkeypatch.chdir(proj)
    rc, out, err = _cli(capsys, "plan", str(path), "--deadline", "1.1x", "--schedule", "s.json",
                        "-o", "p.json")
    assert rc == 0, err
    sched = json.loads((proj / "s.json").read_text())
    assert sched["format"] == "ecal.schedule/1"
    assert sched["ranks"] == ["stage0", "stage1"]
    assert sched["steady_state"] is bool(getattr(load_workload(path).problem, "steady_state", False))
    info = sched["device_info"]
    assert set(info) == {"stage0", "stage1"}
    assert all(v["ready_power_w"] == 120.0 for v in info.values())
    # switches per iteration: changes of ω_dev along each device's entries (+ the wrap)
    for dev, entries in sched["devices"].items():
        clocks = [e["sm_clock_mhz"] for e in entries]
        n = sum(a != b for a, b in zip(clocks, clocks[1:]))
        if sched["steady_state"]:
            n += clocks[-1] != clocks[0]
        assert info[dev]["switches_per_iteration"] == n
        assert [e["task"] for e in entries][0] == f"s{dev[-1]}/forward/0"
    plan = json.loads((proj / "p.json").read_text())
    assert plan["makespan_s"] <= plan["deadline_s"] * (1 + 1e-9)


def test_pareto_on_a_workload_and_microbatches_override(proj, capsys):
    path = _write(proj, _doc())
    rc, out, err = _cli(capsys, "pareto", str(path), "--points", "3", "--microbatches", "2",
                        "-o", str(proj / "c.json"))
    assert rc == 0, err
    curve = json.loads((proj / "c.json").read_text())
    assert len(curve["plans"]) >= 2
    assert all(len(p["tasks"]) == 2 * 2 * 2 for p in curve["plans"])


def test_cli_bad_workload_exit_2_and_nothing_written(proj, capsys):
    path = _write(proj, _doc(shape={"kind": "1f1b", "stages": 2, "microbatches": 3,
                                    "forward": "fwd", "backward": "nope"}))
    rc, out, err = _cli(capsys, "plan", str(path), "--deadline", "1.1x", "--schedule", str(proj / "s.json"))
    assert rc == 2 and len(err) == 1 and "shape.backward" in err[0] and "w.json" in err[0]
    assert not (proj / "s.json").exists()


def test_cli_signature_file_is_pointed_at_the_workload_format(proj, capsys):
    rc, out, err = _cli(capsys, "plan", str(proj / "fwd.json"), "--deadline", "1.1x")
    assert rc == 2 and len(err) == 1 and "ecal.workload/1" in err[0]


def test_bundled_example_plans_to_a_schedule(tmp_path, capsys):
    wl = load_workload(EXAMPLES / "workload_1f1b.json")
    assert wl.kind == "1f1b" and wl.simulated and wl.ranks == tuple(f"stage{i}" for i in range(4))
    assert all(w is not None and w > 0 for w in wl.ready_power_w.values())
    rc, out, err = _cli(capsys, "plan", str(EXAMPLES / "workload_1f1b.json"), "--deadline", "1.05x",
                        "--microbatches", "2", "--schedule", str(tmp_path / "schedule.json"))
    assert rc == 0, err
    sched = json.loads((tmp_path / "schedule.json").read_text())
    assert sched["simulated"] is True and set(sched["devices"]) == set(sched["ranks"])
