"""Backward-compatible names of the fast method, which now lives in one module per idea.

The hull LP is :mod:`solvers.hull_lp`, the Lagrangian bound :mod:`solvers.lagrangian` and
:mod:`solvers.bound`, roundings :mod:`solvers.rounding`, crash and relax
:mod:`solvers.repair`, the search :mod:`solvers.search`, the portfolio
:mod:`solvers.portfolio`, the whole method :mod:`solvers.fast` and curve interpolation
:mod:`solvers.curve`. New code imports from those; the names below keep older imports
(``from solvers.relax import polish_budget``) working.
"""

from __future__ import annotations

from .bound import switch_bound, switch_bound_capped
from .curve import interpolate
from .fast import FastResult, polish_budget, safety_net_s, solve_fast
from .hull_lp import HullLP, LPResult, lower_hull
from .lagrangian import (
    Flow,
    device_viterbi,
    flow_from_duals,
    lagrangian_bound,
    switch_surrogate_duals,
)
from .portfolio import portfolio_members
from .repair import crash, relax, relax_repeatedly
from .rounding import (
    round_lp,
    round_lp_switch_aware,
    round_to_deadline,
    scaled_lagrangian_plan,
    uniform_per_device,
)

__all__ = [
    "FastResult", "Flow", "HullLP", "LPResult", "crash", "device_viterbi", "flow_from_duals",
    "interpolate", "lagrangian_bound", "lower_hull", "polish_budget", "portfolio_members",
    "relax", "relax_repeatedly", "round_lp", "round_lp_switch_aware", "round_to_deadline",
    "safety_net_s", "scaled_lagrangian_plan", "solve_fast", "switch_bound", "switch_bound_capped",
    "switch_surrogate_duals", "uniform_per_device",
]
