"""Several fake GPUs for multi-GPU runs (``execution.multi_gpu``): a picklable opener that each
worker process calls to open its card of a file-backed fake pynvml, and fake "kernels" a
user's module can run on the card its process opened.

The cards live in one state file (``tests.fake_pynvml`` with ``state_path``), each on its own
clock (``fake.card(i)``). A kernel's time scales as 1/f at the card's locked SM clock and its
power rises with f, held under the power limit by lowering f (what the hardware does), as in
tests/test_user_project.py. Each kernel call also sleeps ``FAKE_GPU_WALL_S`` of wall time and, when
``FAKE_GPU_LOG`` names a folder, appends ``{"gpu", "element", "wall_start", "wall_end",
"card_start", "card_end"}`` to ``gpu<I>.jsonl`` there, so a test can check the order of work
across processes on the system-wide monotonic clock.

Faults, by environment (inherited by the spawned workers): ``FAKE_GPU_KILL=I:N`` makes card
I's process SIGKILL itself inside its N-th kernel call made while the card's SM clock is
locked (changed); ``FAKE_GPU_RAISE=I:N`` makes that call raise ``RuntimeError``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from fake_pynvml import FakeGPU, make_fake_pynvml

F_MAX, STATIC_W, DYN_W = 1410.0, 60.0, 300.0

_current: list[Any] = [None, None]     # this process's (card clock namespace, index)


def a100(**kw: Any) -> FakeGPU:
    """An A100-like fake card (the model test_user_project.py characterizes)."""
    base = dict(name="NVIDIA A100-SXM4-40GB", sm_clocks=tuple(range(1410, 209, -15)),
                mem_clocks=(1215,), limit_range_mw=(100_000, 400_000), limit_mw=400_000,
                default_limit_mw=400_000, cores=108 * 64, arch=7)
    base.update(kw)
    return FakeGPU(**base)


def use_card(card: Any, index: int) -> None:
    """Make ``card`` (a ``fake.card(i)`` namespace) the one this process's kernels run on."""
    _current[0], _current[1] = card, int(index)


@dataclass(frozen=True)
class FakeOpener:
    """Opens card ``index`` of the file-backed fake at ``state_path`` as an ``NVMLDevice`` on
    that card's own clock (in a worker process) and makes it this process's card."""

    state_path: str

    def __call__(self, index: int) -> Any:
        from measure.nvml import NVMLDevice

        fake = make_fake_pynvml(state_path=self.state_path)
        card = fake.card(index)
        use_card(card, index)
        return NVMLDevice(index=index, nvml=fake, clock=card.time, sleep=card.sleep,
                          synchronize=lambda: None, setter_relay=None)


def clock_mhz(gpu: FakeGPU) -> float:
    """The SM clock the card runs a kernel at: the lock, lowered to hold the power limit."""
    f = float(gpu.locked_sm[1]) if gpu.locked_sm else F_MAX
    cap = gpu.limit_mw / 1000.0
    return min(f, F_MAX * max((cap - STATIC_W) / DYN_W, 1e-3) ** (1 / 2.5))


def _fault(var: str, index: int, calls: int) -> bool:
    spec = os.environ.get(var, "")
    if not spec:
        return False
    gpu, _, n = spec.partition(":")
    return int(gpu) == index and calls >= int(n)


class Stage:
    """One element's kernel on this process's card (``work_s`` at F_MAX)."""

    def __init__(self, element: str, work_s: float):
        self.element, self.work_s = element, work_s
        self.changed_calls = 0

    def run(self) -> None:
        card, index = _current
        if card is None:
            raise RuntimeError("no fake card opened in this process")
        g = card.gpu
        t0, w0 = card.time(), time.monotonic()
        if g.locked_sm is not None:
            self.changed_calls += 1
            if _fault("FAKE_GPU_KILL", index, self.changed_calls):
                os.kill(os.getpid(), signal.SIGKILL)
            if _fault("FAKE_GPU_RAISE", index, self.changed_calls):
                raise RuntimeError(f"out of memory on fake card {index}")
        f = clock_mhz(g)
        card.busy(self.work_s * F_MAX / f, STATIC_W + DYN_W * (f / F_MAX) ** 2.5)
        # wall time per call (FAKE_GPU_WALL_S, default none): long enough, work started
        # before its predecessor on another card ended shows in the log
        time.sleep(float(os.environ.get("FAKE_GPU_WALL_S", "0")))
        folder = os.environ.get("FAKE_GPU_LOG")
        if folder:
            with open(os.path.join(folder, f"gpu{index}.jsonl"), "a") as fh:
                fh.write(json.dumps({"gpu": index, "element": self.element, "wall_start": w0,
                                     "wall_end": time.monotonic(), "card_start": t0,
                                     "card_end": card.time()}) + "\n")
