"""One GPU's worker process of a multi-GPU run (:mod:`execution.multi_gpu`).

A worker opens its GPU (the picklable opener it was given), sets ``CUDA_VISIBLE_DEVICES`` to
that GPU's UUID, resolves its tasks' work (each element's factory called once, here), and then
serves the parent over its pipe: for each plan, the ready power at the ω its step ends in, then
steps (warm-up, then measured: a common start barrier, its own tick-aligned counter window, its
tasks in the plan's order, waiting for predecessors on other GPUs through its inbox, the hold to
the makespan the parent sends back). Everything runs inside :func:`measure.device.restoring`
and ends with ``close()``: the card is put back on a clean end, an error, a terminating signal,
a stop from the parent (another GPU failed), or the parent's death.

Messages (tuples, first item the kind) — parent → worker: ``("run", run_id, PlanRun,
warmup_steps)``, ``("step", k)`` (k < 0: a warm-up step), ``("hold", makespan_s)``,
``("end",)``, ``("stop",)``; worker → parent: ``("opened", name, uuid, model)``, ``("ready",
ready_power_w)``, ``("finish", k, finish_s)``, ``("held", k)``, ``("window", k, DeviceWindow,
[TaskRun])``, ``("error", text)``. Between workers: ``(run_id, k, task, end_s)`` into the
inbox of each device with a successor of that task.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from frontier.operating_point import OperatingPoint
from measure.device import Device, restoring
from measure.protocol import Protocol, close_window, measure_ready_power_w, wait_for_tick
from solvers.model import Problem

from .results import DeviceWindow, TaskRun
from .run import merged_operating_point
from .work import ExecutionError

__all__ = ["WorkerSpec", "PlanRun", "worker_main"]

#: How long workers wait at the start barrier for the others (s): a worker stuck before it is
#: a worker that failed, and the parent then stops the run.
BARRIER_TIMEOUT_S = 600.0
#: How often a worker waiting for another device (or the parent) checks the abort flag (s).
POLL_S = 0.2


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs (picklable): its plan device and GPU, how to open the GPU, the
    workload to rebuild the problem from (a :class:`~execution.runnable.WorkloadRef` and
    the file it points at), where the user's modules are, and the protocol."""

    device: str
    gpu_index: int
    opener: Callable[[int], Device]
    workload_ref: Any
    workload_path: str
    search_dir: str
    protocol: Protocol


@dataclass(frozen=True)
class PlanRun:
    """One plan to run on the workers: its chosen option per task (problem order)."""

    choice: tuple[int, ...]
    task_names: tuple[str, ...]


# -- the worker ------------------------------------------------------------------------------

class _Stopped(Exception):
    """The parent stopped this worker (another GPU failed, or the run was interrupted)."""


