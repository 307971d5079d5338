"""The 1F1B compute ∥ send pipeline on an H200: SM splits, the stage kernels, and the work
table whose options run compute beside a P2P send (what ``ecal demo`` plans and runs)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from measure.sim import PRESETS, SimKernel
from solvers.model import Problem

from .work import ExecutionError, TaskWork

#: SMs of an H200.
SM_TOTAL = 132
#: The H200 grants SMs in steps of this (a green-context request is rounded up).
SM_GRANULARITY = 8


def compute_sms(k: int) -> int:
    """SMs of the compute side beside a send on ``k`` SMs: the most the device grants (a
    multiple of :data:`SM_GRANULARITY`) that fits beside it. 132 − k is never one (132 is not
    a multiple of 8), and a request for it would run as more SMs than are left."""
    return (SM_TOTAL - int(k)) // SM_GRANULARITY * SM_GRANULARITY


def stage_kernels(stage_sizes: Sequence[float]) -> dict[tuple[int, str], SimKernel]:
    """The simulated kernels of each stage's forward and backward: the ``stage_forward`` /
    ``stage_backward`` presets scaled by the stage's relative size, named ``s{stage}_{inst}``."""
    out = {}
    for s, size in enumerate(stage_sizes):
        for inst in ("forward", "backward"):
            base = PRESETS[f"stage_{inst}"]
            out[(s, inst)] = dataclasses.replace(base, name=f"s{s}_{inst}",
                                                 flops=base.flops * size, bytes=base.bytes * size)
    return out


_PIPELINE_TASK = re.compile(r"^s(\d+)/(forward|backward)/(\d+)$")


def pipeline_work(problem: Problem, stage_kernels: Mapping[tuple[int, str], SimKernel],
                  send_kernel: SimKernel, sm_total: int = SM_TOTAL,
                  granularity: int = SM_GRANULARITY) -> dict[str, tuple[TaskWork, ...]]:
    """The work table of a 1F1B problem whose options are compute ⊕ send (``ecal demo``).

    Task ``s{stage}/{forward|backward}/{mb}`` with an option at ``omega.sm_count = k`` runs
    ``stage_kernels[(stage, inst)]`` on the most SMs the device grants beside the send (a
    multiple of ``granularity`` <= ``sm_total − k``; :func:`compute_sms`) in parallel
    with ``send_kernel`` on ``k`` SMs. For the demo: ``pipeline_work(problem,
    stage_kernels(cfg.stage_sizes), PRESETS["p2p_send"])``.
    """
    out: dict[str, tuple[TaskWork, ...]] = {}
    for t in problem.tasks:
        m = _PIPELINE_TASK.match(t.name)
        if m is None:
            raise ExecutionError(f"task {t.name!r} is not a 1F1B task (s<stage>/<forward|"
                                 "backward>/<microbatch>)")
        key = (int(m.group(1)), m.group(2))
        if key not in stage_kernels:
            raise ExecutionError(f"task {t.name!r}: no kernel for stage {key[0]} {key[1]}")
        works = []
        for j, o in enumerate(t.options):
            k = o.omega.sm_count
            if k is None or not 0 < k < sm_total:
                raise ExecutionError(f"task {t.name!r} option {j} ({o.label}): needs an SM split "
                                     f"0 < sm_count < {sm_total} for the send, got {k!r}")
            compute = (sm_total - k) // max(1, granularity) * max(1, granularity)
            works.append(TaskWork(((stage_kernels[key], compute), (send_kernel, k))))
        out[t.name] = tuple(works)
    return out
