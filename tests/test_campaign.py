"""Campaigns on the local executor: sharding, the file format, kill (SIGKILL) and resume with
every unit committed exactly once, and concurrent campaigns on one store."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frontier.errors import FormatError
from measure.campaign import (
    CampaignMismatchError,
    load_campaign,
    parse_campaign,
    run_campaign,
    shard,
)
from measure.store import ResultsStore

ROOT = Path(__file__).resolve().parents[1]

#: 8 simulated elements (presets), 2 clocks each: 16 units.
ELEMENTS = ["gemm_bf16_8192", "gemm_bf16_4096", "copy_2GiB", "axpy_triton_sm16",
            "attention_flash", "attention_cudnn", "stage_forward", "p2p_send"]
#: short windows: units take milliseconds of real time on the simulator
PROTOCOL = {"window_s": 0.1, "warmup_s": 0.0, "min_windows": 2, "max_windows": 4,
            "ready_window_s": 0.2, "ready_windows": 1, "target_rse": 0.05}


def campaign_doc(name="c8", **extra):
    """The 8-element test campaign as a document."""
    return {"name": name, "device": "sim", "seed": 0, "elements": list(ELEMENTS),
            "grid": "sm_clock_mhz=1980,1380", "protocol": dict(PROTOCOL), **extra}


def write_campaign(path, **kw):
    """Write the test campaign as JSON and return its path."""
    Path(path).write_text(json.dumps(campaign_doc(**kw)))
    return Path(path)


# Runs `python -m ecal campaign ...` with one injected pause: inside the transaction of the
# (K+1)-th unit commit, after its signature row is written, it announces itself (a marker file)
# and waits, so the test's SIGKILL lands mid-transaction.
PAUSING = """
import runpy, sys, time
import measure.store as st
k, marker = int(sys.argv[1]), sys.argv[2]
real, n = st.ResultsStore.add, [0]
def pausing(self, *a, **kw):
    out = real(self, *a, **kw)
    if kw.get("campaign") is not None:
        n[0] += 1
        if n[0] == k + 1:
            open(marker, "w").close()
            time.sleep(120)
    return out
