"""Issue 20, end to end, in the shape of a user's project: a module with factories in the
working folder is characterized through the CLI on the strict fake pynvml (no PYTHONPATH),
``ecal plan workload.json`` writes a schedule, and ``PlanApplier.from_schedule`` runs three
iterations of a 1F1B loop on each rank.

What must hold: the switches made per iteration equal the plan's (``switches_per_iteration``),
the training thread makes no NVML call inside the loop, the card is restored, and the plan's
loop measures less energy on the fake counter than the same loop at the top clock.

The fake "kernels" run on the fake card's clock: time ∝ 1/f at the locked SM clock, power
rising with f and held under the power limit by lowering f (what the hardware does), so the
characterization sees a real trade-off.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import types

import pytest
from fake_pynvml import FakeGPU, install_fake_nvml, make_fake_pynvml

from ecal import cli
from measure.apply import PlanApplier
from solvers.pipeline import stage_order, task_name

MYTRAIN = '''
import fake_cuda                     # in a real project: import torch


def make_fwd():
    """Factory: model and batch built once; returns the step that is timed."""
    model = fake_cuda.Stage(work_s=0.004)
    return model.forward


def make_bwd():
    model = fake_cuda.Stage(work_s=0.008)
    return model.backward
'''

F_MAX, STATIC_W, DYN_W = 1410.0, 60.0, 300.0
FAST = ["--window-s", "0.15", "--warmup-s", "0.01", "--min-windows", "2", "--max-windows", "3",
        "--target-rse", "0.5", "--cooldown-s", "0.01",
        "--grid", "sm_clock_mhz=1410,1200,990,810,power_limit_w=400"]


def _card() -> FakeGPU:
    return FakeGPU(name="NVIDIA A100-SXM4-40GB", sm_clocks=tuple(range(1410, 209, -15)),
                   mem_clocks=(1215,), limit_range_mw=(100_000, 400_000), limit_mw=400_000,
                   default_limit_mw=400_000, cores=108 * 64, arch=7)


def _clock_mhz(gpu: FakeGPU) -> float:
    f = float(gpu.locked_sm[1]) if gpu.locked_sm else F_MAX
    cap = gpu.limit_mw / 1000.0
    f_cap = F_MAX * max((cap - STATIC_W) / DYN_W, 1e-3) ** (1 / 2.5)   # P(f) = cap
    return min(f, f_cap)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "mytrain.py").write_text(textwrap.dedent(MYTRAIN))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    fake = make_fake_pynvml(_card())
    nvml_threads: list[str] = []
    for name in [n for n in dir(fake) if n.startswith("nvmlDeviceSet") or n.startswith("nvmlDeviceReset")]:
        real = getattr(fake, name)

        def rec(*a, _real=real, **k):
            nvml_threads.append(threading.current_thread().name)
            return _real(*a, **k)

        setattr(fake, name, rec)

    class Stage:
        """A stage's kernels on the fake card: time ∝ 1/f, power rising with f."""

        def __init__(self, work_s: float):
            self.work_s = work_s

        def _run(self) -> None:
            f = _clock_mhz(fake.gpu)
            fake.busy(self.work_s * F_MAX / f, STATIC_W + DYN_W * (f / F_MAX) ** 2.5)

        forward = backward = _run
    monkeypatch.setitem(sys.modules, "fake_cuda", types.SimpleNamespace(Stage=Stage))
    FakeClockNVML = install_fake_nvml(monkeypatch, fake)
    sys.modules.pop("mytrain", None)
    yield types.SimpleNamespace(path=tmp_path, fake=fake, nvml_threads=nvml_threads,
                                Stage=Stage, NVML=FakeClockNVML)
    sys.modules.pop("mytrain", None)


