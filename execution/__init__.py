"""execution: run a plan, measure it, hold it against its prediction, and the files around it.

The layer above ``solvers`` (plans) and ``measure`` (devices and protocols); neither imports
it, and ``ecal`` (the command line) is a thin shell over it.

* :mod:`execution.work` — what each task runs (:class:`TaskWork`, :class:`CallableWork`) and
  the work-table file (``ecal.work/1``); :mod:`execution.pipeline` — the 1F1B compute ∥ send
  work of ``ecal demo``.
* :mod:`execution.run` — :func:`run_plan`: execute a plan step after step on devices, measure
  it with the tick-aligned protocol, Eq. 23 per device and step (:mod:`execution.results`,
  per-device predictions from :mod:`execution.predict`).
* :mod:`execution.savings` — measured savings against baselines; :mod:`execution.baselines`
  — the all-max baseline and the baselines file.
* :mod:`execution.workload` — the workload file (``ecal.workload/1``) → a planning problem.
* :mod:`execution.schedule` — a plan → the schedule file (:mod:`measure.schedule`) a
  training loop applies.
* :mod:`execution.runnable` — plan files that name their workload, and running them;
  :mod:`execution.multi_gpu` — a multi-device plan on real GPUs, one worker process per GPU
  (``ecal run --device nvml:0,1,2,3``; the worker: :mod:`execution.gpu_worker`).
* :mod:`execution.localize` — trace a run's deviations and measure co-runs jointly.
"""

from .pipeline import pipeline_work
from .predict import DevicePrediction, predict_devices
from .results import Comparison, ExecutionResult, TaskRun
from .run import run_plan, simulated_devices
from .savings import PlanComparison, Savings, run_with_baselines, savings
from .work import (
    CallableWork,
    ExecutionError,
    TaskWork,
    WorkTable,
    load_work_table,
    save_work_table,
)

__all__ = [
    "run_plan", "simulated_devices", "run_with_baselines", "savings", "Savings", "PlanComparison",
    "ExecutionResult", "Comparison", "TaskRun", "DevicePrediction", "predict_devices",
    "TaskWork", "CallableWork", "WorkTable", "ExecutionError", "load_work_table",
    "save_work_table", "pipeline_work",
]
