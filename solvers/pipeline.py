"""Pipeline-parallel training iterations: the synchronous 1F1B schedule and Perseus profiles.

1F1B (PipeDream-Flush, as in Megatron-LM and Perseus): stage s runs ``min(S − s − 1, N)``
warm-up forwards, then alternates one forward and one backward, then drains the remaining
backwards. Dependencies: F(s, m) → F(s+1, m) (activations), B(s+1, m) → B(s, m) (gradients);
the per-stage order above is the same-device order. One device per stage (``stage{s}``).

Perseus profiles (CSV ``stage,instruction,frequency,time,energy``; seconds, joules) give per
(stage, instruction) the measured time and energy at each SM clock. Accounting choice, as in
Perseus: a GPU waiting on pipeline communication draws the **P2P-blocking power** (default 75 W),
so that power is each stage's idle power and every option's static power s, and the option's
dynamic energy is d = E − s·T. With idle power = s the per-task effective energy is d, exactly
Perseus' "energy − blocking power × time" cost, and the iteration energy at makespan M is
``S·P_block·M + Σ d``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .model import Option, Problem

INSTRUCTIONS = ("forward", "backward")


def stage_order(stage: int, n_stages: int, n_microbatches: int) -> list[tuple[str, int]]:
    """The 1F1B instruction order of one stage as (instruction, microbatch) pairs."""
    warm = min(n_stages - stage - 1, n_microbatches)
    out = [("forward", m) for m in range(warm)]
    for i in range(n_microbatches - warm):
        out.append(("forward", warm + i))
        out.append(("backward", i))
    out += [("backward", m) for m in range(n_microbatches - warm, n_microbatches)]
    return out


def task_name(stage: int, instruction: str, microbatch: int) -> str:
    """Name of a 1F1B task, e.g. ``s0/forward/3``."""
    return f"s{stage}/{instruction}/{microbatch}"


def one_f_one_b(n_stages: int, n_microbatches: int,
                options: Mapping[tuple[int, str], Sequence[Any]] | Callable[[int, str], Sequence[Any]],
                idle_power_w: float | Mapping[str, float] = 75.0, transitions: Any = None,
                name: str | None = None) -> Problem:
    """Build the 1F1B iteration DAG of ``n_stages`` × ``n_microbatches``.

    ``options`` gives the options of (stage, "forward"|"backward") (a mapping or a function);
    every microbatch of that pair shares them (and their measurement keys, so their errors are
    counted as shared). ``idle_power_w``: one number for every stage or per device.
    """
    if n_stages < 1 or n_microbatches < 1:
        raise ValueError(f"1F1B needs >= 1 stage and microbatch, got {n_stages} x {n_microbatches}")
    get = options if callable(options) else (lambda s, i: options[(s, i)])
    tasks = []
    for s in range(n_stages):
        dev = f"stage{s}"
        opts = {}
        for inst in INSTRUCTIONS:
            try:
                raw = list(get(s, inst))
            except KeyError:
                raise ValueError(f"1F1B: no options for stage {s} {inst}") from None
            opts[inst] = [o if isinstance(o, Option) else _keyed(o, s, inst, j) for j, o in enumerate(raw)]
        for inst, m in stage_order(s, n_stages, n_microbatches):
            tasks.append((task_name(s, inst, m), dev, opts[inst]))
    edges = []
    for s in range(n_stages - 1):
        for m in range(n_microbatches):
            edges.append((task_name(s, "forward", m), task_name(s + 1, "forward", m)))
            edges.append((task_name(s + 1, "backward", m), task_name(s, "backward", m)))
    if isinstance(idle_power_w, Mapping):
        idle = dict(idle_power_w)
    else:
        idle = {f"stage{s}": float(idle_power_w) for s in range(n_stages)}
    return Problem.build(tasks, edges, idle, transitions, name or f"1f1b-{n_stages}x{n_microbatches}")


def _keyed(o: Any, stage: int, inst: str, j: int) -> Any:
    """Give a plain option a measurement key shared by all microbatches of (stage, inst)."""
    if isinstance(o, Mapping) and "key" not in o:
        return {**o, "key": f"s{stage}/{inst}#{j}"}
    return o


def read_perseus_csv(path: str | os.PathLike, p2p_power_w: float = 75.0) -> dict[tuple[int, str], list[Option]]:
    """Options per (stage, instruction) from a Perseus profile CSV (see module docstring).

    Read strictly by :func:`solvers.io.read_perseus_profile` (BOM accepted; duplicate rows,
    binary files and bad numbers are one-line :class:`FormatError` naming file and line)."""
    from .io import read_perseus_profile  # lazy: solvers.io imports this module

    return read_perseus_profile(path, p2p_power_w)


def load_perseus_profile(path: str | os.PathLike, p2p_power_w: float = 75.0,
                         n_microbatches: int | None = None, transitions: Any = None) -> Problem:
    """A 1F1B Problem from a Perseus profile CSV. ``n_microbatches`` defaults to 2 × stages
    (the 4×8 layout of Perseus' examples)."""
    prof = read_perseus_csv(path, p2p_power_w)
    n_stages = 1 + max(s for s, _ in prof)
    n_mb = n_microbatches or 2 * n_stages
    name = f"{os.path.basename(str(path))}:1f1b-{n_stages}x{n_mb}"
    return one_f_one_b(n_stages, n_mb, prof, p2p_power_w, transitions, name)
