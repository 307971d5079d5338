"""Grids, sweeps (restore on every exit path, resume after a kill), characterize."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from frontier.operating_point import OperatingPoint
from measure import (
    Grid,
    GridError,
    NVMLDevice,
    Protocol,
    ReadOnlyError,
    SimulatedGPU,
    UnsupportedSettingError,
    characterize,
    parse_grid,
    preset,
    sweep,
)
from tests.fake_pynvml import FakeGPU, make_fake_pynvml

FAST = Protocol(window_s=0.3, min_windows=2, max_windows=3, warmup_s=0.05, ready_windows=1)


def test_parse_grid_ranges_lists_and_errors():
    g = parse_grid("sm_clock_mhz=1980:1200:-60,power_limit_w=700,500")
    assert g.axes["sm_clock_mhz"][0] == 1980 and g.axes["sm_clock_mhz"][-1] == 1200
    assert len(g.axes["sm_clock_mhz"]) == 14 and g.axes["power_limit_w"] == (700.0, 500.0)
    assert len(g) == 28 and len(g.points()) == 28
    pts = g.points()
    assert pts[0] == OperatingPoint(1980, None, 700) and pts[1] == OperatingPoint(1920, None, 700)
    assert parse_grid("sm_count=16:132:16").axes["sm_count"] == (16, 32, 48, 64, 80, 96, 112, 128)
    assert parse_grid(None).points() == [OperatingPoint()]
    assert parse_grid({"sm_clock_mhz": [1980, 1500]}).axes["sm_clock_mhz"] == (1980.0, 1500.0)
    assert Grid.parse(g.label()).axes == g.axes
    for bad, msg in [("clock=1", "unknown knob"), ("1980", "before any"), ("sm_clock_mhz=a", "not a number"),
                     ("sm_clock_mhz=1:2", "start:stop:step"), ("sm_clock_mhz=1980:1200:60", "never reaches"),
                     ("sm_clock_mhz=1,sm_clock_mhz=2", "twice"), ("sm_count=1.5", "integers")]:
        with pytest.raises(GridError, match=msg):
            parse_grid(bad)


class CountingSim(SimulatedGPU):
    """A simulated GPU that records restores."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.restores = 0

    def restore(self):
        self.restores += 1
        super().restore()


def test_bad_grid_rejected_before_any_change():
    gpu = CountingSim()
    with pytest.raises(UnsupportedSettingError, match="1985 MHz"):
        sweep(gpu, {None: preset("copy_2GiB")}, "copy", grid="sm_clock_mhz=1980,1985", progress=None)
    assert gpu._set_calls == [] and gpu.time_s() == 0.0
    fake = make_fake_pynvml(FakeGPU())
    dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
    with pytest.raises(UnsupportedSettingError, match="800 W"):
        sweep(dev, {None: lambda: fake.busy(0.002, 500)}, "w", grid="power_limit_w=700,800", progress=None)
    assert fake.gpu.setter_calls == []


def test_read_only_grid_varying_clocks_is_refused():
    gpu = SimulatedGPU(read_only=True)
    with pytest.raises(ReadOnlyError, match="sm_clock_mhz"):
        sweep(gpu, {None: preset("copy_2GiB")}, "copy", grid="sm_clock_mhz=1500", progress=None)
    res = sweep(gpu, {None: preset("gemm_bf16_8192")}, "gemm", grid="sm_count=32,132", protocol=FAST,
                progress=None)
    assert [s.omega.sm_count for s in res.signatures] == [32, 132]
    assert res.signatures[0].time_s > 3 * res.signatures[1].time_s


def _nvml_dev():
    fake = make_fake_pynvml(FakeGPU())
    dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)

    def work():
        fake.busy(0.003, 400.0)

    return dev, fake, work


def test_exception_mid_sweep_restores_original_settings():
    dev, fake, work = _nvml_dev()
    calls = []

    def boom(p):
        calls.append(p)
        if len(calls) == 2:
            raise RuntimeError("injected")

    with pytest.raises(RuntimeError, match="injected"):
        sweep(dev, {None: work}, "w", grid="sm_clock_mhz=1500,1200,power_limit_w=500", protocol=FAST,
              progress=boom)
    assert fake.gpu.locked_sm is None and fake.gpu.locked_mem is None
    assert fake.gpu.limit_mw == 700_000
    names = [c[0] for c in fake.gpu.setter_calls]
    assert "nvmlDeviceSetGpuLockedClocks" in names and "nvmlDeviceResetGpuLockedClocks" in names


