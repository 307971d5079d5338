"""NVMLDevice against the strict fake pynvml (no GPU needed)."""

from __future__ import annotations

import inspect

import pytest

from frontier.errors import EnergyCalculusError
from frontier.operating_point import OperatingPoint
from measure import (
    NVMLDevice,
    PermissionDeniedError,
    Protocol,
    ReadOnlyError,
    UnsupportedSettingError,
    measure_point,
    open_device,
    restoring,
)
from measure.device import DeviceError
from tests.fake_pynvml import FakeGPU, make_fake_pynvml


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """Device locks and journals go to a fresh folder, not ~/.cache/energy-calculus."""
    monkeypatch.setenv("ECAL_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _dev(read_only=False, **gpu_kw):
    fake = make_fake_pynvml(FakeGPU(**gpu_kw))
    dev = NVMLDevice(nvml=fake, read_only=read_only, clock=fake.time, sleep=fake.sleep,
                     synchronize=lambda: None)
    return dev, fake


def test_fake_has_real_pynvml_signatures():
    real = pytest.importorskip("pynvml")
    fake = make_fake_pynvml()
    for name in fake.FUNCTIONS:
        want = list(inspect.signature(getattr(real, name)).parameters)
        got = list(inspect.signature(getattr(fake, name)).parameters)
        assert got == want, name
    with pytest.raises(TypeError):
        fake.nvmlDeviceSetGpuLockedClocks("h", 1000)     # missing maxGpuClockMHz
    e = fake.NVMLError(fake.NVML_ERROR_NO_PERMISSION)
    assert isinstance(e, fake.NVMLError) and e.value == fake.NVML_ERROR_NO_PERMISSION


def test_fake_counter_ticks_every_100ms():
    fake = make_fake_pynvml()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    v0 = fake.nvmlDeviceGetTotalEnergyConsumption(h)
    fake.sleep(0.05)
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) == v0
    fake.sleep(0.1)
    assert fake.nvmlDeviceGetTotalEnergyConsumption(h) > v0


def test_reads_units_and_operating_set():
    dev, fake = _dev()
    assert dev.energy_j() == pytest.approx(fake.gpu.counter_mj / 1000)
    ops = dev.operating_set()
    assert ops.mem_clocks_mhz == (3201.0, 2201.0)
    assert ops.supported_sm_clocks()[0] == 1980.0 and ops.supported_sm_clocks()[-1] == 345.0
    assert ops.power_limit_range_w == (200.0, 700.0) and ops.sm_count == 132 and ops.sm_granularity == 8
    assert dev.temperature_c() == 35 and dev.clocks_mhz() == {"sm": 1980.0, "mem": 3201.0}
    fake.gpu.event_reasons = 0x4 | 0x1
    assert set(dev.throttle_reasons()) == {"SwPowerCap", "GpuIdle"}
    assert dev.describe()["simulated"] is False and "H200" in dev.name


def test_setters_apply_in_mw_and_restore():
    dev, fake = _dev()
    dev.set_operating_point(OperatingPoint(sm_clock_mhz=1410, mem_clock_mhz=2201, power_limit_w=500))
    g = fake.gpu
    assert g.locked_sm == (1410, 1410) and g.locked_mem == (2201, 2201) and g.limit_mw == 500_000
    assert dev.get_operating_point() == OperatingPoint(1410, 2201, 500)
    dev.restore()
    assert g.locked_sm is None and g.locked_mem is None and g.limit_mw == 700_000


@pytest.mark.parametrize("op, match", [
    (OperatingPoint(sm_clock_mhz=1411), "1411 MHz is not supported"),
    (OperatingPoint(mem_clock_mhz=1000), "memory clock 1000"),
    (OperatingPoint(power_limit_w=900), r"900 W is outside .*\[200, 700\]"),
    (OperatingPoint(sm_count=200), "200 exceeds"),
])
def test_unsupported_values_rejected_before_any_change(op, match):
    dev, fake = _dev()
    with pytest.raises(UnsupportedSettingError, match=match):
        dev.set_operating_point(op)
    assert fake.gpu.setter_calls == []


