"""The execution layer's file formats, each declared once (execution.format_models): work
tables, baselines files, executions and run files. What the writers write reads back; a
malformed document is one line naming the file, the field path and the problem."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any

import pytest

from ecal.cli import main
from ecal.demo import DemoConfig, run_demo
from execution.baselines import all_max_plan, baselines_to_dict, read_baselines
from execution.pipeline import pipeline_work, stage_kernels
from execution.results import execution_from_dict, load_execution
from execution.run import run_plan
from execution.savings import comparison_from_dict, load_run, run_with_baselines
from execution.work import ExecutionError, load_work_table, save_work_table, work_table_from_dict
from frontier.errors import FormatError
from frontier.formats import json_schema
from measure.protocol import Protocol
from measure.sim import PRESETS

SMALL = DemoConfig(n_stages=2, n_microbatches=2, clocks_mhz=(1980, 1440), power_limits_w=(700,),
                   comm_sms=(16,))
FAST = Protocol(target_rse=0.5, min_windows=2, max_windows=3)


@pytest.fixture(scope="module")
def demo():
    r = run_demo(SMALL)
    work = pipeline_work(r.first.problem, stage_kernels(SMALL.stage_sizes[:SMALL.n_stages]),
                         PRESETS["p2p_send"])
    return r.first.plan, r.first.problem, work


@pytest.fixture(scope="module")
def run_doc(demo) -> dict[str, Any]:
    """A run file as ``ecal run -o`` writes it (through JSON)."""
    plan, problem, work = demo
    base = all_max_plan(problem, plan.target_deadline_s or plan.makespan_s)
    cmp = run_with_baselines((plan, problem, work), {"all-max": (base, problem, work)},
                             seed=0, protocol=FAST)
    return json.loads(json.dumps(cmp.to_dict()))


def _fault(call: Any, file: str, path: str, *words: str) -> str:
    """``call()`` raises one line ``file: path: ...`` holding ``words``; the line."""
    with pytest.raises(FormatError) as ei:
        call()
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{file}: {path}: "), msg
    for w in words:
        assert w in msg, msg
    return msg


def _edit(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with ``path`` set to ``value`` (``...``: the key deleted)."""
    out = copy.deepcopy(doc)
    at = out
    for k in path[:-1]:
        at = at[k]
    if value is ...:
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return out


