"""The training-loop hook: ``PlanApplier.from_schedule`` in a 1F1B loop (simulator and the
strict fake pynvml): switches per iteration equal the schedule's, only changed knobs are set,
NVML calls stay off the training thread, errors surface, the device is always restored."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from frontier.errors import FormatError
from frontier.operating_point import OperatingPoint
from measure import NVMLDevice, PermissionDeniedError, PlanApplier, SimulatedGPU
from measure.apply import read_schedule, task_name
from tests.fake_pynvml import FakeGPU, make_fake_pynvml

ROOT = Path(__file__).resolve().parents[1]


def one_f_one_b_order(stage: int, n_stages: int, n_mb: int) -> list[tuple[str, int]]:
    """The 1F1B order of one stage (as solvers.pipeline.stage_order; measure imports no
    solvers, and neither does this test's schedule writer)."""
    warm = min(n_stages - stage - 1, n_mb)
    out = [("forward", m) for m in range(warm)]
    for i in range(n_mb - warm):
        out += [("forward", warm + i), ("backward", i)]
    return out + [("backward", m) for m in range(n_mb - warm, n_mb)]


def clocks(stage: int, inst: str, mb: int) -> dict:
    """A plan whose clocks vary by instruction and microbatch (some repeats: no switch)."""
    if inst == "forward":
        return {"sm_clock_mhz": 1410.0 if mb % 2 else 1200.0, "power_limit_w": 700.0}
    return {"sm_clock_mhz": 1980.0, "power_limit_w": 700.0 if mb < 2 else 500.0}


def steady_switches(entries: list[dict]) -> int:
    """ω_dev changes in one iteration, the wrap (last task → first of the next) included."""
    dev = [tuple(e.get(k) for k in ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w"))
           for e in entries]
    return sum(a != b for a, b in zip(dev, dev[1:] + dev[:1]))


def write_schedule(path: Path, n_stages: int = 2, n_mb: int = 4, optional: bool = True) -> dict:
    devices = {}
    for s in range(n_stages):
        devices[f"stage{s}"] = [{"task": task_name(s, i, m), "start_s": 0.0, "end_s": 0.0,
                                 **clocks(s, i, m)} for i, m in one_f_one_b_order(s, n_stages, n_mb)]
    doc = {"format": "ecal.schedule/1", "deadline_s": 1.0, "makespan_s": 1.0, "devices": devices}
    if optional:
        doc["steady_state"] = True
        doc["ranks"] = [f"stage{s}" for s in range(n_stages)]
        doc["device_info"] = {d: {"ready_power_w": 120.0, "switches_per_iteration": steady_switches(e)}
                              for d, e in devices.items()}
    path.write_text(json.dumps(doc))
    return doc


def run_loop(ap: PlanApplier, stage: int, n_stages: int, n_mb: int, iterations: int, work) -> None:
    with ap:
        for _ in range(iterations):
            for inst, mb in one_f_one_b_order(stage, n_stages, n_mb):
                with ap.element(task_name(stage, inst, mb)):
                    work()


def test_task_names():
    assert task_name(0, "forward", 3) == "s0/forward/3"
    assert task_name(1, "backward", 0, chunk=1) == "s1v1/backward/0"
    with pytest.raises(ValueError):
        task_name(0, "fwd", 0)


@pytest.mark.parametrize("stage", [0, 1])
def test_from_schedule_counts_the_planned_switches_per_iteration(tmp_path, monkeypatch, stage):
    doc = write_schedule(tmp_path / "schedule.json")
    import measure.apply as apply_mod

    def no_calibration(*a, **k):
        raise AssertionError("ready power was calibrated although the schedule carries it")

    monkeypatch.setattr(apply_mod, "measure_ready_power_w", no_calibration)
    gpu = SimulatedGPU(seed=1)
    ap = PlanApplier.from_schedule(tmp_path / "schedule.json", rank=stage, device=gpu)
    assert ap.ready_power_w == 120.0 and ap.iteration_start == doc["devices"][f"stage{stage}"][0]["task"]
    assert not ap.asynchronous             # simulated: inline by default
    run_loop(ap, stage, 2, 4, 3, lambda: gpu.idle(0.001))
    planned = doc["device_info"][f"stage{stage}"]["switches_per_iteration"]
    assert len(ap.switches_per_iteration) == 3
    assert ap.switches_per_iteration[1:] == [planned, planned]
    # the first iteration also switched away from the settings found on entry
    assert ap.switches_per_iteration[0] in (planned, planned + 1)
    assert ap.switches_made == sum(ap.switches_per_iteration)
    assert len(gpu._set_calls) == ap.setter_calls == ap.switches_made    # one call per switch
    assert gpu.get_operating_point() == gpu.operating_set().default


def test_schedule_without_optional_keys_and_step(tmp_path, monkeypatch):
    write_schedule(tmp_path / "s.json", optional=False)
    sched = read_schedule(tmp_path / "s.json", 1)
    assert sched.device == "stage1" and sched.ready_power_w is None and not sched.steady_state
    assert read_schedule(tmp_path / "s.json", "stage0").tasks[0] == "s0/forward/0"
    import measure.apply as apply_mod

    calls = []
    monkeypatch.setattr(apply_mod, "measure_ready_power_w", lambda d: calls.append(d) or 100.0)
    gpu = SimulatedGPU()
    ap = PlanApplier.from_schedule(tmp_path / "s.json", rank=0, device=gpu, iteration_start=None)
    with ap:
        for _ in range(2):
            for inst, mb in one_f_one_b_order(0, 2, 4):
                with ap.element(task_name(0, inst, mb)):
                    gpu.idle(0.001)
            ap.step()
        ap.step()                           # no element since the last mark: nothing counted
    assert len(calls) == 1 and len(ap.switches_per_iteration) == 2
    entries = json.loads((tmp_path / "s.json").read_text())["devices"]["stage0"]
    assert ap.switches_per_iteration[1] == steady_switches(entries)


def test_bad_schedules_are_format_errors(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"format": "ecal.plan/1"}))
    with pytest.raises(FormatError, match="ecal.schedule/1"):
        read_schedule(p, 0)
    write_schedule(p)
    with pytest.raises(FormatError, match="out of range"):
        read_schedule(p, 5)
    doc = json.loads(p.read_text())
    doc["devices"]["stage0"][0]["sm_clock_mhz"] = "fast"
    p.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="positive number"):
        read_schedule(p, 0)