def test_permission_error_names_call_error_and_remedy_and_rolls_back():
    dev, fake = _dev()
    fake.gpu.fail["nvmlDeviceSetGpuLockedClocks"] = fake.NVML_ERROR_NO_PERMISSION
    with pytest.raises(PermissionDeniedError) as ei:
        dev.set_operating_point(OperatingPoint(sm_clock_mhz=1410, power_limit_w=500))
    err = ei.value
    assert err.call == "nvmlDeviceSetGpuLockedClocks"
    assert "NoPermission" in err.nvml_error or "Permission" in err.nvml_error
    assert "root" in err.what_to_do and "nvidia-smi" in err.what_to_do
    assert "nvmlDeviceSetGpuLockedClocks" in str(err)
    assert isinstance(err, EnergyCalculusError)
    # the power limit set first was put back: no half-applied state
    assert fake.gpu.limit_mw == 700_000


def test_not_supported_maps_to_unsupported_setting():
    dev, fake = _dev()
    fake.gpu.fail["nvmlDeviceSetMemoryLockedClocks"] = fake.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(UnsupportedSettingError, match="nvmlDeviceSetMemoryLockedClocks"):
        dev.set_operating_point(OperatingPoint(mem_clock_mhz=2201))


def test_read_only_never_calls_setters():
    dev, fake = _dev(read_only=True)
    with pytest.raises(ReadOnlyError, match="read-only"):
        dev.set_operating_point(OperatingPoint(sm_clock_mhz=1410))
    dev.set_operating_point(OperatingPoint(sm_count=64))     # SM allocation is allowed
    dev.restore()
    assert fake.gpu.setter_calls == []


def test_missing_driver_is_a_clear_device_error():
    fake = make_fake_pynvml()
    fake.gpu.fail["nvmlInit"] = fake.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(DeviceError, match="--device sim"):
        NVMLDevice(nvml=fake)


def test_restoring_context_on_exception():
    dev, fake = _dev()
    with pytest.raises(RuntimeError):
        with restoring(dev):
            dev.set_operating_point(OperatingPoint(sm_clock_mhz=1200, power_limit_w=400))
            raise RuntimeError("boom")
    assert fake.gpu.locked_sm is None and fake.gpu.limit_mw == 700_000


def test_tick_aligned_point_on_fake_counter():
    dev, fake = _dev()

    def work():
        fake.busy(0.002, 600.0)     # 2 ms at 600 W

    sig = measure_point(dev, work, "fake", Protocol(warmup_s=0.05, min_windows=3, max_windows=5))
    assert sig.time_s == pytest.approx(0.002, rel=0.01)
    # a window starts on a tick and the tail is charged at ready power, so E is within a
    # fake-clock read (4 ms × power) over a 0.6 s window
    assert sig.energy_j == pytest.approx(1.2, rel=0.015)
    assert sig.s_w == pytest.approx(123.0, rel=0.01)


def test_open_device_strings():
    fake = make_fake_pynvml()
    assert open_device("sim").simulated and open_device("sim:h200", read_only=True).read_only
    d = open_device("nvml:0", read_only=True, nvml=fake)
    assert isinstance(d, NVMLDevice) and d.read_only
    with pytest.raises(DeviceError, match="unknown device"):
        open_device("tpu:0")
    with pytest.raises(DeviceError, match="integer"):
        open_device("nvml:x")


# -- identity, CUDA mapping, window readings, journal and lock on open ------------------------

def test_describe_has_uuid_and_driver(state_dir):
    dev, fake = _dev()
    d = dev.describe()
    assert d["uuid"] == fake.gpu.uuid and d["uuid"].startswith("GPU-")
    assert d["driver"] == "570.86.15" and d["device"] == dev.name
    dev.close()


class _Props:
    def __init__(self, uuid):
        self.uuid = uuid
        self.multi_processor_count = 132


