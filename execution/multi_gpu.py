"""Run a plan over several real GPUs: one worker process per GPU (``ecal run --device nvml:0,1,2,3``).

The plan's devices are mapped in order onto the GPU indices given (:func:`parse_gpu_list`).
Each GPU gets its own worker process (``multiprocessing``, spawn context: no CUDA or NVML
state is inherited), which

* opens its GPU through the device opener (:class:`NvmlOpener`: :class:`~measure.nvml.NVMLDevice`,
  which takes the GPU's lock and journals the card state before every setter), sets
  ``CUDA_VISIBLE_DEVICES`` to that GPU's UUID (so the user's factories, called next, build
  their model on it) and resolves its tasks' work (each element's factory called once, in
  that worker);
* runs inside :func:`measure.device.restoring`: the card is put back on a clean end, on an
  exception, on SIGINT/SIGTERM/SIGHUP/SIGQUIT and at exit; a SIGKILL leaves the journal, and
  the next open or ``ecal restore`` puts the card back;
* measures each step of the plan with the tick-aligned protocol on its own energy counter
  (:mod:`measure.protocol`), exactly as :func:`execution.run.run_plan` does per device on
  the simulator: ready power at the ω it ends a step in, warm-up steps, then measured steps.

**A step.** The parent sends every worker the step; all meet at a common start barrier; each
opens its counter window (its own next counter tick) and runs its tasks in the plan's
per-device order, each at its planned ω. A task whose predecessor is on another device waits
for that predecessor's completion message: the predecessor's worker puts ``(step, task,
end)`` into the inbox (a ``multiprocessing`` queue) of each device with a successor of it, the
end in seconds from its own step origin. On a real GPU this is where the user's communication
would be (a send/receive between pipeline stages, an all-reduce): the wait stands for it, and
the device idles at ready power meanwhile, as the plan's model assumes. Times are relative to
each device's own window start (its counter tick after the barrier), as on the simulator, so
windows on different GPUs open up to one counter period apart. After its last task each
worker reports its finish; the parent sends back the step's makespan (the latest finish), and
every device holds the step until it (ready power), then closes its window. The parent sums the
devices' window energies into the step's and repeats steps until the protocol's target
relative standard error, as :func:`~execution.run.run_plan` does.

Results are assembled by :func:`execution.run.execution_result`: the same
:class:`~execution.results.ExecutionResult` (Eq. 23 per device, with a Bonferroni correction
over the devices, and for the step) as a simulated run, with ``simulated`` false and the GPUs
used in ``meta["gpus"]``.

**Failures.** A worker that raises (its GPU locked by another process, the user's work
failing, a lost GPU) reports the error and restores its card; a worker that dies (SIGKILL) is
seen by its process sentinel. Either way the parent sets the common abort flag, breaks the
barrier and stops the other workers, which restore their cards and end; then it raises
:class:`GpuWorkerError` naming the GPU. SIGINT/SIGTERM on the parent stops the workers the same
way (a Ctrl-C on a terminal reaches every worker too: each restores its own card).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from frontier.errors import EnergyCalculusError
from frontier.operating_point import OperatingPoint
from measure.device import Device, restoring
from measure.protocol import Protocol, measure_ready_power_w, relative_se, wait_for_tick
from solvers.model import Problem
from solvers.plan import Plan

from .results import DeviceWindow, ExecutionResult, TaskRun
from .run import Measured, execution_result, merged_operating_point
from .work import ExecutionError

log = logging.getLogger(__name__)

__all__ = ["GpuWorkerError", "NvmlOpener", "parse_gpu_list", "run_plans_on_gpus", "nvml_opener"]

#: How long workers wait at the start barrier for the others (s): a worker stuck before it is
#: a worker that failed, and the parent then stops the run.
BARRIER_TIMEOUT_S = 600.0
#: How long a stopped worker gets to restore its card and end before it is sent SIGTERM (s).
STOP_TIMEOUT_S = 120.0
#: How often a worker waiting for another device checks the abort flag (s).
POLL_S = 0.2


class GpuWorkerError(EnergyCalculusError):
    """A GPU's worker failed (raised, or died) during a multi-GPU run; the other GPUs were
    stopped and restored. ``gpu`` is its ``nvml:INDEX``, ``device`` its plan device."""

    def __init__(self, gpu: str, device: str, what: str, died: bool = False):
        self.gpu, self.device, self.what, self.died = gpu, device, what, died
        left = (f"; its card may be left changed: ecal restore --device {gpu} puts it back from "
                "its journal" if died else "")
        super().__init__(f"GPU {gpu} (plan device {device}) failed: {what}; the other GPUs were "
                         f"stopped and restored{left}")


def parse_gpu_list(spec: str) -> tuple[int, ...] | None:
    """The GPU indices of ``nvml:I,J,...`` (``None`` for a spec naming one GPU or no NVML
    GPU). Refuses an index that is not an integer or repeats (:class:`ExecutionError`)."""
    kind, _, arg = spec.strip().lower().partition(":")
    if kind != "nvml" or "," not in arg:
        return None
    parts = [a.strip() for a in arg.split(",")]
    try:
        idx = tuple(int(a) for a in parts)
    except ValueError:
        raise ExecutionError(f"--device {spec}: expected nvml:INDEX,INDEX,... with integer "
                             "indices") from None
    if any(i < 0 for i in idx):
        raise ExecutionError(f"--device {spec}: GPU indices must be >= 0")
    dup = sorted({i for i in idx if idx.count(i) > 1})
    if dup:
        raise ExecutionError(f"--device {spec}: GPU index {dup[0]} is named twice (one plan "
                             "device per GPU)")
    return idx


def map_gpus(spec: str, indices: Sequence[int], devices: Sequence[str]) -> dict[str, int]:
    """Plan device → GPU index, in order; refuses a list whose length differs from the plan's
    device count (:class:`ExecutionError`)."""
    if len(indices) != len(devices):
        raise ExecutionError(f"--device {spec}: names {len(indices)} GPUs but the plan has "
                             f"{len(devices)} devices ({', '.join(devices)}); give one index per "
                             "plan device, in the plan's device order")
    return dict(zip(devices, (int(i) for i in indices)))


@dataclass(frozen=True)
class NvmlOpener:
    """Opens GPU ``index`` for a worker: a real GPU through NVML (picklable, as every opener
    must be: it travels to the worker process)."""

    def __call__(self, index: int) -> Device:
        from measure.nvml import NVMLDevice

        return NVMLDevice(index=index)


def nvml_opener() -> Callable[[int], Device]:
    """The opener a run uses when none is given (a seam: tests give one over a fake NVML)."""
    return NvmlOpener()


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
            t_end = gpu.time_s()
            if tick:
                t_b, e_b = wait_for_tick(gpu, proto.tick_timeout_s, proto.poll_s)
                tail = t_b - t_end
            else:
                e_b, tail = gpu.energy_j(), 0.0
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


def _worker_main(spec: WorkerSpec, conn: Connection, barrier: Any, inboxes: Mapping[str, Any],
                 abort: Any, parent_pid: int, elements: Sequence[str]) -> None:
    """A worker process's entry point (spawned): serve the parent until it stops us."""
    handler = logging.StreamHandler(sys.stderr)
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


