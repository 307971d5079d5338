"""The seams between commands: ``ecal plan -o`` records its workload so ``ecal run PLAN`` needs
no ``--workload``, and a preset characterized under another ``--name`` keeps its work.

Everything runs on the simulated H200 (seconds)."""

from __future__ import annotations

import json

import pytest

from ecal import cli

GRID = ["--grid", "sm_clock_mhz=1980,1500", "--device", "sim"]


def _workload(path, source="s.json", **extra):
    doc = {"format": "ecal.workload/1", "elements": {"fwd": source},
           "shape": {"kind": "chain", "tasks": ["fwd", "fwd", "fwd"]},
           "idle_power_w": 100.0, "transitions": "free", **extra}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def project(tmp_path, monkeypatch, capsys):
    """A folder with a preset characterized as ``fwd`` and a chain workload of it."""
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["characterize", "copy_2GiB", "--name", "fwd", "-o", "s.json", *GRID])
    assert rc == 0, capsys.readouterr().err
    _workload(tmp_path / "w.json")
    capsys.readouterr()
    return tmp_path


def test_a_renamed_preset_keeps_its_work(project):
    sigs = json.loads((project / "s.json").read_text())["signatures"]
    assert {s["meta"]["work"] for s in sigs.values()} == {"copy_2GiB"}
    from execution.workload import load_workload

    wl = load_workload(project / "w.json")
    assert wl.works == {"fwd": "copy_2GiB"}      # no hand edit of the workload needed


def test_plan_records_its_workload_and_run_needs_no_flag(project, capsys):
    assert cli.main(["plan", "w.json", "--deadline", "1.2x", "-o", "plan.json"]) == 0
    doc = json.loads((project / "plan.json").read_text())
    assert doc["format"] == "ecal.plan/1"
    assert doc["workload"]["file"] == "w.json"
    assert doc["workload"]["resolved"] == str((project / "w.json").resolve())
    capsys.readouterr()
    rc = cli.main(["run", "plan.json", "--no-baselines", "-o", "ex.json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    ex = json.loads((project / "ex.json").read_text())
    assert ex["format"] == "ecal.execution/1" and ex["simulated"] is True


def test_plan_records_the_overrides_it_was_made_with(project, capsys):
    assert cli.main(["plan", "w.json", "--deadline", "1.2x", "--idle-power-w", "80",
                     "--transition-time-s", "0.001", "-o", "plan.json"]) == 0
    wl = json.loads((project / "plan.json").read_text())["workload"]
    assert wl["idle_power_w"] == 80.0 and wl["transition_time_s"] == 0.001
    capsys.readouterr()
    # the same problem is rebuilt: the plan matches it (else run_plan refuses the plan)
    assert cli.main(["run", "plan.json", "--no-baselines"]) in (0, 1), capsys.readouterr().err


def test_a_plan_moved_away_from_its_workload_is_found_or_names_the_flag(project, capsys):
    assert cli.main(["plan", "w.json", "--deadline", "1.2x", "-o", "plan.json"]) == 0
    (project / "sub").mkdir()
    (project / "plan.json").rename(project / "sub" / "plan.json")
    capsys.readouterr()
    assert cli.main(["run", "sub/plan.json", "--no-baselines"]) == 0   # found as given
    (project / "w.json").rename(project / "gone.json")
    capsys.readouterr()
    assert cli.main(["run", "sub/plan.json", "--no-baselines"]) == 2
    err = capsys.readouterr().err
    assert "--workload" in err and "w.json" in err and err.count("\n") == 1, err
    # --workload names the copy
    assert cli.main(["run", "sub/plan.json", "--workload", "gone.json", "--no-baselines"]) == 0


def test_a_plan_without_a_workload_names_the_flag(project, capsys):
    assert cli.main(["plan", "w.json", "--deadline", "1.2x", "-o", "plan.json"]) == 0
    doc = json.loads((project / "plan.json").read_text())
    del doc["workload"]
    (project / "bare.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert cli.main(["run", "bare.json"]) == 2
    err = capsys.readouterr().err
    assert "--workload" in err and err.count("\n") == 1, err
