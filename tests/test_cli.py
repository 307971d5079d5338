"""End-to-end tests of the ``ecal`` command line, run as real subprocesses on bundled examples.

Bad input must give a one-line error naming the problem, exit code 2, and no output file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from measure.replay import shared_data_dir

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "ecal" / "examples"
SHARED = shared_data_dir()


def ecal(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "ecal", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ecal ")
    for n in needles:
        assert n in lines[0], lines[0]


def test_help_lists_commands_and_examples():
    r = ecal("--help")
    assert r.returncode == 0
    for c in ("characterize", "frontier", "compose", "plan", "pareto", "check", "import", "demo"):
        assert c in r.stdout
    assert "examples:" in r.stdout and "exit codes" in r.stdout


def test_compose_worked_example():
    r = ecal("compose", str(EXAMPLES / "attention_tp2.json"))
    assert r.returncode == 0, r.stderr
    assert "layer_tp2: T = 5.700" in r.stdout and "E = 3192" in r.stdout
    r = ecal("compose", str(EXAMPLES / "attention_tp2.json"), "--json")
    doc = json.loads(r.stdout)
    tp2 = next(c for c in doc["compositions"] if c["name"] == "layer_tp2")
    assert tp2["predicted"]["energy_j"] == pytest.approx(3.192)


def test_check_h200_flags_and_exit_code():
    r = ecal("check", str(EXAMPLES / "h200_compositions.json"))
    assert r.returncode == 1, r.stderr
    assert "seq_gemm8192_copy" in r.stdout and "FLAGGED on T" in r.stdout
    assert "4 of 4 composite(s) flagged" in r.stdout


def test_characterize_frontier_roundtrip(tmp_path):
    r = ecal("characterize", "copy_2GiB", "--grid", "sm_clock_mhz=1980:1380:-300",
             "-o", "copy.json", "--plot", "copy.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "simulated H200" in r.stdout
    assert (tmp_path / "copy.json").exists() and (tmp_path / "copy.png").stat().st_size > 1000
    r = ecal("frontier", "copy.json", "--plot", "f.png", "-o", "f.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "copy_2GiB" in r.stdout
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["meta"]["frontier"]["elements"]["copy_2GiB"]["measured"] == 3
    # the frontier file is a signature file: every reader of signatures takes it
    r = ecal("frontier", "f.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    kept = doc["meta"]["frontier"]["elements"]["copy_2GiB"]["frontier"]
    assert f"{kept} frontier point(s) of {kept} measured" in r.stdout
    r = ecal("compose", "f.json", cwd=tmp_path)
    assert r.returncode == 2 and "has no compositions to predict" in r.stderr


def test_frontier_refuses_its_input_as_output(tmp_path):
    r = ecal("characterize", "copy_2GiB", "--grid", "sm_clock_mhz=1980:1380:-300",
             "-o", "copy.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    before = (tmp_path / "copy.json").read_bytes()
    r = ecal("frontier", "copy.json", "-o", "copy.json", cwd=tmp_path)
    one_line_error(r, "is the input file")
    assert (tmp_path / "copy.json").read_bytes() == before


def test_store_filter_lists_models_present(tmp_path):
    r = ecal("characterize", "copy_2GiB", "--grid", "sm_clock_mhz=1980:1380:-300",
             "-o", "copy.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ecal("store", "import", "st.sqlite", "copy.json", cwd=tmp_path).returncode == 0
    r = ecal("frontier", "st.sqlite", "--gpu-model", "H200", cwd=tmp_path)
    one_line_error(r, "it has GPU model(s) 'simulated H200'")


def test_missing_file_is_one_line_error(tmp_path):
    r = ecal("compose", str(tmp_path / "nope.json"))
    one_line_error(r, "nope.json")


def test_malformed_workbook_names_field_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 1, "units": {"time": "s", "energy": "J", "power": "W"},
                               "signatures": {"a": {"s_w": 80, "time_s": "abc", "energy_j": 1.0}},
                               "compositions": [{"name": "c", "expr": {"seq": ["a", "a"]}}]}))
    one_line_error(ecal("compose", str(bad)), "signatures.a.time_s")


def test_invalid_json_names_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1,\n "signatures": {')
    one_line_error(ecal("check", str(bad)), "bad.json", "line")


def test_negative_time_rejected(tmp_path):
    bad = tmp_path / "neg.json"
    bad.write_text(json.dumps({"schema_version": 1, "units": {"time": "s", "energy": "J", "power": "W"},
                               "signatures": {"a": {"s_w": 80, "time_s": -1.0, "energy_j": 1.0}}}))
    r = ecal("frontier", str(bad), "--plot", str(tmp_path / "out.png"))
    one_line_error(r, "time")
    assert not (tmp_path / "out.png").exists()


def test_bad_grid_rejected_before_anything_written(tmp_path):
    r = ecal("characterize", "copy_2GiB", "--grid", "sm_clock_mhz=5000", "-o", "x.json", cwd=tmp_path)
    one_line_error(r, "5000")
    assert list(tmp_path.iterdir()) == []


def test_unknown_work_and_device(tmp_path):
    one_line_error(ecal("characterize", "nonsense_kernel", cwd=tmp_path), "nonsense_kernel")
    one_line_error(ecal("characterize", "copy_2GiB", "--device", "tpu:0", cwd=tmp_path), "tpu:0")


@pytest.mark.skipif(not (SHARED / "nv-dvfs").exists(), reason="../shared/data is absent (a user's clone)")
def test_import_nvdvfs(tmp_path):
    r = ecal("import", "nv-dvfs", str(SHARED / "nv-dvfs" / "v100-dvfs-real.csv"), "-o", "v100.json",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "20 element(s), 200 signature(s)" in r.stdout
    r = ecal("frontier", "v100.json", "--element", "cfd/cuda_compute_flux/input000", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


PIPE = str(EXAMPLES / "pipeline_4x8.csv")


def test_plan_bundled_pipeline(tmp_path):
    r = ecal("plan", PIPE, "--deadline", "1.05x", "-o", "plan.json", "--plot", "plan.png",
             "--schedule", "sched.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "plan for" in r.stdout and "gap" in r.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["makespan_s"] <= plan["deadline_s"] * (1 + 1e-9)
    sched = json.loads((tmp_path / "sched.json").read_text())
    assert set(sched["devices"]) == {f"stage{i}" for i in range(4)}
    assert all("sm_clock_mhz" in e for e in sched["devices"]["stage0"])
    assert (tmp_path / "plan.png").stat().st_size > 1000


def test_pareto_bundled_pipeline(tmp_path):
    r = ecal("pareto", PIPE, "--points", "4", "--microbatches", "4", "-o", "c.json",
             "--plot", "c.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    curve = json.loads((tmp_path / "c.json").read_text())
    energies = [p["energy_j"] for p in curve["plans"]]
    assert energies == sorted(energies, reverse=True)


def test_infeasible_deadline_reports_fastest_and_writes_nothing(tmp_path):
    r = ecal("plan", PIPE, "--deadline", "0.5x", "-o", "plan.json", cwd=tmp_path)
    one_line_error(r, "fastest")
    assert not (tmp_path / "plan.json").exists()


def test_bad_deadline_text(tmp_path):
    one_line_error(ecal("plan", PIPE, "--deadline", "soon", cwd=tmp_path), "--deadline")


def test_malformed_profile_names_file(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1980,abc,1.0\n")
    one_line_error(ecal("plan", str(bad), "--deadline", "1.1x", "-o", "p.json", cwd=tmp_path), "bad.csv")
    assert not (tmp_path / "p.json").exists()


def test_demo_command_runs(tmp_path):
    r = ecal("demo", "--out", "d", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "SIMULATED H200" in r.stdout and "saved" in r.stdout
    assert (tmp_path / "d" / "plan.json").exists()


def test_plan_json_is_pure_json(tmp_path):
    # nothing else may reach stdout (e.g. a solver library's banner) when --json is asked for
    r = ecal("plan", PIPE, "--deadline", "1.05x", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["makespan_s"] <= doc["deadline_s"] * (1 + 1e-9)


def test_bad_time_limit(tmp_path):
    one_line_error(ecal("plan", PIPE, "--deadline", "1.05x", "--time-limit-s", "-1", cwd=tmp_path),
                   "--time-limit-s")


def test_fast_plan_with_switches_honours_time_limit(tmp_path):
    # with switch costs the fast method improves the plan for --time-limit-s seconds
    r = ecal("plan", PIPE, "--deadline", "1.1x", "--method", "fast", "--transition-time-s", "0.001",
             "--time-limit-s", "0.2", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["method"] == "fast" and doc["wall_s"] < 5.0
    assert doc["makespan_s"] <= doc["deadline_s"] * (1 + 1e-9)


def test_large_plan_says_how_long_its_search_may_take(tmp_path):
    # 4 stages x 64 microbatches = 512 tasks: a progress line on stderr names the search's cap
    r = ecal("plan", PIPE, "--microbatches", "64", "--deadline", "1.1x", "--transition-time-s", "0.001",
             "--time-limit-s", "0.3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "planning 512 tasks on 4 devices (switch-cost search: " in r.stderr
    assert "work units, safety net 0.3 s)" in r.stderr
    assert "gap" in r.stdout
