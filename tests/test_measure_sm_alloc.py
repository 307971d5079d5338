"""SM allocation through green contexts: absent torch, fake torch modules of each API shape."""

from __future__ import annotations

import sys
import types

import pytest

from measure import FeatureUnavailableError
from measure.sm_alloc import allocate_sms, available, green_context_class, run_on_sms


def _fake_torch(kind: str, log: list):
    class GC:
        def __init__(self, num_sms=None):
            self.num_sms_req = num_sms
            granted = -(-num_sms // 8) * 8
            if kind != "no_readback":
                self.sm_count = granted

        def set_context(self):
            log.append(("set", self.num_sms_req))

        def pop_context(self):
            log.append(("pop", self.num_sms_req))

    if kind in ("positional", "no_readback"):
        def create(num_sms, device_id=0):
            log.append(("create", num_sms, device_id))
            return GC(num_sms)
        GC.create = staticmethod(create)
    elif kind == "keyword":
        def create(*, num_sms, device_id=0, workqueue_scope=None):
            log.append(("create", num_sms, device_id))
            return GC(num_sms)
        GC.create = staticmethod(create)
    torch = types.SimpleNamespace(__version__="2.x", cuda=types.SimpleNamespace(
        green_contexts=types.SimpleNamespace(GreenContext=GC)))
    return torch


def test_absent_torch_gives_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)   # import torch -> ImportError
    with pytest.raises(FeatureUnavailableError, match="torch is not installed"):
        run_on_sms(lambda: None, 1, 16)
    assert available() is False


def test_torch_without_green_contexts():
    old = types.SimpleNamespace(__version__="2.3", cuda=types.SimpleNamespace())
    with pytest.raises(FeatureUnavailableError, match="torch 2.3 is too old for CUDA green contexts.*torch >= 2.9 built with CUDA >= 12.8"):
        green_context_class(old)
    assert available(old) is False


@pytest.mark.parametrize("kind", ["positional", "keyword", "constructor", "no_readback"])
def test_fake_torch_api_shapes_and_granted_count(kind):
    log: list = []
    torch = _fake_torch(kind, log)
    calls = []
    granted = run_on_sms(lambda: calls.append(1), 3, 33, device_index=0, torch=torch)
    assert granted == 40 and len(calls) == 3           # Hopper rounds 33 up to 40
    assert ("set", 33) in log and ("pop", 33) in log
    assert log.index(("set", 33)) < log.index(("pop", 33))
    assert available(torch)


def test_context_popped_on_exception_and_bad_request():
    log: list = []
    torch = _fake_torch("positional", log)
    with pytest.raises(RuntimeError):
        with allocate_sms(16, torch=torch):
            raise RuntimeError("work failed")
    assert log[-1] == ("pop", 16)
    with pytest.raises(ValueError):
        allocate_sms(0, torch=torch)


def test_driver_failure_is_feature_unavailable():
    class GC:
        @staticmethod
        def create(num_sms, device_id=0):
            raise RuntimeError("CUDA driver too old")

    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(green_contexts=types.SimpleNamespace(GreenContext=GC)))
    with pytest.raises(FeatureUnavailableError, match="driver too old"):
        allocate_sms(16, torch=torch)