def _nvml_device(**gpu_kw):
    fake = make_fake_pynvml(FakeGPU(**gpu_kw))
    threads: list[tuple[str, int]] = []
    for name in fake.FUNCTIONS:       # record which thread makes every NVML call
        fn = getattr(fake, name)

        def rec(*a, _fn=fn, _name=name, **k):
            threads.append((_name, threading.get_ident()))
            return _fn(*a, **k)

        setattr(fake, name, rec)
    dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
    return dev, fake, threads


def test_nvml_switches_run_on_the_helper_thread_and_set_only_changed_knobs(tmp_path):
    doc = write_schedule(tmp_path / "schedule.json")
    dev, fake, threads = _nvml_device()
    syncs = []
    ap = PlanApplier.from_schedule(tmp_path / "schedule.json", rank=0, device=dev,
                                   synchronize=lambda: syncs.append(1))
    assert ap.asynchronous
    main = threading.get_ident()
    inside: list[tuple[str, int]] = []
    journalled = []

    def work():
        fake.busy(0.002, 300.0)

    with ap:
        start = len(threads)
        for it in range(3):
            for inst, mb in one_f_one_b_order(0, 2, 4):
                with ap.element(task_name(0, inst, mb)):
                    work()
            if it == 0:
                ap.wait()
                journalled.append(dev.changed_settings)
        ap.wait()
        inside = threads[start:]
    planned = doc["device_info"]["stage0"]["switches_per_iteration"]
    assert ap.switches_per_iteration[1:] == [planned, planned]
    # the training thread made no NVML call inside the loop; the helper made them all
    assert inside and all(tid != main for _, tid in inside)
    setters = [n for n, _ in inside if n.startswith("nvmlDeviceSet")]
    n_sm = sum(n == "nvmlDeviceSetGpuLockedClocks" for n in setters)
    n_pl = sum(n == "nvmlDeviceSetPowerManagementLimit" for n in setters)
    assert len(setters) == n_sm + n_pl and n_sm + n_pl >= ap.switches_made
    # each switch sets only what changes: never both setters for an SM-clock-only change
    assert len(setters) < 2 * ap.switches_made
    entries = doc["devices"]["stage0"]
    seq = [entries[0]] + entries * 3
    exp_sm = sum(a["sm_clock_mhz"] != b["sm_clock_mhz"] for a, b in zip(seq, seq[1:])) + 1
    exp_pl = sum(a["power_limit_w"] != b["power_limit_w"] for a, b in zip(seq, seq[1:]))
    assert (n_sm, n_pl) == (exp_sm, exp_pl)
    assert len(syncs) == ap.switches_made                     # synchronized before each switch
    assert "gpu_locked_clocks" in journalled[0]              # the setter path is journalled
    assert fake.gpu.locked_sm is None and fake.gpu.limit_mw == 700_000   # restored on exit
    assert dev.changed_settings == ()
    dev.close()


def test_helper_thread_error_surfaces_on_the_training_thread(tmp_path):
    write_schedule(tmp_path / "schedule.json")
    dev, fake, _ = _nvml_device()
    fake.fail_calls("nvmlDeviceSetGpuLockedClocks", fake.NVML_ERROR_NO_PERMISSION, count=99, start=2)
    ap = PlanApplier.from_schedule(tmp_path / "schedule.json", rank=1, device=dev,
                                   synchronize=None)
    with pytest.raises(PermissionDeniedError, match="nvmlDeviceSetGpuLockedClocks"):
        run_loop(ap, 1, 2, 4, 3, lambda: fake.busy(0.002, 300.0))
    assert fake.gpu.locked_sm is None and fake.gpu.limit_mw == 700_000
    assert dev.changed_settings == ()
    dev.close()