st.ResultsStore.add = pausing
sys.argv = ["ecal"] + sys.argv[3:]
runpy.run_module("ecal", run_name="__main__", alter_sys=True)
"""


def ecal_child(cwd, args, pause_after=None, marker=None, state=None):
    """``python -m ecal ARGS`` as a child (or the pausing variant), in ``cwd``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ECAL_STATE_DIR": str(state or cwd / "state")}
    pre = ["-m", "ecal"] if pause_after is None else ["-c", PAUSING, str(pause_after), str(marker)]
    return subprocess.Popen([sys.executable, *pre, *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_when_paused(p, marker, timeout_s=180):
    """Wait until the child announces its pause, then SIGKILL it."""
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the campaign never reached its pause"
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def store_state(path, name):
    """(committed units, stored rows, content without who measured it) of a store."""
    with ResultsStore(path) as st:
        return st.done_units(name), st.count(), st.contents(measured_by=False)


def test_a_campaign_shards_into_element_kappa_omega_units(tmp_path):
    spec = parse_campaign({**campaign_doc(), "elements": [
        "copy_2GiB", {"name": "att", "kappas": {"flash": "attention_flash", "cudnn": "attention_cudnn"}},
        {"work": "p2p_send", "grid": "sm_count=4,16,132"}]})
    units = shard(spec)
    assert len(units) == 2 + 2 * 2 + 3
    assert {u.kappa for u in units if u.element == "att"} == {"flash", "cudnn"}
    assert {u.omega.sm_count for u in units if u.element == "p2p_send"} == {4, 16, 132}
    assert len({u.key for u in units}) == len(units)


@pytest.mark.parametrize("doc, field", [
    ({"elements": []}, "elements"),
    ({"elements": ["copy_2GiB"], "colour": 1}, "colour"),
    ({"elements": [{"work": "copy_2GiB", "kappas": {"a": "copy_2GiB"}}]}, "elements[0]"),
    ({"elements": ["copy_2GiB"], "grid": "sm_clock_mhz=fast"}, "grid"),
    ({"elements": ["copy_2GiB"], "protocol": {"window_s": -1}}, "protocol"),
    ({"elements": ["copy_2GiB", "copy_2GiB"]}, "elements[1].name"),
    ({"elements": ["copy_2GiB"], "device": "tpu"}, "device"),
])
def test_a_bad_campaign_file_names_the_field(doc, field):
    with pytest.raises(FormatError) as e:
        parse_campaign(doc, "c.json")
    assert e.value.path == field


def test_the_yaml_example_loads_and_the_cli_refuses_bad_input(tmp_path, capsys):
    from ecal.cli import main

    spec = load_campaign(ROOT / "ecal" / "examples" / "campaign_sim.yaml")
    assert spec.name == "sim-demo" and len(shard(spec)) > 8
    (tmp_path / "bad.yaml").write_text("name: x\nelements: [copy_2GiB]\ngrid: 'sm_clock_mhz=12345'\n")
    assert main(["campaign", str(tmp_path / "bad.yaml"), "--quiet"]) == 2
    assert "SM clock 12345 MHz is not supported" in capsys.readouterr().err
    assert not (tmp_path / "bad.sqlite").exists()
    assert main(["campaign", str(tmp_path / "missing.yaml")]) == 2


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The 8-element campaign, uninterrupted, on one simulated GPU (in-process driver)."""
    d = tmp_path_factory.mktemp("ref")
    old = os.environ.get("ECAL_STATE_DIR")
    os.environ["ECAL_STATE_DIR"] = str(d / "state")
    try:
        res = run_campaign(parse_campaign(campaign_doc()), d / "ref.sqlite", gpus=1, progress=False)
    finally:
        if old is None:
            os.environ.pop("ECAL_STATE_DIR", None)
        else:
            os.environ["ECAL_STATE_DIR"] = old
    assert (res.total, res.measured, res.failed) == (16, 16, {})
    return d / "ref.sqlite"


def test_local_campaign_killed_and_resumed_commits_every_unit_once(tmp_path, reference):
    camp = write_campaign(tmp_path / "c8.json")
    args = ["campaign", str(camp), "--store", "c8.sqlite", "--gpus", "4", "--json"]
    marker = tmp_path / "paused"
    kill_when_paused(ecal_child(tmp_path, args, pause_after=5, marker=marker), marker)
    done, rows, _ = store_state(tmp_path / "c8.sqlite", "c8")
    assert len(done) == 5 and rows == 5         # the 6th unit's transaction was rolled back
    # the killed driver's workers notice and stop (releasing their GPUs' locks)
    pids = {rec["measured_by"]["pid"] for rec in done.values()}
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, "workers outlived their driver"
        time.sleep(0.1)
    again = ecal_child(tmp_path, args)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    summary = json.loads(out)
    assert (summary["units"], summary["resumed"], summary["measured"]) == (16, 5, 11)
    done, rows, content = store_state(tmp_path / "c8.sqlite", "c8")
    assert len(done) == 16 and rows == 16
    assert content == store_state(reference, "c8")[2]
    # who measured each unit is recorded: one of the four GPUs, and a worker process only
    # ever its own (how many GPUs took a unit is scheduling: on a loaded machine one worker
    # can take them all, so that is not asserted)
    by = [(rec["measured_by"]["pid"], rec["measured_by"]["uuid"]) for rec in done.values()]
    assert {u for _, u in by} <= {f"SIM-H200-{i}" for i in range(4)}
    assert len(dict(by)) == len(set(by)), by
    assert all(rec["measured_by"]["host"] for rec in done.values())
    # a third run has nothing left to do
    third = ecal_child(tmp_path, args)
    out, err = third.communicate(timeout=300)
    assert third.returncode == 0, err
    assert json.loads(out)["measured"] == 0


def test_resuming_with_another_protocol_or_seed_is_refused(tmp_path, monkeypatch):
    small = {**campaign_doc(), "elements": ["copy_2GiB"]}
    run_campaign(parse_campaign(small), tmp_path / "s.sqlite", gpus=1, progress=False)
    for change in ({"seed": 1}, {"protocol": {**PROTOCOL, "target_rse": 0.02}}):
        with pytest.raises(CampaignMismatchError, match="resuming would mix"):
            run_campaign(parse_campaign({**small, **change}), tmp_path / "s.sqlite", gpus=1,
                         progress=False)


def test_failed_gpus_are_retried_and_attempts_recorded(tmp_path):
    doc = {**campaign_doc(), "elements": ["copy_2GiB", "p2p_send"],
           "simulate": {"fail_once_dir": str(tmp_path / "faults")}}
    res = run_campaign(parse_campaign(doc), tmp_path / "f.sqlite", gpus=2, progress=False)
    assert (res.measured, res.failed) == (4, {})
    done, _, _ = store_state(tmp_path / "f.sqlite", "c8")
    assert sorted(r["attempts"] for r in done.values()) == [2, 2, 2, 2]
    doc["max_retries"] = 0
    doc["name"] = "no-retries"
    doc["simulate"] = {"fail_once_dir": str(tmp_path / "faults2")}
    res = run_campaign(parse_campaign(doc), tmp_path / "f.sqlite", gpus=2, progress=False)
    assert res.measured == 0 and len(res.failed) == 4 and not res.work_failed
    assert all("simulated fault" in v for v in res.failed.values())


def test_concurrent_campaigns_on_one_store(tmp_path, reference):
    camps = [write_campaign(tmp_path / f"c{i}.json", name=f"run{i}") for i in range(3)]
    procs = [ecal_child(tmp_path, ["campaign", str(c), "--store", "shared.sqlite", "--gpus", "2",
                                   "--json"], state=tmp_path / f"state{i}")
             for i, c in enumerate(camps)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert json.loads(out)["measured"] == 16
    import sqlite3

    db = sqlite3.connect(tmp_path / "shared.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    with ResultsStore(tmp_path / "shared.sqlite") as st:
        assert all(len(st.done_units(f"run{i}")) == 16 for i in range(3))
        # the same points on the same simulated cards: one row per key, the last commit's
        assert st.count() == len({r.key for r in st.rows()})
        got = {row[:9] for row in st.contents(measured_by=False)}
        assert got == {row[:9] for row in store_state(reference, "c8")[2]}


def test_sigterm_stops_the_workers_and_exits_130_keeping_what_was_committed(tmp_path):
    camp = write_campaign(tmp_path / "c8.json")
    args = ["campaign", str(camp), "--store", "c8.sqlite", "--gpus", "2", "--quiet"]
    marker = tmp_path / "paused"
    p = ecal_child(tmp_path, args, pause_after=3, marker=marker)
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "interrupted (SIGTERM)" in err, err
    done, rows, _ = store_state(tmp_path / "c8.sqlite", "c8")
    assert len(done) == 3 and rows == 3
    pids = {rec["measured_by"]["pid"] for rec in done.values()}
    deadline = time.monotonic() + 60
    while any(_alive(q) for q in pids):
        assert time.monotonic() < deadline, "workers outlived their driver"
        time.sleep(0.1)


def test_an_unknown_work_is_bad_input_before_anything_runs(tmp_path, capsys):
    from ecal.cli import main

    camp = tmp_path / "c.json"
    camp.write_text(json.dumps({**campaign_doc(), "elements": ["copy_2GiB", "no_such_kernel"]}))
    assert main(["campaign", str(camp), "--quiet"]) == 2
    assert "unknown work 'no_such_kernel'" in capsys.readouterr().err
    assert not (tmp_path / "c.sqlite").exists()
