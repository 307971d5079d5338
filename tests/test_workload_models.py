"""The typed models of the workload and schedule formats (execution.workload_models,
frontier.format_models.ScheduleFile): a malformed document is one line naming the file and the
field path; what the writers write validates and reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecal.cli import main
from execution.workload import WORKLOAD_FORMAT, load_workload, workload_from_dict
from execution.workload_models import SHAPES, WorkloadFile, known_keys
from frontier.errors import FormatError
from frontier.format_models import ScheduleFile
from frontier.formats import content, json_schema, validate
from frontier.io import save_signatures
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature
from measure.schedule import DeviceInfo, ScheduleEntry, read_schedule, schedule_to_dict

EXAMPLES = Path(__file__).resolve().parent.parent / "ecal" / "examples"


def _sigs(name: str, t0: float) -> list[Signature]:
    return [Signature(name, s_w=100.0, time_s=t0 * (1 + 0.1 * k), d_j=(5.0 - k) * t0 * 100,
                      var_time_s2=1e-10, var_energy_j2=1e-4, n=3,
                      omega=OperatingPoint(sm_clock_mhz=f), meta={"ready_power_w": 120.0})
            for k, f in enumerate((1980, 1680, 1380))]


@pytest.fixture
def proj(tmp_path):
    for nm, el, t in (("fwd.json", "stage_forward", 0.01), ("bwd.json", "stage_backward", 0.02)):
        save_signatures(tmp_path / nm, {f"{s.name}@{s.omega.label()}": s for s in _sigs(el, t)})
    return tmp_path


def _workload(**over) -> dict:
    d = {"format": WORKLOAD_FORMAT, "name": "w",
         "elements": {"fwd": {"source": "fwd.json", "element": "stage_forward"}, "bwd": "bwd.json"},
         "shape": {"kind": "1f1b", "stages": 2, "microbatches": 3, "forward": "fwd",
                   "backward": "bwd"},
         "idle_power_w": 60.0, "transitions": {"constant": {"time_s": 0.001, "energy_j": 0.0}}}
    d.update(over)
    return d


def _schedule() -> dict:
    entries = {d: [ScheduleEntry(f"s{i}/forward/0", 0.0, 0.01,
                                 {"sm_clock_mhz": 1980.0, "power_limit_w": 700.0, "sm_count": 16}),
                   ScheduleEntry(f"s{i}/backward/0", 0.01, 0.03, {"sm_clock_mhz": 1380.0})]
               for i, d in enumerate(("stage0", "stage1"))}
    return schedule_to_dict(
        entries, problem="p", deadline_s=0.04, makespan_s=0.03, energy_j=5.0, simulated=True,
        confidence={"confidence": 0.9, "solved_deadline_s": 0.035, "p_meets_deadline": 0.93},
        steady_state=True, ranks=["stage0", "stage1"],
        device_info={"stage0": DeviceInfo(120.0, 2), "stage1": DeviceInfo(None, 2)})


def _one_line(exc: pytest.ExceptionInfo, file: str, path: str, words: str) -> None:
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{file}: {path}: ") and words in msg, msg


# -- workload: the model alone -------------------------------------------------------------------

WORKLOAD_FAULTS = [
    (lambda d: d.update(stray=1), "stray", "unknown key (known: description, devices"),
    (lambda d: d["elements"]["fwd"].update(file="x"), "elements.fwd.file", "unknown key"),
    (lambda d: d.update(devices={"stage0": {"idle": 1.0}}), "devices.stage0.idle",
     "unknown key (known: idle_power_w, transitions)"),
    (lambda d: d["elements"].update(fwd=3), "elements.fwd", 'a path or an object with "source"'),
    (lambda d: d.update(steady_state="yes"), "steady_state", "true or false"),
    (lambda d: d.update(name=7), "name", "valid string"),
    (lambda d: d.update(ranks="stage0"), "ranks", "valid list"),
    (lambda d: d.pop("elements"), "elements", "missing"),
    (lambda d: d["elements"]["fwd"].pop("source"), "elements.fwd.source", "missing"),
    (lambda d: d.update(elements={}), "elements", "at least one element"),
    (lambda d: d.update(devices={"stage0": {"idle_power_w": float("nan")}}),
     "devices.stage0.idle_power_w", "non-negative finite number"),
]


@pytest.mark.parametrize("edit,path,words", WORKLOAD_FAULTS, ids=[f[1] for f in WORKLOAD_FAULTS])
def test_a_malformed_workload_is_one_line_naming_the_field(proj, edit, path, words):
    doc = _workload()
    edit(doc)
    file = str(proj / "w.json")
    with pytest.raises(FormatError) as ei:
        workload_from_dict(doc, file)
    _one_line(ei, file, path, words)


SHAPE_FAULTS = [
    ({"stages": 2.5}, "shape.stages", "must be an integer >= 1 (got 2.5)"),
    ({"stages": True}, "shape.stages", "integer >= 1"),
    ({"microbatches": None}, "shape.microbatches", "integer >= 1"),
    ({"stagez": 2}, "shape.stagez", "unknown key (known: backward, forward, kind, microbatches"),
    ({"kind": "interleaved-1f1b", "chunks": 1}, "shape.chunks", "integer >= 2"),
    ({"kind": "interleaved-1f1b"}, "shape.chunks", "missing"),
    ({"kind": "chain", "tasks": []}, "shape.tasks", "non-empty list"),
    ({"kind": "chain", "tasks": ["fwd", 3]}, "shape.tasks[1]", "an element name or an object"),
    ({"kind": "chain", "tasks": [{"element": "fwd", "nm": "a"}]}, "shape.tasks[0].nm",
     "unknown key (known: element, name)"),
    ({"kind": "dag", "tasks": [{"name": "a", "element": "fwd"}]}, "shape.tasks[0].device",
     "missing"),
    ({"kind": "dag", "tasks": [{"name": "a", "element": "fwd", "device": "g"}],
      "edges": [["a"]]}, "shape.edges[0]", "at least 2 items"),
]


@pytest.mark.parametrize("change,path,words", SHAPE_FAULTS, ids=[f[1] + ":" + f[2][:20] for f in SHAPE_FAULTS])
def test_a_malformed_shape_names_the_shape_field(proj, change, path, words):
    doc = _workload()
    shape = doc["shape"]
    if change.get("kind") in ("chain", "dag"):
        shape = {"kind": change["kind"]}
    shape.update(change)
    doc["shape"] = shape
    with pytest.raises(FormatError) as ei:
        workload_from_dict(doc, str(proj / "w.json"))
    _one_line(ei, str(proj / "w.json"), path, words)


def test_transitions_rules_name_their_fields(proj):
    file = str(proj / "w.json")
    for rule, path, words in (
            ({"constant": {"time_s": -1}}, "transitions.constant.time_s", "non-negative number"),
            ({"constant": {"energy_j": 1.0}}, "transitions.constant.time_s", "missing"),
            ({"constant": {"time_s": 0.1, "e": 1}}, "transitions.constant.e",
             "unknown key (known: energy_j, time_s)"),
            ({"file": 3}, "transitions.file", "valid string"),
            ({"file": "t.json", "x": 1}, "transitions.x", "unknown key (known: file)")):
        with pytest.raises(FormatError) as ei:
            workload_from_dict(_workload(transitions=rule), file)
        _one_line(ei, file, path, words)


def test_the_bundled_workload_and_every_shape_validate():
    doc = json.loads((EXAMPLES / "workload_1f1b.json").read_text())
    _, body = content("w.json", doc, "workload")
    m = validate(WorkloadFile, body, "w.json")
    assert m.steady_state is True and set(m.elements) == {"fwd", "bwd"}
    assert m.elements["fwd"].element == "stage_forward"
    short = validate(WorkloadFile, {**body, "elements": {"fwd": "a.json"}}, "w.json")
    assert short.elements["fwd"].source == "a.json" and short.elements["fwd"].element is None
    for kind, model in SHAPES.items():
        assert kind in str(model.model_json_schema()["properties"]["kind"])


def test_known_keys_follow_the_path():
    assert known_keys(WorkloadFile, "elements.fwd.file") == ("element", "gpu_model", "kappa",
                                                             "source", "work")
    assert known_keys(WorkloadFile, "devices.g0.x") == ("idle_power_w", "transitions")
    assert known_keys(SHAPES["chain"], "tasks[3].x") == ("element", "name")
    assert known_keys(WorkloadFile, "nowhere.x") == ()


def test_chain_names_are_kept(proj):
    doc = _workload(shape={"kind": "chain", "tasks": ["fwd", {"element": "bwd"}, "fwd",
                                                      {"element": "bwd", "name": "last"}]},
                    idle_power_w=10.0)
    wl = workload_from_dict(doc, str(proj / "w.json"))
    assert [t.name for t in wl.problem.tasks] == ["fwd/0", "bwd/1", "fwd/1", "last"]


def test_workload_json_schema_declares_the_model():
    schema = json_schema("workload")
    assert schema["properties"]["format"]["const"] == "ecal.workload/1"
    assert {"elements", "shape"} <= set(schema["required"])
    assert schema["additionalProperties"] is False


# -- schedule ------------------------------------------------------------------------------------

def test_the_writers_schedule_validates_and_reads_back(tmp_path):
    doc = _schedule()
    _, body = content("s.json", doc, "schedule")
    m = validate(ScheduleFile, body, "s.json")
    assert m.device_info is not None and m.device_info["stage1"].ready_power_w is None
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    r0 = read_schedule(p, 0)
    assert r0.device == "stage0" and r0.steady_state and r0.ready_power_w == 120.0
    assert r0.switches_per_iteration == 2
    assert r0.omegas["s0/forward/0"] == OperatingPoint(sm_clock_mhz=1980.0, power_limit_w=700.0,
                                                       sm_count=16)
    assert isinstance(r0.omegas["s0/forward/0"].sm_count, int)
    assert read_schedule(p, "stage1").ready_power_w is None


def test_a_planned_schedule_round_trips(proj, capsys, monkeypatch):
    (proj / "w.json").write_text(json.dumps(_workload()))
    monkeypatch.chdir(proj)
    # the CLI writes it with execution.schedule.stage_schedule
    assert main(["plan", "w.json", "--deadline", "1.1x", "--schedule", "s.json"]) == 0
    doc = json.loads((proj / "s.json").read_text())
    validate(ScheduleFile, content("s.json", doc, "schedule")[1], "s.json")
    wl = load_workload(proj / "w.json")
    assert read_schedule(proj / "s.json", 1).device == "stage1"
    assert set(doc["devices"]) == set(wl.ranks or ())


SCHEDULE_FAULTS = [
    (lambda d: d.update(stray=1), "stray", "unknown field"),
    (lambda d: d["devices"]["stage0"][0].update(sm_clock=1.0), "devices.stage0[0].sm_clock",
     "unknown field"),
    (lambda d: d["devices"]["stage0"][0].update(sm_clock_mhz="fast"),
     "devices.stage0[0].sm_clock_mhz", "must be a positive number"),
    (lambda d: d["devices"]["stage0"][0].update(power_limit_w=float("nan")),
     "devices.stage0[0].power_limit_w", "NaN"),      # read_json names it
    (lambda d: d["devices"]["stage1"][1].pop("task"), "devices.stage1[1].task", "missing"),
    (lambda d: d.update(devices={}), "devices", "at least 1 item"),
    (lambda d: d["devices"].update(stage1=[]), "devices.stage1", "at least 1 item"),
    (lambda d: d.pop("devices"), "devices", "missing"),
    (lambda d: d.update(ranks=[0, 1]), "ranks[0]", "valid string"),
    (lambda d: d["device_info"]["stage0"].update(ready_power_w=0), "device_info.stage0.ready_power_w",
     "positive number"),
    (lambda d: d["device_info"]["stage0"].update(switches_per_iteration=1.5),
     "device_info.stage0.switches_per_iteration", "valid integer"),
    (lambda d: d.update(steady_state="yes"), "steady_state", "valid boolean"),
]


@pytest.mark.parametrize("edit,path,words", SCHEDULE_FAULTS, ids=[f[1] for f in SCHEDULE_FAULTS])
def test_a_malformed_schedule_is_one_line_naming_the_field(tmp_path, edit, path, words):
    doc = _schedule()
    edit(doc)
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(FormatError) as ei:
        read_schedule(p, 0)
    _one_line(ei, str(p), path, words)


def test_nan_in_a_schedule_in_memory_is_named_by_the_model():
    doc = _schedule()
    doc["deadline_s"] = float("nan")
    doc["devices"]["stage1"][0]["sm_clock_mhz"] = float("inf")
    with pytest.raises(FormatError) as ei:
        validate(ScheduleFile, content("s.json", doc, "schedule")[1], "s.json")
    _one_line(ei, "s.json", "deadline_s", "finite number")
    doc["deadline_s"] = 1.0
    with pytest.raises(FormatError) as ei:
        validate(ScheduleFile, content("s.json", doc, "schedule")[1], "s.json")
    _one_line(ei, "s.json", "devices.stage1[0].sm_clock_mhz", "positive finite number")


def test_schedule_domain_checks_stay(tmp_path):
    doc = _schedule()
    doc["devices"]["stage0"].append(dict(doc["devices"]["stage0"][0]))
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"devices\.stage0\[2\]\.task: task 's0/forward/0' appears twice"):
        read_schedule(p, 0)
    with pytest.raises(FormatError, match=r"ranks: rank 2 out of range"):
        read_schedule(p, 2)
    with pytest.raises(FormatError, match=r"devices: no device 'gpu9'"):
        read_schedule(p, "gpu9")


def test_a_minimal_hand_written_schedule_still_reads(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"format": "ecal.schedule/1",
                             "devices": {"gpu0": [{"task": "a", "sm_clock_mhz": 1410,
                                                   "sm_count": None}]}}))
    r = read_schedule(p, 0)
    assert r.device == "gpu0" and r.omegas["a"] == OperatingPoint(sm_clock_mhz=1410.0)
    assert r.ready_power_w is None and r.switches_per_iteration is None and not r.steady_state
