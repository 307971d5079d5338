"""``ecal characterize`` on a user's own project: ``module:factory`` from the working folder,
the default grid from the device's own clocks, one ready-power calibration per ω_dev shared by
a campaign, protocol options, ``--name``, and the one-line error for user code on the simulator.

The GPU is the strict fake pynvml (tests/fake_pynvml.py) on its own clock; a "kernel" of the
user's step advances that clock at a power (``fake_cuda`` below stands in for torch.cuda).
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
import types

import pytest
from fake_pynvml import FakeGPU, install_fake_nvml, make_fake_pynvml

import measure
import measure.nvml as mn
from ecal import cli
from ecal.commands import DEFAULT_GRID
from measure import (
    Grid,
    Protocol,
    ReadyPowerCache,
    SimulatedGPU,
    characterize,
    default_grid,
    preset,
)
from measure.results_log import ResultsLog

msweep = importlib.import_module("measure.sweep")   # (measure.sweep is also a function)

MYTRAIN = '''
import fake_cuda                      # in a real project: import torch

CALLS = {"factory": 0, "step": 0, "plain": 0}


def make_step():
    """Factory: builds the model and batch once, returns the step."""
    CALLS["factory"] += 1
    model = fake_cuda.Model(kernel_s=0.004, power_w=350.0)

    def step():
        CALLS["step"] += 1
        model.forward_backward()

    return step


def make_bwd():
    CALLS["factory"] += 1
    model = fake_cuda.Model(kernel_s=0.008, power_w=420.0)
    return model.forward_backward


def plain_step():
    """A zero-argument work (no factory): returns a 'loss', not a callable."""
    CALLS["plain"] += 1
    fake_cuda.Model(kernel_s=0.002, power_w=300.0).forward_backward()
    return 0.5


from measure import preset
COPY = preset("copy_2GiB")            # a simulated kernel defined in a module


def broken_factory():
    raise RuntimeError("no GPU memory for my model")
'''

#: A fast protocol on the command line (also shows the options are passed through).
FAST = ["--window-s", "0.15", "--warmup-s", "0.01", "--min-windows", "2", "--max-windows", "3",
        "--target-rse", "0.5", "--cooldown-s", "0.01"]


def _a100() -> FakeGPU:
    """A card unlike the simulated H200: SM clocks 210–1410 MHz, power limits 100–400 W."""
    return FakeGPU(name="NVIDIA A100-SXM4-40GB", sm_clocks=tuple(range(1410, 209, -15)),
                   mem_clocks=(1215,), limit_range_mw=(100_000, 400_000), limit_mw=400_000,
                   default_limit_mw=400_000, cores=108 * 64, arch=7)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project folder as the working directory (not on sys.path, no PYTHONPATH), a
    fake GPU behind NVML, and ``fake_cuda`` whose kernels run on that GPU's clock."""
    (tmp_path / "mytrain.py").write_text(textwrap.dedent(MYTRAIN))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    fake = make_fake_pynvml(_a100())

    class Model:
        def __init__(self, kernel_s: float, power_w: float):
            self.kernel_s, self.power_w = kernel_s, power_w

        def forward_backward(self) -> None:
            fake.busy(self.kernel_s, self.power_w)

    monkeypatch.setitem(sys.modules, "fake_cuda", types.SimpleNamespace(Model=Model))
    install_fake_nvml(monkeypatch, fake)
    sys.modules.pop("mytrain", None)
    yield types.SimpleNamespace(path=tmp_path, fake=fake)
    sys.modules.pop("mytrain", None)


def _count_calibrations(monkeypatch) -> list:
    calls: list = []
    real = msweep.measure_ready_power_w

    def counted(device, protocol=Protocol()):
        calls.append(device.get_operating_point().dev)
        return real(device, protocol)

    monkeypatch.setattr(msweep, "measure_ready_power_w", counted)
    return calls


