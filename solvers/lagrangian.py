"""The Lagrangian bound with switch costs, from any flow on the hull LP's precedence rows.

Dualise every precedence row of the hull LP (:class:`solvers.hull_lp.HullLP`) with a
multiplier μ ≥ 0. The LP's own duals are such a μ: an s–t flow on the precedence edges. For
any μ the problem separates per device into a chain with per-task weight ``cost + f_v·T``
(``f_v``: the flow out of task v) plus switch costs ``extra + μ_e·τ`` on its device edges,
which a Viterbi pass over options solves exactly (:func:`device_viterbi`). The bound is that
value plus a constant; conservation errors of numerical duals are charged explicitly (start
times boxed in [0, D]), so it is valid for every μ ≥ 0. With switch costs it is at least
the hull LP's value at the LP's duals; other multipliers (:func:`switch_surrogate_duals`,
:mod:`solvers.switch_lp`, :mod:`solvers.ascent`) raise it further (:mod:`solvers.bound`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .model import Problem

if TYPE_CHECKING:      # for types only: solvers.periodic (imported by hull_lp) uses this module
    from .hull_lp import HullLP


@dataclass(frozen=True)
class Flow:
    """An s–t flow on the precedence rows (LP duals): per-task outflow f, μ on the device edge
    into each task, and the constant part of the Lagrangian (conservation errors charged),
    ``const_j`` = ``slope_j_per_s`` × the deadline."""

    f: np.ndarray
    mu_dev: np.ndarray
    const_j: float
    slope_j_per_s: float = 0.0


def flow_from_duals(p: Problem, lp: HullLP, duals: np.ndarray, deadline_s: float) -> Flow:
    """Per-task flows from the LP duals; S ∈ [0, D] and M ∈ [0, D] bound the residual terms."""
    ix = p.index
    n = ix.n
    mu = np.asarray(duals, dtype=float)
    u, w = lp.row_pairs[:, 0], lp.row_pairs[:, 1]
    inner = w >= 0
    f = np.bincount(u, weights=mu, minlength=n)
    net = f - np.bincount(w[inner], weights=mu[inner], minlength=n)
    dev = inner & (np.asarray(ix.dev_prev, dtype=np.int64)[np.maximum(w, 0)] == u)
    mu_dev = np.bincount(w[dev], weights=mu[dev], minlength=n)
    flow_sink = float(mu[~inner].sum())
    # S_v appears with coefficient net_v, M with P − flow_sink.
    slope = float(np.minimum(net, 0.0).sum()) + min(0.0, ix.p_total - flow_sink)
    return Flow(f, mu_dev, slope * float(deadline_s), slope)


def device_viterbi(p: Problem, f: np.ndarray, mu_dev: np.ndarray,
                   lockstep: bool = True) -> tuple[float, np.ndarray]:
    """Per device, min Σ (cost + f·T) + Σ switches (extra + μ·τ) exactly; (value, choice).
    Devices that fit :func:`lockstep_layout` go through :func:`viterbi_lockstep` together
    unless ``lockstep`` is False (the per-device loop: the same values and choices)."""
    ix = p.index
    total = 0.0
    choice = np.zeros(ix.n, dtype=int)
    free = ix.switch_free_tasks
    if free.size:
        # no switch matrix on the device: every task's minimum is independent, in one pass
        off, tflat = ix.time_flat
        owner = ix.option_owner
        val = ix.cost_flat + np.asarray(f, dtype=float)[owner] * tflat
        mins = np.minimum.reduceat(val, off)
        pos = np.where(val <= mins[owner], np.arange(val.size), val.size)
        first = np.minimum.reduceat(pos, off) - off        # first minimiser, as np.argmin
        total += float(mins[free].sum())
        choice[free] = first[free]
    lock = lockstep_layout(ix) if lockstep else None
    if lock is not None:
        return viterbi_lockstep(ix, lock, np.asarray(f, dtype=float), mu_dev, choice, total), choice
    for d, seq in ix.dev_seq.items():
        if d in ix.switch_free_devices:
            continue
        val = None
        back = []
        for pos, v in enumerate(seq):
            own = ix.cost[v] + f[v] * ix.time[v]
            if pos == 0:
                val = own.copy()
                back.append(None)
                continue
            if ix.tau[v] is None:
                j = int(np.argmin(val))
                back.append(np.full(len(own), j))
                val = own + val[j]
            else:
                m = val[:, None] + ix.extra[v] + mu_dev[v] * ix.tau[v]
                arg = np.argmin(m, axis=0)
                back.append(arg)
                val = own + m[arg, np.arange(m.shape[1])]
        b = int(np.argmin(val))
        total += float(val[b])
        for pos in range(len(seq) - 1, -1, -1):
            choice[seq[pos]] = b
            if pos:
                b = int(back[pos][b])
    return total, choice


@dataclass(frozen=True)
class Lockstep:
    """Devices with switch costs stepped through together by :func:`viterbi_lockstep`:
    ``tasks[pos]`` the pos-th task of each, ``flat[pos]`` their options' indices in the
    flattened option arrays, ``switch_s``/``extra_j[pos]`` their constant switch latency and
    extra energy (position 0: unused)."""

    tasks: np.ndarray          # positions × devices
    flat: np.ndarray           # positions × devices × options
    switch_s: np.ndarray       # positions × devices
    extra_j: np.ndarray        # positions × devices


def lockstep_layout(ix) -> Lockstep | None:
    """The :class:`Lockstep` layout of a problem's index ``ix`` when every device with switch costs has as many tasks,
    each position has as many options on every device, and every switch costs one constant
    (latency, extra) except that staying on an option is free, as in 1F1B with one clock per
    option; else None. Cached on the index."""
    cache = ix.__dict__.setdefault("_lockstep", [])
    if cache:
        return cache[0]
    cache.append(_lockstep_layout(ix))
    return cache[0]


def _lockstep_layout(ix) -> Lockstep | None:
    """:func:`lockstep_layout`'s layout, built (or refused) once per index."""
    seqs = [seq for d, seq in ix.dev_seq.items() if d not in ix.switch_free_devices]
    if not seqs or len({len(s) for s in seqs}) != 1:
        return None
    tasks = np.array(seqs).T
    ks = np.array(ix.k)[tasks]
    if (ks != ks[0, 0]).any():
        return None
    seen: dict[tuple[int, int], tuple[float, float] | None] = {}   # 1F1B shares its matrices
    consts = []
    for v in tasks[1:].ravel():
        key = (id(ix.tau[v]), id(ix.extra[v]))
        if key not in seen:
            seen[key] = _constant_stay_free(ix.tau[v], ix.extra[v])
        if seen[key] is None:
            return None
        consts.append(seen[key])
    flat = ix.time_flat[0][tasks][:, :, None] + np.arange(ks[0, 0])[None, None, :]
    sw = np.zeros(tasks.shape)
    ex = np.zeros(tasks.shape)
    if consts:
        sw[1:], ex[1:] = np.array(consts).T.reshape(2, *tasks[1:].shape)
    return Lockstep(tasks, flat, sw, ex)