def _characterize_and_plan(project, capsys) -> dict:
    rc = cli.main(["characterize", "mytrain:make_fwd", "mytrain:make_bwd", "--device", "nvml:0",
                   "--name", "fwd", "--name", "bwd", "-o", "sigs.json", *FAST])
    assert rc == 0, capsys.readouterr().err
    (project.path / "workload.json").write_text(json.dumps({
        "format": "ecal.workload/1", "name": "my-2-stage-step",
        "elements": {"fwd": {"source": "sigs.json", "element": "fwd"},
                     "bwd": {"source": "sigs.json", "element": "bwd"}},
        "shape": {"kind": "1f1b", "stages": 2, "microbatches": 4, "forward": "fwd",
                  "backward": "bwd"},
        "idle_power_w": 60.0, "transitions": {"constant": {"time_s": 0.001}},
        "steady_state": True}))
    rc = cli.main(["plan", "workload.json", "--deadline", "1.3x", "-o", "plan.json",
                   "--schedule", "schedule.json"])
    assert rc == 0, capsys.readouterr().err
    return json.loads((project.path / "schedule.json").read_text())


def _loop(ap: PlanApplier | None, stage: int, fwd, bwd, iterations: int) -> None:
    for _ in range(iterations):
        for inst, mb in stage_order(stage, 2, 4):
            work = fwd if inst == "forward" else bwd
            if ap is None:
                work()
            else:
                with ap.element(task_name(stage, inst, mb)):
                    work()


def test_from_my_code_to_a_plan_in_my_training_loop(project, capsys):
    doc = _characterize_and_plan(project, capsys)
    assert doc["steady_state"] is True and doc["ranks"] == ["stage0", "stage1"]
    info = doc["device_info"]
    # the plan uses more than one clock on some stage (there is a trade-off to exploit)
    clocks = {e.get("sm_clock_mhz") for d in doc["devices"].values() for e in d}
    assert len(clocks) > 1
    assert sum(info[d]["switches_per_iteration"] for d in info) > 0

    card = project.fake.gpu           # one card: the ranks run one after the other on it
    fwd, bwd = project.Stage(0.004).forward, project.Stage(0.008).backward
    sigs = json.loads((project.path / "sigs.json").read_text())["signatures"]
    for rank, dev in enumerate(doc["ranks"]):
        planned = info[dev]["switches_per_iteration"]
        # 1. the hook as shipped: NVML on the helper thread
        project.nvml_threads.clear()
        device = project.NVML(index=0)
        ap = PlanApplier.from_schedule("schedule.json", rank=rank, device=device)
        assert ap.ready_power_w == info[dev]["ready_power_w"]     # no calibration
        with ap:
            _loop(ap, rank, fwd, bwd, 3)
        device.close()
        # iteration 1 also leaves the settings found on entry; from then on, exactly the plan
        assert ap.switches_per_iteration[1:] == [planned, planned], dev
        assert ap.switches_made >= 2 * planned
        # every setter call inside the loop came from the helper thread; the training thread
        # makes only the restore on exit (reset clocks, put the limit back)
        helper = [t for t in project.nvml_threads if t != threading.main_thread().name]
        assert len(helper) >= ap.switches_made - (ap.switches_per_iteration[0] - planned)
        assert card.locked_sm is None and card.limit_mw == 400_000        # restored

        # 2. measured savings: the loop at the top clock against the loop under the plan.
        # Inline switches here, so each lands before its task's fake kernels (on a real GPU
        # the helper thread's switch lands while the task's kernels already run).
        e0 = card.energy_true_j
        _loop(None, rank, fwd, bwd, 3)
        e_top_j = card.energy_true_j - e0
        device = project.NVML(index=0)
        ap = PlanApplier.from_schedule("schedule.json", rank=rank, device=device,
                                       asynchronous=False)
        with ap:
            e0 = card.energy_true_j          # the loop only, not the applier's entry and exit
            _loop(ap, rank, fwd, bwd, 3)
            e_plan_j = card.energy_true_j - e0
        device.close()
        assert ap.switches_per_iteration[1:] == [planned, planned], dev
        assert e_plan_j < e_top_j, (dev, e_plan_j, e_top_j)
        # and the measurement agrees with what the characterization predicts for these tasks
        predicted_j = 3 * sum(_energy_of(sigs, e) for e in doc["devices"][dev])
        assert e_plan_j == pytest.approx(predicted_j, rel=0.02)