def test_sigint_mid_sweep_restores_and_raises_keyboardinterrupt():
    dev, fake, work = _nvml_dev()
    seen = []

    def interrupt(p):
        seen.append(p)
        if len(seen) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        sweep(dev, {None: work}, "w", grid="sm_clock_mhz=1500,1200,power_limit_w=450", protocol=FAST,
              progress=interrupt)
    assert fake.gpu.locked_sm is None and fake.gpu.limit_mw == 700_000
    assert signal.getsignal(signal.SIGINT) is before     # handler put back


def test_sigterm_chains_to_previous_handler_after_restoring():
    gpu = CountingSim()

    class Terminated(Exception):
        pass

    def prev(signum, frame):
        raise Terminated

    old = signal.signal(signal.SIGTERM, prev)
    try:
        with pytest.raises(Terminated):
            sweep(gpu, {None: preset("copy_2GiB")}, "copy", grid="sm_clock_mhz=1500,1200", protocol=FAST,
                  progress=lambda p: os.kill(os.getpid(), signal.SIGTERM))
        assert gpu.restores >= 1 and gpu.get_operating_point() == gpu.operating_set().default
        assert signal.getsignal(signal.SIGTERM) is prev
    finally:
        signal.signal(signal.SIGTERM, old)


def test_resume_after_kill_loses_and_repeats_nothing(tmp_path):
    path = tmp_path / "sweep.jsonl"
    grid = "sm_clock_mhz=1980:1500:-120,power_limit_w=700,450"
    k = preset("gemm_bf16_8192")

    class Kill(BaseException):
        pass

    done = []

    def killer(p):
        done.append(p)
        if len(done) == 4:
            raise Kill

    with pytest.raises(Kill):
        sweep(SimulatedGPU(seed=1), {None: k}, "gemm", grid=grid, protocol=FAST, results_path=str(path),
              progress=killer)
    first = [json.loads(x) for x in path.read_text().splitlines()]
    measured_first = [r["key"] for r in first if r["kind"] == "point"]
    assert len(measured_first) == 4
    # a kill during a write leaves a partial last line: tolerated, and that point re-measured
    with open(path, "a") as fh:
        fh.write('{"kind": "point", "key": "[\\"gemm\\", nu')
    events = []
    res = sweep(SimulatedGPU(seed=1), {None: k}, "gemm", grid=grid, protocol=FAST, results_path=str(path),
                progress=events.append)
    assert res.resumed == 4 and res.measured == 6 and len(res.signatures) == 10
    assert res.meta["dropped_partial_line"] is True
    assert [e.measured for e in events] == [False] * 4 + [True] * 6
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    keys = [r["key"] for r in recs if r["kind"] == "point"]
    assert len(keys) == len(set(keys)) == 10 and keys[:4] == measured_first
    # a third run measures nothing
    again = sweep(SimulatedGPU(seed=1), {None: k}, "gemm", grid=grid, protocol=FAST, results_path=str(path),
                  progress=None)
    assert again.measured == 0 and again.resumed == 10
    assert [s.key for s in again.signatures] == [s.key for s in res.signatures]
    assert {s.name for s in again.signatures} == {"gemm"}


def test_corrupt_middle_line_is_an_error_naming_file_and_line(tmp_path):
    from frontier.errors import FormatError

    path = tmp_path / "r.jsonl"
    path.write_text('{"kind": "header"}\nnot json\n{"kind": "header"}\n')
    with pytest.raises(FormatError, match="line 2"):
        sweep(SimulatedGPU(), {None: preset("copy_2GiB")}, "copy", results_path=str(path), progress=None)


def test_early_stop_after_k_rising_energies():
    # at low clocks the GEMM's static energy grows faster than dynamic energy falls
    res = sweep(SimulatedGPU(), {None: preset("gemm_bf16_8192")}, "gemm",
                grid="sm_clock_mhz=1200:345:-45", protocol=FAST, progress=None, early_stop_k=2)
    assert res.skipped, "energy should rise at the lowest clocks"
    es = [s.energy_j for s in res.signatures]
    assert es[-1] > es[-2] > es[-3]
    assert len(res.signatures) + len(res.skipped) == len(parse_grid("sm_clock_mhz=1200:345:-45"))


