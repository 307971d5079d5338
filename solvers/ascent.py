"""Raise the Lagrangian bound with switch costs by supergradient ascent over conserving flows.

The bound of :func:`solvers.lagrangian.lagrangian_bound` holds for any multipliers μ ≥ 0 on the
precedence rows, and it is largest (the value of the LP with switch costs, solver-notes §4)
at that LP's duals. The hull LP's duals ignore switches; on 1F1B 16x64 with 1 ms switches
they leave the bound 0.06 % below that LP, whose own solve takes about a minute there.

The ascent starts from given duals and keeps flow conservation at every task, so the start
times drop out of the Lagrangian and its supergradient along a conserving direction is just
the plan's path lengths: for a row (u, w), ``T_u + τ_uw`` under the per-device Viterbi choice
x*, less the deadline on rows into the makespan. Each step projects that vector onto the
conserving directions (a least-squares fit of node potentials, one sparse Laplacian solve),
holds rows whose μ would turn negative at 0 change, and takes a Polyak step towards a target
a little above the best bound so far, halving the margin when the bound stalls. Every
iterate's bound is valid, so stopping early loses only strength.

Measured on 1F1B 16x64 (60 clocks, 1 ms switches, 2-core machine) at 1.05x: from the
surrogate LP's duals (:func:`solvers.lagrangian.switch_surrogate_duals`), 150 iterations
(4.3 s) end 1.0 J below the LP with switch costs (whose own solve takes 35–70 s there); from
the hull LP's duals the same 150 iterations end 11.9 J below it: the start matters. A plain
supergradient step, which leaves the flows, is charged for the conservation it breaks and
gained nothing. The step counts and margins are :class:`solvers.options.AscentOptions`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from scipy.sparse import coo_matrix, identity
from scipy.sparse.linalg import spsolve

from .model import Problem
from .options import AscentOptions


def _incidence(n: int, rows: list[tuple[int, int]]):
    """Node–row incidence of the tasks that must conserve flow (those with an incoming row:
    a task without one starts at 0 whatever flows out of it), +1 at a row's tail and −1 at
    its head; rows into the makespan (head −1) have no head node."""
    heads = np.array([w for _, w in rows], dtype=int)
    inner = np.zeros(n, dtype=bool)
    inner[heads[heads >= 0]] = True
    node = np.full(n, -1)
    node[inner] = np.arange(int(inner.sum()))
    r, c, v = [], [], []
    for k, (u, w) in enumerate(rows):
        if inner[u]:
            r.append(node[u])
            c.append(k)
            v.append(1.0)
        if w >= 0:
            r.append(node[w])
            c.append(k)
            v.append(-1.0)
    return coo_matrix((v, (r, c)), shape=(int(inner.sum()), len(rows))).tocsr()


def _project(B, g: np.ndarray, free: np.ndarray) -> np.ndarray:
    """``g`` on the ``free`` rows minus the potential differences that fit it best in least
    squares: a direction that changes no task's net flow (0 on the other rows)."""
    Bf = B[:, free]
    lap = (Bf @ Bf.T).tocsc()
    # nodes whose every row is held have an empty Laplacian row; any potential does there
    lap = lap + 1e-12 * identity(lap.shape[0], format="csc")
    pi = spsolve(lap, Bf @ g[free])
    return np.where(free, g - B.T @ pi, 0.0)


