"""The fast method's lower bound with switch costs: the best of a few duals, raised by ascent.

The hull LP ignores switches; its duals give a Lagrangian bound (:mod:`solvers.lagrangian`)
that already charges them. :func:`switch_bound` tries one more set of multipliers: the duals of
the LP with constant switch costs where that LP is small (:mod:`solvers.switch_lp`), else of
the surrogate LP (:func:`solvers.lagrangian.switch_surrogate_duals`), and raises the best start
by supergradient ascent over conserving flows (:mod:`solvers.ascent`). One more LP solve and
the ascent's steps: worth it for a single plan, not per point of a curve.
"""

from __future__ import annotations

import numpy as np

from .ascent import flow_ascent_capped
from .hull_lp import HullLP, LPResult
from .lagrangian import lagrangian_bound, switch_surrogate_duals
from .model import Problem
from .options import BoundOptions
from .switch_lp import switch_lp_duals


def switch_bound(p: Problem, lp: HullLP, res: LPResult, deadline_s: float,
                 opts: BoundOptions = BoundOptions()) -> float:
    """:func:`switch_bound_capped` without a safety net: the bound after ``opts.ascent.iters``
    steps."""
    return switch_bound_capped(p, lp, res, deadline_s, opts)[0]


def switch_bound_capped(p: Problem, lp: HullLP, res: LPResult, deadline_s: float,
                        opts: BoundOptions = BoundOptions(),
                        seconds: float | None = None) -> tuple[float, bool]:
    """The Lagrangian bound with switch costs from the best of the hull LP's duals (``res``)
    and one more LP's, raised by :func:`solvers.ascent.flow_ascent`. The other LP is the one
    with constant switch costs where it is small (:func:`solvers.switch_lp.switch_lp_duals`,
    the transport LP's value), else the surrogate LP (:func:`solvers.lagrangian.switch_surrogate_duals`), which
    needs no more columns than the hull LP. One more LP solve and the ascent: worth it for a
    single plan, not per point of a curve. ``opts``: the LP size limit, the surrogate's share
    and the ascent's steps. Returns (bound J, whether the ``seconds`` wall-clock safety net cut
    the ascent short)."""

    def evaluate(m: np.ndarray) -> tuple[float, np.ndarray]:
        return lagrangian_bound(p, lp, m, deadline_s)

    cands = [res.duals]
    mu_sw = switch_lp_duals(p, lp.rows, deadline_s, opts.switch_lp_max_columns)
    if mu_sw is not None:
        cands.append(mu_sw)
    elif p.n_tasks <= opts.surrogate_max_tasks:
        mu = switch_surrogate_duals(p, lp, deadline_s, opts.surrogate_share)
        if mu is not None:
            cands += [mu, 0.5 * (mu + res.duals)]
    start = max(cands, key=lambda m: evaluate(m)[0])
    value, _, capped = flow_ascent_capped(p, lp.rows, start, deadline_s, evaluate, opts.ascent, seconds)
    return value, capped
