"""Applying a plan: set each element's operating point around its execution.

>>> from measure.sim import SimulatedGPU, preset
>>> from frontier.operating_point import OperatingPoint
>>> gpu = SimulatedGPU()
>>> plan = {"gemm": OperatingPoint(sm_clock_mhz=1500), "copy": OperatingPoint(sm_clock_mhz=1980)}
>>> with PlanApplier(gpu, plan) as ap:
...     with ap.element("gemm"):
...         gpu.run(preset("gemm_bf16_8192"), 100)
...     with ap.element("copy"):
...         gpu.run(preset("copy_2GiB"), 100)
>>> ap.transitions, gpu.get_operating_point() == gpu.operating_set().default
(2, True)

In a training loop, build it from the ``schedule.json`` that ``ecal plan --schedule`` writes
(format ``ecal.schedule/1``, see :mod:`measure.schedule`)::

    applier = PlanApplier.from_schedule("schedule.json", rank=pp_rank, device="nvml:0")
    with applier:
        for step in range(steps):
            for instruction, mb in my_1f1b_order(pp_rank):
                with applier.element(task_name(pp_rank, instruction, mb)):
                    forward_or_backward(instruction, mb)

**Task names.** A pipeline schedule names its tasks ``s{stage}/{instruction}/{microbatch}``
(``s0/forward/3``, ``s2/backward/0``; zero-based), and an interleaved schedule
``s{stage}v{chunk}/{instruction}/{microbatch}`` (``s1v0/forward/2``), ``instruction`` being
``forward`` or ``backward``; :func:`task_name` builds them. Any other plan names its tasks as
its problem file does; :attr:`PlanApplier.omegas` lists them.

**What happens at** ``element(name)``. When the task's operating point differs from the one
in force, the hook (1) synchronizes (``synchronize``: by default ``torch.cuda.synchronize``
when torch sees a GPU, so the new clock does not land on the previous task's kernels still
queued — Zeus's pipeline-frequency optimizer does the same), then (2) hands only the knobs
that change (SM clock, memory clock, power limit; the SM allocation travels with each
element) to a single helper thread, which applies the switches in order through the device's
own (journalled, signal-shielded) setter. The training thread does not wait for NVML: the
new clock lands a little after the task starts, as with Zeus. An error in the helper thread
is raised on the training thread at the next ``element`` or on exit. A clean exit first lets
the helper apply what is still queued; on an exception or a terminating signal the queue is
dropped (a setter in flight finishes first). Either way the device is then restored (:func:`measure.device.restoring`). ``asynchronous=False`` applies switches
inline instead (the default on simulated devices, whose virtual clock is not thread-safe).

**Iterations and switches.** ``switches_made`` counts changes of ω_dev (device-wide knobs);
``switches_per_iteration`` lists them per completed iteration. An iteration ends at
:meth:`PlanApplier.step` or, automatically, when ``iteration_start`` (from a schedule: the
rank's first task) begins again; the last one closes on exit. The first iteration also holds
the switch away from the settings found on entry; from the second on, the counts equal the
schedule's ``device_info[...]["switches_per_iteration"]`` of a steady-state plan.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from frontier.errors import InputError, UnknownNameError
from frontier.operating_point import OperatingPoint

from .device import Device, restoring
from .protocol import measure_ready_power_w, wait_for_tick
from .schedule import RankSchedule, read_schedule

__all__ = ["PlanApplier", "ElementRun", "RankSchedule", "read_schedule", "task_name",
           "default_synchronize"]

_AUTO = "auto"


def task_name(stage: int, instruction: str, microbatch: int, chunk: int | None = None) -> str:
    """The schedule's name of a pipeline task: ``s{stage}/{instruction}/{microbatch}``, or
    ``s{stage}v{chunk}/...`` for virtual stage ``chunk`` of an interleaved schedule."""
    if instruction not in ("forward", "backward"):
        raise InputError(f"instruction must be 'forward' or 'backward', got {instruction!r}")
    head = f"s{int(stage)}" + (f"v{int(chunk)}" if chunk is not None else "")
    return f"{head}/{instruction}/{int(microbatch)}"


def default_synchronize() -> Callable[[], None] | None:
    """``torch.cuda.synchronize`` when torch is importable and sees a GPU, else ``None``."""
    try:
        import torch  # optional
    except ImportError:
        return None
    try:
        return torch.cuda.synchronize if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken CUDA setup: nothing to synchronize with
        return None


@dataclass(frozen=True)
class ElementRun:
    """One execution of an element under the plan: time, energy (counter delta; ``None``
    unless per-element energy was asked for — it costs counter reads), whether ω switched."""

    name: str
    omega: OperatingPoint
    time_s: float
    energy_j: float | None
    switched: bool


class _Switcher:
    """A single helper thread that applies operating points in order (one queue), so the
    training thread never waits on the device's setter. The first error is kept for the
    training thread; later switches are then skipped (the device's state is in doubt)."""

    def __init__(self, device: Device, lock: threading.RLock):
        self.device = device
        self.lock = lock
        self.error: BaseException | None = None
        self.closing = False
        self.applied = 0
        self._q: queue.SimpleQueue[OperatingPoint | None] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="ecal-plan-applier", daemon=True)
        self._thread.start()

    def submit(self, op: OperatingPoint) -> None:
        with self._count_lock:
            self._pending += 1
            self._idle.clear()
        self._q.put(op)

    def _loop(self) -> None:
        while True:
            op = self._q.get()
            if op is None:
                return
            try:
                with self.lock:
                    if not self.closing and self.error is None:
                        self.device.set_operating_point(op)
                        self.applied += 1
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self.error = exc
            finally:
                with self._count_lock:
                    self._pending -= 1
                    if self._pending == 0:
                        self._idle.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every submitted switch was applied (or skipped); False on timeout."""
        return self._idle.wait(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Skip what is still queued, let a setter in flight finish, end the thread (it ends
        by itself even when this wait is interrupted: the stop mark is queued first)."""
        self.closing = True
        self._q.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)


