"""Co-runs on a real GPU: several streams of work started together on one CUDA device.

What :meth:`measure.nvml.NVMLDevice.run_parallel` runs, so that joint characterization
(:mod:`measure.joint`), the interaction table and the simulator's co-run calibration work on a
GPU as they do on the simulated H200. A co-run is a list of ``(work, k, sm_count)``: each work
is a callable that enqueues its kernels on the current stream, run ``k`` times back to back on
its own stream; ``sm_count`` None runs on the whole device, a count on that many SMs.

How the streams are made:

* every branch on the whole device: plain CUDA streams (the kernels share the SMs as the
  hardware schedules them);
* every branch with an SM count: the partitions of **one split** of the device
  (:func:`measure.sm_alloc.split_sms`: the CUDA driver's split through cuda-python, or torch's
  ``GreenContext.split``), so they are disjoint; where only separate green contexts exist the
  partitions may share SMs, and the co-run is labelled ``overlapping``
  (:attr:`CoRunner.last_split`);
* a mix of both is refused: a branch on the whole device would share SMs with the others.

The branches are forked from the caller's current stream by one event and joined back into it,
so the co-run is ordered after what the caller enqueued before it and before what it enqueues
after; nothing here synchronizes (the device does, as after :meth:`~measure.device.Device.run`).
Splits are cached per tuple of SM counts: a characterization calls the same co-run many times.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from frontier.errors import InputError

from .device import FeatureUnavailableError
from .sm_alloc import SMSplit, split_sms

log = logging.getLogger(__name__)

#: One branch of a co-run: (work, times to run it, SMs or None for the whole device).
Branch = tuple[Callable[[], Any], int, int | None]


class CoRunner:
    """Starts co-runs on CUDA device ``device_index`` (``sm_total`` SMs) through ``torch``.

    ``last_split`` is the :class:`~measure.sm_alloc.SMSplit` the latest partitioned co-run
    used (None for whole-device streams): its ``disjoint``/``overlapping`` and granted counts
    are what a signature of that co-run must record.
    """

    def __init__(self, torch: Any, device_index: int, sm_total: int,
                 split: Callable[..., SMSplit] = split_sms) -> None:
        self._torch = torch
        self.device_index = int(device_index)
        self.sm_total = int(sm_total)
        self._split = split
        self._streams: dict[tuple[int | None, ...], tuple[list[Any], SMSplit | None]] = {}
        self.last_split: SMSplit | None = None

    def streams_for(self, sms: Sequence[int | None]) -> tuple[list[Any], SMSplit | None]:
        """The streams (one per branch) for SM counts ``sms``, made once and cached."""
        key = tuple(None if s is None or int(s) >= self.sm_total else int(s) for s in sms)
        if key in self._streams:
            return self._streams[key]
        torch = self._torch
        if all(s is None for s in key):
            made: tuple[list[Any], SMSplit | None] = (
                [torch.cuda.Stream(self.device_index) for _ in key], None)
        elif any(s is None for s in key):
            raise FeatureUnavailableError(
                f"co-run with SM counts {list(sms)}: a branch on the whole device would share "
                "SMs with the partitioned ones; give every branch a count, or none")
        else:
            split = self._split([int(s) for s in key if s is not None], self.device_index, torch,
                                sm_total=self.sm_total)
            if split.overlapping:
                log.warning("co-run on %s SMs: partitions may share SMs (%s)",
                            "+".join(str(s) for s in key), split.note or split.method)
            made = ([self._stream_of(p) for p in split.partitions], split)
        self._streams[key] = made
        return made

    def _stream_of(self, part: Any) -> Any:
        if part.stream is not None:
            return part.stream
        ctx = part.context
        ctx.set_context()           # a stream belongs to the context current at its creation
        try:
            return self._torch.cuda.Stream(self.device_index)
        finally:
            ctx.pop_context()

    def launch(self, branches: Sequence[Branch]) -> None:
        """Enqueue the co-run: fork every branch's stream from the current stream, run each
        branch's work ``k`` times on its stream, join them back. Does not synchronize."""
        branches = list(branches)
        if not branches:
            raise InputError("co-run: no branches")
        for i, (work, k, _) in enumerate(branches):
            if not callable(work):
                raise TypeError(f"co-run branch {i}: work must be callable, got "
                                f"{type(work).__name__}")
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise InputError(f"co-run branch {i}: k must be an integer >= 1, got {k!r}")
        torch = self._torch
        streams, split = self.streams_for([sm for _, _, sm in branches])
        self.last_split = split
        cur = torch.cuda.current_stream(self.device_index)
        start = torch.cuda.Event()
        start.record(cur)
        for (work, k, _), s in zip(branches, streams):
            s.wait_event(start)
            with torch.cuda.stream(s):
                for _ in range(k):
                    work()
        for s in streams:
            cur.wait_stream(s)
