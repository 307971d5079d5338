"""``ecal run PLAN --device nvml:0,1,2,3``: a 4-stage pipeline plan over four fake GPUs, one
worker process per GPU (issue 30).

The user's module is characterized on one in-process fake card (as tests/test_user_project.py
does), planned as a 4-stage 1F1B workload, and run over four file-backed fake cards
(tests/fake_multi_gpu.py), each opened in its own spawned worker on its own clock. The cards
are found at a 350 W power limit (not the 400 W default), so a restore that resets instead of
putting back shows.

What must hold: the result has the form of a simulated run's (Eq. 23 per device and for the
step) and every card is as found afterwards; no task starts before its predecessors on other
GPUs ended (on the system-wide monotonic clock, from the kernels' own log, and in the result's
step times); a worker SIGKILLed mid-run ends the run with one line naming its GPU while the
others restore, and ``ecal restore`` puts the killed one's card back from its journal; a device
list that does not fit the plan is refused with exit status 2 before anything runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pytest
from fake_multi_gpu import FakeOpener, a100, use_card
from fake_pynvml import install_fake_nvml, load_cards, make_fake_pynvml, save_cards

from ecal import cli

MYTRAIN = '''
import fake_multi_gpu as cuda        # in a real project: import torch


def make_fwd():
    return cuda.Stage("fwd", 0.004).run


def make_bwd():
    return cuda.Stage("bwd", 0.008).run
'''

FAST = ["--window-s", "0.15", "--warmup-s", "0.01", "--min-windows", "2", "--max-windows", "3",
        "--target-rse", "0.5", "--cooldown-s", "0.01",
        "--grid", "sm_clock_mhz=1410,1200,990,810,power_limit_w=400"]
FOUND_MW = 350_000
GPUS = 4


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """sigs.json (characterized on a fake card), workload.json and plan.json in a folder."""
    mp = pytest.MonkeyPatch()
    d = tmp_path_factory.mktemp("multi")
    (d / "gputrain.py").write_text(textwrap.dedent(MYTRAIN))
    mp.chdir(d)
    mp.setenv("ECAL_STATE_DIR", str(d / "state-characterize"))
    mp.delenv("ZEUSD_SOCK_PATH", raising=False)
    sys.modules.pop("gputrain", None)
    try:
        fake = make_fake_pynvml(a100())
        install_fake_nvml(mp, fake)
        use_card(fake.card(0), 0)
        assert cli.main(["characterize", "gputrain:make_fwd", "gputrain:make_bwd", "--device",
                         "nvml:0", "--name", "fwd", "--name", "bwd", "-o", "sigs.json",
                         *FAST]) == 0
        (d / "workload.json").write_text(json.dumps({
            "format": "ecal.workload/1", "name": "four-stage-step",
            "elements": {"fwd": {"source": "sigs.json", "element": "fwd", "work": "gputrain:make_fwd"},
                         "bwd": {"source": "sigs.json", "element": "bwd", "work": "gputrain:make_bwd"}},
            "shape": {"kind": "1f1b", "stages": GPUS, "microbatches": 2, "forward": "fwd",
                      "backward": "bwd"},
            "idle_power_w": 123.0, "transitions": "free"}))   # the fake's setters take no time
        assert cli.main(["plan", "workload.json", "--deadline", "1.3x", "-o", "plan.json"]) == 0
    finally:
        mp.undo()
        sys.modules.pop("gputrain", None)
    return d


@pytest.fixture
def cards(planned, tmp_path, monkeypatch):
    """Four file-backed fake cards found at 350 W, the workers' opener pointed at them, the
    kernels' log in tmp_path/log; the working folder is the planned project."""
    state = tmp_path / "cards.json"
    save_cards(state, [a100(limit_mw=FOUND_MW, uuid=f"GPU-multi-{i}-{tmp_path.name}")
                       for i in range(GPUS)])
    (tmp_path / "log").mkdir()
    monkeypatch.chdir(planned)
    monkeypatch.setenv("FAKE_GPU_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("FAKE_GPU_WALL_S", "0.01")
    import execution.multi_gpu as mg

    monkeypatch.setattr(mg, "nvml_opener", lambda: FakeOpener(str(state)))
    return state


def settings(state: Path) -> list[tuple]:
    return [(c["limit_mw"], c["locked_sm"], c["locked_mem"]) for c in load_cards(state)]


def as_found(state: Path) -> list[tuple]:
    return [(FOUND_MW, None, None)] * GPUS


def journals() -> list[Path]:
    import os

    return sorted(Path(os.environ["ECAL_STATE_DIR"]).glob("*.json"))


def kernel_log(folder: Path, gpu: int) -> list[dict]:
    p = folder / f"gpu{gpu}.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []


def test_a_four_gpu_plan_runs_one_worker_per_gpu_and_restores_every_card(cards, tmp_path, capsys):
    out = tmp_path / "run.json"
    rc = cli.main(["run", "plan.json", "--device", "nvml:0,1,2,3", "--json", "-o", str(out)])
    cap = capsys.readouterr()
    # the fake runs exactly the characterized kernels: the plan keeps its deadline and its
    # prediction (Eq. 23, every GPU and the step); the fake has no noise, so the baseline's
    # tiny counter rounding can flag, which is a note, not the plan's result
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    assert json.loads(out.read_text()) == doc
    assert doc["problems"] == []
    # the one results-file model of every run (ecal.run/1), read back as a simulated run's is
    from execution.savings import load_run

    back = load_run(out)
    assert [d.name for d in back.plan.devices] == [d["name"] for d in doc["plan"]["devices"]]
    plan, base = doc["plan"], doc["baselines"]["all_max"]
    # the form of a simulated run's result: Eq. 23 per device and for the step
    assert plan["format"] == "ecal.execution/1" and plan["simulated"] is False
    devices = [d["name"] for d in plan["devices"]]
    assert len(devices) == GPUS
    for d in plan["devices"] + [plan["step"]]:
        assert d["deviation"]["flagged"] is False, d
        assert d["n_steps"] == plan["n_steps"] >= 3
    assert plan["meta"]["bonferroni_devices"] == GPUS
    gpus = plan["meta"]["gpus"]
    assert [gpus[d]["gpu"] for d in devices] == [f"nvml:{i}" for i in range(GPUS)]
    assert len({gpus[d]["uuid"] for d in devices}) == GPUS
    # every step's energy is the sum of its four windows, each tick-aligned on its own card
    for k, e in enumerate(plan["meta"]["step_energies_j"]):
        ws = [w for w in plan["windows"] if w["step"] == k]
        assert len(ws) == GPUS and sum(w["energy_j"] for w in ws) == pytest.approx(e)
        assert all(w["tail_s"] >= 0 and w["counter_end_j"] > w["counter_start_j"] for w in ws)
    assert plan["step"]["measured_energy_j"] < base["step"]["measured_energy_j"]
    assert doc["savings"][0]["measured"] > 0
    # cross-device order, in the result's step times: no task starts before a predecessor
    # on another device ended
    _assert_order_in_result(plan)
    # ... and on the wall clock, from the kernels' own log (every GPU ran work)
    _assert_order_on_the_wall_clock(plan, tmp_path / "log")
    # every card as found, no journal left
    assert settings(cards) == as_found(cards)
    assert journals() == []


def _edges(plan: dict) -> list[tuple[str, str]]:
    """(predecessor, task) pairs on different devices, from the planned task times: a 1F1B
    pipeline's forward s → s+1 and backward s+1 → s for each microbatch."""
    tasks = plan["meta"]["planned_tasks"]
    out = []
    for name, t in tasks.items():
        stage, inst, mb = name.split("/")
        s = int(stage[1:])
        pred = f"s{s - 1}/forward/{mb}" if inst == "forward" else f"s{s + 1}/backward/{mb}"
        if pred in tasks:
            assert tasks[pred]["device"] != t["device"]
            out.append((pred, name))
    assert len(out) == 2 * 2 * (GPUS - 1)
    return out


def _assert_order_in_result(plan: dict) -> None:
    by_step: dict[int, dict[str, dict]] = {}
    for r in plan["tasks"]:
        by_step.setdefault(r["step"], {})[r["name"]] = r
    edges = _edges(plan)
    for runs in by_step.values():
        for u, v in edges:
            assert runs[v]["start_s"] >= runs[u]["end_s"] - 1e-9, (u, v, runs[u], runs[v])


def _assert_order_on_the_wall_clock(plan: dict, log: Path) -> None:
    """Map each GPU's logged kernel calls onto its tasks (a worker runs its tasks in order:
    warm-up step, then the measured steps) and check every cross-device edge in wall time."""
    devices = [d["name"] for d in plan["devices"]]
    gpu_of = {d: plan["meta"]["gpus"][d]["gpu"] for d in devices}
    wall: dict[tuple[int, str], tuple[float, float]] = {}
    for d in devices:
        runs = [r for r in plan["tasks"] if r["device"] == d]
        per_step = len({r["name"] for r in runs})
        calls = kernel_log(log, int(gpu_of[d].split(":")[1]))
        warm = plan["warmup_steps"] * per_step
        assert len(calls) >= warm + len(runs)
        for r, c in zip(sorted(runs, key=lambda r: (r["step"], r["start_s"])), calls[warm:]):
            assert c["element"] == {"forward": "fwd", "backward": "bwd"}[r["name"].split("/")[1]]
            wall[(r["step"], r["name"])] = (c["wall_start"], c["wall_end"])
    for k in range(plan["n_steps"]):
        for u, v in _edges(plan):
            assert wall[(k, v)][0] >= wall[(k, u)][1], (k, u, v)


def test_a_killed_worker_stops_the_others_and_ecal_restore_fixes_its_card(cards, tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.setenv("FAKE_GPU_KILL", "2:2")      # GPU 2's 2nd kernel call at a changed clock
    out = tmp_path / "run.json"
    rc = cli.main(["run", "plan.json", "--device", "nvml:0,1,2,3", "--no-baselines",
                   "-o", str(out)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("ecal run: error:")]
    assert rc == 3 and len(lines) == 1, err
    assert "GPU nvml:2" in lines[0] and "SIGKILL" in lines[0], lines[0]
    assert "ecal restore --device nvml:2" in lines[0], lines[0]
    assert not out.exists()
    found = as_found(cards)
    now = settings(cards)
    assert [now[i] for i in (0, 1, 3)] == [found[i] for i in (0, 1, 3)]
    assert now[2] != found[2] and now[2][1] is not None      # killed with its clock locked
    assert len(journals()) == 1
    from ecal.recovery import cmd_restore

    fake = make_fake_pynvml(state_path=cards)
    assert cmd_restore(argparse.Namespace(device="nvml:2", json=True), nvml=fake) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["uuid"] for r in doc["restored"]] == [load_cards(cards)[2]["uuid"]]
    assert settings(cards) == found
    assert journals() == []


def test_a_worker_whose_work_raises_stops_the_run_with_every_card_restored(cards, tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.setenv("FAKE_GPU_RAISE", "1:1")
    rc = cli.main(["run", "plan.json", "--device", "nvml:0,1,2,3", "--no-baselines"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("ecal run: error:")]
    assert rc == 3 and len(lines) == 1, err
    assert "GPU nvml:1" in lines[0] and "out of memory on fake card 1" in lines[0], lines[0]
    assert settings(cards) == as_found(cards)
    assert journals() == []


@pytest.mark.parametrize("spec, needle", [("nvml:0,1,2", "names 3 GPUs but the plan has 4"),
                                          ("nvml:0,1,2,3,4", "names 5 GPUs"),
                                          ("nvml:0,1,1,2", "GPU index 1 is named twice"),
                                          ("nvml:0,x,2,3", "integer indices")])
def test_a_device_list_that_does_not_fit_the_plan_is_refused(cards, tmp_path, capsys, spec, needle):
    out = tmp_path / "run.json"
    rc = cli.main(["run", "plan.json", "--device", spec, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and needle in err, err
    assert not out.exists()
    assert settings(cards) == as_found(cards) and journals() == []
    assert all(not (tmp_path / "log" / f"gpu{i}.jsonl").exists() for i in range(GPUS))


def test_parse_gpu_list():
    from execution.multi_gpu import map_gpus, parse_gpu_list

    assert parse_gpu_list("nvml:0") is None and parse_gpu_list("sim") is None
    assert parse_gpu_list("nvml:3, 1,0") == (3, 1, 0)
    assert map_gpus("nvml:3,1", (3, 1), ["a", "b"]) == {"a": 3, "b": 1}


CHILD = '''
import sys
sys.path[:0] = [{tests!r}, {root!r}]
from fake_multi_gpu import FakeOpener
import execution.multi_gpu as mg
mg.nvml_opener = lambda: FakeOpener({state!r})
from ecal import cli
sys.exit(cli.main(["run", "plan.json", "--device", "nvml:0,1,2,3", "--no-baselines"]))
'''


@pytest.mark.parametrize("sig, whom", [("SIGTERM", "parent"), ("SIGINT", "group")])
def test_an_interrupted_run_restores_every_card(cards, tmp_path, sig, whom):
    """``kill -TERM`` on ecal (the parent) or a Ctrl-C (SIGINT to the whole process group)
    mid-run: exit 130, every card as found, no journal left."""
    import os
    import signal
    import subprocess
    import time

    here = Path(__file__).resolve().parent
    script = CHILD.format(tests=str(here), root=str(here.parent), state=str(cards))
    env = {**os.environ, "FAKE_GPU_WALL_S": "0.05"}
    p = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        # wait until every card was changed (each worker is inside the measured run)
        while not all(s[1] is not None for s in settings(cards)):
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        if whom == "parent":
            p.send_signal(getattr(signal, sig))
        else:
            os.killpg(p.pid, getattr(signal, sig))
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert f"interrupted ({sig})" in err, err
    assert settings(cards) == as_found(cards)
    assert journals() == []


def test_a_gpu_in_use_stops_the_run_before_any_card_changes(cards, tmp_path, capsys):
    """Another process holds GPU 1's lock: its worker is refused at open, the run ends with one
    line naming nvml:1 and the holder, and no card was changed."""
    held = FakeOpener(str(cards))(1)           # this process holds GPU 1's lock
    try:
        rc = cli.main(["run", "plan.json", "--device", "nvml:0,1,2,3", "--no-baselines"])
    finally:
        held.close()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("ecal run: error:")]
    assert rc == 3 and len(lines) == 1, err
    assert "GPU nvml:1" in lines[0] and "LockedError" in lines[0], lines[0]
    import os

    assert str(os.getpid()) in lines[0], lines[0]
    assert settings(cards) == as_found(cards) and journals() == []
    assert all(not (tmp_path / "log" / f"gpu{i}.jsonl").exists() for i in range(GPUS))


def test_a_gpu_list_is_for_ecal_run_only():
    """Paths that open devices in this process (ecal tune) refuse a GPU list in one line."""
    from execution.runnable import RunInputError, open_run_devices

    with pytest.raises(RunInputError, match="a list of GPUs runs a plan with ecal run"):
        open_run_devices(["a", "b"], "nvml:0,1", 0)
