"""Zeus interop: ZeusMonitor windows of any name, one element per window and GPU; power-limit
optimizer profiles; ``ecal export zeus-pfo`` in the form Zeus's PFO ``PointSolution`` reads.
Round trips run against the real ``zeus`` package where it imports without a GPU."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

from ecal.cli import main
from frontier.errors import FormatError
from frontier.io import load_signatures
from measure import replay
from measure.replay import shared_data_dir
from measure.zeus import (
    from_measurements,
    load_zeus_monitor_log,
    load_zeus_plo_profile,
    pfo_frequencies,
    pfo_json,
    pfo_text,
)

LOG = """start_time,window_name,elapsed_time,gpu0_energy,gpu1_energy,gpu2_energy,gpu3_energy
10.0,train_step,0.50,150.0,160.0,155.0,158.0
11.0,train_step,0.52,152.0,161.0,156.0,159.0
12.0,__GlobalPowerLimitOptimizer_300,5.0,1500.0,1600.0,1550.0,1580.0
18.0,__GlobalPowerLimitOptimizer_250,5.5,1400.0,1450.0,1420.0,1440.0
24.0,eval,1.0,200.0,210.0,205.0,208.0
"""


def _zeus():
    return pytest.importorskip("zeus", reason="zeus is an optional extra: pip install 'energy-calculus[zeus]'")


def test_monitor_log_one_element_per_window_and_gpu(tmp_path):
    p = tmp_path / "job.csv"
    p.write_text(LOG)
    sigs = load_zeus_monitor_log(p)
    assert sorted(sigs) == sorted([f"{w}/gpu{i}" for w in ("train_step", "eval", "job")
                                   for i in range(4)])
    s = sigs["train_step/gpu1"]
    assert len(s) == 1 and s[0].n == 2 and s[0].devices == frozenset({"gpu1"})
    assert s[0].time_s == pytest.approx(0.51) and s[0].energy_j == pytest.approx(160.5)
    plo = sigs["job/gpu3"]
    assert [x.omega.power_limit_w for x in plo] == [250.0, 300.0]


def test_monitor_log_errors(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("start_time,window_name,elapsed_time\n1,a,1\n")
    with pytest.raises(FormatError, match="gpuN_energy"):
        load_zeus_monitor_log(p)
    p.write_text("start_time,window_name,elapsed_time,gpu0_energy\n1,a,1,5\n1,a,1,5\n")
    with pytest.raises(FormatError, match="line 3"):
        load_zeus_monitor_log(p)


def test_shared_profile_logs_import_per_gpu():
    d = shared_data_dir() / "zeus" / "profile_data"
    f = d / "A40+resnet18+gpu0,1,2,3.csv"
    if not f.exists():
        pytest.skip(f"shared Zeus data not here ({d})")
    sigs = load_zeus_monitor_log(f)
    assert sorted(sigs) == [f"A40+resnet18+gpu0,1,2,3/gpu{i}" for i in range(4)]
    summed = replay.load_zeus_profile(f)["A40+resnet18+gpu0,1,2,3"]
    per = {k: {s.omega.power_limit_w: s for s in v} for k, v in sigs.items()}
    for s in summed:                       # per-GPU energies add up to the old summed element
        tot = sum(per[k][s.omega.power_limit_w].energy_j for k in per)
        assert tot == pytest.approx(s.energy_j, rel=1e-9)


def test_plo_profile_json(tmp_path):
    p = tmp_path / "plo.json"
    p.write_text(json.dumps({"measurements": [{"power_limit": 300, "energy": 8000.0, "time": 40.0},
                                              {"power_limit": 200, "energy": 7000.0, "time": 48.0}]}))
    sigs = load_zeus_plo_profile(p, n_gpus=4, steps=40, static_power_w=20.0)
    (name, v), = sigs.items()
    assert name == "plo" and [s.omega.power_limit_w for s in v] == [200.0, 300.0]
    assert v[1].time_s == pytest.approx(1.0) and v[1].energy_j == pytest.approx(200.0)
    assert len(v[0].devices) == 4 and v[0].s_w == pytest.approx(80.0)
    p.write_text(json.dumps({"measurements": [{"power_limit": 300, "energy": -1, "time": 1}]}))
    with pytest.raises(FormatError, match=r"measurements\[0\].energy"):
        load_zeus_plo_profile(p)


def test_import_cli_kinds(tmp_path, capsys):
    log = tmp_path / "job.csv"
    log.write_text(LOG)
    assert main(["import", "zeus-monitor", str(log), "-o", str(tmp_path / "m.json")]) == 0
    keys = load_signatures(tmp_path / "m.json")
    assert any(k.startswith("train_step/gpu2") for k in keys)
    plo = tmp_path / "plo.json"
    plo.write_text(json.dumps({"measurements": [{"power_limit": 300, "energy": 80.0, "time": 4.0}]}))
    assert main(["import", "zeus-plo", str(plo), "-o", str(tmp_path / "p.json")]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["import", "zeus-plo", str(bad), "-o", str(tmp_path / "q.json")]) == 2
    assert not (tmp_path / "q.json").exists()


def _schedule(power_limit: bool = True) -> dict:
    def e(s, inst, m, f):
        d = {"task": f"s{s}/{inst}/{m}", "start_s": 0.0, "end_s": 0.0, "sm_clock_mhz": f}
        if power_limit:
            d["power_limit_w"] = 600.0
        return d

    return {"format": "ecal.schedule/1", "ranks": ["stage0", "stage1"], "devices": {
        "stage1": [e(1, "forward", 0, 1410.0), e(1, "backward", 0, 1980.0),
                   e(1, "forward", 1, 1410.0), e(1, "backward", 1, 1965.0)],
        "stage0": [e(0, "forward", 0, 1200.0), e(0, "forward", 1, 1200.0),
                   e(0, "backward", 0, 1980.0), e(0, "backward", 1, 1980.0)]}}


def test_pfo_frequencies_and_warnings():
    s = pfo_frequencies(_schedule())
    assert s.devices == ("stage0", "stage1")
    assert s.frequencies[0] == (("forward", 1200), ("forward", 1200), ("backward", 1980),
                                ("backward", 1980))
    assert any("power limits cannot be carried" in w for w in s.warnings)
    assert not pfo_frequencies(_schedule(power_limit=False)).warnings
    assert eval(pfo_text(s)) == [list(f) for f in s.frequencies]   # noqa: S307 - what Zeus does
    assert pfo_json(s)[1] == {"rank": 1, "frequencies": [["forward", 1410], ["backward", 1980],
                                                         ["forward", 1410], ["backward", 1965]]}
    bad = _schedule()
    bad["devices"]["stage0"][0]["task"] = "gemm"
    with pytest.raises(FormatError, match="not a pipeline task"):
        pfo_frequencies(bad)


def test_pfo_from_a_plan_file():
    plan = {"schema_version": "ecal.plan/1", "tasks": [
        {"name": "s0/backward/0", "device": "stage0", "start_s": 0.2, "sm_clock_mhz": 1980.0},
        {"name": "s0/forward/0", "device": "stage0", "start_s": 0.0, "sm_clock_mhz": 1095.0},
        {"name": "s1/forward/0", "device": "stage1", "start_s": 0.1, "sm_clock_mhz": None}]}
    s = pfo_frequencies(plan)
    assert s.frequencies == ((("forward", 1095), ("backward", 1980)), (("forward", 0),))
    assert any("no SM clock" in w for w in s.warnings)


def test_export_cli(tmp_path, capsys):
    sched = tmp_path / "schedule.json"
    sched.write_text(json.dumps(_schedule()))
    out = tmp_path / "freqs.py"
    assert main(["export", "zeus-pfo", str(sched), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: power limits cannot be carried" in err
    assert eval(out.read_text())[0][0] == ("forward", 1200)   # noqa: S307
    assert main(["export", "zeus-pfo", str(sched), "-o", str(tmp_path / "f.json"), "--json"]) == 0
    assert json.loads((tmp_path / "f.json").read_text())[0]["rank"] == 0
    assert main(["export", "zeus-pfo", str(sched), "-o", str(tmp_path / "f.txt")]) == 2
    plan = tmp_path / "notaplan.json"
    plan.write_text("{}")
    assert main(["export", "zeus-pfo", str(plan), "-o", str(tmp_path / "g.py")]) == 2
    assert not (tmp_path / "g.py").exists() and not (tmp_path / "f.txt").exists()


# -- against the real zeus package ---------------------------------------------------------

class _FakeZeusGPUs:
    """Zeus's GPU layer for ZeusMonitor without a GPU: an energy counter per GPU (mJ)."""

    def __init__(self, n: int, watts: list[float]):
        self.mj = [0.0] * n
        self.watts = watts

    def __len__(self) -> int:
        return len(self.mj)

    def supports_get_total_energy_consumption(self, index: int) -> bool:
        return True

    def get_total_energy_consumption(self, index: int) -> float:
        self.mj[index] += self.watts[index] * 1000.0     # 1 s of work between two reads
        return self.mj[index]