def test_factory_from_the_working_folder_on_the_default_grid(project, monkeypatch, capsys):
    calib = _count_calibrations(monkeypatch)
    rc = cli.main(["characterize", "mytrain:make_step", "mytrain:make_bwd", "--device", "nvml:0",
                   "--name", "s0_forward", "--name", "s0_backward", "-o", "s0.json",
                   "--results", "sweep.jsonl", "--json", *FAST])
    out = capsys.readouterr()
    assert rc == 0, out.err
    mytrain = sys.modules["mytrain"]
    assert mytrain.__file__.startswith(str(project.path))   # found in the working folder
    assert mytrain.CALLS["factory"] == 2          # each factory once, outside the windows
    assert mytrain.CALLS["step"] > 10             # the work it returned is what was measured

    # the default grid comes from the fake A100's own clocks and limits
    grid = default_grid(_opset_of(project.fake))
    clocks = grid.axes["sm_clock_mhz"]
    assert max(clocks) == 1410 and min(clocks) == pytest.approx(705, abs=15) and len(clocks) == 12
    assert grid.axes["power_limit_w"] == (400.0, 280.0)
    assert set(clocks) <= set(float(c) for c in project.fake.gpu.sm_clocks)

    doc = json.loads(out.out)
    assert doc["format"] == "energy-calculus/characterization-campaign"
    els = {e["element"]: e for e in doc["elements"]}
    assert set(els) == {"s0_forward", "s0_backward"}
    for e in els.values():
        omegas = {(s["omega"]["sm_clock_mhz"], s["omega"]["power_limit_w"]) for s in e["signatures"]}
        assert omegas == {(c, p) for c in clocks for p in (400.0, 280.0)}
        # the protocol options reached every point
        ps = e["signatures"][0]["meta"]["protocol_settings"]
        assert (ps["window_s"], ps["warmup_s"], ps["cooldown_s"], ps["min_windows"],
                ps["max_windows"], ps["target_rse"]) == (0.15, 0.01, 0.01, 2, 3, 0.5)
        assert all(2 <= s["meta"]["windows"] <= 3 for s in e["signatures"])

    # one calibration per ω_dev for the whole campaign, not one per element
    n_dev = len(grid)
    assert len(calib) == n_dev and len(set(calib)) == n_dev
    assert doc["ready_power"]["calibrations"] == n_dev and doc["ready_power"]["reuses"] == n_dev

    # -o: one signature file holding both elements, and the ready power per ω_dev (contract C)
    saved = json.loads((project.path / "s0.json").read_text())
    assert len(saved["meta"]["ready_power_w"]) == n_dev
    assert saved["meta"]["elements"] == ["s0_forward", "s0_backward"]
    from frontier.io import load_signatures

    keys = load_signatures(project.path / "s0.json")
    assert {k.split("@")[0] for k in keys} == {"s0_forward", "s0_backward"}

    # each element's results file records the ready power it used (reused ones say so)
    fwd = ResultsLog(project.path / "sweep.s0_forward.jsonl")
    bwd = ResultsLog(project.path / "sweep.s0_backward.jsonl")
    assert fwd.ready_w == bwd.ready_w and len(fwd.ready_w) == n_dev
    recs = [json.loads(x) for x in (project.path / "sweep.s0_backward.jsonl").read_text().splitlines()]
    assert {r.get("source") for r in recs if r["kind"] == "ready"} == {"campaign"}
    # the card is back as it was
    assert project.fake.gpu.locked_sm is None and project.fake.gpu.limit_mw == 400_000


def _opset_of(fake):
    dev = mn.NVMLDevice(0, read_only=True, nvml=fake)
    try:
        return dev.operating_set()
    finally:
        dev.close()


def test_a_resumed_campaign_reuses_the_recorded_ready_power(project, monkeypatch, capsys):
    args = ["characterize", "mytrain:make_step", "mytrain:make_bwd", "--device", "nvml:0",
            "--grid", "sm_clock_mhz=1410,1200,power_limit_w=400", "--results", "r.jsonl", *FAST]
    assert cli.main(args) == 0, capsys.readouterr().err
    calib = _count_calibrations(monkeypatch)
    # a second element joins the campaign; its file is new, the first's holds the calibrations
    (project.path / "r.make_bwd.jsonl").unlink()
    assert cli.main(args) == 0, capsys.readouterr().err
    assert calib == []        # nothing calibrated again: the first file's values were reused


def test_plain_function_and_name(project, monkeypatch, capsys):
    rc = cli.main(["characterize", "mytrain:plain_step", "--device", "nvml:0", "--grid",
                   "sm_clock_mhz=1410,1005", "--name", "my_step", "--json", *FAST])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert doc["element"] == "my_step" and len(doc["signatures"]) == 2
    assert set(doc["meta"]["ready_power_w"]) == {"1410MHz", "1005MHz"}
    assert sys.modules["mytrain"].CALLS["plain"] > 10
    assert sys.modules["mytrain"].CALLS["factory"] == 0


def test_default_name_is_the_attribute_as_typed(project, capsys):
    rc = cli.main(["characterize", "mytrain:make_step", "--device", "nvml:0", "--grid",
                   "sm_clock_mhz=1410", "--json", *FAST])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)["element"] == "make_step"