def _energy_of(sigs: dict, entry: dict) -> float:
    """Characterized energy of a schedule entry's element at its operating point, J."""
    element = "fwd" if "/forward/" in entry["task"] else "bwd"
    for s in sigs.values():
        om = s.get("omega", {})
        if (s.get("name", "").split("@")[0] == element and om.get("sm_clock_mhz") == entry["sm_clock_mhz"]
                and om.get("power_limit_w") == entry.get("power_limit_w")):
            return s["energy_j"]
    raise AssertionError(f"no signature of {element} at {entry}")


def test_ecal_run_measures_my_plan_on_my_gpu(project, capsys):
    """The closed loop on the user's own code: ``ecal run plan.json --workload W --device
    nvml:0`` runs each task's element (the factories, called once) at the plan's ω, measures
    the step with the tick-aligned protocol, and the all-top-clock baseline; the measured
    saving is positive and the prediction holds (the fake's kernels are what was
    characterized)."""
    rc = cli.main(["characterize", "mytrain:make_fwd", "mytrain:make_bwd", "--device", "nvml:0",
                   "--name", "fwd", "--name", "bwd", "-o", "sigs.json", *FAST])
    assert rc == 0, capsys.readouterr().err
    (project.path / "chain.json").write_text(json.dumps({
        "format": "ecal.workload/1", "name": "my-step-on-one-gpu",
        "elements": {"fwd": {"source": "sigs.json", "element": "fwd", "work": "mytrain:make_fwd"},
                     "bwd": {"source": "sigs.json", "element": "bwd", "work": "mytrain:make_bwd"}},
        "shape": {"kind": "chain", "tasks": ["fwd", "fwd", "bwd", "bwd"]},
        "idle_power_w": 123.0}))
    # switches are never free by accident: measure them on the GPU, then name the table
    assert cli.main(["transitions", "chain.json", "--device", "nvml:0", "--repeats", "1",
                     "-o", "transitions.json"]) == 0, capsys.readouterr().err
    doc = json.loads((project.path / "chain.json").read_text())
    doc["transitions"] = {"file": "transitions.json"}
    (project.path / "chain.json").write_text(json.dumps(doc))
    assert cli.main(["plan", "chain.json", "--deadline", "1.3x", "-o", "plan.json"]) == 0
    capsys.readouterr()
    rc = cli.main(["run", "plan.json", "--workload", "chain.json", "--device", "nvml:0",
                   "--json", "-o", "run.json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert json.loads((project.path / "run.json").read_text()) == doc
    plan, base = doc["plan"], doc["baselines"]["all_max"]
    assert plan["simulated"] is False
    assert plan["step"]["measured_energy_j"] < base["step"]["measured_energy_j"]
    (saving,) = doc["savings"]
    assert saving["measured"] > 0
    assert plan["step"]["deviation"]["flagged"] is False, plan["step"]
    assert project.fake.gpu.locked_sm is None and project.fake.gpu.limit_mw == 400_000


def test_ecal_run_on_a_real_gpu_refuses_what_it_cannot_run(project, capsys):
    rc = cli.main(["characterize", "mytrain:make_fwd", "--device", "nvml:0", "--name", "fwd",
                   "-o", "sigs.json", *FAST])
    assert rc == 0, capsys.readouterr().err
    base = {"format": "ecal.workload/1", "elements": {"fwd": {"source": "sigs.json"}},
            "idle_power_w": 123.0, "transitions": "free"}
    (project.path / "nowork.json").write_text(json.dumps(
        {**base, "shape": {"kind": "chain", "tasks": ["fwd", "fwd"]}}))
    (project.path / "two.json").write_text(json.dumps(
        {**base, "shape": {"kind": "1f1b", "stages": 2, "microbatches": 2, "forward": "fwd",
                           "backward": "fwd"}}))
    for wl, msg in (("nowork.json", "no work to run"), ("two.json", "single-device plans")):
        assert cli.main(["plan", wl, "--deadline", "1.2x", "-o", f"{wl}.plan"]) == 0
        capsys.readouterr()
        rc = cli.main(["run", f"{wl}.plan", "--workload", wl, "--device", "nvml:0"])
        err = capsys.readouterr().err
        assert rc == 2 and msg in err and err.count("\n") == 1, err
    rc = cli.main(["run", "nowork.json.plan", "--device", "nvml:0"])
    assert rc == 2 and "--workload" in capsys.readouterr().err
    assert project.fake.gpu.locked_sm is None