# -- each model gives a schema -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["work", "baselines", "execution", "run"])
def test_each_model_prints_its_schema(kind, capsys):
    assert main(["schema", kind]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == json_schema(kind) and schema["properties"]["format"]["const"] == f"ecal.{kind}/1"


# -- work tables ---------------------------------------------------------------------------------

def test_a_work_table_reads_back_as_written_and_in_its_older_form(demo, tmp_path):
    _, _, work = demo
    p = save_work_table(tmp_path / "work.json", work)
    assert load_work_table(p) == {k: tuple(v) for k, v in work.items()}
    doc = json.loads(p.read_text())
    old = {**doc, "format": "energy-calculus/work-table", "version": 1}
    assert work_table_from_dict(old, "old.json") == load_work_table(p)


@pytest.mark.parametrize("path, value, where, words", [
    (("kernels", "p2p_send", "colour"), 1, "kernels.p2p_send.colour", ("unknown field",)),
    (("kernels", "p2p_send", "flops"), "many", "kernels.p2p_send.flops", ("number", "'many'")),
    (("kernels", "p2p_send", "link_bytes"), math.nan, "kernels.p2p_send.link_bytes", ("finite",)),
    (("kernels", "p2p_send", "name"), ..., "kernels.p2p_send.name", ("missing",)),
    (("kernels", "p2p_send", "tiles"), 0, "kernels.p2p_send.tiles", ("greater than or equal to 1",)),
    (("kernels", "p2p_send", "link_sm_sat"), None, "kernels.p2p_send.link_sm_sat", ("integer",)),
    (("kernels",), {}, "kernels", ("at least one kernel",)),
    (("tasks", "s0/forward/0"), [], "tasks.s0/forward/0", ("at least one option",)),
    (("tasks", "s0/forward/0", 0, "streams"), [], "tasks.s0/forward/0[0].streams",
     ("at least one stream",)),
    (("tasks", "s0/forward/0", 0, "streams", 1, "sm_count"), True,
     "tasks.s0/forward/0[0].streams[1].sm_count", ("integer",)),
    (("simulated",), "yes", "simulated", ("boolean",)),
])
def test_a_malformed_work_table_is_one_line(demo, tmp_path, path, value, where, words):
    _, _, work = demo
    doc = json.loads(save_work_table(tmp_path / "w.json", work).read_text())
    bad = _edit(doc, path, value)
    _fault(lambda: work_table_from_dict(bad, "w.json"), "w.json", where, *words)


def test_what_a_work_table_means_is_checked_by_its_reader(demo, tmp_path):
    _, _, work = demo
    doc = json.loads(save_work_table(tmp_path / "w.json", work).read_text())
    bad = _edit(doc, ("tasks", "s0/forward/0", 0, "streams", 0, "kernel"), "nope")
    _fault(lambda: work_table_from_dict(bad, "w.json"), "w.json",
           "tasks.s0/forward/0[0].streams[0].kernel", "no kernel 'nope'")
    bad = _edit(doc, ("kernels", "p2p_send", "name"), "other")
    _fault(lambda: work_table_from_dict(bad, "w.json"), "w.json", "kernels.p2p_send.name",
           "not the key")
    idle = {"name": "p2p_send", "flops": 0, "bytes": 0, "link_bytes": 0}
    bad = _edit(doc, ("kernels", "p2p_send"), idle)
    _fault(lambda: work_table_from_dict(bad, "w.json"), "w.json", "kernels.p2p_send",
           "does no work")
    _fault(lambda: work_table_from_dict({**doc, "format": "ecal.plan/1"}, "w.json"), "w.json",
           "format", "'plan'")


# -- baselines files -----------------------------------------------------------------------------

def test_a_baselines_file_reads_back_as_written_and_in_its_older_form(tmp_path):
    (tmp_path / "max.json").write_text("{}")
    f = tmp_path / "b.json"
    f.write_text(json.dumps(baselines_to_dict({"all-max": "max.json"}, simulated=True)))
    assert read_baselines(f) == {"all-max": tmp_path / "max.json"}
    f.write_text(json.dumps({"format": "energy-calculus/baselines", "version": 1,
                             "baselines": {"all-max": "max.json"}}))
    assert read_baselines(f) == {"all-max": tmp_path / "max.json"}
    f.write_text(json.dumps(baselines_to_dict({"all-max": "gone.json"})))
    with pytest.raises(ExecutionError, match="baselines.all-max: .*gone.json: no such file"):
        read_baselines(f)


@pytest.mark.parametrize("doc, where, words", [
    ({"baselines": {"a": "a.json"}, "colour": 1}, "colour", ("unknown field",)),
    ({"baselines": {"a": 3}}, "baselines.a", ("string", "3")),
    ({"baselines": {"a": ""}}, "baselines.a", ("at least 1",)),
    ({"baselines": {}}, "baselines", ("at least one baseline",)),
    ({}, "baselines", ("missing",)),
    ({"baselines": {"a": "a.json"}, "simulated": math.nan}, "simulated", ()),
])
def test_a_malformed_baselines_file_is_one_line(tmp_path, doc, where, words):
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"format": "ecal.baselines/1", **doc}))
    _fault(lambda: read_baselines(f), str(f), where, *words)


# -- executions and run files --------------------------------------------------------------------

def test_an_execution_reads_back_as_written(demo, tmp_path):
    res = run_plan(*demo, seed=0, protocol=FAST)
    doc = json.loads(json.dumps(res.to_dict()))
    back = execution_from_dict(doc, "ex.json")
    assert json.loads(json.dumps(back.to_dict())) == doc
    assert back.summary() == res.summary() and back.problems() == res.problems()
    (tmp_path / "ex.json").write_text(json.dumps(doc))
    assert load_execution(tmp_path / "ex.json") == back
    # the older identity, and an infinite RSE (one step) as the writer hands it over
    old = {k: v for k, v in doc.items() if k != "format"}
    assert execution_from_dict({**old, "schema_version": "ecal.execution/1"}, "ex.json") == back
    assert math.isinf(execution_from_dict({**doc, "rse_energy": math.inf}).rse_energy)


