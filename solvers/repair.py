"""Repair and relax a plan against a horizon: the crash and relax passes of the fast method.

:func:`crash` makes a late plan meet its deadline by speeding up critical tasks, the cheapest
Δenergy per second gained first (switch latencies included). :func:`relax` gives each task,
in one topological pass, the cheapest option its float allows, so a plan that meets the
horizon still meets it; :func:`relax_repeatedly` repeats it while it changes the plan.
:func:`repaired` chains both over a few horizons.
"""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from .feasibility import meets_deadline, plan_meets_deadline
from .model import Problem


def _local_vec(ix, v: int, ch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per option b of task v: (duration + switch latencies in/out, cost + switch extras)."""
    t = ix.time[v].copy()
    c = ix.cost[v].copy()
    u = ix.dev_prev[v]
    if u >= 0 and ix.tau[v] is not None:
        t += ix.tau[v][ch[u], :]
        c += ix.extra[v][ch[u], :]
    w = ix.dev_next[v]
    if w >= 0 and ix.tau[w] is not None:
        t += ix.tau[w][:, ch[w]]
        c += ix.extra[w][:, ch[w]]
    return t, c


def crash(p: Problem, choice: np.ndarray, deadline_s: float, max_iter: int = 20_000) -> np.ndarray | None:
    """Speed up critical tasks (least Δcost per second gained) until the makespan ≤ deadline."""
    ix = p.index
    ch = choice.copy()
    for _ in range(max_iter):
        start, end, mk = ix.schedule(ch)
        if meets_deadline(mk, deadline_s):
            return ch
        lf = ix.latest(ch, mk)
        tol = 1e-9 * mk
        best, arg = math.inf, None
        for v in np.flatnonzero(end >= lf - tol):
            t, c = _local_vec(ix, v, ch)
            gain = t[ch[v]] - t
            ok = gain > 1e-12 * mk
            if not ok.any():
                continue
            # Prefer the smallest useful step: rate over the options that gain time.
            rate = np.where(ok, (c - c[ch[v]]) / np.where(ok, gain, 1.0), np.inf)
            b = int(np.argmin(rate))
            if rate[b] < best:
                best, arg = float(rate[b]), (v, b)
        if arg is None:
            return None
        ch[arg[0]] = arg[1]
    return None


def relax(p: Problem, choice: np.ndarray, horizon_s: float) -> np.ndarray:
    """One topological pass: each task takes the cheapest option that still fits its float
    (finish by its latest finish given the current successors), switch latencies and extras
    included, so a plan that meets ``horizon_s`` still meets it. In a steady state a device's
    first task also waits for its wrap switch from the device's last task, and the last task
    only takes options whose wrap latency fits before the first task's start."""
    ix = p.index
    ch = choice.copy()
    dur = ix.durations(ch)
    lf = ix.latest(ch, horizon_s).tolist()
    end = [0.0] * ix.n
    begin = [0.0] * ix.n
    tol = 1e-12 * horizon_s
    stairs = ix.stairs
    # steady state: last task → the first task its wrap switch leads into
    wrap_next = ({ix.wrap_prev[f]: f for f in range(ix.n) if ix.wrap_tau[f] is not None}
                 if ix.steady_state else {})
    for v in ix.order:
        es = max((end[u] for u in ix.preds[v]), default=0.0)
        u = ix.dev_prev[v]
        w = ix.dev_next[v]
        wrapped = wrap_next and (ix.wrap_tau[v] is not None or v in wrap_next)
        if ix.tau[v] is None and (w < 0 or ix.tau[w] is None) and not wrapped:
            # no switch on either side: the cheapest option within the float, by bisection
            if u >= 0 and end[u] > es:
                es = end[u]
            times, arg, best = stairs[v]
            k = bisect_right(times, lf[v] + tol - es)
            cur = int(ch[v])
            if k and best[k - 1] < ix.cost[v][cur] - 1e-12:
                cur = arg[k - 1]
                ch[v] = cur
            begin[v] = es
            end[v] = es + float(ix.time[v][cur])
            dur[v] = ix.time[v][cur]
            continue
        t = ix.time[v]
        c = ix.cost[v]
        start = np.full(len(t), es)
        fin_lim = np.full(len(t), lf[v] + tol)
        ok = np.ones(len(t), dtype=bool)
        if u >= 0:
            t_in = ix.tau[v][ch[u], :] if ix.tau[v] is not None else 0.0
            start = np.maximum(start, end[u] + t_in)
            if ix.extra[v] is not None:
                c = c + ix.extra[v][ch[u], :]
        elif wrapped and ix.wrap_tau[v] is not None:
            # a device's first task starts after the wrap switch from its (current) last task
            last = ix.wrap_prev[v]
            start = np.maximum(start, ix.wrap_tau[v][ch[last], :])
            c = c + ix.wrap_extra[v][ch[last], :]
        if w >= 0 and ix.tau[w] is not None:
            fin_lim = np.minimum(fin_lim, lf[w] - dur[w] - ix.tau[w][:, ch[w]] + tol)
            c = c + ix.extra[w][:, ch[w]]
        if wrapped and v in wrap_next:
            # the last task: its wrap latency must fit before the first task's start, as scheduled
            f = wrap_next[v]
            ok &= ix.wrap_tau[f][:, ch[f]] <= begin[f] + tol
            c = c + ix.wrap_extra[f][:, ch[f]]
        fin = start + t
        ok &= fin <= fin_lim
        ok[ch[v]] = True           # the current option always fits (see the docstring)
        b = int(np.argmin(np.where(ok, c, np.inf)))
        if c[b] >= c[ch[v]] - 1e-12:
            b = int(ch[v])
        ch[v] = b
        begin[v] = start[b]
        end[v] = fin[b]
        dur[v] = t[b]
    return ch


def relax_repeatedly(p: Problem, choice: np.ndarray, horizon_s: float, rounds: int = 3) -> np.ndarray:
    """:func:`relax` applied until the plan stops changing, at most ``rounds`` times (one pass
    can free float that the next uses)."""
    ch = choice
    for _ in range(rounds):
        nxt = relax(p, ch, horizon_s)
        if np.array_equal(nxt, ch):
            break
        ch = nxt
    return ch


def repaired(p: Problem, ch: np.ndarray, deadline_s: float, horizons: list[float]) -> np.ndarray | None:
    """``ch`` made feasible (:func:`crash`) and relaxed; the cheapest over ``horizons``."""
    ix = p.index
    if not plan_meets_deadline(p, ch, deadline_s):
        ch = crash(p, ch, deadline_s)
        if ch is None:
            return None
    best, best_e = None, math.inf
    for horizon in sorted({min(max(h, ix.makespan(ch)), deadline_s) for h in horizons}):
        c2 = relax_repeatedly(p, ch, horizon)
        e = ix.objective(c2)
        if e < best_e:
            best, best_e = c2.copy(), e
    return best