# -- the parent ------------------------------------------------------------------------------

@dataclass
class _Handle:
    device: str
    gpu_index: int
    proc: Any
    conn: Connection
    name: str = ""
    uuid: str | None = None
    closed: bool = False

    @property
    def gpu(self) -> str:
        return f"nvml:{self.gpu_index}"


class _Pool:
    """The parent's side: the workers, their pipes, the barrier, the abort flag."""

    def __init__(self, gpus: Mapping[str, int], opener: Callable[[int], Device],
                 workload_ref: Any, workload_path: str, protocol: Protocol,
                 elements: Sequence[str]):
        ctx = multiprocessing.get_context("spawn")
        self.barrier = ctx.Barrier(len(gpus))
        self.abort = ctx.Event()
        self.inboxes = {d: ctx.Queue() for d in gpus}
        self.handles: list[_Handle] = []
        search_dir = os.getcwd()
        for d, i in gpus.items():
            ours, theirs = ctx.Pipe()
            spec = WorkerSpec(d, i, opener, workload_ref, workload_path, search_dir, protocol)
            p = ctx.Process(target=_worker_main, name=f"ecal-gpu-{i}",
                            args=(spec, theirs, self.barrier, self.inboxes, self.abort,
                                  os.getpid(), list(elements)))
            p.start()
            theirs.close()
            self.handles.append(_Handle(d, i, p, ours))

    def send(self, msg: tuple) -> None:
        for h in self.handles:
            h.conn.send(msg)

    def gather(self, kind: str) -> dict[str, tuple]:
        """One ``kind`` message from every worker; a worker's error or death raises
        :class:`GpuWorkerError` naming its GPU."""
        got: dict[str, tuple] = {}
        pending = {h.device: h for h in self.handles}
        while pending:
            objs: list[Any] = []
            for h in pending.values():
                objs += [h.conn, h.proc.sentinel]
            for obj in wait(objs):
                ready = next((h for h in pending.values() if obj in (h.conn, h.proc.sentinel)),
                             None)
                if ready is None:      # its pipe and its sentinel both woke us: done already
                    continue
                msg = self._read(ready)
                if msg[0] in ("error", "died"):
                    raise GpuWorkerError(ready.gpu, ready.device, msg[1], msg[0] == "died")
                if msg[0] != kind:
                    raise GpuWorkerError(ready.gpu, ready.device, f"unexpected message {msg[0]!r}")
                got[ready.device] = msg
                del pending[ready.device]
        return got

    def _read(self, h: _Handle) -> tuple:
        try:
            if h.conn.poll():
                return h.conn.recv()
        except (EOFError, OSError):
            pass
        h.proc.join(5.0)
        code = h.proc.exitcode
        how = (f"its worker was killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"its worker ended (exit status {code})")
        return ("died", how)

    def close(self, failed: bool) -> None:
        """Stop every worker (they restore their cards) and wait for them; on a failure or an
        interrupt the abort flag and the barrier stop those blocked mid-step."""
        if failed:
            self.abort.set()
            self.barrier.abort()
        for h in self.handles:
            try:
                h.conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for h in self.handles:
            h.proc.join(STOP_TIMEOUT_S)
            if h.proc.is_alive():     # SIGTERM: its restoring() handler puts the card back
                log.error("GPU %s's worker did not stop within %gs: sending SIGTERM", h.gpu,
                          STOP_TIMEOUT_S)
                h.proc.terminate()
                h.proc.join(STOP_TIMEOUT_S)
        for q in self.inboxes.values():
            q.close()
            q.join_thread()


def run_plans_on_gpus(plans: Sequence[Plan], problem: Problem, gpus: Mapping[str, int], *,
                      workload_ref: Any, workload_path: str, elements: Sequence[str],
                      protocol: Protocol = Protocol(), warmup_steps: int = 1, alpha: float = 0.05,
                      opener: Callable[[int], Device] | None = None) -> list[ExecutionResult]:
    """Run each of ``plans`` (made for ``problem``) on the GPUs ``gpus`` (plan device → GPU
    index), one after the other on the same workers, and hold each against Eq. 23 (module
    doc). ``workload_ref`` (a :class:`~execution.runnable.WorkloadRef`) and
    ``workload_path`` rebuild ``problem`` in each worker, whose ``elements`` (one per task, in
    problem order) name the work each task runs. ``opener`` opens a GPU by index in its worker
    (default :func:`nvml_opener`; it must be picklable). Raises :class:`GpuWorkerError` when a
    worker fails (the others restored)."""
    from .predict import chosen_options

    if warmup_steps < 0:
        raise ExecutionError(f"warmup_steps must be >= 0, got {warmup_steps!r}")
    names = list(problem.index.devices)
    missing = [d for d in names if d not in gpus]
    if missing:
        raise ExecutionError(f"no GPU given for plan device(s) {missing}")
    runs = [PlanRun(tuple(chosen_options(p, problem)), tuple(t.name for t in problem.tasks))
            for p in plans]
    pool = _Pool({d: gpus[d] for d in names}, opener or nvml_opener(), workload_ref,
                 workload_path, protocol, elements)
    failed = True
    try:
        opened = pool.gather("opened")
        results = []
        for run_id, (plan, run) in enumerate(zip(plans, runs)):
            m = _run_one(pool, run_id, run, problem, protocol, warmup_steps)
            kind = opened[names[0]][3] if names else "none"    # the model, e.g. NVIDIA H200
            gpus_meta = {d: {"gpu": f"nvml:{gpus[d]}", "name": opened[d][1], "uuid": opened[d][2]}
                         for d in names}
            results.append(execution_result(
                plan, problem, list(run.choice), m, protocol=protocol, warmup_steps=warmup_steps,
                alpha=alpha, seed=0, simulated=False, device_kind=kind,
                meta={"gpus": gpus_meta, "workers": "one process per GPU (execution.multi_gpu)"}))
        failed = False
        return results
    finally:
        pool.close(failed)


def _run_one(pool: _Pool, run_id: int, run: PlanRun, problem: Problem, protocol: Protocol,
             warmup_steps: int) -> Measured:
    """Ready power, warm-up steps, then measured steps until the target RSE, over the
    workers (as :func:`execution.run.run_plan` does on simulated devices)."""
    ix = problem.index
    names = list(ix.devices)
    # task runs listed per step in the plan's topological order, as the simulator lists them
    pos = {problem.tasks[v].name: j for j, v in enumerate(ix.order)}
    pool.send(("run", run_id, run, warmup_steps))
    ready = pool.gather("ready")
    ready_w = {d: float(ready[d][1]) for d in names}

    def step(k: int) -> tuple[dict[str, tuple], float, dict[str, float]]:
        pool.send(("step", k))
        fin = pool.gather("finish")
        finish = {d: float(fin[d][2]) for d in names}
        mk = max(finish.values(), default=0.0)
        pool.send(("hold", mk))
        return pool.gather("window" if k >= 0 else "held"), mk, finish

    for j in range(warmup_steps):
        step(-1 - j)
    tasks: list[TaskRun] = []
    windows: list[DeviceWindow] = []
    step_e: list[float] = []
    step_t: list[float] = []
    dev_e: dict[str, list[float]] = {d: [] for d in names}
    dev_t: dict[str, list[float]] = {d: [] for d in names}
    k = 0
    while k < protocol.max_windows:
        got, mk, finish = step(k)
        step_runs: list[TaskRun] = []
        total = 0.0
        for d in names:
            _, _, window, runs = got[d]
            windows.append(window)
            step_runs += runs
            dev_e[d].append(window.energy_j)
            dev_t[d].append(finish[d])
            total += window.energy_j
        tasks += sorted(step_runs, key=lambda r: pos[r.name])
        step_e.append(total)
        step_t.append(mk)
        k += 1
        if k >= protocol.min_windows and relative_se(step_e) <= protocol.target_rse:
            break
    pool.send(("end",))
    return Measured(ready_w, tasks, windows, step_e, step_t, dev_e, dev_t, k)