def flow_ascent(p: Problem, rows: list[tuple[int, int]], duals: np.ndarray, deadline_s: float,
                evaluate: Callable[[np.ndarray], tuple[float, np.ndarray]],
                iters: int | None = None, seconds: float | None = None,
                opts: AscentOptions = AscentOptions()) -> tuple[float, np.ndarray]:
    """The best Lagrangian bound found from ``duals`` (μ ≥ 0 per row of ``rows``, as
    ``HullLP.rows``) in ``iters`` steps (default ``opts.iters``; fewer if the ``seconds``
    wall-clock safety net fires, see :func:`flow_ascent_capped`), and its multipliers.

    ``evaluate(μ)`` returns (bound J, per-task choice x*), e.g.
    ``lambda m: lagrangian_bound(p, lp, m, deadline_s)`` (:mod:`solvers.lagrangian`). The result is never below
    ``evaluate(duals)``; deterministic for given inputs unless ``seconds`` cuts it short.

    Example (``p`` a problem with switch costs, ``D`` its deadline in s)::

        lp = HullLP(p)
        bound_j, mu = flow_ascent(p, lp.rows, lp.solve(D).duals, D,
                                  lambda m: lagrangian_bound(p, lp, m, D))
    """
    if iters is not None:
        opts = replace(opts, iters=int(iters))
    value, mu, _ = flow_ascent_capped(p, rows, duals, deadline_s, evaluate, opts, seconds)
    return value, mu


def flow_ascent_capped(p: Problem, rows: list[tuple[int, int]], duals: np.ndarray, deadline_s: float,
                       evaluate: Callable[[np.ndarray], tuple[float, np.ndarray]],
                       opts: AscentOptions = AscentOptions(),
                       seconds: float | None = None) -> tuple[float, np.ndarray, bool]:
    """:func:`flow_ascent` with ``opts.iters`` steps (its work budget), plus whether the
    ``seconds`` wall-clock safety net stopped it before them (then the bound depends on the
    machine's speed)."""
    ix = p.index
    task_steps = int(opts.max_task_steps / max(ix.n, 1))
    if task_steps < min(opts.iters, opts.min_steps):
        task_steps = 0                        # too few to move the bound (AscentOptions.min_steps)
    iters = min(opts.iters, task_steps)
    mu = np.maximum(np.asarray(duals, dtype=float), 0.0)
    if not rows:
        return evaluate(mu)[0], mu, False
    tail = np.array([u for u, _ in rows], dtype=int)
    head = np.array([w for _, w in rows], dtype=int)
    on_device = np.array([w >= 0 and ix.dev_prev[w] == u for u, w in rows])
    to_end = head < 0
    B = _incidence(ix.n, rows)
    best, best_mu = -np.inf, mu
    margin, stall = None, 0
    capped = False
    t0 = time.perf_counter()
    for it in range(iters + 1):
        val, x = evaluate(mu)
        if val > best + 1e-9 * abs(val):
            best, best_mu, stall = val, mu, 0
        else:
            stall += 1
            if stall >= opts.patience:
                margin, stall = 0.5 * margin, 0
        if it == iters:
            break
        if seconds is not None and time.perf_counter() - t0 > seconds:
            capped = True
            break
        if margin is None:
            margin = opts.margin * max(abs(val), 1.0)
        target = best + margin
        # supergradient along conserving directions: path lengths under x*, less the
        # deadline where the row enters the makespan (its multiplier exceeds P then)
        dur, tau = ix.durations(x), ix.switch_tau(x)
        g = dur[tail] + np.where(on_device, tau[np.maximum(head, 0)], 0.0)
        if mu[to_end].sum() >= ix.p_total:
            g = g - np.where(to_end, deadline_s, 0.0)
        free = np.ones(len(rows), dtype=bool)
        step, d = 0.0, np.zeros(len(rows))
        for _ in range(opts.passes):         # hold rows the step would drive below 0
            d = _project(B, g, free)
            norm2 = float(d @ d)
            if norm2 <= 1e-18 * float(g @ g):     # nothing left to move along
                step = 0.0
                break
            step = max(target - val, 0.0) / norm2
            hit = free & (mu + step * d < 0.0)
            if not hit.any():
                break
            free &= ~hit
        if step <= 0.0 or not np.any(d):
            break
        neg = d < 0
        if neg.any():
            step = min(step, float(np.min(mu[neg] / -d[neg])))
        mu = np.maximum(mu + step * d, 0.0)
    return best, best_mu, capped
