"""``ecal run PLAN --device sim``: runs a plan ``ecal demo`` wrote and reproduces the demo's own
execution for the same seed; bad inputs are one-line errors with exit status 2. Simulated."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from ecal.demo import DemoConfig, run_demo, write_demo

CFG = DemoConfig(n_stages=2, n_microbatches=2, clocks_mhz=(1980, 1440), power_limits_w=(700,),
                 comm_sms=(16,), curve_points=3)


def run_cli(*argv: str) -> int:
    """``ecal run ...`` in this process: through ``ecal.cli`` once the command is wired there,
    else through the handler with the CLI's error contract (one line, exit 2)."""
    from ecal import cli

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    if "run" in sub.choices:
        return cli.main(["run", *argv])
    from ecal.cmd_run import add_run_arguments, cmd_run
    from frontier.errors import EnergyCalculusError

    p = argparse.ArgumentParser(prog="ecal run")
    add_run_arguments(p)
    args = p.parse_args(list(argv))
    args.command = "run"
    try:
        return cmd_run(args)
    except (EnergyCalculusError, OSError, ValueError, KeyError) as exc:
        import sys

        print(f"ecal run: error: {cli._error_line(exc)}", file=sys.stderr)
        return 2


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    r = run_demo(CFG)
    d = tmp_path_factory.mktemp("run") / "demo"
    write_demo(r, d)
    return r, d


def one_line_error(capsys, code: int, *needles: str) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("ecal run: error: ")
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _copy(demo_dir: Path, tmp_path: Path) -> Path:
    d = tmp_path / "copy"
    shutil.copytree(demo_dir, d)
    return d


def test_run_reproduces_the_demo_execution(demo, capsys, tmp_path):
    r, d = demo
    out = tmp_path / "result.json"
    rc = run_cli(str(d / "plan.json"), "--device", "sim", "--seed", str(CFG.seed), "-o", str(out),
                 "--json")
    doc = json.loads(capsys.readouterr().out)
    # exit 1 exactly when the plan missed its deadline or an Eq. 23 test of the plan flagged
    assert rc == (1 if doc["plan"]["problems"] else 0)
    assert doc == json.loads(out.read_text())
    want = r.comparison
    assert doc["simulated"] is True
    # the written plan, run again on the same seed, is the demo's own run, exactly
    assert doc["plan"]["step"]["measured_energy_j"] == want.plan.step.measured_energy_j
    assert doc["plan"]["step"]["measured_time_s"] == want.plan.step.measured_time_s
    # the tuned plan predicts its model energy plus the offset measured on its own runs
    from solvers.calibration import plan_calibration

    cal = plan_calibration(r.plan)
    assert doc["plan"]["step"]["predicted_energy_j"] == pytest.approx(
        r.plan.energy_j + cal.step.energy_j, rel=1e-9)
    assert doc["plan"]["flagged"] == want.plan.flagged
    assert set(doc["baselines"]) == set(want.baselines)
    for n, b in want.baselines.items():
        assert doc["baselines"][n]["step"]["measured_energy_j"] == b.step.measured_energy_j
    for got, s in zip(doc["savings"], want.savings):
        assert got["baseline"] == s.baseline
        assert got["measured"] == pytest.approx(s.measured, rel=1e-12)
        assert got["sd_measured"] == pytest.approx(s.sd_measured, rel=1e-12)


def test_round1_plan_file_reproduces_the_flag(demo, capsys):
    r, d = demo
    assert run_cli(str(d / "plan_round1.json")) == (1 if r.first.execution.problems() else 0)
    text = capsys.readouterr().out
    assert "SIMULATED" in text
    assert ("FLAGGED" in text.splitlines()[2]) == r.first.flagged
    assert f"{r.first.execution.step.measured_energy_j:.2f}" in text


def test_text_output_has_savings(demo, capsys):
    r, d = demo
    code = 1 if r.comparison.plan.problems() else 0
    assert run_cli(str(d / "plan.json"), "--no-baselines") == code
    assert "savings" not in capsys.readouterr().out
    assert run_cli(str(d / "plan.json")) == code
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("result: ") and f"exit {code}" in out
    assert "savings (SIMULATED" in out and "vs all-max" in out


