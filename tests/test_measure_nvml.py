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