class _Worker:
    """One GPU's side of the run (in its own process; see the module doc)."""

    def __init__(self, spec: WorkerSpec, conn: Connection, barrier: Any, inboxes: Mapping[str, Any],
                 abort: Any, parent_pid: int, elements: Sequence[str]):
        self.spec, self.conn, self.barrier = spec, conn, barrier
        self.elements = list(elements)     # each task's element (problem order)
        self.inboxes, self.abort, self.parent_pid = inboxes, abort, parent_pid
        self.arrived: dict[tuple[int, int, int], float] = {}
        self.run_id = -1

    def recv(self) -> tuple:
        while not self.conn.poll(POLL_S):
            self._check_alive()
        msg = self.conn.recv()
        if msg[0] == "stop":
            raise _Stopped()
        return msg

    def _check_alive(self) -> None:
        if self.abort.is_set():
            raise _Stopped()
        if os.getppid() != self.parent_pid:
            raise _Stopped()      # the parent is gone: restore and end

    def serve(self) -> None:
        spec = self.spec
        gpu = spec.opener(spec.gpu_index)
        try:
            with restoring(gpu):
                uuid = getattr(gpu, "uuid", None)
                if uuid:    # the user's factories build their model on this GPU
                    os.environ["CUDA_VISIBLE_DEVICES"] = str(uuid)
                self.gpu = gpu
                wl = spec.workload_ref.load(spec.workload_path)
                self.problem: Problem = wl.problem
                self.works = self._load_works(wl)
                self.conn.send(("opened", gpu.name, uuid, getattr(gpu, "model", gpu.name)))
                while True:
                    try:
                        msg = self.recv()
                    except _Stopped:
                        break
                    if msg[0] == "run":
                        self.run_plan(msg[1], msg[2], msg[3])
        finally:
            gpu.close()

    def _load_works(self, wl: Any) -> dict[str, Any]:
        from measure.factory import load_work

        ix = self.problem.index
        mine = {self.elements[v] for v in ix.dev_seq.get(self.spec.device, [])}
        return {el: load_work(wl.works[el], device=self.gpu, search_dir=self.spec.search_dir).work
                for el in sorted(mine)}

    # -- one plan --------------------------------------------------------------------------
    def run_plan(self, run_id: int, run: PlanRun, warmup_steps: int) -> None:
        problem, d, gpu = self.problem, self.spec.device, self.gpu
        if tuple(t.name for t in problem.tasks) != run.task_names:
            raise ExecutionError(f"worker for {d}: the workload it loaded is not the plan's problem")
        self.run_id = run_id
        ix = problem.index
        ops = [problem.tasks[v].options[run.choice[v]].omega.dev for v in range(ix.n)]
        mine = [v for v in ix.order if ix.device[v] == d]
        self._set_op(ops[mine[-1]] if mine else None)
        ready_w = measure_ready_power_w(gpu, self.spec.protocol)
        self.conn.send(("ready", ready_w))
        steady = bool(problem.steady_state)
        proto = self.spec.protocol
        tick = proto.window == "tick_aligned"
        while True:
            msg = self.recv()
            if msg[0] == "end":
                return
            k = int(msg[1])
            measured = k >= 0
            if not steady and mine:
                self._set_op(ops[mine[0]])
            self.barrier.wait(BARRIER_TIMEOUT_S)
            if measured and tick:
                origin, e_a = wait_for_tick(gpu, proto.tick_timeout_s, proto.poll_s)
            else:
                e_a, origin = (gpu.energy_j() if measured else 0.0), gpu.time_s()
            runs, finish = self._step(k, mine, ops, run.choice, origin)
            self.conn.send(("finish", k, finish))
            _, mk = self.recv()
            left = mk - (gpu.time_s() - origin)
            if left > 0:
                gpu.idle(left)       # hold the step to the makespan at ready power
            if not measured:
                self.conn.send(("held", k))
                continue
            e_b, tail = close_window(gpu, proto, tick)
            e = (e_b - e_a) - ready_w * tail
            window = DeviceWindow(k, d, e_a, e_b, tail, ready_w, e, finish, mk, None)
            self.conn.send(("window", k, window, runs))

    def _set_op(self, op: OperatingPoint | None) -> float:
        """Set ω_dev when it differs from what is in force; the settle time paid (s)."""
        gpu = self.gpu
        cur = gpu.get_operating_point()
        if op is None or merged_operating_point(cur, op) == cur.dev:
            return 0.0
        t0 = gpu.time_s()
        gpu.set_operating_point(op)
        return gpu.time_s() - t0

    def _step(self, k: int, mine: list[int], ops: list[OperatingPoint], choice: Sequence[int],
              origin: float) -> tuple[list[TaskRun], float]:
        """This device's tasks of step ``k`` (times from ``origin``): its runs and finish."""
        problem, d, gpu = self.problem, self.spec.device, self.gpu
        ix = problem.index
        end: dict[int, float] = {}
        runs: list[TaskRun] = []
        for v in mine:
            switch = self._set_op(ops[v])
            ready = max((end[u] if ix.device[u] == d else self._wait_for(k, u)
                         for u in ix.preds[v]), default=0.0)
            wait_s = max(0.0, ready - (gpu.time_s() - origin))
            if wait_s > 0:
                gpu.idle(wait_s)
            start = gpu.time_s() - origin
            el = self.elements[v]
            gpu.run(self.works[el], 1)
            end[v] = gpu.time_s() - origin
            for dest in dict.fromkeys(ix.device[w] for w in ix.succs[v] if ix.device[w] != d):
                self.inboxes[dest].put((self.run_id, k, v, end[v]))
            t = problem.tasks[v]
            runs.append(TaskRun(k, t.name, d, int(choice[v]), t.options[choice[v]].label, el,
                                start, end[v], switch, wait_s, None))
        return runs, (end[mine[-1]] if mine else 0.0)

    def _wait_for(self, k: int, u: int) -> float:
        """The end of task ``u`` (another device's) in step ``k``: blocks until its worker's
        completion message arrives (module doc), checking the abort flag meanwhile."""
        key = (self.run_id, k, u)
        inbox = self.inboxes[self.spec.device]
        while key not in self.arrived:
            try:
                run_id, kk, uu, end = inbox.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive()
                continue
            self.arrived[(run_id, kk, uu)] = float(end)
        return self.arrived.pop(key)


def worker_main(spec: WorkerSpec, conn: Connection, barrier: Any, inboxes: Mapping[str, Any],
                 abort: Any, parent_pid: int, elements: Sequence[str]) -> None:
    """A worker process's entry point (spawned): serve the parent until it stops us."""
    handler = logging.StreamHandler()  # stderr: a spawned worker has no ecal front end of its own
    handler.setFormatter(logging.Formatter(f"ecal: nvml:{spec.gpu_index}: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("measure.nvml").setLevel(logging.INFO)
    for q in inboxes.values():    # what is left in a queue at the end is never needed
        q.cancel_join_thread()
    w = _Worker(spec, conn, barrier, inboxes, abort, parent_pid, elements)
    try:
        w.serve()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then the process ends
        if not isinstance(exc, _Stopped):
            try:
                conn.send(("error", _describe(exc)))
            except (OSError, ValueError):
                pass
        os._exit(1 if not isinstance(exc, _Stopped) else 0)


def _describe(exc: BaseException) -> str:
    from measure.factory import UserCodeError

    if isinstance(exc, UserCodeError) and exc.__cause__ is not None:
        c = exc.__cause__
        return f"{exc}: {type(c).__name__}: {_first_line(c)}"
    if isinstance(exc, threading.BrokenBarrierError):
        return "another GPU's worker did not reach the start barrier"
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
