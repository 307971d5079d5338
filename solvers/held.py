"""The switch-cost search's moves in work independent of the problem's size: paths re-planned
against a held schedule.

:func:`solvers.lns.polish` recomputes the whole schedule (earliest and latest starts, the
makespan, the energy) around every path it re-plans: O(tasks) per move, so past a few thousand
tasks a work unit buys fewer moves per task and the search's gap grows with the size. Here one
feasible schedule is *held* (:class:`HeldSchedule`: every task's option, start and duration,
all ending by the deadline) and the moves update it themselves:

* a path re-planned inside the window the held schedule leaves it
  (:func:`solvers.lns.path_window`) fits with every other task where it is held, so the plan
  with the path at the DP's start times is again a feasible schedule: no makespan pass;
* the move's energy change is the window's own cost difference (the path's options, its
  switch extras to fixed neighbours and between its own tasks): no energy pass;
* after moves over a quarter of the tasks the schedule is held again from the plan
  (α·ASAP + (1 − α)·ALAP, as :func:`solvers.lns.polish` holds it: slack a move freed goes
  back to everyone) and the plan's makespan and energy are checked exactly; the plan returned
  is the best so checked, never worse than the start.

The idle-power term (total idle power × makespan) is not part of a move's change: a move may
let the makespan grow toward the deadline, which the exact check then prices (plans of the
fast method end at the deadline: makespan/deadline 0.99999994 on 32x128 1F1B at 1.05x).
Steady-state problems (a wrap switch from each device's last task to its first, which no
window prices) keep :func:`solvers.lns.polish`'s exact moves, as do problems under
:data:`MIN_TASKS` tasks (their plans, and the numbers the documents quote, stay as they were):
:func:`polish` and :func:`iterated_polish` choose (:func:`applies`), and the search calls them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import lns
from .feasibility import meets_deadline
from .lns import (
    Budget,
    PathWindow,
    _chain_dp,
    dependency_paths,
    held_options,
    neighbourhoods,
    path_window,
)
from .model import Problem
from .options import SearchOptions

#: From this many tasks on the search re-plans against a held schedule (:func:`applies`):
#: below it one exact pass costs less than the moves it would save.
MIN_TASKS = 6144

#: Work units per task position of a path window (building it; its DP labels are charged
#: apart), per task of an exact pass over the whole problem (a rebuild or a check), and per
#: kicked task: the same unit as :data:`solvers.lns.LABELS_PER_UNIT` (about 0.07 ms).
UNITS_PER_POSITION = 0.15
UNITS_PER_PASS_TASK = 1 / 90
UNITS_PER_KICK_TASK = 0.05

#: Tasks on each side of a kicked segment re-planned with it, on its device and on the
#: devices its dependencies reach.
KICK_MARGIN = 24


def applies(p: Problem) -> bool:
    """Whether the search on ``p`` uses held schedules: at least :data:`MIN_TASKS` tasks and no
    steady-state wrap."""
    return p.index.n >= MIN_TASKS and not p.index.steady_state


@dataclass
class HeldSchedule:
    """A plan and one feasible schedule of it: ``choice`` (option per task), ``start_s`` and
    ``dur_s`` per task, every task ending by ``deadline_s``; ``energy_j`` is the plan's energy
    at its last exact check plus the changes of the moves since (the idle term left out, see
    the module docstring); ``since`` counts the task positions moved since the schedule was
    last held from the plan."""

    choice: np.ndarray
    start_s: np.ndarray
    dur_s: np.ndarray
    deadline_s: float
    energy_j: float
    since: int = 0


def schedule_passes(p: Problem, choice: np.ndarray, deadline_s: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(earliest start, duration, latest finish by ``deadline_s``) of each task of ``choice``:
    the two exact passes a schedule is held from."""
    ix = p.index
    start, end, _ = ix.schedule(choice)
    return start, end - start, ix.latest(choice, deadline_s)