def test_characterize_kappa_grid_frontier_and_progress(capsys):
    works = {"flash": preset("attention_flash"), "efficient": preset("attention_efficient"),
             "cudnn": preset("attention_cudnn")}
    # the library shows no progress by itself: the caller passes a reporter (here: its lines)
    res = characterize(works, grid="sm_clock_mhz=1980,1500,1095", name="attention", protocol=FAST,
                       progress=lambda e: print(e.line(), file=sys.stderr))
    assert len(res.signatures) == 9 and res.simulated and res.element == "attention"
    assert {s.kappa for s in res.signatures} == set(works)
    front = res.frontier_signatures()
    assert 1 <= len(front) < 9 and all(s.kappa != "efficient" for s in front)
    err = capsys.readouterr().err
    assert "[9/9]" in err and "eta" in err
    d = res.to_dict()
    assert d["simulated"] is True and d["device"] == "simulated H200" and len(d["signatures"]) == 9


def test_characterize_small_pipeline_grid_is_quick(tmp_path):
    import time

    t = time.monotonic()
    sigs = []
    for name in ("stage_forward", "stage_backward", "p2p_send"):
        r = characterize(preset(name), grid="sm_clock_mhz=1980:1080:-180,power_limit_w=700,400,sm_count=16,132",
                         progress=None)
        sigs += r.signatures
    assert time.monotonic() - t < 10
    assert len(sigs) == 3 * 6 * 2 * 2
    p2p = {s.omega.sm_count: s.time_s for s in sigs if s.name == "p2p_send" and s.omega.sm_clock_mhz == 1980
           and s.omega.power_limit_w == 700}
    assert p2p[16] == pytest.approx(p2p[132], rel=0.1)     # a few SMs saturate the link
    path = r.save(tmp_path / "p2p.json")
    assert path.exists()


def test_characterize_restores_device():
    gpu = SimulatedGPU()
    characterize(preset("copy_2GiB"), device=gpu, grid="sm_clock_mhz=1500,power_limit_w=300", protocol=FAST,
                 progress=None)
    assert gpu.get_operating_point() == gpu.operating_set().default


def test_result_table_marks_frontier_and_simulation():
    res = characterize(preset("stage_forward"), grid="sm_clock_mhz=1980,1440,1080", protocol=FAST, progress=None)
    text = res.to_table()
    assert "[SIMULATED]" in text and "simulated H200" in text and text.count("\n*") >= 1
    keys = res.keyed()
    assert len(keys) == 3 and all(k.startswith("stage_forward@fused forward@") for k in keys)


def test_measure_never_imports_solvers():
    import ast
    from pathlib import Path

    import measure

    for f in Path(measure.__file__).parent.glob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(m == "solvers" or m.startswith("solvers.") for m in mods), f.name


def test_ready_power_reuse_only_at_one_omega_dev():
    gpu = SimulatedGPU(read_only=True)
    res = sweep(gpu, {None: preset("copy_2GiB")}, "copy", grid="sm_count=32,132", protocol=FAST,
                progress=None, ready_power_w=111.0)
    assert all(s.s_w == 111.0 for s in res.signatures)
    with pytest.raises(ValueError, match="one ω_dev"):
        sweep(SimulatedGPU(), {None: preset("copy_2GiB")}, "copy", grid="sm_clock_mhz=1500",
              progress=None, ready_power_w=111.0)


def test_resume_refuses_results_from_another_device(tmp_path):
    from measure.results_log import ResultsMismatchError

    path = tmp_path / "r.jsonl"
    sweep(SimulatedGPU(), {None: preset("copy_2GiB")}, "copy", protocol=FAST, results_path=str(path),
          progress=None)
    dev, fake, work = _nvml_dev()
    with pytest.raises(ResultsMismatchError, match="simulated H200"):
        sweep(dev, {None: work}, "copy", protocol=FAST, results_path=str(path), progress=None)


def test_a_runaway_grid_range_is_refused_before_listing():
    from measure.grid import GridError, parse_grid

    with pytest.raises(GridError, match="more than 10,000 values"):
        parse_grid("sm_clock_mhz=1:1e12:1")
    with pytest.raises(GridError, match="finite"):
        parse_grid("sm_clock_mhz=1:inf:1")
