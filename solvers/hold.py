"""Hold starts and held re-plans: a plan's middle rebuilt so every device holds one or two clocks.

With switch costs, the path-by-path search (:mod:`solvers.lns`) tracks a long pipeline's
steady-state period by letting each device wobble between neighbouring clocks. It pays a switch
latency each time. It cannot move every device's held clock at once. This module builds the
start that does:
- it keeps the plan's schedule outside a common time window (the ramps);
- inside the window, each device with switch costs holds the cheapest operating point whose
  busy time fits a common fraction ``q`` of what the plan spends there;
- optionally, a slower level runs before a common split time and a faster one after, which
  costs one switch per device.

The level and the split are the largest that still meet the deadline. The search then
polishes the result. On the 1F1B benchmark with 1 ms switches, splitting the search budget
between the plan and this start lowers the proven gap at the same work
(``experiments/bench_solvers.py``).

A hold start keeps the plan's ramps, so its level must fit them. A *re-plan*
(:func:`held_problem`, :func:`replan_levels`, used by :func:`solvers.search.replan_hold`) goes
further: it fixes the held tasks at a level that may be slower than fits, picked by the held
problem's hull LP, and plans everything outside the window again, ramps included, which
then run faster to pay for the slower steady state. With 60 discrete clocks every stage of a
pipeline loses part of a clock step when it holds one clock per cycle, and a common period
slightly slower than the LP's lets several stages hold the clock just above it.

Devices are compared by ratio to the plan's own busy time, not by absolute time. So the rule
needs no pipeline structure: on a 1F1B pipeline it is the common cycle period; on other DAGs it
is just one more start for the search to accept or drop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .feasibility import plan_meets_deadline
from .model import Problem, Task
from .options import HoldOptions


@dataclass(frozen=True)
class _Core:
    """One device's held tasks: their options by common ω (``option[i, k]``: option of task
    ``tasks[i]`` at the k-th ω), busy-time ratio and effective energy per ω, and base starts."""

    tasks: np.ndarray
    option: np.ndarray
    ratio: np.ndarray
    cost_j: np.ndarray
    start_s: np.ndarray


def _cores(p: Problem, choice: np.ndarray, start: np.ndarray, lo_s: float, hi_s: float) -> list[_Core]:
    """The held tasks of every device with switch costs: those starting within
    [``lo_s``, ``hi_s``] in ``choice``'s schedule (``start``: its start times), if at least
    two share some ω."""
    ix = p.index
    dur, tau = ix.durations(choice), ix.switch_tau(choice)
    off, tflat = ix.time_flat
    cflat = ix.cost_flat
    out = []
    for seq in ix.dev_seq.values():
        if all(ix.tau[v] is None for v in seq):
            continue
        seq = np.asarray(seq)
        core = seq[(start[seq] >= lo_s) & (start[seq] <= hi_s)]
        if core.size < 2:
            continue
        by_omega = [{o.omega.dev: i for i, o in enumerate(p.tasks[v].options)} for v in core]
        common = set(by_omega[0]).intersection(*by_omega[1:])
        if not common:
            continue
        omegas = sorted(common, key=repr)
        opt = np.array([[m[w] for w in omegas] for m in by_omega])
        flat = off[core][:, None] + opt
        busy_s = dur[core].sum() + tau[core[1:]].sum()    # latencies inside the window too
        if busy_s <= 0:
            continue
        out.append(_Core(core, opt, tflat[flat].sum(axis=0) / busy_s, cflat[flat].sum(axis=0),
                         start[core]))
    return out


def _levels(cores: list[_Core], band: float) -> list[tuple[int, ...]]:
    """Distinct held assignments (an ω column per core), slowest-fitting first to last as the
    common ratio ``q`` grows through ``1 ± band``: each core takes its cheapest ω whose ratio
    is at most ``q`` (its fastest when none is)."""
    qs = sorted({float(r) for c in cores for r in c.ratio if abs(r - 1) <= band})
    out: list[tuple[int, ...]] = []
    for q in qs:
        pick = []
        for c in cores:
            ok = np.flatnonzero(c.ratio <= q * (1 + 1e-12))
            pick.append(int(ok[np.argmin(c.cost_j[ok])]) if ok.size else int(np.argmin(c.ratio)))
        if not out or out[-1] != tuple(pick):
            out.append(tuple(pick))
    return out


def _apply(choice: np.ndarray, cores: list[_Core], slow, fast, split_s: float) -> np.ndarray:
    """``choice`` with each core at its ``slow`` ω before ``split_s`` and ``fast`` after."""
    ch = choice.copy()
    for c, ks, kf in zip(cores, slow, fast):
        ch[c.tasks] = np.where(c.start_s < split_s, c.option[:, ks], c.option[:, kf])
    return ch


def _window_levels(p: Problem, choice: np.ndarray, deadline_s: float, window: tuple[float, float],
                   band: float) -> tuple[list[_Core], list[tuple[int, ...]], int]:
    """The held tasks in ``window`` (fractions of ``choice``'s makespan), their levels
    (:func:`_levels`) and the index of the slowest one-level hold of ``choice`` that meets
    ``deadline_s`` (bisection), -1 when none does or nothing can be held."""
    start, _, m = p.index.schedule(choice)
    cores = _cores(p, choice, start, window[0] * m, window[1] * m)
    levels = _levels(cores, band) if cores else []
    lo, hi = -1, len(levels)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if plan_meets_deadline(p, _apply(choice, cores, levels[mid], levels[mid], 0.0), deadline_s):
            lo = mid
        else:
            hi = mid
    return cores, levels, lo


def hold_start(p: Problem, choice, deadline_s: float, window: tuple[float, float] | None = None,
               opts: HoldOptions = HoldOptions()) -> tuple[float, np.ndarray] | None:
    """The cheapest plan that meets ``deadline_s`` (energy J, choice) built from ``choice`` by
    holding clocks through ``window`` (fractions of its makespan; default the first of
    ``opts.windows``), or None when no device with
    switch costs has two tasks there sharing an ω, or no held level meets the deadline.

    One level: the slowest common ratio (within ±``opts.band``) that meets the deadline. Two
    levels: each of the three fastest such levels after the ``opts.pairs`` next slower ones,
    with the latest split that meets the deadline (found by bisection over the held tasks'
    start times)."""
    ix = p.index
    window = opts.windows[0] if window is None else window
    pairs = opts.pairs
    choice = np.asarray(choice, dtype=int)
    cores, levels, lo = _window_levels(p, choice, deadline_s, window, opts.band)
    if lo < 0:
        return None
    best_ch = _apply(choice, cores, levels[lo], levels[lo], 0.0)
    best = ix.objective(best_ch)
    splits = np.unique(np.concatenate([c.start_s for c in cores]))
    for f in range(max(lo - 2, 0), lo + 1):
        for s in range(lo + 1, min(lo + 1 + pairs, len(levels))):
            a, b = 0, len(splits)    # latest split that fits; splits[0] holds no slow task
            while b - a > 1:
                mid = (a + b) // 2
                if plan_meets_deadline(p, _apply(choice, cores, levels[s], levels[f], splits[mid]), deadline_s):
                    a = mid
                else:
                    b = mid
            if a:                    # the bisection saw splits[a] fit
                ch = _apply(choice, cores, levels[s], levels[f], splits[a])
                e = ix.objective(ch)
                if e < best:
                    best, best_ch = e, ch
    return best, best_ch


def best_hold(p: Problem, choice, deadline_s: float,
              opts: HoldOptions = HoldOptions()) -> tuple[np.ndarray, tuple[float, float]] | None:
    """The cheapest :func:`hold_start` over ``opts.windows``: (its choice, its window), or None
    (always above ``opts.max_tasks`` tasks)."""
    if p.n_tasks > opts.max_tasks:
        return None
    found = [(h[0], h[1], w) for w in opts.windows
             if (h := hold_start(p, choice, deadline_s, w, opts)) is not None]
    if not found:
        return None
    _, ch, w = min(found, key=lambda h: h[0])
    return ch, w


def best_hold_start(p: Problem, choice, deadline_s: float,
                    opts: HoldOptions = HoldOptions()) -> np.ndarray | None:
    """The cheapest :func:`hold_start` over ``opts.windows`` (its choice), or None."""
    found = best_hold(p, choice, deadline_s, opts)
    return None if found is None else found[0]


@dataclass(frozen=True)
class HeldProblem:
    """``problem`` is the original with every held task reduced to its held option;
    ``fixed`` maps those tasks (original index) to that option. Tasks keep their order, so a
    choice for ``problem`` is one for the original once :meth:`expand` restores the held ones."""

    problem: Problem
    fixed: dict[int, int]

    def expand(self, choice) -> np.ndarray:
        """The original problem's choice: held tasks at their held option, others as given."""
        ch = np.asarray(choice, dtype=int).copy()
        for v, k in self.fixed.items():
            ch[v] = k
        return ch


def held_problem_values(p: Problem, cores: list[_Core], level: tuple[int, ...]) -> dict[int, int]:
    """Held task (index in ``p``) → its option at ``level`` (one ω column per core)."""
    return {int(v): int(c.option[i, k]) for c, k in zip(cores, level) for i, v in enumerate(c.tasks)}


def held_problem(p: Problem, cores: list[_Core], level: tuple[int, ...]) -> HeldProblem:
    """``p`` with each core's tasks held at its ω column ``level[i]``."""
    fixed = held_problem_values(p, cores, level)
    tasks = tuple(Task(t.name, t.device, (t.options[fixed[v]],)) if v in fixed else t
                  for v, t in enumerate(p.tasks))
    return HeldProblem(p.with_(tasks=tasks, name=f"{p.name} (held)"), fixed)


def replan_levels(p: Problem, choice, deadline_s: float, window: tuple[float, float],
                  opts: HoldOptions = HoldOptions()) -> tuple[list[_Core], list[tuple[int, ...]]]:
    """Candidate levels for a re-plan around a hold in ``window``: up to
    ``opts.replan_levels`` held assignments spread evenly from the slowest one-level hold that
    fits ``choice``'s own ramps to ratio ``1 + opts.replan_span`` times it, slower ones
    included (a re-plan speeds the ramps up to pay for them). Returns (cores, levels, fastest
    first); no levels when nothing can be held."""
    span, count = opts.replan_span, opts.replan_levels
    choice = np.asarray(choice, dtype=int)
    cores, levels, lo = _window_levels(p, choice, deadline_s, window, opts.band)
    if lo < 0:
        return cores, []
    q0 = _ratio(cores, levels[lo])
    cand = [i for i in range(lo, len(levels)) if _ratio(cores, levels[i]) <= q0 * (1 + span) * (1 + 1e-12)]
    pick = np.unique(np.linspace(0, len(cand) - 1, min(count, len(cand))).round().astype(int))
    return cores, [levels[cand[i]] for i in pick]


def _ratio(cores: list[_Core], level: tuple[int, ...]) -> float:
    """The common ratio a level stands for: the largest of its cores' ratios."""
    return max(float(c.ratio[k]) for c, k in zip(cores, level))


def wrap_polish(p: Problem, choice: np.ndarray, deadline_s: float, rounds: int = 3) -> np.ndarray:
    """``choice`` improved where a steady state's wrap switch (a device's last task → its first)
    is priced: the searches price consecutive pairs only, so this tries every option of each
    wrapped device's first and last task, and both at once at one common ω_dev, keeping the
    cheapest plan that meets ``deadline_s`` (:meth:`solvers.index.ProblemIndex.objective`, wrap
    included). About 3·K evaluations per wrapped device and round; ``choice`` itself when
    nothing is wrapped or nothing better fits."""
    ix = p.index
    best = np.array(choice, dtype=int)
    if not ix.steady_state:
        return best
    wraps = [(ix.wrap_prev[f], f) for f in range(ix.n) if ix.wrap_tau[f] is not None]
    best_e = ix.objective(best) if plan_meets_deadline(p, best, deadline_s) else np.inf
    for _ in range(rounds):
        improved = False
        for last, first in wraps:
            om_l = [o.omega.dev for o in p.tasks[last].options]
            om_f = [o.omega.dev for o in p.tasks[first].options]
            moves = [((first, b),) for b in range(ix.k[first])]
            moves += [((last, a),) for a in range(ix.k[last])]
            moves += [((first, b), (last, a)) for b in range(ix.k[first])
                      for a in range(ix.k[last]) if om_f[b] == om_l[a]]
            for move in moves:
                ch = best.copy()
                for v, o in move:
                    ch[v] = o
                if np.array_equal(ch, best) or not plan_meets_deadline(p, ch, deadline_s):
                    continue
                e = ix.objective(ch)
                if e < best_e - 1e-12 * max(abs(best_e), 1.0):
                    best, best_e, improved = ch, e, True
        if not improved:
            break
    return best