def hold_schedule(p: Problem, choice: np.ndarray, deadline_s: float, alpha: float,
                  energy_j: float | None = None,
                  passes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> HeldSchedule:
    """``choice`` held at α·ASAP + (1 − α)·ALAP starts (a convex combination of two feasible
    schedules, so feasible when ``choice`` meets ``deadline_s``); ``energy_j`` defaults to the
    plan's exact energy, ``passes`` to :func:`schedule_passes` (left unchanged)."""
    ix = p.index
    start, dur, lf = schedule_passes(p, choice, deadline_s) if passes is None else passes
    held = alpha * start + (1 - alpha) * (lf - dur)
    e = ix.objective(choice) if energy_j is None else energy_j
    return HeldSchedule(np.asarray(choice).copy(), held, dur.copy(), float(deadline_s), float(e))


def window_value(w: PathWindow, options: np.ndarray) -> float:
    """The cost (J) :func:`solvers.lns.chain_dp` gives ``options`` (one per position) in
    window ``w``: each position's cost, switch extras to fixed neighbours included, plus the
    extras between consecutive positions on one device."""
    tot = 0.0
    for pos, j in enumerate(options):
        tot += float(w.cost_j[pos][j])
        link = w.links[pos]
        if link is not None:
            tot += float(link[1][options[pos - 1], j])
    return tot


def window_starts(w: PathWindow, options: np.ndarray) -> np.ndarray | None:
    """The earliest start of each position under ``options`` in window ``w`` (as the chain DP
    schedules them: after the release, the previous position and the switch between them),
    or None when some position would finish after its latest finish."""
    out = np.empty(len(options))
    prev_end = -math.inf
    for pos, j in enumerate(options):
        s = float(w.release_s[pos][j])
        if pos:
            link = w.links[pos]
            gate = prev_end + (float(link[0][options[pos - 1], j]) if link is not None else 0.0)
            s = max(s, gate)
        f = s + float(w.time_s[pos][j])
        if f > w.due_s[pos][j]:
            return None
        out[pos] = s
        prev_end = f
    return out


def _apply(p: Problem, h: HeldSchedule, path: list[int], options: np.ndarray,
           starts: np.ndarray) -> None:
    """Put ``path`` at ``options`` and ``starts`` in ``h``."""
    ix = p.index
    h.choice[path] = options
    h.start_s[path] = starts
    h.dur_s[path] = [ix.time[v][j] for v, j in zip(path, options)]
    h.since += len(path)


def try_path(p: Problem, h: HeldSchedule, path: list[int], cap: int, gcap: int,
             budget: Budget) -> float:
    """Re-plan ``path`` in the window ``h`` leaves it; keep the DP's sequence when it costs
    less. Charges ``budget`` its labels and the window's positions; returns the energy change
    (J, 0 when nothing changed)."""
    D = h.deadline_s
    win = path_window(p, path, h.choice, h.start_s, h.dur_s, D, tol_s=1e-13 * D)
    sub, labels = _chain_dp(win, cap, gcap)
    budget.spend(labels / 1000 + UNITS_PER_POSITION * len(path) + 1.0)
    old = h.choice[path]
    if sub is None or np.array_equal(sub, old):
        return 0.0
    delta = window_value(win, sub) - window_value(win, old)
    if delta >= -1e-9 * abs(h.energy_j):
        return 0.0
    starts = window_starts(win, sub)
    if starts is None:                  # the DP's own sequence always fits; kept as a guard
        return 0.0
    _apply(p, h, path, sub, starts)
    h.energy_j += delta
    return delta


class _Checked:
    """The best plan an exact check has confirmed so far, and the rebuilds of the held
    schedule (every ``p.index.n / 4`` moved positions)."""

    def __init__(self, p: Problem, choice: np.ndarray, deadline_s: float, budget: Budget):
        self.p, self.D, self.budget = p, float(deadline_s), budget
        self.best = np.asarray(choice).copy()
        self.best_j = p.index.objective(self.best)
        self.passes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None   # the best's
        budget.spend(UNITS_PER_PASS_TASK * p.index.n)

    def hold(self, choice: np.ndarray, alpha: float) -> HeldSchedule:
        """``choice`` checked (kept when it is the best so far and meets the deadline) and held
        at ``alpha``; the best plan held instead when ``choice`` misses the deadline or costs
        more than it (a move that let the makespan grow more than it saved)."""
        ix = self.p.index
        self.budget.spend(2 * UNITS_PER_PASS_TASK * ix.n)
        start, end, mk = ix.schedule(choice)
        e = ix.objective(choice, mk)
        if meets_deadline(mk, self.D) and e < self.best_j:
            self.best, self.best_j = np.asarray(choice).copy(), e
            self.passes = (start, end - start, ix.latest(choice, self.D))
        elif self.passes is None:
            self.passes = schedule_passes(self.p, self.best, self.D)
        return hold_schedule(self.p, self.best, self.D, alpha, self.best_j, self.passes)

    def due(self, h: HeldSchedule) -> bool:
        """Whether ``h`` has moved enough to be held again."""
        return h.since * 4 >= self.p.index.n


def polish_held(p: Problem, choice: np.ndarray, deadline_s: float, alphas: tuple[float, ...],
                paths: list[list[int]], cap: int, gcap: int, budget: Budget) -> np.ndarray:
    """:func:`solvers.lns.polish` with held schedules: sweeps over ``paths`` cycling
    ``alphas`` until a whole cycle finds nothing or ``budget`` is spent; the best checked plan
    (never worse than ``choice``)."""
    checked = _Checked(p, choice, deadline_s, budget)
    idle = 0
    k = 0
    while idle < len(alphas) and paths and not budget.done():
        a = alphas[k % len(alphas)]
        k += 1
        h = checked.hold(checked.best, a)
        improved = False
        for path in paths:
            if budget.done():
                break
            if checked.due(h):
                h = checked.hold(h.choice, a)
            improved |= try_path(p, h, path, cap, gcap, budget) < 0
        checked.hold(h.choice, a)
        idle = 0 if improved else idle + 1
    return checked.best


def _path_of(p: Problem) -> dict[int, list[int]]:
    """Task → the dependency path (:func:`solvers.lns.dependency_paths`) it is on; cached on
    the problem's index."""
    ix = p.index
    cache = ix.__dict__.setdefault("_held_path_of", {})
    if not cache:
        for path in dependency_paths(p):
            for v in path:
                cache[v] = path
    return cache


def _pieces(p: Problem, seg: list[int]) -> list[list[int]]:
    """Paths around a kicked segment: its device's tasks within :data:`KICK_MARGIN` of it, the
    same stretch of every other device its dependencies reach, and the dependency paths
    through it."""
    ix = p.index
    pos = ix.__dict__.setdefault("_held_pos", {})
    if not pos:
        for seq in ix.dev_seq.values():
            for i, v in enumerate(seq):
                pos[v] = i
    out = []
    reach = {ix.device[seg[0]]: (pos[seg[0]], pos[seg[-1]])}
    for v in seg:
        for u in list(ix.preds[v]) + list(ix.succs[v]):
            d = ix.device[u]
            lo, hi = reach.get(d, (pos[u], pos[u]))
            reach[d] = (min(lo, pos[u]), max(hi, pos[u]))
    for d in ix.dev_seq:                       # the index's device order, not a set's
        if d in reach:
            seq = ix.dev_seq[d]
            lo, hi = reach[d]
            out.append(seq[max(lo - KICK_MARGIN, 0):hi + KICK_MARGIN + 1])
    path_of = _path_of(p)
    seen: set[int] = set()
    for v in seg:
        q = path_of.get(v)
        if q is not None and id(q) not in seen:
            seen.add(id(q))
            out.append(q)
    return [q for q in out if len(q) > 1]


def iterated_polish_held(p: Problem, choice: np.ndarray, deadline_s: float, seed: int,
                         max_segment: int, caps: tuple[int, int], budget: Budget) -> np.ndarray:
    """:func:`solvers.lns.iterated_polish` with held schedules: a kick holds a random segment
    of one device at one ω (when it fits its window), the paths around it are re-planned
    (:func:`_pieces`), and the whole is kept when it costs less, else undone. The best
    checked plan (never worse than ``choice``)."""
    ix = p.index
    rng = np.random.default_rng(seed)
    checked = _Checked(p, choice, deadline_s, budget)
    h = checked.hold(checked.best, 0.5)
    D = h.deadline_s
    seqs = [s for s in ix.dev_seq.values() if len(s) > 1]
    while seqs and not budget.done():
        if checked.due(h):
            h = checked.hold(h.choice, 0.5)
        seq = seqs[int(rng.integers(len(seqs)))]
        length = int(rng.integers(2, min(max_segment, len(seq)) + 1))
        i = int(rng.integers(0, len(seq) - length + 1))
        seg = seq[i:i + length]
        v = seg[int(rng.integers(length))]
        budget.spend(UNITS_PER_KICK_TASK * length + 1.0)
        new = held_options(p, h.choice[seg], seg, p.tasks[v].options[h.choice[v]].omega.dev)
        if np.array_equal(new, h.choice[seg]):
            continue
        win = path_window(p, seg, h.choice, h.start_s, h.dur_s, D, tol_s=1e-13 * D)
        starts = window_starts(win, new)
        if starts is None:                     # does not fit where the rest is held: dropped
            continue
        pieces = _pieces(p, seg)
        touched = sorted({t for q in pieces for t in q} | set(seg))
        saved = (h.choice[touched].copy(), h.start_s[touched].copy(), h.dur_s[touched].copy(),
                 h.energy_j, h.since)
        delta = window_value(win, new) - window_value(win, h.choice[seg])
        _apply(p, h, seg, new, starts)
        h.energy_j += delta
        for q in pieces:
            delta += try_path(p, h, q, caps[0], caps[1], budget)
        if delta >= -1e-9 * abs(h.energy_j):   # undone: the kick and the moves after it
            h.choice[touched], h.start_s[touched], h.dur_s[touched] = saved[:3]
            h.energy_j, h.since = saved[3], saved[4]
    checked.hold(h.choice, 0.5)
    return checked.best


def polish(p: Problem, choice: np.ndarray, deadline_s: float, budget_s: float = 600.0,
           alphas: tuple[float, ...] = SearchOptions().alphas, paths: list[list[int]] | None = None,
           cap: int = 48, gcap: int = 160, work: float = 2_000.0,
           budget: Budget | None = None) -> np.ndarray:
    """:func:`solvers.lns.polish` (same arguments), by :func:`polish_held` where
    :func:`applies`."""
    if not applies(p):
        return lns.polish(p, choice, deadline_s, budget_s, alphas, paths, cap, gcap, work, budget)
    budget = Budget.of(work, budget_s) if budget is None else budget
    paths = neighbourhoods(p) if paths is None else paths
    return polish_held(p, choice, deadline_s, alphas, paths, cap, gcap, budget)


def iterated_polish(p: Problem, choice: np.ndarray, deadline_s: float, budget_s: float = 600.0,
                    seed: int = 0, max_segment: int = 32, work: float = 2_000.0,
                    budget: Budget | None = None, caps: tuple[int, int] = (16, 64)) -> np.ndarray:
    """:func:`solvers.lns.iterated_polish` (same arguments), by :func:`iterated_polish_held`
    where :func:`applies`."""
    if not applies(p):
        return lns.iterated_polish(p, choice, deadline_s, budget_s, seed, max_segment, work, budget, caps)
    budget = Budget.of(work, budget_s) if budget is None else budget
    return iterated_polish_held(p, choice, deadline_s, seed, max_segment, caps, budget)
