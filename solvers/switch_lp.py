"""The LP relaxation *with* constant switch costs, for the Lagrangian bound of small problems.

The hull LP (:class:`solvers.hull_lp.HullLP`) drops switch costs, so its duals price no edge for
them; when switches cost energy but no time its duals do not see them at all. This LP keeps
them with solver-notes §4's per-ω rows: every option of every task is a column x, and each
consecutive same-device pair (u, w) has one z per operating point ω with
z_ω ≥ X_u,ω − X_w,ω; the switch indicator Σ_ω z_ω adds its latency to the device edge and its
extra energy to the objective. That is the transport LP's value (both charge
c·Σ_ω max(0, X_u,ω − X_w,ω)) with K instead of K² columns per pair, so its duals give
:func:`solvers.lagrangian.lagrangian_bound` the transport LP's strength.

It is solved only where it is cheap: all switch costs constant (a
:class:`~solvers.model.ConstantTransition`) and at most ``max_columns`` columns (options,
per-ω switch columns and starts; default
:attr:`solvers.options.BoundOptions.switch_lp_max_columns`). Measured
with HiGHS's interior point method (``linprog(method="highs-ipm")``, about twice as fast as
its dual simplex from 8x32 up) on 1F1B profiles with 60 clocks and 1 ms switches, 2-core
machine: 4x8 (7.5 k columns) 0.26 s; 8x32 (61 k) 8.5 s; 16x64 (247 k) about 2 minutes.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from .index import constant_switch
from .model import Problem
from .options import BoundOptions


def _pairs(p: Problem) -> dict[int, tuple] | None:
    """``constant_switch`` of every device pair with a switch cost, keyed by the later task;
    None when some pair's costs depend on the operating points."""
    ix = p.index
    out = {}
    for w in range(ix.n):
        u = ix.dev_prev[w]
        if u < 0 or ix.tau[w] is None:
            continue
        c = constant_switch(p, u, w)
        if c is None:
            return None
        out[w] = c
    return out


def switch_lp_duals(p: Problem, rows: list[tuple[int, int]], deadline_s: float,
                    max_columns: int = BoundOptions().switch_lp_max_columns) -> np.ndarray | None:
    """Duals μ ≥ 0 of the precedence ``rows`` (``HullLP.rows``: (u, w) for S_u + T_u (+ switch
    latency on device edges) ≤ S_w, and (v, -1) for S_v + T_v ≤ M) in the LP with constant
    switch costs at ``deadline_s``; None when the costs are not constant, the LP has more than
    ``max_columns`` columns, or it fails. Any μ ≥ 0 gives a valid Lagrangian bound, so the
    LP's accuracy only affects how strong that bound is."""
    ix = p.index
    n = ix.n
    z_most = sum(ix.k[ix.dev_prev[w]] for w in range(n) if ix.tau[w] is not None)
    if n + 1 + sum(ix.k) + z_most > max_columns:        # before the per-pair checks
        return None
    pairs = _pairs(p)
    if not pairs:
        return None
    # columns: S (n), M, x (every option of every task), z (one per ω of u per device pair)
    xoff = np.concatenate([[0], np.cumsum(ix.k)]).astype(int) + n + 1
    zoff, col = {}, int(xoff[-1])
    for w, (_, _, groups_u, _) in pairs.items():
        zoff[w] = col
        col += len(groups_u)
    cost = np.zeros(col)
    cost[n] = ix.p_total
    cost[xoff[0]:xoff[-1]] = ix.cost_flat
    r, c, val = [], [], []

    def add(row, cols, vals):
        r.extend([row] * len(cols))
        c.extend(cols)
        val.extend(vals)

    for k, (u, w) in enumerate(rows):
        add(k, [u, w if w >= 0 else n], [1.0, -1.0])
        add(k, range(xoff[u], xoff[u + 1]), ix.time[u])
        if w >= 0 and ix.dev_prev[w] == u and w in pairs and pairs[w][0] > 0:
            m = len(pairs[w][2])
            add(k, range(zoff[w], zoff[w] + m), [pairs[w][0]] * m)
    k = len(rows)
    for w, (_, extra_j, groups_u, groups_w) in pairs.items():
        u = ix.dev_prev[w]
        cost[zoff[w]:zoff[w] + len(groups_u)] = extra_j
        for j, (om, aa) in enumerate(groups_u.items()):     # X_u,ω − X_w,ω − z_ω ≤ 0
            bb = groups_w.get(om, [])
            add(k, [xoff[u] + a for a in aa] + [xoff[w] + b for b in bb] + [zoff[w] + j],
                [1.0] * len(aa) + [-1.0] * len(bb) + [-1.0])
            k += 1
    A_ub = coo_matrix((val, (r, c)), shape=(k, col)).tocsr()
    ec = np.arange(xoff[0], xoff[-1])
    A_eq = coo_matrix((np.ones(ec.size), (ix.option_owner, ec)), shape=(n, col)).tocsr()
    bounds = np.zeros((col, 2))
    bounds[:, 1] = np.inf
    bounds[n, 1] = deadline_s
    bounds[xoff[0]:, 1] = 1.0
    res = linprog(cost, A_ub=A_ub, b_ub=np.zeros(k), A_eq=A_eq, b_eq=np.ones(n),
                  bounds=bounds, method="highs-ipm")
    if res.status != 0:
        return None
    return np.maximum(-np.asarray(res.ineqlin.marginals)[:len(rows)], 0.0)