class _FakeTorch:
    """torch.cuda as seen by a process with some GPUs visible (UUIDs without 'GPU-')."""

    def __init__(self, uuids):
        self.uuids, self.synced = list(uuids), []
        torch = self

        class cuda:  # noqa: N801 - mirrors torch.cuda
            is_available = staticmethod(lambda: True)
            device_count = staticmethod(lambda: len(torch.uuids))
            get_device_properties = staticmethod(lambda i: _Props(torch.uuids[i]))
            synchronize = staticmethod(lambda i=None: torch.synced.append(i))

        self.cuda = cuda


U = ["GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-1111-1111-1111-111111111111",
     "GPU-cccccccc-2222-2222-2222-222222222222"]


@pytest.mark.parametrize("visible, want", [
    (None, 2), ("2", 0), ("0,2", 1), ("2,0,1", 0), (" 1 , 2 ", 1), (U[2], 0), (f"{U[0]},{U[2]}", 1),
    ("GPU-cccc", 0), ("GPU-CCCCCCCC-2222", 0),
])
def test_cuda_index_from_cuda_visible_devices(visible, want):
    from measure import cuda_index_for

    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    no_torch = _FakeTorch([])
    no_torch.cuda.is_available = staticmethod(lambda: False)
    assert cuda_index_for(U[2], 2, torch=no_torch, environ=env) == want


@pytest.mark.parametrize("visible", ["0,1", "", "0,bogus,2", "MIG-xyz,2", "-1"])
def test_cuda_index_not_visible_is_a_clear_error(visible):
    from measure import cuda_index_for

    no_torch = _FakeTorch([])
    no_torch.cuda.is_available = staticmethod(lambda: False)
    with pytest.raises(DeviceError, match="not visible to CUDA"):
        cuda_index_for(U[2], 2, torch=no_torch, environ={"CUDA_VISIBLE_DEVICES": visible})


def test_cuda_index_by_torch_uuid():
    from measure import cuda_index_for

    torch = _FakeTorch([U[2][4:], U[0][4:]])        # torch prints UUIDs without "GPU-"
    assert cuda_index_for(U[2], 2, torch=torch, environ={}) == 0
    assert cuda_index_for(U[0], 0, torch=torch, environ={}) == 1
    with pytest.raises(DeviceError, match="not among the 2 CUDA devices"):
        cuda_index_for(U[1], 1, torch=torch, environ={})


def test_nvml_2_with_cuda_visible_devices_2_uses_cuda_0(state_dir, monkeypatch):
    import sys

    import measure.sm_alloc

    fake = make_fake_pynvml(gpus=[FakeGPU(uuid=u) for u in U])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    monkeypatch.setitem(sys.modules, "torch", None)         # no torch: CUDA_VISIBLE_DEVICES decides
    dev = NVMLDevice(index=2, nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=lambda: None)
    assert dev.uuid == U[2] and dev.cuda_index == 0
    seen = {}
    monkeypatch.setattr(measure.sm_alloc, "run_on_sms",
                        lambda work, n, num_sms, device_index=0, torch=None: seen.update(idx=device_index))
    dev.run(lambda: None, 1, sm_count=64)
    assert seen["idx"] == 0
    # with torch, synchronize and get_device_properties get the CUDA index found by UUID
    torch = _FakeTorch([U[2][4:]])
    monkeypatch.setitem(sys.modules, "torch", torch)
    dev2 = NVMLDevice(index=2, nvml=make_fake_pynvml(gpus=[FakeGPU(uuid=u) for u in U]),
                      read_only=True, sleep=lambda s: None)
    dev2.run(lambda: None)
    assert torch.synced == [0] and dev2.operating_set().sm_count == 132
    dev.close()
    dev2.close()


def test_run_and_read_reads_before_synchronizing(state_dir):
    order = []
    fake = make_fake_pynvml(FakeGPU())

    def sync():
        order.append("sync")
        fake.gpu.event_reasons = 0x1          # idle after the work finished

    dev = NVMLDevice(nvml=fake, clock=fake.time, sleep=fake.sleep, synchronize=sync)
    dev.set_operating_point(OperatingPoint(sm_clock_mhz=1410))

    def work():
        order.append("work")
        fake.gpu.event_reasons = 0x4          # power capped while it runs

    r = dev.run_and_read(work, 3)
    assert order == ["work", "work", "work", "sync"]
    assert r.throttle_reasons == ("SwPowerCap",) and r.sm_clock_mhz == 1410
    assert dev.reading().throttle_reasons == ("GpuIdle",)
    dev.close()
    assert fake.gpu.locked_sm is None