def test_real_zeus_monitor_log_and_measurements_round_trip(tmp_path, monkeypatch):
    _zeus()
    energy = importlib.import_module("zeus.monitor.energy")
    gpus = _FakeZeusGPUs(2, [300.0, 250.0])
    monkeypatch.setattr(energy, "get_gpus", lambda *a, **k: gpus)
    log = tmp_path / "zeus.csv"
    mon = energy.ZeusMonitor(gpu_indices=[0, 1], cpu_indices=[], log_file=str(log))
    got: dict[str, list] = {}
    for w in ("train_step", "train_step", "__GlobalPowerLimitOptimizer_275"):
        mon.begin_window(w, sync_execution=False)
        got.setdefault(w, []).append(mon.end_window(w, sync_execution=False))
    mon.log_file.close()
    from_log = load_zeus_monitor_log(log, plo_name="plo")
    from_obj = from_measurements(got, plo_name="plo")
    assert sorted(from_log) == sorted(from_obj) == ["plo/gpu0", "plo/gpu1", "train_step/gpu0",
                                                     "train_step/gpu1"]
    for k in from_log:
        a, b = from_log[k][0], from_obj[k][0]
        assert a.energy_j == pytest.approx(b.energy_j) and a.n == b.n and a.omega == b.omega
    assert from_obj["train_step/gpu0"][0].energy_j == pytest.approx(300.0)
    assert from_obj["plo/gpu1"][0].omega.power_limit_w == 275.0


