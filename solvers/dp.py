"""Exact dynamic programming for chains (spec §9.2, solver-notes §5.2).

A chain is a DAG whose precedence order is total. Its makespan is the sum of durations and
switch latencies, so the energy ``P_total·M + Σ cost + Σ switch extra`` is additive along it.
State = the previous task's option, so switching costs are exact.

Method (exact, with a proof of optimality):

1. Lagrangian relaxation of the deadline: for a multiplier λ ≥ 0 a Viterbi pass over options
   (O(n·K²) with numpy) minimises Σ (energy + λ·time). Bisection on λ gives the best lower bound
   ``L(λ) − λ·D`` and a feasible plan (the Viterbi path at the feasible end of the bracket).
2. If that plan's energy equals the bound, it is optimal. Otherwise a Pareto DP over
   (time, energy) per state runs forward, dropping a partial plan when it cannot meet the
   deadline (time + fastest suffix > D) or when its Lagrangian completion bound exceeds the
   incumbent. Pruning only removes partial plans that no optimal completion extends, so the
   result is exact; the label count is capped (``DpOptions.max_labels``) — past the cap the plan is
   returned with its Lagrangian gap and status ``feasible``.

Steady state (``Problem(steady_state=True)``): each device's wrap switch (its last task → its
first) couples two positions. The DP fixes the ω_dev of every wrapped device's first task, one
run per combination (at most :attr:`solvers.options.DpOptions.max_wrap_runs`), charges the wrap to the last task's
options (now a function of its option alone) and keeps the cheapest run: still exact. A wrap
latency is additive only before the chain's first task; a chain whose other devices pay a
wrap latency (which may overlap the work of the devices before them) is not a DP chain.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from frontier.errors import InputError

from .feasibility import latest_makespan_s, meets_deadline
from .model import Problem
from .options import DpOptions


@dataclass(frozen=True)
class ChainArrays:
    """Per-position arrays of a chain: duration, energy (incl. P_total·t) and switch matrices."""

    order: list[int]
    t: list[np.ndarray]
    e: list[np.ndarray]
    tau: list[np.ndarray | None]     # switch latency from the previous position's option
    sw: list[np.ndarray | None]      # switch energy incl. P_total·τ


def chain_order(p: Problem, opts: DpOptions = DpOptions()) -> list[int] | None:
    """The chain order if the problem is a chain whose switches are all between neighbours
    (in a steady state: whose wrap latencies are additive and few enough to enumerate, at
    most ``opts.max_wrap_runs`` runs; see the module docstring)."""
    ix = p.index
    order = ix.order
    for a, b in zip(order, order[1:]):
        if not (ix.dev_prev[b] == a or a in ix.preds[b]):
            return None
    for pos, v in enumerate(order):
        if ix.tau[v] is not None and (pos == 0 or ix.dev_prev[v] != order[pos - 1]):
            return None
    runs = 1
    for _, first, groups in _wraps(p):
        if first != order[0] and ix.wrap_tau[first].any():
            return None
        runs *= len(groups)
    if runs > opts.max_wrap_runs:
        return None
    return order


def _wraps(p: Problem) -> list[tuple[int, int, list[list[int]]]]:
    """(last, first, the first task's options grouped by ω_dev) of each priced wrap pair."""
    ix = p.index
    out = []
    for first in range(ix.n):
        if ix.wrap_tau[first] is None:
            continue
        groups: dict = {}
        for b, o in enumerate(p.tasks[first].options):
            groups.setdefault(o.omega.dev, []).append(b)
        out.append((ix.wrap_prev[first], first, list(groups.values())))
    return out


def _fix_wrap(p: Problem, ca: ChainArrays, pos: dict[int, int],
              fixed: list[tuple[int, int, list[int]]]) -> ChainArrays:
    """``ca`` with each wrapped first task restricted to the options ``sel`` (one ω_dev) and
    its wrap switch charged to the last task's options."""
    ix = p.index
    t, e, tau, sw = list(ca.t), list(ca.e), list(ca.tau), list(ca.sw)
    n = len(t)
    for last, first, sel in fixed:
        i, j = pos[first], pos[last]
        t[i], e[i] = t[i][sel], e[i][sel]
        if tau[i] is not None:
            tau[i], sw[i] = tau[i][:, sel], sw[i][:, sel]
        if i + 1 < n and tau[i + 1] is not None:
            tau[i + 1], sw[i + 1] = tau[i + 1][sel, :], sw[i + 1][sel, :]
        # every option in sel has the same ω_dev, so the wrap's column is the same for all
        wt = ix.wrap_tau[first][:, sel[0]]
        t[j] = t[j] + wt
        e[j] = e[j] + ix.wrap_extra[first][:, sel[0]] + ix.p_total * wt
    return replace(ca, t=t, e=e, tau=tau, sw=sw)


def chain_arrays(p: Problem, order: list[int]) -> ChainArrays:
    """Arrays of the chain in order."""
    ix = p.index
    P = ix.p_total
    t = [ix.time[v] for v in order]
    e = [ix.cost[v] + P * ix.time[v] for v in order]
    tau = [ix.tau[v] for v in order]
    sw = [None if ix.tau[v] is None else ix.extra[v] + P * ix.tau[v] for v in order]
    return ChainArrays(order, t, e, tau, sw)


def _viterbi(ca: ChainArrays, lam: float) -> tuple[float, list[int]]:
    """min Σ (e + λ t) over the chain with switches; returns (value, choice per position)."""
    n = len(ca.t)
    val = ca.e[0] + lam * ca.t[0]
    back: list[np.ndarray | None] = [None]
    for i in range(1, n):
        own = ca.e[i] + lam * ca.t[i]
        if ca.tau[i] is None:
            j = int(np.argmin(val))
            back.append(np.full(len(own), j))
            val = own + val[j]
        else:
            m = val[:, None] + ca.sw[i] + lam * ca.tau[i]
            arg = np.argmin(m, axis=0)
            back.append(arg)
            val = own + m[arg, np.arange(m.shape[1])]
    b = int(np.argmin(val))
    best = float(val[b])
    ch = [0] * n
    for i in range(n - 1, -1, -1):
        ch[i] = b
        if i:
            b = int(back[i][b])
    return best, ch


def _suffix(ca: ChainArrays, lam: float | None) -> list[np.ndarray]:
    """h[i][a]: min over completions after position i (given option a at i) of Σ(e + λ t), or of
    Σ t when ``lam`` is None (fastest suffix)."""
    n = len(ca.t)
    h = [np.zeros(len(ca.t[-1]))] * n
    h = list(h)
    h[n - 1] = np.zeros(len(ca.t[n - 1]))
    for i in range(n - 1, 0, -1):
        own = ca.t[i] if lam is None else ca.e[i] + lam * ca.t[i]
        nxt = own + h[i]
        if ca.tau[i] is None:
            h[i - 1] = np.full(len(ca.t[i - 1]), float(nxt.min()))
        else:
            link = ca.tau[i] if lam is None else ca.sw[i] + lam * ca.tau[i]
            h[i - 1] = (link + nxt[None, :]).min(axis=1)
    return h


def _path_te(ca: ChainArrays, ch: list[int]) -> tuple[float, float]:
    t = sum(float(ca.t[i][c]) for i, c in enumerate(ch))
    e = sum(float(ca.e[i][c]) for i, c in enumerate(ch))
    for i in range(1, len(ch)):
        if ca.tau[i] is not None:
            t += float(ca.tau[i][ch[i - 1], ch[i]])
            e += float(ca.sw[i][ch[i - 1], ch[i]])
    return t, e


@dataclass(frozen=True)
class ChainResult:
    """Outcome of :func:`solve_chain`: choice per task (problem order), energy, bound, exactness."""

    choice: list[int]
    energy_j: float
    lower_bound_j: float
    exact: bool
    labels: int


def lagrangian(ca: ChainArrays, deadline_s: float, iters: int = 60):
    """Best Lagrangian bound and the best feasible Viterbi path found while bisecting on λ.
    Feasible means :func:`solvers.feasibility.meets_deadline`; the bound is for makespans up
    to :func:`solvers.feasibility.latest_makespan_s` (the same set of plans)."""
    D_max = latest_makespan_s(deadline_s)
    v0, ch0 = _viterbi(ca, 0.0)
    t0, e0 = _path_te(ca, ch0)
    if meets_deadline(t0, deadline_s):
        return 0.0, v0, ch0, e0            # unconstrained optimum meets the deadline: exact
    lo, hi = 0.0, 1.0
    best_lb = v0
    best_ch, best_e = None, np.inf
    while True:
        v, ch = _viterbi(ca, hi)
        t, e = _path_te(ca, ch)
        best_lb = max(best_lb, v - hi * D_max)
        if meets_deadline(t, deadline_s):
            best_ch, best_e = ch, e
            break
        lo, hi = hi, hi * 4
        if hi > 1e15:
            return hi, best_lb, None, np.inf
    infeasible: list[list[int]] = []
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        v, ch = _viterbi(ca, mid)
        t, e = _path_te(ca, ch)
        best_lb = max(best_lb, v - mid * D_max)
        if meets_deadline(t, deadline_s):
            hi = mid
            if e < best_e:
                best_ch, best_e = ch, e
        else:
            lo = mid
            infeasible = [ch]
        if hi - lo <= 1e-9 * hi:          # λ to 1e-9: the DP closes what is left
            break
    # Splice the cheap infeasible path with the feasible one at one or two cut points: the
    # Lagrangian paths differ in few places, so this closes most of the duality gap cheaply.
    for a in infeasible:
        ch, e = _splice(ca, a, best_ch, D_max)
        if e < best_e:
            best_ch, best_e = ch, e
    return hi, best_lb, best_ch, best_e


def _prefix_te(ca: ChainArrays, ch: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative (time, energy) of positions < i, without the switch into position i."""
    n = len(ch)
    t = np.zeros(n + 1)
    e = np.zeros(n + 1)
    for i, c in enumerate(ch):
        dt = float(ca.t[i][c])
        de = float(ca.e[i][c])
        if i and ca.tau[i] is not None:
            dt += float(ca.tau[i][ch[i - 1], c])
            de += float(ca.sw[i][ch[i - 1], c])
        t[i + 1] = t[i] + dt
        e[i + 1] = e[i] + de
    return t, e


def _own_and_switch(ca: ChainArrays, i: int, prev: int, cur: int, what: str) -> float:
    """Own time/energy of option ``cur`` at position i plus the switch from ``prev``."""
    own = float((ca.t if what == "t" else ca.e)[i][cur])
    if i and prev >= 0 and ca.tau[i] is not None:
        own += float((ca.tau if what == "t" else ca.sw)[i][prev, cur])
    return own


def _splice(ca: ChainArrays, a: list[int], b: list[int], D: float) -> tuple[list[int], float]:
    """Best feasible b[:i] + a[i:j] + b[j:] (i < j) by vectorised search over cut points.

    Time (and likewise energy) of the spliced path = tb[n] + G[i] + H[j] with
    G[i] = tb[i] − ta[i+1] + (a[i] after b[i−1]) and H[j] = ta[j] − tb[j+1] + (b[j] after a[j−1]).
    """
    n = len(a)
    ta, ea = _prefix_te(ca, a)
    tb, eb = _prefix_te(ca, b)
    g = {}
    h = {}
    for what, pa, pb in (("t", ta, tb), ("e", ea, eb)):
        gi = np.array([pb[i] - pa[i + 1] + _own_and_switch(ca, i, b[i - 1] if i else -1, a[i], what)
                       for i in range(n)])
        hj = np.empty(n + 1)
        hj[n] = pa[n] - pb[n]
        for j in range(1, n):
            hj[j] = pa[j] - pb[j + 1] + _own_and_switch(ca, j, a[j - 1], b[j], what)
        hj[0] = np.inf
        g[what], h[what] = gi, hj
    budget = D - tb[n]                    # D: the latest makespan allowed (tolerance included)
    best = (float(eb[n]), 0, 0)
    for i in range(n):
        dt = g["t"][i] + h["t"][i + 1:]
        de = g["e"][i] + h["e"][i + 1:]
        de = np.where(dt <= budget, de, np.inf)
        k = int(np.argmin(de))
        if eb[n] + de[k] < best[0]:
            best = (float(eb[n] + de[k]), i, i + 1 + k)
    _, i, j = best
    ch = list(b[:i]) + list(a[i:j]) + list(b[j:])
    t, e = _path_te(ca, ch)
    if t > D:                        # guard against round-off at the boundary
        return list(b), _path_te(ca, b)[1]
    return ch, e


def solve_chain(p: Problem, deadline_s: float, order: list[int], opts: DpOptions = DpOptions(),
                rel_tol: float = 1e-12, *, _ca: ChainArrays | None = None) -> ChainResult:
    """Exact minimum-energy choice for a chain under ``deadline_s`` (see module docstring);
    ``opts``: the label cap and the incumbent pass's time bucket. ``_ca``: the chain's arrays
    as :func:`_solve_wrapped` fixed them (internal)."""
    max_labels = opts.max_labels
    if _ca is None and _wraps(p):
        return _solve_wrapped(p, deadline_s, order, opts, rel_tol)
    ca = chain_arrays(p, order) if _ca is None else _ca
    # One feasibility predicate (solvers.feasibility): the DP optimises over every makespan
    # that meets the deadline, so it accepts what Problem.check_feasible accepts.
    lam, lb, ch, ub = lagrangian(ca, deadline_s)
    deadline_s = latest_makespan_s(deadline_s)
    if ch is None:
        raise InputError("no feasible chain plan")   # callers check feasibility first
    tol = rel_tol * max(abs(ub), 1.0)
    exact = ub - lb <= tol
    labels = 0
    suffixes = _suffixes(ca, lam, opts.multipliers) if not exact else None
    if not exact:
        # A beam search first tightens the incumbent, which shrinks the exact DP's band.
        got = _pareto_dp(ca, deadline_s, lam, ub, tol, min(max_labels, opts.incumbent_max_labels),
                         bucket_s=opts.bucket_rel * deadline_s, suffixes=suffixes)
        if got is not None and got[1] < ub:
            ch, ub = got[0], got[1]
            exact = ub - lb <= tol
    if not exact:
        got = _pareto_dp(ca, deadline_s, lam, ub, tol, max_labels, suffixes=suffixes)
        if got is not None:
            ch2, e2, labels = got
            if e2 < ub:
                ch, ub = ch2, e2
            exact = True
            lb = ub
    choice = [0] * p.index.n
    for pos, v in enumerate(order):
        choice[v] = ch[pos]
    return ChainResult(choice, float(ub), float(lb), exact, labels)   # the bound raw, unclamped


def _solve_wrapped(p: Problem, deadline_s: float, order: list[int], opts: DpOptions,
                   rel_tol: float) -> ChainResult:
    """:func:`solve_chain` of a steady state: one run per combination of the wrapped first
    tasks' ω_dev (:func:`_fix_wrap`), the cheapest plan, and the least bound over the runs
    (the optimum is the least of the runs' optima; a run no plan fits has none)."""
    wraps = _wraps(p)
    pos = {v: i for i, v in enumerate(order)}
    ca = chain_arrays(p, order)
    best: ChainResult | None = None
    lb, labels, runs_exact = math.inf, 0, True
    for sels in itertools.product(*(groups for _, _, groups in wraps)):
        fixed = [(last, first, sel) for (last, first, _), sel in zip(wraps, sels)]
        cf = _fix_wrap(p, ca, pos, fixed)
        # the run's fastest plan (its least makespan, the wrap included) misses: no plan fits
        if not meets_deadline(float((cf.t[0] + _suffix(cf, None)[0]).min()), deadline_s):
            continue
        try:
            r = solve_chain(p, deadline_s, order, opts, rel_tol, _ca=cf)
        except ValueError:
            continue
        choice = list(r.choice)
        for _, first, sel in fixed:
            choice[first] = sel[choice[first]]
        lb, labels = min(lb, r.lower_bound_j), labels + r.labels
        runs_exact &= r.exact
        if best is None or r.energy_j < best.energy_j:
            best = replace(r, choice=choice)
    if best is None:
        raise InputError("no feasible chain plan")   # callers check feasibility first
    # exact when every run was (then lb is the least optimum, the best plan's energy)
    return ChainResult(best.choice, best.energy_j, float(lb), runs_exact, labels)


def _cross_state_prune(ca: ChainArrays, nxt: int, T, E, S, par):
    """Drop labels dominated by a label of *another* state even after that one pays the
    largest possible switch into the next position: (t + τmax, e + εmax) ≤ (t', e'). Valid
    because τ, ε ≥ 0, so the other label's completions cost at most that much more."""
    if len(T) < 2:
        return T, E, S, par
    if nxt >= len(ca.t) or ca.tau[nxt] is None:
        dt = de = 0.0                    # the state no longer matters: plain Pareto over all
    else:
        dt = float(ca.tau[nxt].max())
        de = float(ca.sw[nxt].max())
    o = np.lexsort((E, T))
    T, E, S, par = T[o], E[o], S[o], par[o]
    pref = np.minimum.accumulate(E)
    if dt == 0.0:
        # Energy-only switches (τ = 0, ε > 0) still cost the other label up to εmax more.
        keep = np.ones(len(T), dtype=bool)
        keep[1:] = E[1:] < pref[:-1] + de
    else:
        # last label with t_i ≤ t_j − dt (strictly earlier, since dt > 0)
        j = np.searchsorted(T, T - dt, side="right") - 1
        dom = (j >= 0) & (pref[np.maximum(j, 0)] + de <= E)
        keep = ~dom
    return T[keep], E[keep], S[keep], par[keep]


def _suffixes(ca: ChainArrays, lam: float, factors: tuple[float, ...]):
    """The multipliers λ·factor and, per multiplier, the suffix bounds h (:func:`_suffix`),
    plus the fastest suffix: what both passes of :func:`_pareto_dp` prune with."""
    lams = [lam * f for f in factors]
    return lams, [_suffix(ca, x) for x in lams], _suffix(ca, None)


def _pareto_dp(ca: ChainArrays, D: float, lam: float, ub: float, tol: float, max_labels: int,
               beam: int | None = None, bucket_s: float | None = None, suffixes=None):
    """Bounded (time, energy) Pareto DP; None when the label cap is hit. With ``beam`` only the
    ``beam`` labels with the best completion bounds are kept per position, and with ``bucket_s``
    one label (the cheapest) per state and time bucket: heuristics that find a good incumbent
    fast (not exact)."""
    n = len(ca.t)
    # Several multipliers: each gives a valid completion bound; their max follows the convex
    # envelope of the suffix's cost-vs-time curve better than one λ (DpOptions.multipliers).
    lams, h_lams, h_time = suffixes if suffixes is not None else _suffixes(ca, lam, DpOptions().multipliers)

    def bound(i: int, tt: np.ndarray, ee: np.ndarray, states) -> np.ndarray:
        b = None
        for x, h in zip(lams, h_lams):
            v = ee + x * (tt - D) + (h[i][states] if states is not None else h[i][None, :])
            b = v if b is None else np.maximum(b, v)
        return b

    tslack = 0.0                  # D is the latest makespan allowed, tolerance included
    # labels at position i: arrays T, E, state (option), parent index
    T = ca.t[0].copy()
    E = ca.e[0].copy()
    S = np.arange(len(T))
    keep = (T + h_time[0] <= D + tslack) & (bound(0, T, E, S) <= ub + tol)
    T, E, S = T[keep], E[keep], S[keep]
    state_dtype = np.int16 if max(len(x) for x in ca.t) < 2**15 else np.int32
    parents: list[tuple[np.ndarray, np.ndarray]] = [(S.astype(state_dtype), np.full(len(S), -1, dtype=np.int32))]
    total = len(T)
    for i in range(1, n):
        k = len(ca.t[i])
        if ca.tau[i] is None:
            tt = T[:, None] + ca.t[i][None, :]
            ee = E[:, None] + ca.e[i][None, :]
        else:
            tt = T[:, None] + ca.tau[i][S] + ca.t[i][None, :]
            ee = E[:, None] + ca.sw[i][S] + ca.e[i][None, :]
        ok = (tt + h_time[i][None, :] <= D + tslack)
        ok &= bound(i, tt, ee, None) <= ub + tol
        src, st = np.nonzero(ok)
        tt, ee = tt[src, st], ee[src, st]
        o = np.lexsort((ee, tt, st))
        src, st, tt, ee = src[o], st[o], tt[o], ee[o]
        bounds = np.searchsorted(st, np.arange(k + 1))
        keep = np.zeros(len(st), dtype=bool)
        for b in range(k):
            a, z = bounds[b], bounds[b + 1]
            if a == z:
                continue
            seg = ee[a:z]
            run = np.minimum.accumulate(seg)
            kk = np.empty(z - a, dtype=bool)
            kk[0] = True
            kk[1:] = seg[1:] < run[:-1]
            keep[a:z] = kk
        T, E, S, par = tt[keep], ee[keep], st[keep], src[keep]
        T, E, S, par = _cross_state_prune(ca, i + 1, T, E, S, par)
        if bucket_s is not None and len(T) > 1:
            o = np.lexsort((T, S))
            T, E, S, par = T[o], E[o], S[o], par[o]
            b = np.floor(T / bucket_s).astype(np.int64)
            last = np.ones(len(T), dtype=bool)
            last[:-1] = (S[1:] != S[:-1]) | (b[1:] != b[:-1])
            T, E, S, par = T[last], E[last], S[last], par[last]
        if beam is not None and len(T) > beam:
            sel = np.argpartition(bound(i, T, E, S), beam)[:beam]
            T, E, S, par = T[sel], E[sel], S[sel], par[sel]
        parents.append((S.astype(state_dtype), par.astype(np.int32)))   # compact: labels pile up
        total += len(T)
        if total > max_labels or len(T) == 0:
            return None
    j = int(np.argmin(E))
    best = float(E[j])
    ch = [0] * n
    for i in range(n - 1, -1, -1):
        S_i, par = parents[i]
        ch[i] = int(S_i[j])
        j = int(par[j])
    return ch, best, total