class _StopThenRestore:
    """What :func:`restoring` restores: stop the helper thread first (a setter in flight
    finishes, nothing queued runs after), then the device's own restore."""

    def __init__(self, applier: PlanApplier):
        self._applier = applier
        self.name = applier.device.name

    def restore(self) -> None:
        ap = self._applier
        if ap._switcher is not None:
            ap._switcher.closing = True
        with ap._device_lock:
            ap.device.restore()


class PlanApplier:
    """Apply ``omegas`` (element name → operating point) around each element's execution.

    Use as a context manager; inside, wrap each element's work in ``with applier.element(name)``.
    The device's operating point is changed only when the element's differs from the one in
    force, and only the knobs that differ are set (``transitions`` counts changes of ω_dev,
    ``setter_calls`` the device setter calls). The whole block is one tick-aligned energy
    window (``total_energy_j``, ``total_time_s``); the device is restored on exit.

    ``ready_power_w``: the ready power charged for the closing tick wait; when ``None`` it is
    calibrated on entry (seconds of device time). ``synchronize``: called before each switch
    (``"auto"``: :func:`default_synchronize`; ``None``: never). ``asynchronous``: switches go
    to a helper thread (default: on every device that is not simulated). ``iteration_start``:
    the element that begins an iteration (for ``switches_per_iteration``; see module doc).
    """

    def __init__(self, device: Device, omegas: Mapping[str, OperatingPoint],
                 ready_power_w: float | None = None, per_element_energy: bool = False, *,
                 synchronize: Callable[[], Any] | None | str = _AUTO,
                 asynchronous: bool | None = None, iteration_start: str | None = None):
        self.device = device
        self.omegas = dict(omegas)
        for name, op in self.omegas.items():
            device.operating_set().validate(op)   # reject a bad plan before any change
            if device.read_only and op.dev != OperatingPoint():
                from .device import ReadOnlyError

                raise ReadOnlyError(f"plan element {name!r} needs {op.dev.label()} but "
                                    f"{device.name} is read-only")
        if iteration_start is not None and iteration_start not in self.omegas:
            raise UnknownNameError(f"iteration_start {iteration_start!r} is not in the plan")
        self.ready_power_w = ready_power_w
        self.per_element_energy = per_element_energy
        self.synchronize: Callable[[], Any] | None = (
            default_synchronize() if synchronize == _AUTO else synchronize)  # type: ignore[assignment]
        self.asynchronous = (not device.simulated) if asynchronous is None else bool(asynchronous)
        self.iteration_start = iteration_start
        self.runs: list[ElementRun] = []
        self.transitions = 0
        self.setter_calls = 0
        self.switches_per_iteration: list[int] = []
        self.total_time_s: float | None = None
        self.total_energy_j: float | None = None
        self.schedule: RankSchedule | None = None
        self._current: OperatingPoint | None = None
        self._stack = contextlib.ExitStack()
        self._t0 = self._e0 = 0.0
        self._iter_switches = 0
        self._iter_elements = 0
        self._device_lock = threading.RLock()
        self._switcher: _Switcher | None = None
        self._owned_device = False

    @classmethod
    def from_schedule(cls, path: str | os.PathLike, rank: int | str = 0,
                      device: Device | str | None = None, *,
                      ready_power_w: float | None = None, nvml: Any = None,
                      **kwargs: Any) -> PlanApplier:
        """An applier for rank ``rank``'s tasks of the ``ecal.schedule/1`` file ``path``
        (:func:`read_schedule`), on ``device``: a :class:`Device`, a spec string (``"sim"``,
        ``"nvml:0"``; opened here and closed on exit) or ``None`` for ``nvml:$LOCAL_RANK``
        (0 when unset). The ready power is ``ready_power_w``, else the file's
        ``device_info[device]["ready_power_w"]``; only when neither is there is it
        calibrated on entry. ``iteration_start`` defaults to the rank's first task; other
        keyword arguments go to the constructor."""
        sched = read_schedule(path, rank)
        owned = not isinstance(device, Device)
        if owned:
            from .factory import open_device

            spec = device if device is not None else f"nvml:{int(os.environ.get('LOCAL_RANK', 0))}"
            dev = open_device(str(spec), nvml=nvml)
        else:
            dev = device  # type: ignore[assignment]
        kwargs.setdefault("iteration_start", sched.tasks[0])
        try:
            ap = cls(dev, sched.omegas, ready_power_w if ready_power_w is not None
                     else sched.ready_power_w, **kwargs)
        except BaseException:
            if owned:
                dev.close()
            raise
        ap.schedule = sched
        ap._owned_device = owned
        return ap

    # -- context ---------------------------------------------------------------------------
    def __enter__(self) -> PlanApplier:
        if self._owned_device:
            self._stack.callback(self.device.close)
        self._stack.enter_context(restoring(_StopThenRestore(self)))  # type: ignore[arg-type]
        try:
            if self.ready_power_w is None:
                self.ready_power_w = measure_ready_power_w(self.device)
            self._current = self.device.get_operating_point()
            self._t0, self._e0 = wait_for_tick(self.device)
            if self.asynchronous:
                self._switcher = _Switcher(self.device, self._device_lock)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        worker_error: BaseException | None = None
        sw = self._switcher
        try:
            try:
                if sw is not None and exc_type is None:
                    sw.wait()     # a clean exit applies what is queued (its errors show)
            finally:
                # Even when a (deferred) signal interrupts the wait: the thread must end.
                if sw is not None:
                    sw.stop()
                    worker_error = sw.error
            self._close_iteration()
            if exc_type is None and worker_error is None:
                t_end = self.device.time_s()
                # Back to the settings whose ready power was measured before waiting for the
                # closing tick: the tail is then charged at the right power.
                with self._device_lock:
                    self.device.restore()
                t_b, e_b = wait_for_tick(self.device)
                self.total_time_s = t_end - self._t0
                self.total_energy_j = (e_b - self._e0) - (self.ready_power_w or 0.0) * (t_b - t_end)
        finally:
            # restoring() sees the body's exception: a failed restore is noted on it, never
            # put in its place.
            self._stack.__exit__(exc_type, exc, tb)
        if worker_error is not None and worker_error is not exc:
            if exc is not None:
                from .device import _add_note

                _add_note(exc, f"the plan applier's helper thread also failed: "
                               f"{type(worker_error).__name__}: {worker_error}")
            else:
                raise worker_error

    # -- the hook ----------------------------------------------------------------------------
    def _raise_worker_error(self) -> None:
        sw = self._switcher
        if sw is not None and sw.error is not None:
            err = sw.error
            raise err

    @property
    def switches_made(self) -> int:
        """Changes of ω_dev made so far (the same as ``transitions``)."""
        return self.transitions

    def step(self) -> None:
        """Mark the end of an iteration: its switch count goes to ``switches_per_iteration``
        (nothing happens when no element ran since the last mark)."""
        self._close_iteration()

    def _close_iteration(self) -> None:
        if self._iter_elements:
            self.switches_per_iteration.append(self._iter_switches)
        self._iter_switches = self._iter_elements = 0

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every switch handed to the helper thread was applied (True), or until
        ``timeout_s`` passed (False); raises the helper's error. Immediate when inline."""
        ok = self._switcher.wait(timeout_s) if self._switcher is not None else True
        self._raise_worker_error()
        return ok

    @contextlib.contextmanager
    def element(self, name: str) -> Iterator[ElementRun | None]:
        """Run the body under element ``name``'s operating point (see module doc)."""
        self._raise_worker_error()
        if name not in self.omegas:
            raise UnknownNameError(f"element {name!r} is not in the plan; planned: "
                           f"{sorted(self.omegas)[:12]}{' ...' if len(self.omegas) > 12 else ''}")
        if name == self.iteration_start:
            self._close_iteration()
        op = self.omegas[name]
        switched = False
        cur = self._current or OperatingPoint()
        want = OperatingPoint(
            op.sm_clock_mhz if op.sm_clock_mhz is not None else cur.sm_clock_mhz,
            op.mem_clock_mhz if op.mem_clock_mhz is not None else cur.mem_clock_mhz,
            op.power_limit_w if op.power_limit_w is not None else cur.power_limit_w,
            op.sm_count)
        if want != cur:
            # Only the knobs that change; the SM allocation is per element and always given.
            delta = OperatingPoint(
                want.sm_clock_mhz if want.sm_clock_mhz != cur.sm_clock_mhz else None,
                want.mem_clock_mhz if want.mem_clock_mhz != cur.mem_clock_mhz else None,
                want.power_limit_w if want.power_limit_w != cur.power_limit_w else None,
                want.sm_count)
            switched = want.dev != cur.dev
            if switched and self.synchronize is not None:
                self.synchronize()        # the new clock must not land on queued kernels
            if self._switcher is not None:
                self._switcher.submit(delta)
            else:
                with self._device_lock:
                    self.device.set_operating_point(delta)
            self.setter_calls += 1
            self.transitions += int(switched)
            self._iter_switches += int(switched)
            self._current = want
        self._iter_elements += 1
        e0 = self.device.energy_j() if self.per_element_energy else None
        t0 = self.device.time_s()
        yield None
        t1 = self.device.time_s()
        e1 = self.device.energy_j() if self.per_element_energy else None
        self.runs.append(ElementRun(name, op, t1 - t0, None if e0 is None else e1 - e0, switched))

    def per_element(self) -> dict[str, dict[str, float]]:
        """Totals per element name: executions, time_s, energy_j (when measured)."""
        out: dict[str, dict[str, float]] = {}
        for r in self.runs:
            d = out.setdefault(r.name, {"executions": 0, "time_s": 0.0, "energy_j": 0.0})
            d["executions"] += 1
            d["time_s"] += r.time_s
            if r.energy_j is not None:
                d["energy_j"] += r.energy_j
        return out