def test_real_zeus_plo_profile_round_trip(tmp_path):
    _zeus()
    pl = importlib.import_module("zeus.optimizer.power_limit")
    doc = pl._PowerLimitMeasurementList(measurements=[
        pl.PowerLimitMeasurement(power_limit=300, energy=9000.0, time=40.0),
        pl.PowerLimitMeasurement(power_limit=175, energy=7500.0, time=52.0)]).json(indent=4)
    p = tmp_path / "profile.json"
    p.write_text(doc)
    (name, sigs), = load_zeus_plo_profile(p, steps=40).items()
    assert [s.omega.power_limit_w for s in sigs] == [175.0, 300.0]
    assert sigs[1].energy_j == pytest.approx(225.0) and sigs[1].time_s == pytest.approx(1.0)


_PFO: list = []


def _zeus_pfo_modules(monkeypatch=None):
    """Zeus's PFO schedule types and PointSolution. Where the package imports (torch there),
    as it is; else its ``common`` and ``server.scheduler`` modules are loaded under a bare
    package (its __init__ imports torch for the training-side optimizer), with a stand-in for
    ``aiofiles`` (server I/O) when that is absent. Loaded once per test process: pydantic
    refuses to define Zeus's settings class twice."""
    _zeus()
    pytest.importorskip("pandas", reason="zeus's PFO module needs pandas")
    if _PFO:
        return _PFO[0]
    name = "zeus.optimizer.pipeline_frequency"
    try:
        mods = (importlib.import_module(f"{name}.common"),
                importlib.import_module(f"{name}.server.scheduler"))
    except ImportError:
        import zeus.optimizer as zo

        d = Path(zo.__file__).parent / "pipeline_frequency"
        if not (d / "server" / "scheduler.py").exists():
            pytest.skip("this zeus has no pipeline_frequency/server/scheduler.py")
        for m in [m for m in sys.modules if m.startswith(name)]:
            del sys.modules[m]
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(d)]
        sys.modules[name] = pkg
        if importlib.util.find_spec("aiofiles") is None:
            sys.modules["aiofiles"] = types.ModuleType("aiofiles")
        mods = (importlib.import_module(f"{name}.common"),
                importlib.import_module(f"{name}.server.scheduler"))
    _PFO.append(mods)
    return mods


