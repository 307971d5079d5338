"""Co-runs on a real device (issue 30): ``NVMLDevice.run_parallel`` over the fake NVML and a
fake torch that rounds SM requests and overlaps separate green contexts as the hardware does;
joint characterization on an NVML device."""

from __future__ import annotations

import logging
import sys

import pytest

from measure import sm_alloc
from measure.corun import CoRunner
from measure.device import FeatureUnavailableError
from measure.joint import JointPair, characterize_pairs
from measure.protocol import Protocol
from tests.fake_pynvml import FakeGPU, install_fake_nvml, make_fake_pynvml
from tests.fake_torch import make_fake_driver, make_fake_torch
from tests.test_sm_granted import _isolated  # noqa: F401 - autouse: fresh state, no cuda-python

FAST = Protocol(window_s=0.2, warmup_s=0.02, min_windows=3, max_windows=3, ready_window_s=0.2,
                ready_windows=1)


def _device(monkeypatch, torch):
    monkeypatch.setitem(sys.modules, "torch", torch)
    fake = make_fake_pynvml(FakeGPU())
    cls = install_fake_nvml(monkeypatch, fake)
    return fake, cls(index=0, read_only=True, cuda_index=0)


def _recorder(torch, log, name, fake=None, seconds=0.001, watts=400.0):
    """A work that notes which SMs its stream holds (and, on the fake card, burns time)."""
    def work():
        log.append((name, torch.cuda.current_stream().sm_ids))
        if fake is not None:
            fake.busy(seconds, watts)
    work.__name__ = name
    return work


def test_disjoint_partitions_from_one_driver_split(monkeypatch):
    torch = make_fake_torch()
    drv = make_fake_driver()
    monkeypatch.setattr(sm_alloc, "cuda_driver", lambda: drv)
    _, dev = _device(monkeypatch, torch)
    seen: list = []
    dev.run_parallel([(_recorder(torch, seen, "a"), 2, 66), (_recorder(torch, seen, "b"), 1, 52)])
    split = dev.last_split
    dev.close()
    assert split.disjoint and split.granted == (72, 56)          # 66 runs as 72
    a = {frozenset(ids) for n, ids in seen if n == "a"}
    b = {frozenset(ids) for n, ids in seen if n == "b"}
    assert [n for n, _ in seen] == ["a", "a", "b"]
    (sa,), (sb,) = a, b
    assert len(sa) == 72 and len(sb) == 56 and not sa & sb
    # forked from one event recorded on the caller's stream, joined back into it
    kinds = [c[0] for c in torch.calls + drv.calls]   # driver streams note their own calls
    assert kinds.count("record") == 1 and kinds.count("wait_event") == 2
    assert kinds.count("wait_stream") == 2


def test_separate_contexts_are_labelled_overlapping(monkeypatch, caplog):
    torch = make_fake_torch()               # no driver split, no torch split: two contexts
    _, dev = _device(monkeypatch, torch)
    seen: list = []
    with caplog.at_level(logging.WARNING, logger="measure.corun"):
        dev.run_parallel([(_recorder(torch, seen, "a"), 1, 64), (_recorder(torch, seen, "b"), 1, 64)])
    split = dev.last_split
    dev.close()
    assert split.overlapping and "share SMs" in caplog.text
    (_, ids_a), (_, ids_b) = seen
    assert ids_a & ids_b                    # the fake carves both from SM 0, as torch does


def test_whole_device_streams_and_a_mixed_request(monkeypatch):
    torch = make_fake_torch()
    _, dev = _device(monkeypatch, torch)
    seen: list = []
    dev.run_parallel([(_recorder(torch, seen, "a"), 1, None), (_recorder(torch, seen, "b"), 1, None)])
    assert dev.last_split is None and all(len(ids) == 132 for _, ids in seen)
    with pytest.raises(FeatureUnavailableError, match="whole device"):
        dev.run_parallel([(_recorder(torch, seen, "a"), 1, None), (_recorder(torch, seen, "b"), 1, 64)])
    dev.close()


def test_streams_are_made_once_per_split():
    torch = make_fake_torch()
    made: list = []

    def split(counts, index, torch_, sm_total=None):
        made.append(tuple(counts))
        return sm_alloc.split_sms(counts, index, torch_, driver=make_fake_driver(),
                                  sm_total=sm_total)
    runner = CoRunner(torch, 0, 132, split=split)
    for _ in range(3):
        runner.launch([(lambda: None, 1, 64), (lambda: None, 1, 64)])
    assert made == [(64, 64)]


@pytest.mark.parametrize("branch, match", [
    ((lambda: None, 0, None), "k must be"), ((lambda: None, True, None), "k must be"),
    (("not callable", 1, None), "callable")])
def test_bad_branches_are_refused(branch, match):
    runner = CoRunner(make_fake_torch(), 0, 132)
    with pytest.raises((TypeError, ValueError), match=match):
        runner.launch([branch, (lambda: None, 1, None)])


def test_without_torch_a_co_run_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    fake = make_fake_pynvml(FakeGPU())
    dev = install_fake_nvml(monkeypatch, fake)(index=0, read_only=True, cuda_index=0)
    with pytest.raises(FeatureUnavailableError, match="torch"):
        dev.run_parallel([(lambda: None, 1, None), (lambda: None, 1, None)])
    dev.close()


def test_joint_characterization_on_an_nvml_device_records_the_partitions(monkeypatch):
    torch = make_fake_torch()
    monkeypatch.setattr(sm_alloc, "cuda_driver", make_fake_driver)
    fake, dev = _device(monkeypatch, torch)
    seen: list = []
    pair = JointPair("gemm", _recorder(torch, seen, "gemm", fake, 0.002, 600.0),
                     "copy", _recorder(torch, seen, "copy", fake, 0.001, 300.0),
                     splits=((96, 32),))
    table = characterize_pairs(dev, [pair], protocol=FAST, progress=None)
    dev.close()
    assert fake.gpu.setter_calls == []                  # read-only: nothing set
    (entry,) = table.entries
    joint = entry.signature.meta["joint"]
    assert joint["partitions"]["disjoint"] is True
    assert [p["granted"] for p in joint["partitions"]["partitions"]] == [96, 32]
    assert entry.signature.time_s > 0 and entry.signature.energy_j > 0
