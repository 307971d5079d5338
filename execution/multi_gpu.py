"""Run a plan over several real GPUs: one worker process per GPU (``ecal run --device nvml:0,1,2,3``).

The plan's devices are mapped in order onto the GPU indices given (:func:`parse_gpu_list`).
Each GPU gets its own worker process (``multiprocessing``, spawn context: no CUDA or NVML
state is inherited; :mod:`execution.gpu_worker`, which lists the messages), which

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
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from frontier.errors import EnergyCalculusError
from measure.device import Device
from measure.protocol import Protocol, relative_se
from solvers.model import Problem
from solvers.plan import Plan

from .gpu_worker import PlanRun, WorkerSpec, worker_main
from .results import DeviceWindow, ExecutionResult, TaskRun
from .run import Measured, execution_result
from .work import ExecutionError

log = logging.getLogger(__name__)

__all__ = ["GpuWorkerError", "NvmlOpener", "parse_gpu_list", "run_plans_on_gpus", "nvml_opener"]

#: How long a stopped worker gets to restore its card and end before it is sent SIGTERM (s).
STOP_TIMEOUT_S = 120.0


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
            p = ctx.Process(target=worker_main, name=f"ecal-gpu-{i}",
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