def test_real_zeus_point_solution_reads_the_export(tmp_path, monkeypatch, capsys):
    common, sched = _zeus_pfo_modules(monkeypatch)
    src = tmp_path / "schedule.json"
    src.write_text(json.dumps(_schedule()))
    out = tmp_path / "freqs.py"
    assert main(["export", "zeus-pfo", str(src), "-o", str(out)]) == 0
    expected = pfo_frequencies(_schedule()).frequencies
    job = common.JobInfo(pp_degree=2, dp_degree=1, tp_degree=1, world_size=2)
    ranks = [common.RankInfo(rank=r, dp_rank=0, pp_rank=r, tp_rank=0,
                             available_frequencies=[1980, 1410, 1200]) for r in range(2)]
    settings = common.PFOServerSettings(scheduler_args={"solution_path": str(out)})
    point = sched.PointSolution(job, ranks, settings, str(out))
    got = sorted(point.next_schedule(), key=lambda s: s.rank)
    assert [tuple(tuple(x) for x in s.frequencies) for s in got] == list(expected)
    # the JSON form parses as Zeus FrequencySchedule objects
    assert main(["export", "zeus-pfo", str(src), "-o", str(tmp_path / "f.json")]) == 0
    objs = [common.FrequencySchedule.parse_obj(o)
            for o in json.loads((tmp_path / "f.json").read_text())]
    assert [o.rank for o in objs] == [0, 1] and objs[1].frequencies[1] == ("backward", 1980)
    # 3D parallelism: PointSolution3D copies each stage's list to its DP ranks
    job3 = common.JobInfo(pp_degree=2, dp_degree=2, tp_degree=1, world_size=4)
    ranks3 = [common.RankInfo(rank=r, dp_rank=r // 2, pp_rank=r % 2, tp_rank=0,
                              available_frequencies=[1980]) for r in range(4)]
    p3 = sched.PointSolution3D(job3, ranks3, settings, str(out))
    assert [len(s.frequencies) for s in p3.next_schedule()] == [4, 4, 4, 4]


def test_real_zeus_pfo_profile_csv_reads_as_a_perseus_profile(tmp_path, monkeypatch):
    common, _ = _zeus_pfo_modules(monkeypatch)
    res = common.InstructionProfilingResult(__root__=[
        common.OfflineProfilingResult(rank=s, dp_rank=0, pp_rank=s, tp_rank=0,
                                      forward_time={1980: 0.010, 1410: 0.013},
                                      forward_energy={1980: 4.0, 1410: 3.2},
                                      backward_time={1980: 0.020, 1410: 0.026},
                                      backward_energy={1980: 8.0, 1410: 6.5})
        for s in range(2)])
    p = tmp_path / "profile.csv"
    res.to_csv(str(p))
    sigs = replay.load_perseus(p)
    assert sorted(sigs) == ["stage0/backward", "stage0/forward", "stage1/backward", "stage1/forward"]
    assert [s.omega.sm_clock_mhz for s in sigs["stage1/forward"]] == [1410.0, 1980.0]