def test_no_factory_flag_takes_the_attribute_as_the_work(project, capsys):
    rc = cli.main(["characterize", "mytrain:make_step", "--no-factory", "--device", "nvml:0",
                   "--grid", "sm_clock_mhz=1410", *FAST])
    err = capsys.readouterr().err
    # make_step itself takes no GPU time on the card: refused in one line, not a hang
    assert rc == 2 and "took no device time" in err and err.strip().count("\n") == 0


def test_user_code_on_the_simulator_is_a_one_line_error(project, capsys):
    rc = cli.main(["characterize", "mytrain:make_step", "--device", "sim"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0
    assert "nvml:INDEX" in err and "--list" in err and "mytrain:make_step" in err
    assert sys.modules["mytrain"].CALLS["factory"] == 0       # refused before it was called


def test_a_failing_factory_is_the_users_error(project, capsys):
    rc = cli.main(["characterize", "mytrain:broken_factory", "--device", "nvml:0",
                   "--grid", "sm_clock_mhz=1410", *FAST])
    err = capsys.readouterr().err
    assert rc == 3 and "no GPU memory for my model" in err and "Traceback" in err


def test_missing_module_names_the_folder(project, capsys):
    rc = cli.main(["characterize", "nosuchmod:f", "--device", "nvml:0"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "nosuchmod" in err and str(project.path) in err


@pytest.mark.parametrize("argv, what", [
    (["--name", "a", "--name", "b"], "--name"),
    (["--window-s", "0"], "--window-s"),
    (["--min-windows", "5", "--max-windows", "2"], "--min-windows"),
    (["--cooldown-s", "-1"], "--cooldown-s"),
    (["--name", "a@b"], "'@'"),
])
def test_bad_protocol_and_name_options(argv, what, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["characterize", "copy_2GiB", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and what in err and err.count("\n") == 0


def test_sim_default_grid_is_unchanged():
    opset = SimulatedGPU().operating_set()
    assert default_grid(opset) == Grid.parse(DEFAULT_GRID)
    assert default_grid(opset, read_only=True) == Grid.parse("sm_count=132,120:8:-16")   # as granted


def test_zero_time_work_on_the_simulator_fails_fast():
    with pytest.raises(measure.DeviceError, match="took no device time"):
        characterize(lambda: None, device=SimulatedGPU(), grid="sm_clock_mhz=1980", progress=None)


def test_ready_power_cache_is_bit_for_bit_on_the_simulator():
    """Reuse changes only the device time: every signature equals the one without reuse."""
    grid = "sm_clock_mhz=1980,1500,power_limit_w=700,400"
    proto = Protocol(window_s=0.2, min_windows=2, max_windows=3, target_rse=0.2)
    names = ("copy_2GiB", "gemm_bf16_8192")
    alone = [characterize(preset(n), device=SimulatedGPU(seed=1), grid=grid, protocol=proto,
                          progress=None) for n in names]
    cache = ReadyPowerCache()
    dev = SimulatedGPU(seed=1)
    shared = [characterize(preset(n), device=dev, grid=grid, protocol=proto, progress=None,
                           ready_cache=cache) for n in names]
    assert cache.calibrations == 4 and cache.reuses == 4
    for a, b in zip(alone, shared):
        assert [(s.time_s, s.energy_j, s.var_energy_j2) for s in a.signatures] == \
               [(s.time_s, s.energy_j, s.var_energy_j2) for s in b.signatures]
        assert a.meta["ready_power_w"] == b.meta["ready_power_w"]
    # another seed is another device identity: nothing is reused from it
    other = characterize(preset("copy_2GiB"), device=SimulatedGPU(seed=2), grid=grid,
                         protocol=proto, progress=None, ready_cache=cache)
    assert cache.calibrations == 8 and len(other.signatures) == 4


def test_a_campaign_of_presets_without_a_results_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["characterize", "copy_2GiB", "stage_forward", "--grid", "sm_clock_mhz=1980,1500",
                   "-o", "c.json", *FAST])
    out = capsys.readouterr().out
    assert rc == 0 and "ready power: 2 calibration(s)" in out and "reused 2 time(s)" in out
    meta = json.loads((tmp_path / "c.json").read_text())["meta"]
    assert meta["elements"] == ["copy_2GiB", "stage_forward"] and meta["simulated"] is True
    assert set(meta["ready_power_w"]) == {"1980MHz", "1500MHz"}
    rc = cli.main(["characterize", "copy_2GiB", "stage_forward", "--plot", "p.png"])
    assert rc == 2 and "--plot" in capsys.readouterr().err and not (tmp_path / "p.png").exists()


def test_a_simulated_kernel_from_a_module_runs_on_the_simulator(project, capsys):
    rc = cli.main(["characterize", "mytrain:COPY", "--device", "sim", "--grid",
                   "sm_clock_mhz=1980", "--json", *FAST])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)["simulated"] is True