def _constant_stay_free(tau: np.ndarray | None, ext: np.ndarray | None) -> tuple[float, float] | None:
    """(latency, extra energy) of every switch when those are one constant off the diagonal
    and 0 on it (staying on an option is free, every change costs the same); else None."""
    if tau is None or tau.shape[0] != tau.shape[1] or tau.shape[0] < 2:
        return None
    off = ~np.eye(tau.shape[0], dtype=bool)
    t, e = tau[off], ext[off]
    if np.diag(tau).any() or np.diag(ext).any() or np.ptp(t) > 0 or np.ptp(e) > 0 or not (t[0] > 0 or e[0] > 0):
        return None
    return float(t[0]), float(e[0])


def viterbi_lockstep(ix, lock: Lockstep, f: np.ndarray, mu_dev: np.ndarray, choice: np.ndarray,
                      total: float) -> float:
    """:func:`device_viterbi` over the devices of ``lock`` at once, writing their tasks'
    options into ``choice``. Each step costs O(options) per
    device instead of O(options²): the cheapest way into option j is staying on j or the
    cheapest switch from another option, whose cost is one constant. Returns ``total`` plus
    their values, added device by device. The arithmetic, the tie-breaking (first minimiser)
    and the order of the sum are the per-device loop's, so values and choices agree bit for
    bit."""
    own_all = ix.cost_flat + f[ix.option_owner] * ix.time_flat[1]
    n_pos, g = lock.tasks.shape
    rows = np.arange(g)
    val = own_all[lock.flat[0]]
    K = val.shape[1]
    cols = np.arange(K)[None, :]
    back = []
    for pos in range(1, n_pos):
        v = lock.tasks[pos]
        w = (val + lock.extra_j[pos][:, None]) + (mu_dev[v] * lock.switch_s[pos])[:, None]
        a1 = np.argmin(w, axis=1)
        w2 = w.copy()
        w2[rows, a1] = np.inf
        a2 = np.argmin(w2, axis=1)
        sw = np.where(a1[:, None] == cols, a2[:, None], a1[:, None])       # first other minimiser
        sw_val = w[rows[:, None], sw]
        arg = np.where(val < sw_val, cols, np.where(sw_val < val, sw, np.minimum(cols, sw)))
        back.append(arg)
        val = own_all[lock.flat[pos]] + np.where(arg == cols, val, sw_val)
    b = np.argmin(val, axis=1)
    for d in range(g):
        total += float(val[d, b[d]])
    for pos in range(n_pos - 1, -1, -1):
        choice[lock.tasks[pos]] = b
        if pos:
            b = back[pos - 1][rows, b]
    return total


def lagrangian_bound(p: Problem, lp: HullLP, duals: np.ndarray, deadline_s: float):
    """Lagrangian bound from the LP duals with switch costs; returns (bound, per-task choice)."""
    fl = flow_from_duals(p, lp, duals, deadline_s)
    val, choice = device_viterbi(p, fl.f, fl.mu_dev)
    return fl.const_j + val, choice


def switch_surrogate_duals(p: Problem, lp: HullLP, deadline_s: float, share: float) -> np.ndarray | None:
    """Duals of the hull LP with ``share`` × (smallest switch latency) added to every device
    edge, or None when that LP is infeasible. That LP is no relaxation, but any duals μ ≥ 0
    give a valid Lagrangian bound (:func:`lagrangian_bound`), and these price device edges
    as if some switches were paid (for the share, see
    :class:`solvers.options.BoundOptions`)."""
    ix = p.index
    lat = np.zeros(len(lp.rows))
    for k, (u, w) in enumerate(lp.rows):
        if w >= 0 and ix.dev_prev[w] == u and ix.tau[w] is not None:
            pos = ix.tau[w][ix.tau[w] > 0]
            lat[k] = share * float(pos.min()) if pos.size else 0.0
    if not lat.any():
        return None
    res = lp.linprog(deadline_s, lat)
    if res.status != 0:
        return None
    return np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