def test_crash_in_the_loop_restores_the_device(tmp_path):
    write_schedule(tmp_path / "schedule.json")
    dev, fake, _ = _nvml_device()
    ap = PlanApplier.from_schedule(tmp_path / "schedule.json", rank=0, device=dev, synchronize=None)
    with pytest.raises(RuntimeError, match="user bug"):
        with ap:
            for inst, mb in one_f_one_b_order(0, 2, 4)[:5]:
                with ap.element(task_name(0, inst, mb)):
                    fake.busy(0.002, 300.0)
            ap.wait()
            assert fake.gpu.locked_sm is not None
            raise RuntimeError("user bug")
    assert fake.gpu.locked_sm is None and fake.gpu.limit_mw == 700_000
    assert dev.changed_settings == ()
    dev.close()


def test_inline_mode_and_existing_api_on_nvml():
    dev, fake, threads = _nvml_device()
    plan = {"a": OperatingPoint(sm_clock_mhz=1500), "b": OperatingPoint(sm_clock_mhz=1200)}
    with PlanApplier(dev, plan, ready_power_w=123.0, asynchronous=False, synchronize=None) as ap:
        for name in "abab":
            with ap.element(name):
                fake.busy(0.01, 300.0)
    assert ap.transitions == 4 and ap.setter_calls == 4
    assert sum(n == "nvmlDeviceSetGpuLockedClocks" for n, _ in threads) == 4
    assert not any(n == "nvmlDeviceSetPowerManagementLimit" for n, _ in threads)
    assert ap.total_energy_j is not None and ap.total_energy_j > 0
    dev.close()


def test_worked_example_runs_on_the_simulator(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "docs/examples/pytorch_1f1b_loop.py"),
                        "--device", "sim", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "switches per iteration" in r.stdout


def test_sigint_in_the_loop_stops_the_helper_and_restores(tmp_path):
    import signal

    write_schedule(tmp_path / "schedule.json")
    dev, fake, _ = _nvml_device()
    ap = PlanApplier.from_schedule(tmp_path / "schedule.json", rank=0, device=dev, synchronize=None)
    with pytest.raises(KeyboardInterrupt):
        with ap:
            for k, (inst, mb) in enumerate(one_f_one_b_order(0, 2, 4) * 2):
                with ap.element(task_name(0, inst, mb)):
                    fake.busy(0.002, 300.0)
                if k == 6:
                    signal.raise_signal(signal.SIGINT)
    assert fake.gpu.locked_sm is None and fake.gpu.limit_mw == 700_000
    assert dev.changed_settings == ()
    ap._switcher._thread.join(10)          # it ends by itself once stopped
    assert not ap._switcher._thread.is_alive()
    dev.close()


def test_from_schedule_opens_and_closes_a_device_named_by_spec(tmp_path):
    write_schedule(tmp_path / "schedule.json")
    fake = make_fake_pynvml(FakeGPU())
    ap = PlanApplier.from_schedule(tmp_path / "schedule.json", rank=1, device="nvml:0",
                                   nvml=fake, synchronize=None)
    assert isinstance(ap.device, NVMLDevice) and ap.schedule.device == "stage1"
    run_loop(ap, 1, 2, 4, 2, lambda: fake.busy(0.002, 300.0))
    assert fake.gpu.initialized == 0          # closed (nvmlShutdown) on exit
    assert fake.gpu.locked_sm is None and len(ap.switches_per_iteration) == 2
    ap2 = PlanApplier.from_schedule(tmp_path / "schedule.json", rank=0, device="sim")
    run_loop(ap2, 0, 2, 4, 1, lambda: ap2.device.idle(0.001))
    assert ap2.switches_made > 0


def test_switches_equal_those_ecal_plan_counts(tmp_path):
    """Contract B end to end: the schedule `ecal plan WORKLOAD --schedule` writes, run for
    three iterations per rank, switches exactly as its device_info says from iteration 2."""
    workload = ROOT / "ecal" / "examples" / "workload_1f1b.json"
    from ecal.cli import main

    out = tmp_path / "schedule.json"
    rc = main(["plan", str(workload), "--deadline", "1.05x", "--microbatches", "2",
               "--schedule", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    info = doc["device_info"]
    for rank, dev in enumerate(doc["ranks"]):
        gpu = SimulatedGPU(seed=rank)
        ap = PlanApplier.from_schedule(out, rank=rank, device=gpu)
        assert ap.ready_power_w == info[dev]["ready_power_w"]        # no calibration
        with ap:
            for _ in range(3):
                for task in ap.schedule.tasks:
                    with ap.element(task):
                        gpu.idle(0.001)
        planned = info[dev]["switches_per_iteration"]
        assert ap.switches_per_iteration[1:] == [planned, planned], dev
