"""``ecal selftest``: the simulator through the real CLI, the fake NVML opened read-only, and
``--write`` (settings changed, then restored, also after a signal or through ``ecal restore``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ecal import cli
from measure import journal as jr
from measure import sm_alloc
from measure.selftest import (
    FORMAT,
    SelftestWorks,
    check_counter_period,
    check_deep_idle,
    run_selftest,
)
from tests.fake_pynvml import FakeGPU, install_fake_nvml, make_fake_pynvml
from tests.fake_torch import make_fake_driver, make_fake_torch

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "selftest.md").read_text()
CHECKS = ("counter_period", "counter_read_cost", "deep_idle_power", "ready_power",
          "sequential_composite", "sm_split_scaling", "sm_partitions")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ECAL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(sm_alloc, "_CACHE", {})
    monkeypatch.setattr(sm_alloc, "cuda_driver", lambda: None)


def _nvml(monkeypatch, **gpu):
    fake = make_fake_pynvml(FakeGPU(**gpu))
    cls = install_fake_nvml(monkeypatch, fake)
    return fake, cls(index=0, read_only=True, cuda_index=0)


def _fake_works(fake, torch=None, extra_j: float = 0.0) -> SelftestWorks:
    """Works on the fake card: ``a`` takes 2 ms on all 132 SMs (longer on fewer, when a fake
    torch tells which stream it runs on), ``b`` 1 ms; ``seq`` is both (plus ``extra_j``)."""
    def a():
        sms = len(torch.cuda.current_stream().sm_ids) if torch is not None else 132
        fake.busy(0.002 * 132 / sms, 500.0)

    def b():
        fake.busy(0.001, 300.0)

    def both():
        a()
        b()
        if extra_j:
            fake.busy(extra_j / 400.0, 400.0)
    return SelftestWorks(a, b, both, "a", "b")


# -- the simulator through the real CLI -----------------------------------------------------

def test_selftest_on_the_simulator_through_the_cli(tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ECAL_STATE_DIR": str(tmp_path / "state")}
    p = subprocess.run([sys.executable, "-m", "ecal", "selftest", "--device", "sim", "--json",
                        "-o", str(out)], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc == json.loads(out.read_text())
    assert doc["format"] == FORMAT == "ecal.selftest/1"
    assert doc["simulated"] is True and doc["read_only"] is True and doc["ok"] is True
    assert doc["verdict"] in ("pass", "warn")
    assert [c["name"] for c in doc["checks"]] == list(CHECKS)
    for c in doc["checks"]:
        assert set(c) == {"name", "assumption", "verdict", "value", "unit", "detail", "data"}
        assert c["verdict"] in ("pass", "warn", "fail", "skipped")
    by = {c["name"]: c for c in doc["checks"]}
    assert 0.073 <= by["counter_period"]["value"] <= 0.127          # the simulated tick
    assert by["ready_power"]["value"] > by["deep_idle_power"]["value"]
    assert by["sequential_composite"]["data"]["deviation"]["c_alpha"] == pytest.approx(1.96, abs=0.01)
    points = by["sm_split_scaling"]["data"]["points"]
    assert [(p["requested"], p["granted"]) for p in points] == [(34, 40), (67, 72), (132, 132)]
    assert by["sm_partitions"]["verdict"] == "skipped"
    # every key of the report and every check is documented
    for key in list(doc) + list(CHECKS) + list(doc["checks"][0]):
        assert f"`{key}`" in DOC, key


def test_table_read_only_and_with_write(capsys):
    assert cli.main(["selftest", "--device", "sim"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in CHECKS) and re.search(r"^verdict: (pass|warn)", out, re.M)
    assert "(read-only)" in out and "power_cap_windows" not in out
    assert cli.main(["selftest", "--device", "sim", "--write"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in CHECKS + WRITE_CHECKS) and "then restored" in out


def test_docs_record_the_real_run():
    assert "## Recorded runs" in DOC and "| 2026-12-04 | NVIDIA H200" in DOC and "--write" in DOC
    report = json.loads((ROOT / "experiments" / "results" / "selftest_h200.json").read_text())
    assert report["format"] == FORMAT and report["simulated"] is False
    assert {c["name"] for c in report["checks"]} == set(CHECKS)


# -- over the fake NVML, read-only ----------------------------------------------------------

def test_selftest_over_the_fake_nvml_is_read_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)          # no torch: split checks skipped
    fake, dev = _nvml(monkeypatch)
    report = run_selftest(dev, _fake_works(fake))
    dev.close()
    assert fake.gpu.setter_calls == []
    v = report.to_dict()["verdicts"]
    assert v["counter_period"] == v["counter_read_cost"] == v["ready_power"] == "pass"
    assert v["sequential_composite"] == "pass"
    assert v["sm_split_scaling"] == v["sm_partitions"] == "skipped"
    assert "needs torch >= 2.9" in report.check("sm_split_scaling").detail
    assert report.check("counter_period").value == pytest.approx(0.1, abs=0.005)
    assert report.check("counter_read_cost").value == pytest.approx(0.004, rel=0.01)
    assert report.check("ready_power").value == pytest.approx(123.0, rel=0.01)
    # the fake card idles at the same power with or without a context: said, not passed
    assert v["deep_idle_power"] == "warn" and report.ok


def test_selftest_over_the_fake_nvml_with_green_contexts(monkeypatch):
    torch = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(sm_alloc, "cuda_driver", make_fake_driver)
    fake, dev = _nvml(monkeypatch)
    report = run_selftest(dev, _fake_works(fake, torch))
    dev.close()
    assert fake.gpu.setter_calls == []
    scaling = report.check("sm_split_scaling")
    assert scaling.verdict == "pass", scaling.detail
    assert [(p["requested"], p["granted"]) for p in scaling.data["points"]] == [(34, 40), (67, 72), (132, 132)]
    parts = report.check("sm_partitions")
    assert parts.verdict == "pass" and parts.data["disjoint"] is True
    assert [p["granted"] for p in parts.data["partitions"]] == [64, 64]


def test_overlapping_partitions_are_a_warning(monkeypatch):
    torch = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    fake, dev = _nvml(monkeypatch)
    report = run_selftest(dev, _fake_works(fake, torch))
    dev.close()
    parts = report.check("sm_partitions")
    assert parts.verdict == "warn" and parts.data["overlapping"] is True and "OVERLAPPING" in parts.detail


def test_cli_over_the_fake_nvml_without_torch(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)
    fake, dev = _nvml(monkeypatch)
    dev.close()
    assert cli.main(["selftest", "--device", "nvml:0", "-o", str(tmp_path / "r.json")]) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["simulated"] is False and doc["device"]["uuid"] == fake.gpu.uuid
    assert doc["verdicts"]["sequential_composite"] == "skipped"   # no work to run without torch
    assert fake.gpu.setter_calls == []


# -- verdict rules --------------------------------------------------------------------------

def test_a_composite_off_its_prediction_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    fake, dev = _nvml(monkeypatch)
    report = run_selftest(dev, _fake_works(fake, extra_j=0.05))     # 0.05 J more per composite
    dev.close()
    c = report.check("sequential_composite")
    assert c.verdict == "fail" and c.value > 1.0 and not report.ok and report.verdict == "fail"


def test_a_capped_element_faster_beside_low_power_work_is_diagnosed(monkeypatch):
    """As on the real H200: ``a`` sits at the 700 W limit alone; beside ``b`` it runs faster
    (the cap is an average), so the composite is flagged, and the detail names the cause."""
    monkeypatch.setitem(sys.modules, "torch", None)
    fake, dev = _nvml(monkeypatch)

    def a():
        fake.busy(0.002, 700.0)

    def b():
        fake.busy(0.001, 300.0)

    def both():
        fake.busy(0.0018, 760.0)
        b()
    report = run_selftest(dev, SelftestWorks(a, b, both, "a", "b"))
    dev.close()
    c = report.check("sequential_composite")
    assert c.verdict == "fail" and c.data["capped"] == ["a"]
    assert "at the power limit" in c.detail and "ecal check --pairs" in c.detail


def test_an_uncapped_composite_off_its_prediction_names_no_cap(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    fake, dev = _nvml(monkeypatch)
    report = run_selftest(dev, _fake_works(fake, extra_j=0.05))
    dev.close()
    c = report.check("sequential_composite")
    assert c.data["capped"] == [] and "power limit" not in c.detail


def test_a_counter_that_never_ticks_fails(monkeypatch):
    fake, dev = _nvml(monkeypatch, tick_s=5.0)
    c = check_counter_period(dev)
    dev.close()
    assert c.verdict == "fail" and "did not advance" in c.detail


def test_deep_idle_rules():
    assert check_deep_idle(80.0, "model", 123.0, True).verdict == "pass"
    near = check_deep_idle(121.0, "measured_before_context", 123.0, False)
    assert near.verdict == "warn" and "no CUDA context" in near.detail
    assert check_deep_idle(80.0, "model", None, True).verdict == "skipped"


# -- one clear message for own code without a GPU ----------------------------------------------

@pytest.mark.parametrize("device", ["sim", "nvml:0"])
def test_own_code_without_a_gpu_says_what_works_instead_of_looping(device, tmp_path, monkeypatch, capsys):
    (tmp_path / "mytrain_nogpu.py").write_text("CALLS = []\n\ndef make_step():\n"
                                               "    CALLS.append(1)\n    return lambda: None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mytrain_nogpu", raising=False)
    fake = make_fake_pynvml()
    fake.gpu.fail["nvmlInit"] = fake.NVML_ERROR_LIBRARY_NOT_FOUND     # no driver on this host
    install_fake_nvml(monkeypatch, fake)
    rc = cli.main(["characterize", "mytrain_nogpu:make_step", "--device", device])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0
    assert "mytrain_nogpu:make_step" in err and "without a GPU" in err
    assert "Zeus logs" in err and "ecal characterize --list" in err and "ecal plan" in err
    assert "--device sim" not in err                        # never sent back to the simulator
    made = getattr(sys.modules.get("mytrain_nogpu"), "CALLS", [])
    assert made == []                                         # refused before it was called


# -- --write: the cap on short windows, switch latency per knob, restored after ---------------

WRITE_CHECKS = ("power_cap_windows", "switch_latency_sm_clock", "switch_latency_mem_clock",
                "switch_latency_power_limit", "settings_restored")


class CappedWork:
    """Work on the fake card drawing ``uncapped_w`` for 2 ms a call, under a power limit that
    the firmware enforces as an average: after ``headroom_s`` of work from rest (an idle gap of
    over 50 ms) the call draws the limit and runs proportionally longer (same energy above
    ready); before, it draws ``uncapped_w``. ``headroom_s=0``: a limit held at every instant;
    ``enforce=False``: the limit is never enforced."""

    def __init__(self, fake, uncapped_w: float = 500.0, headroom_s: float = 0.0, enforce: bool = True):
        self.fake, self.p_u, self.headroom_s, self.enforce = fake, uncapped_w, headroom_s, enforce
        self.since = self.last_end = -1.0

    def __call__(self) -> None:
        g = self.fake.gpu
        t = self.fake.time()
        if t - self.last_end > 0.05:
            self.since = t                       # from rest: the averaging window has headroom
        cap = g.limit_mw / 1000.0
        p, dt = self.p_u, 0.002
        if self.enforce and cap < self.p_u and t - self.since >= self.headroom_s:
            dt *= (self.p_u - g.idle_power_w) / (cap - g.idle_power_w)
            p = cap
        self.fake.busy(dt, p)
        self.last_end = self.fake.time()


def _write_run(monkeypatch, gpu=None, **work):
    monkeypatch.setitem(sys.modules, "torch", None)
    fake = make_fake_pynvml(gpu or FakeGPU(limit_mw=650_000))
    cls = install_fake_nvml(monkeypatch, fake)
    dev = cls(index=0, cuda_index=0)
    a = CappedWork(fake, **work)

    def b():
        fake.busy(0.001, 300.0)
    found = fake.gpu.settings()
    report = run_selftest(dev, SelftestWorks(a, b, lambda: (a(), b()), "a", "b"), write=True)
    dev.close()
    return fake, report, found


def test_write_over_the_fake_nvml_restores_and_a_held_cap_passes(monkeypatch):
    fake, report, found = _write_run(monkeypatch)
    doc = report.to_dict()
    assert [c["name"] for c in doc["checks"]] == list(CHECKS) + list(WRITE_CHECKS)
    assert doc["read_only"] is False and doc["write_checks"].startswith("ran")
    # every setter was journalled and put back: the card as found, no journal left
    assert fake.gpu.settings() == found
    assert not jr.path_for(fake.gpu.uuid).exists()
    calls = {c[0] for c in fake.gpu.setter_calls}
    assert {"nvmlDeviceSetPowerManagementLimit", "nvmlDeviceSetGpuLockedClocks",
            "nvmlDeviceSetMemoryLockedClocks", "nvmlDeviceResetGpuLockedClocks",
            "nvmlDeviceResetMemoryLockedClocks"} <= calls
    cap = report.check("power_cap_windows")
    assert cap.data["power_limit_w"] == 375.0                  # 75 % of the 500 W drawn uncapped
    assert cap.data["uncapped_power_w"] == pytest.approx(500.0, rel=0.01)
    assert [w["window_s"] for w in cap.data["windows"]] == [0.05, 0.2, 1.0, 3.0]
    for w in cap.data["windows"]:
        assert w["power_w"] == pytest.approx(375.0, rel=0.01)
    assert cap.verdict == "pass"
    # the fake shows a clock lock at once: the probes' latency is the setter's own cost (0)
    for name in WRITE_CHECKS[1:3]:
        assert report.check(name).verdict == "pass" and report.check(name).value == 0.0
    limit = report.check("switch_latency_power_limit")
    assert limit.data["shown_by"] == "kernel_time" and limit.verdict == "pass"
    # the first chunk after the setter already runs capped: one 5 ms chunk of 2.8 ms calls
    assert limit.value == pytest.approx(2 * 0.002 * 377 / 252, rel=0.01)
    assert report.check("settings_restored").verdict == "pass"


def test_a_cap_that_averages_over_time_is_a_warning_naming_the_window(monkeypatch):
    _, report, _ = _write_run(monkeypatch, headroom_s=0.1)
    cap = report.check("power_cap_windows")
    by = {w["window_s"]: w["ratio_to_limit"] for w in cap.data["windows"]}
    # 50 ms all at 500 W (4/3 of the limit); 200 ms: 100 ms at 500 W, then the limit
    assert by[0.05] == pytest.approx(500 / 375, rel=0.01)
    assert by[0.2] > 1.1 and by[3.0] < 1.03
    assert cap.verdict == "warn" and "time average" in cap.detail
    assert cap.data["shortest_window_at_limit_s"] in (1.0, 3.0)
    assert report.ok


def test_a_cap_never_enforced_fails(monkeypatch):
    _, report, _ = _write_run(monkeypatch, enforce=False)
    cap = report.check("power_cap_windows")
    assert cap.verdict == "fail" and "does not hold" in cap.detail and not report.ok
    # no element slows under the limit: its latency is the limit read back
    assert report.check("switch_latency_power_limit").data["shown_by"] == "limit_read_back"


def test_a_slow_clock_lock_is_measured_and_warned(monkeypatch):
    _, report, _ = _write_run(monkeypatch, FakeGPU(limit_mw=650_000, clock_settle_s=0.2))
    for name in ("switch_latency_sm_clock", "switch_latency_mem_clock"):
        c = report.check(name)
        assert c.value == pytest.approx(0.2, abs=0.001) and c.verdict == "warn", c.detail


def test_a_clock_lock_that_never_shows_fails(monkeypatch):
    fake, report, found = _write_run(monkeypatch, FakeGPU(limit_mw=650_000, clock_settle_s=10.0))
    c = report.check("switch_latency_sm_clock")
    assert c.verdict == "fail" and "never showed" in c.detail and fake.gpu.settings() == found


def test_write_on_the_simulator_restores_it(tmp_path):
    from frontier.files import write_json_atomic
    from measure.selftest import load_selftest_report
    from measure.sim import SimulatedGPU

    dev = SimulatedGPU(seed=1)
    found = dev.get_operating_point()
    report = run_selftest(dev, write=True)
    assert dev.get_operating_point() == found and len(dev._set_calls) > 10
    cap = report.check("power_cap_windows")
    # the simulator as it is: a verdict either way, said as measured (not assumed)
    assert cap.verdict in ("pass", "warn") and len(cap.data["windows"]) == 4
    assert report.check("switch_latency_sm_clock").value == pytest.approx(
        dev.switch_time_s(found, found.with_(sm_clock_mhz=report.check("switch_latency_sm_clock").data["to_mhz"])),
        abs=0.001)
    assert report.check("settings_restored").verdict == "pass"
    write_json_atomic(tmp_path / "st.json", report.to_dict())      # the report's model holds
    assert load_selftest_report(tmp_path / "st.json")["read_only"] is False
    for name in WRITE_CHECKS:                                        # and every check is documented
        assert f"`{name}`" in DOC, name


CHILD = r"""
import os, signal, sys
from tests.fake_pynvml import make_fake_pynvml
from measure.nvml import NVMLDevice
from measure.selftest import SelftestWorks, run_selftest
fake = make_fake_pynvml(state_path=sys.argv[1])
sig = getattr(signal, sys.argv[2])
fake.after_call("nvmlDeviceSetGpuLockedClocks", lambda: os.kill(os.getpid(), sig))
dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
a = lambda: fake.busy(0.002, 500.0)
b = lambda: fake.busy(0.001, 300.0)
run_selftest(dev, SelftestWorks(a, b, lambda: (a(), b()), "a", "b"), write=True)
print("finished", flush=True)
"""


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_a_signal_mid_write(sig, tmp_path, capsys):
    """Killed inside the SM-clock setter (the cap check has set and restored the limit):
    SIGTERM/SIGINT restore at once; SIGKILL leaves the journal, and `ecal restore` puts the
    card back."""
    import argparse

    from ecal.recovery import cmd_restore
    from tests.fake_pynvml import load_cards, save_cards

    state = tmp_path / "card.json"
    card = FakeGPU(limit_mw=650_000)
    save_cards(state, [card])
    found = {"limit_mw": 650_000, "locked_sm": None, "locked_mem": None}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ECAL_STATE_DIR": str(tmp_path / "state")}
    p = subprocess.run([sys.executable, "-c", CHILD, str(state), sig], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert "finished" not in p.stdout, p.stderr
    s = load_cards(state)[0]
    settings = {"limit_mw": s["limit_mw"], "locked_sm": s["locked_sm"], "locked_mem": s["locked_mem"]}
    journal = jr.path_for(card.uuid, tmp_path / "state")
    if sig == "SIGKILL":
        assert p.returncode == -signal.SIGKILL
        assert settings["locked_sm"] is not None and journal.exists()
        rec = jr.read_journal(journal)
        assert set(rec.entries) == {"gpu_locked_clocks"} and rec.pid != os.getpid()
        assert cmd_restore(argparse.Namespace(device=None, json=False),
                           nvml=make_fake_pynvml(state_path=state)) == 0
        assert "restored" in capsys.readouterr().out
        s = load_cards(state)[0]
        settings = {"limit_mw": s["limit_mw"], "locked_sm": s["locked_sm"], "locked_mem": s["locked_mem"]}
    else:
        assert p.returncode in (-getattr(signal, sig), 130, 1), p.stderr
    assert settings == found
    assert not journal.exists()