def test_journal_written_before_setter_and_cleared_after_restore(state_dir):
    from measure import journal as jr

    dev, fake = _dev(limit_mw=650_000)
    path = jr.path_for(fake.gpu.uuid)
    seen = []
    for nth in (1, 2):
        fake.after_call("nvmlDeviceSetPowerManagementLimit",
                        lambda: seen.append(jr.read_journal(path).entries["power_limit"].restore_mw),
                        nth=nth)
    dev.set_operating_point(OperatingPoint(power_limit_w=500))
    dev.set_operating_point(OperatingPoint(power_limit_w=450))
    assert seen == [650_000, 650_000]          # the value found before the first change
    assert dev.changed_settings == ("power_limit",)
    dev.restore()
    assert fake.gpu.limit_mw == 650_000 and not path.exists() and dev.changed_settings == ()
    dev.close()


def test_permission_denied_setter_leaves_no_journal(state_dir):
    from measure import journal as jr

    dev, fake = _dev()
    fake.gpu.fail["nvmlDeviceSetGpuLockedClocks"] = fake.NVML_ERROR_NO_PERMISSION
    with pytest.raises(PermissionDeniedError):
        dev.set_operating_point(OperatingPoint(sm_clock_mhz=1410))
    assert not jr.path_for(fake.gpu.uuid).exists()
    dev.restore()                               # nothing to restore: no reset call is made
    assert [c for c in fake.gpu.setter_calls if "Reset" in c[0]] == []
    dev.close()


def test_one_process_per_gpu_and_read_only_is_not_locked(state_dir):
    from measure import LockedError

    gpu = FakeGPU()
    fake = make_fake_pynvml(gpu)
    a = NVMLDevice(nvml=fake, sleep=fake.sleep)
    with pytest.raises(LockedError, match=f"process {__import__('os').getpid()}"):
        NVMLDevice(nvml=fake, sleep=fake.sleep)
    NVMLDevice(nvml=fake, read_only=True).close()
    a.close()
    NVMLDevice(nvml=fake, sleep=fake.sleep).close()      # released on close


def test_cmd_restore_nothing_to_do(state_dir, capsys):
    import argparse

    from ecal.recovery import cmd_restore

    fake = make_fake_pynvml()
    assert cmd_restore(argparse.Namespace(device=None, json=False), nvml=fake) == 0
    assert "nothing to restore" in capsys.readouterr().out
    assert cmd_restore(argparse.Namespace(device="nvml:0", json=True), nvml=fake) == 0
    assert '"restored": []' in capsys.readouterr().out
    with pytest.raises(DeviceError, match="nvml:INDEX"):
        cmd_restore(argparse.Namespace(device="sim", json=False), nvml=fake)


def test_cmd_restore_every_journal_on_two_gpus(state_dir, capsys):
    import argparse

    from ecal.recovery import cmd_restore
    from measure import journal as jr

    gpus = [FakeGPU(limit_mw=600_000), FakeGPU(limit_mw=650_000)]
    fake = make_fake_pynvml(gpus=gpus)
    for i, g in enumerate(gpus):               # as a killed run leaves them (without its lock)
        j = jr.DeviceJournal(g.uuid, i, g.name)
        j.record("power_limit", g.limit_mw, 400_000)
        j.record("gpu_locked_clocks", None, [1200, 1200])
        g.limit_mw, g.locked_sm = 400_000, (1200, 1200)
    assert cmd_restore(argparse.Namespace(device=None, json=False), nvml=fake) == 0
    out = capsys.readouterr().out
    assert all(g.uuid in out for g in gpus) and "power limit 600 W" in out and "650 W" in out
    assert [g.settings() for g in gpus] == [
        {"limit_mw": 600_000, "locked_sm": None, "locked_mem": None},
        {"limit_mw": 650_000, "locked_sm": None, "locked_mem": None}]
    assert jr.list_journals() == []
