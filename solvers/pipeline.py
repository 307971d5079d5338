"""Pipeline-parallel training iterations: 1F1B, GPipe and interleaved 1F1B schedules, and
Perseus profiles.

Schedules (one device per pipeline rank, ``stage{s}``; the per-device order below is the
same-device order of the :class:`~solvers.model.Problem`):

- **1F1B** (PipeDream-Flush, as in Megatron-LM and Perseus): stage s runs
  ``min(S − s − 1, M)`` warm-up forwards, then alternates one forward and one backward, then
  drains the remaining backwards.
- **GPipe** (``torch.distributed.pipelining.ScheduleGPipe``): every stage runs all M forwards,
  then all M backwards, both in microbatch order 0 … M−1.
- **Interleaved 1F1B** (Megatron-LM's virtual pipeline stages,
  ``forward_backward_pipelining_with_interleaving``): the model is cut into S·v virtual stages
  and rank r holds chunks c = 0 … v−1, i.e. virtual stages c·S + r. Forwards walk a table of
  (microbatch, chunk) pairs made of groups of N consecutive microbatches (N =
  ``group_size``, Megatron's ``microbatch_group_size_per_vp_stage``, default S): each group runs
  on chunk 0, then chunk 1, … The k-th backward takes the k-th entry of the same table with the
  chunk mirrored (v − 1 − c). Rank r runs ``min(2·(S − r − 1) + (v − 1)·N, M·v)`` warm-up
  forwards, then forward k + warm-up followed by backward k, then the remaining backwards.
  Megatron's constraints apply: v ≥ 2, S ≤ N ≤ M and ``M mod N`` is 0 or ≥ S.

Dependencies are the data flow: a forward sends its activations to the next (virtual) stage,
F(j, m) → F(j+1, m), and a backward sends its gradients to the previous one,
B(j+1, m) → B(j, m); the last stage's backward follows its own forward on the same device.
Task names are ``s{stage}/{forward|backward}/{microbatch}``, and for interleaved 1F1B
``s{stage}v{chunk}/{forward|backward}/{microbatch}``.

Perseus profiles (CSV ``stage,instruction,frequency,time,energy``; seconds, joules) give per
(stage, instruction) the measured time and energy at each SM clock. Accounting choice, as in
Perseus: a GPU waiting on pipeline communication draws the **P2P-blocking power** (default 75 W),
so that power is each stage's idle power and every option's static power s, and the option's
dynamic energy is d = E − s·T. With idle power = s the per-task effective energy is d, exactly
Perseus' "energy − blocking power × time" cost, and the iteration energy at makespan M is
``S·P_block·M + Σ d``.

Every builder takes ``steady_state``: the step repeats, so each device's switch from its last
task back to its first is charged (passed to :meth:`Problem.build` when the model has it).

Every builder also takes ``max_tasks`` (default
:data:`solvers.options.DEFAULT_MAX_TASKS`; None: no limit): the number of tasks
(:func:`pipeline_task_count`, arithmetic on the shape) is checked before any task is made, so
``--microbatches 10000000`` is one line (:class:`~solvers.model.ProblemTooLargeError`), not a
MemoryError.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from frontier.errors import InputError

from .limits import check_options, check_tasks
from .model import Option, Problem
from .options import DEFAULT_MAX_TASKS

INSTRUCTIONS = ("forward", "backward")
#: The schedules :func:`pipeline` builds.
SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")


def stage_order(stage: int, n_stages: int, n_microbatches: int) -> list[tuple[str, int]]:
    """The 1F1B instruction order of one stage as (instruction, microbatch) pairs."""
    warm = min(n_stages - stage - 1, n_microbatches)
    out = [("forward", m) for m in range(warm)]
    for i in range(n_microbatches - warm):
        out.append(("forward", warm + i))
        out.append(("backward", i))
    out += [("backward", m) for m in range(n_microbatches - warm, n_microbatches)]
    return out


def gpipe_order(stage: int, n_stages: int, n_microbatches: int) -> list[tuple[str, int]]:
    """The GPipe order of one stage: every forward, then every backward, in microbatch order
    (the same on every stage; ``stage`` and ``n_stages`` are checked only)."""
    _check_shape(n_stages, n_microbatches, stage)
    return [("forward", m) for m in range(n_microbatches)] + [("backward", m) for m in range(n_microbatches)]


def interleaved_table(n_microbatches: int, n_chunks: int, group_size: int) -> list[tuple[int, int]]:
    """Megatron-LM's schedule table: the (microbatch, chunk) of each forward slot. Groups of
    ``group_size`` consecutive microbatches run through chunk 0, then chunk 1, …; the last
    group takes whatever microbatches are left."""
    out: list[tuple[int, int]] = []
    for lo in range(0, n_microbatches, group_size):
        hi = min(lo + group_size, n_microbatches)
        out += [(m, c) for c in range(n_chunks) for m in range(lo, hi)]
    return out


def check_interleaved(n_stages: int, n_microbatches: int, n_chunks: int,
                      group_size: int | None = None) -> int:
    """Validate an interleaved 1F1B shape as Megatron-LM does; returns the group size N.
    Raises ValueError with a one-line reason."""
    _check_shape(n_stages, n_microbatches)
    if isinstance(n_chunks, bool) or not isinstance(n_chunks, int) or n_chunks < 2:
        raise InputError(f"interleaved 1F1B needs >= 2 chunks per stage, got {n_chunks!r} "
                         "(one chunk is plain 1F1B)")
    n = n_stages if group_size is None else group_size
    if isinstance(n, bool) or not isinstance(n, int) or not n_stages <= n <= n_microbatches:
        raise InputError(f"interleaved 1F1B: group size {n!r} must be an integer in "
                         f"[stages={n_stages}, microbatches={n_microbatches}]")
    rest = n_microbatches % n
    if 0 < rest < n_stages:
        raise InputError(f"interleaved 1F1B: microbatches mod group size = {rest} must be 0 or "
                         f">= stages ({n_stages}); the last group would wait on dependencies")
    return n


def interleaved_order(stage: int, n_stages: int, n_microbatches: int, n_chunks: int,
                      group_size: int | None = None) -> list[tuple[str, int, int]]:
    """The interleaved 1F1B order of one rank as (instruction, chunk, microbatch) triples
    (Megatron-LM's order; see the module docstring)."""
    n = check_interleaved(n_stages, n_microbatches, n_chunks, group_size)
    _check_shape(n_stages, n_microbatches, stage)
    table = interleaved_table(n_microbatches, n_chunks, n)
    total = len(table)
    warm = min(2 * (n_stages - stage - 1) + (n_chunks - 1) * n, total)

    def fwd(k: int) -> tuple[str, int, int]:
        m, c = table[k]
        return ("forward", c, m)

    def bwd(k: int) -> tuple[str, int, int]:
        m, c = table[k]
        return ("backward", n_chunks - 1 - c, m)

    out = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        out.append(fwd(k + warm))
        out.append(bwd(k))
    out += [bwd(k) for k in range(total - warm, total)]
    return out


def task_name(stage: int, instruction: str, microbatch: int, chunk: int | None = None) -> str:
    """Name of a pipeline task: ``s0/forward/3``, or with a chunk (interleaved) ``s0v1/forward/3``."""
    where = f"s{stage}" if chunk is None else f"s{stage}v{chunk}"
    return f"{where}/{instruction}/{microbatch}"


def device_name(stage: int) -> str:
    """The device (pipeline rank) of stage ``stage``: ``stage{s}``."""
    return f"stage{stage}"


def _check_shape(n_stages: int, n_microbatches: int, stage: int | None = None) -> None:
    for what, v in (("stages", n_stages), ("microbatches", n_microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"a pipeline needs an integer >= 1 of {what}, got {v!r}")
    if stage is not None and not 0 <= stage < n_stages:
        raise InputError(f"stage {stage!r} is not in 0..{n_stages - 1}")


def pipeline_task_count(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> int:
    """The tasks of one iteration of any schedule: a forward and a backward per stage, chunk
    and microbatch (arithmetic: nothing is built)."""
    return 2 * int(n_stages) * int(n_microbatches) * max(int(n_chunks), 1)


def pipeline_layout(schedule: str, n_stages: int, n_microbatches: int, n_chunks: int = 1,
                    group_size: int | None = None, *, max_tasks: int | None = DEFAULT_MAX_TASKS
                    ) -> tuple[dict[int, list[tuple[str, int, str, int]]], list[tuple[str, str]]]:
    """The tasks and dependencies of one iteration of ``schedule`` (one of :data:`SCHEDULES`):
    per stage, its tasks in execution order as (task name, chunk, instruction, microbatch),
    and the data-flow edges (before, after). Chunk is 0 outside interleaved 1F1B. More than
    ``max_tasks`` tasks (None: no limit) raise :class:`~solvers.model.ProblemTooLargeError`
    before anything is built."""
    if schedule not in SCHEDULES:
        raise InputError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    _check_shape(n_stages, n_microbatches)
    shape = f"{n_stages} stages x {n_microbatches} microbatches" + (
        f" x {n_chunks} chunks" if schedule == "interleaved-1f1b" else "")
    check_tasks(pipeline_task_count(n_stages, n_microbatches, n_chunks if schedule == "interleaved-1f1b" else 1),
                max_tasks, f"{schedule} pipeline of {shape}")
    S, M = n_stages, n_microbatches
    order: dict[int, list[tuple[str, int, str, int]]] = {}
    edges: list[tuple[str, str]] = []
    if schedule == "interleaved-1f1b":
        v = n_chunks
        check_interleaved(S, M, v, group_size)
        for s in range(S):
            order[s] = [(task_name(s, i, m, c), c, i, m)
                        for i, c, m in interleaved_order(s, S, M, v, group_size)]
        # virtual stage j = c·S + r; data flows j -> j+1 forward and j+1 -> j backward
        for j in range(S * v - 1):
            (c0, r0), (c1, r1) = divmod(j, S), divmod(j + 1, S)
            for m in range(M):
                edges.append((task_name(r0, "forward", m, c0), task_name(r1, "forward", m, c1)))
                edges.append((task_name(r1, "backward", m, c1), task_name(r0, "backward", m, c0)))
        return order, edges
    if n_chunks != 1:
        raise InputError(f"{schedule} has one chunk per stage, got {n_chunks!r} (use interleaved-1f1b)")
    per = stage_order if schedule == "1f1b" else gpipe_order
    for s in range(S):
        order[s] = [(task_name(s, i, m), 0, i, m) for i, m in per(s, S, M)]
    for s in range(S - 1):
        for m in range(M):
            edges.append((task_name(s, "forward", m), task_name(s + 1, "forward", m)))
            edges.append((task_name(s + 1, "backward", m), task_name(s, "backward", m)))
    return order, edges


def pipeline(schedule: str, n_stages: int, n_microbatches: int,
             options: Mapping[Any, Sequence[Any]] | Callable[..., Sequence[Any]], *,
             n_chunks: int = 1, group_size: int | None = None,
             idle_power_w: float | Mapping[str, float] = 75.0, transitions: Any = None,
             name: str | None = None, steady_state: bool = False,
             max_tasks: int | None = DEFAULT_MAX_TASKS, max_options: int | None = None) -> Problem:
    """The iteration DAG of ``schedule`` (``"1f1b"``, ``"gpipe"`` or ``"interleaved-1f1b"``).

    ``options`` gives the options of (stage, instruction) — for interleaved 1F1B of
    (stage, chunk, instruction) — as a mapping or a function of those arguments; every
    microbatch shares them (and their measurement keys, so their errors count as shared).
    ``idle_power_w``: one number for every stage or per device. ``steady_state``: the
    iteration repeats (each device's wrap-around switch is charged). ``max_tasks`` and
    ``max_options`` (options over all tasks; None: no limit) are checked before the tasks
    are made (:class:`~solvers.model.ProblemTooLargeError`).
    """
    order, edges = pipeline_layout(schedule, n_stages, n_microbatches, n_chunks, group_size,
                                   max_tasks=max_tasks)
    chunked = schedule == "interleaved-1f1b"
    if callable(options):
        get = options
    else:
        def get(*k: Any) -> Sequence[Any]:
            return options[k]
    tasks = []
    n_opts = 0
    for s in range(n_stages):
        opts: dict[tuple[int, str], list[Any]] = {}
        for c in range(n_chunks if chunked else 1):
            for inst in INSTRUCTIONS:
                args = (s, c, inst) if chunked else (s, inst)
                try:
                    raw = list(get(*args))
                except KeyError:
                    what = f"stage {s} chunk {c} {inst}" if chunked else f"stage {s} {inst}"
                    raise InputError(f"{schedule}: no options for {what}") from None
                prefix = f"s{s}v{c}" if chunked else f"s{s}"
                opts[(c, inst)] = [o if isinstance(o, Option) else _keyed(o, prefix, inst, j)
                                   for j, o in enumerate(raw)]
        if max_options is not None:
            n_opts += sum(len(opts[(c, inst)]) for _nm, c, inst, _m in order[s])
            check_options(n_opts, max_options, f"{schedule} pipeline")
        for nm, c, inst, _m in order[s]:
            tasks.append((nm, device_name(s), opts[(c, inst)]))
    if isinstance(idle_power_w, Mapping):
        idle = dict(idle_power_w)
    else:
        idle = {device_name(s): float(idle_power_w) for s in range(n_stages)}
    shape = f"{n_stages}x{n_microbatches}" + (f"x{n_chunks}" if chunked else "")
    return build_problem(tasks, edges, idle, transitions, name or f"{schedule}-{shape}", steady_state)


def build_problem(tasks: Sequence[tuple[str, str, Sequence[Any]]], edges: Sequence[tuple[str, str]],
                  idle_power_w: Mapping[str, float], transitions: Any, name: str,
                  steady_state: bool = False) -> Problem:
    """:meth:`Problem.build`, passing ``steady_state`` only when asked for and the model knows
    it (a model without it builds the one-iteration problem; ``problem.steady_state`` is then
    absent, which readers take as False)."""
    if steady_state and "steady_state" in inspect.signature(Problem.build).parameters:
        return Problem.build(tasks, edges, idle_power_w, transitions, name, steady_state=True)
    return Problem.build(tasks, edges, idle_power_w, transitions, name)


def one_f_one_b(n_stages: int, n_microbatches: int,
                options: Mapping[tuple[int, str], Sequence[Any]] | Callable[[int, str], Sequence[Any]],
                idle_power_w: float | Mapping[str, float] = 75.0, transitions: Any = None,
                name: str | None = None, steady_state: bool = False,
                max_tasks: int | None = DEFAULT_MAX_TASKS) -> Problem:
    """Build the 1F1B iteration DAG of ``n_stages`` × ``n_microbatches``.

    ``options`` gives the options of (stage, "forward"|"backward") (a mapping or a function);
    every microbatch of that pair shares them (and their measurement keys, so their errors are
    counted as shared). ``idle_power_w``: one number for every stage or per device.
    ``max_tasks``: see :func:`pipeline`.
    """
    if n_stages < 1 or n_microbatches < 1:
        raise InputError(f"1F1B needs >= 1 stage and microbatch, got {n_stages} x {n_microbatches}")
    return pipeline("1f1b", n_stages, n_microbatches, options, idle_power_w=idle_power_w,
                    transitions=transitions, name=name or f"1f1b-{n_stages}x{n_microbatches}",
                    steady_state=steady_state, max_tasks=max_tasks)


def gpipe(n_stages: int, n_microbatches: int,
          options: Mapping[tuple[int, str], Sequence[Any]] | Callable[[int, str], Sequence[Any]],
          idle_power_w: float | Mapping[str, float] = 75.0, transitions: Any = None,
          name: str | None = None, steady_state: bool = False,
          max_tasks: int | None = DEFAULT_MAX_TASKS) -> Problem:
    """Build the GPipe iteration DAG (all forwards, then all backwards on every stage);
    arguments as :func:`one_f_one_b`."""
    return pipeline("gpipe", n_stages, n_microbatches, options, idle_power_w=idle_power_w,
                    transitions=transitions, name=name, steady_state=steady_state,
                    max_tasks=max_tasks)


def interleaved_1f1b(n_stages: int, n_microbatches: int, n_chunks: int,
                     options: Mapping[tuple[int, int, str], Sequence[Any]] | Callable[[int, int, str], Sequence[Any]],
                     idle_power_w: float | Mapping[str, float] = 75.0, transitions: Any = None,
                     name: str | None = None, group_size: int | None = None,
                     steady_state: bool = False, max_tasks: int | None = DEFAULT_MAX_TASKS) -> Problem:
    """Build Megatron-LM's interleaved 1F1B iteration DAG: ``n_chunks`` model chunks per
    stage; ``options`` of (stage, chunk, instruction); ``group_size`` N as Megatron's
    ``microbatch_group_size_per_vp_stage`` (default: ``n_stages``)."""
    return pipeline("interleaved-1f1b", n_stages, n_microbatches, options, n_chunks=n_chunks,
                    group_size=group_size, idle_power_w=idle_power_w, transitions=transitions,
                    name=name, steady_state=steady_state, max_tasks=max_tasks)


def _keyed(o: Any, prefix: str, inst: str, j: int) -> Any:
    """Give a plain option a measurement key shared by all microbatches of (stage, inst)."""
    if isinstance(o, Mapping) and "key" not in o:
        return {**o, "key": f"{prefix}/{inst}#{j}"}
    return o