def test_a_run_file_reads_back_as_written(run_doc, tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(run_doc))
    back = load_run(tmp_path / "run.json")
    assert json.loads(json.dumps(back.to_dict())) == run_doc
    assert [s.baseline for s in back.savings] == ["all-max"]
    # an infinite z is written as null and read back with the error's sign
    ex = copy.deepcopy(run_doc["plan"])
    dev = ex["step"]["deviation"]
    dev.update(z_time=None, error_time_s=-1.0)
    assert execution_from_dict(ex, "ex.json").step.deviation.z_time == -math.inf


@pytest.mark.parametrize("path, value, where, words", [
    (("colour",), 1, "colour", ("unknown field",)),
    (("simulated",), 1, "simulated", ("boolean",)),
    (("plan", "n_steps"), "3", "plan.n_steps", ("integer", "'3'")),
    (("plan", "step", "deviation", "alpha"), ..., "plan.step.deviation.alpha", ("missing",)),
    (("plan", "step", "measured_energy_j"), math.nan, "plan.step.measured_energy_j", ("finite",)),
    (("plan", "tasks", 0, "colour"), 1, "plan.tasks[0].colour", ("unknown field",)),
    (("baselines", "all-max", "devices", 0, "sd_measured_time_s"), -1.0,
     "baselines.all-max.devices[0].sd_measured_time_s", ("greater than or equal to 0",)),
    (("baselines", "all-max", "format"), "ecal.plan/1", "baselines.all-max.format", ("'plan'",)),
    (("plan",), [], "plan", ("JSON object",)),
    (("savings", 0, "measured"), math.inf, "savings[0].measured", ("finite",)),
    (("savings", 0, "baseline"), ..., "savings[0].baseline", ("missing",)),
])
def test_a_malformed_run_file_is_one_line(run_doc, path, value, where, words):
    bad = _edit(run_doc, path, value)
    _fault(lambda: comparison_from_dict(bad, "run.json"), "run.json", where, *words)


def test_what_a_run_file_means_is_checked_by_its_reader(run_doc):
    bad = _edit(run_doc, ("savings", 0, "baseline"), "nope")
    _fault(lambda: comparison_from_dict(bad, "run.json"), "run.json", "savings[0].baseline",
           "no baseline 'nope'")
    bad = _edit(run_doc, ("plan", "windows", 0, "device"), "gpu9")
    _fault(lambda: comparison_from_dict(bad, "run.json"), "run.json", "plan.windows[0].device",
           "no device 'gpu9'")
    two = run_doc["plan"]["devices"][0]
    bad = _edit(run_doc, ("plan", "devices"), [two, two])
    _fault(lambda: comparison_from_dict(bad, "run.json"), "run.json", "plan.devices[1].name",
           "twice")
    _fault(lambda: comparison_from_dict(run_doc["plan"], "ex.json"), "ex.json", "format",
           "'execution'")


def test_an_execution_read_back_is_the_result(demo):
    res = run_plan(*demo, seed=1, protocol=FAST)
    back = execution_from_dict(json.loads(json.dumps(res.to_dict())))
    # every field but the deviation's infinities (none here) survives JSON exactly
    assert dataclasses.replace(back, meta=res.meta) == res


def test_an_infinite_rse_is_written_as_null_and_read_back_as_infinite(demo, tmp_path):
    """One step (or a zero mean energy) gives an infinite RSE; JSON has no Infinity, so the CLI's
    writer puts null there and the reader, which refuses Infinity literals, takes it back."""
    from ecal.output import Outputs

    res = dataclasses.replace(run_plan(*demo, seed=0, protocol=FAST), rse_energy=math.inf)
    out = Outputs()
    out.json(tmp_path / "ex.json", res.to_dict())
    out.commit()
    text = (tmp_path / "ex.json").read_text()
    assert "Infinity" not in text and json.loads(text)["rse_energy"] is None
    assert math.isinf(load_execution(tmp_path / "ex.json").rse_energy)