def test_plan_without_workload(demo, capsys, tmp_path):
    _, d = demo
    doc = json.loads((d / "plan.json").read_text())
    del doc["workload"]
    p = tmp_path / "bare.json"
    p.write_text(json.dumps(doc))
    one_line_error(capsys, run_cli(str(p)), "bare.json", "no workload")


def test_missing_work_file(demo, capsys, tmp_path):
    _, d = demo
    c = _copy(d, tmp_path)
    (c / "work.json").unlink()
    one_line_error(capsys, run_cli(str(c / "plan.json")), "workload.work", "work.json", "no such file")


def test_mismatched_problem(demo, capsys, tmp_path):
    _, d = demo
    c = _copy(d, tmp_path)
    doc = json.loads((c / "plan.json").read_text())
    doc["workload"]["problem"] = "problem_round1.json"     # plan 2 against round 1's problem
    (c / "plan.json").write_text(json.dumps(doc))
    one_line_error(capsys, run_cli(str(c / "plan.json")), "another problem")


def test_malformed_work_file_names_the_field(demo, capsys, tmp_path):
    _, d = demo
    c = _copy(d, tmp_path)
    w = json.loads((c / "work.json").read_text())
    first = next(iter(w["tasks"]))
    w["tasks"][first][0]["streams"][0]["sm_cout"] = 16
    (c / "work.json").write_text(json.dumps(w))
    one_line_error(capsys, run_cli(str(c / "plan.json")), "work.json", "sm_cout", "unknown field")


def test_work_table_round_trips(demo, tmp_path):
    from execution.pipeline import pipeline_work
    from execution.work import load_work_table, save_work_table

    r, _ = demo
    p = tmp_path / "w.json"
    save_work_table(p, r.work)
    assert load_work_table(p) == {k: tuple(v) for k, v in r.work.items()}
    assert pipeline_work(r.problem, *_kernels(r)) == load_work_table(p)


def _kernels(r):
    import measure
    from execution.pipeline import stage_kernels

    cfg = r.config
    return stage_kernels(cfg.stage_sizes[: cfg.n_stages]), measure.PRESETS["p2p_send"]


def test_a_real_device_needs_the_workload(demo, capsys):
    _, d = demo
    one_line_error(capsys, run_cli(str(d / "plan.json"), "--device", "nvml:0"), "--workload")
    one_line_error(capsys, run_cli(str(d / "plan.json"), "--device", "tpu"), "sim")


def test_output_path_checked_before_work(demo, capsys, tmp_path):
    _, d = demo
    one_line_error(capsys, run_cli(str(d / "plan.json"), "-o", str(tmp_path)), "is a folder")
    one_line_error(capsys, run_cli(str(tmp_path / "nope.json")), "nope.json", "no such file")


def test_a_workload_plan_runs_on_simulated_h200s_with_its_baseline(tmp_path, capsys):
    """ecal run PLAN --workload W (the bundled example, its elements simulated presets): the
    plan runs on one simulated H200 per stage against every task at the top clock; the result
    is deterministic for a seed and says SIMULATED."""
    from ecal.cli import main

    wl = str(Path(__file__).resolve().parents[1] / "ecal" / "examples" / "workload_1f1b.json")
    plan = str(tmp_path / "plan.json")
    assert main(["plan", wl, "--deadline", "1.1x", "--microbatches", "2", "-o", plan]) == 0
    capsys.readouterr()
    docs = []
    for _ in range(2):
        rc = main(["run", plan, "--workload", wl, "--microbatches", "2", "--json"])
        docs.append(json.loads(capsys.readouterr().out))
        assert rc == (1 if docs[-1]["problems"] else 0)
    assert docs[0] == docs[1]
    doc = docs[0]
    assert doc["plan"]["simulated"] is True and set(doc["baselines"]) == {"all_max"}
    assert doc["savings"][0]["measured"] > 0
    # a plan made for another microbatch count is refused, not run
    assert main(["run", plan, "--workload", wl]) == 2
    err = capsys.readouterr().err
    assert "does not match problem" in err and err.count("\n") == 1, err
