"""The portfolio: more searches with other DP caps, in worker processes, beside the first.

Two searches with different label caps end in different local optima, and the better of the
two is steadier across kick seeds than either. It is off by default (no members: on the
benchmarks it changed the plans by at most 0.0004 %, see
:class:`solvers.options.PortfolioOptions`). From ``options.portfolio.min_tasks`` tasks on,
:func:`run_portfolio` starts every extra member of ``options.portfolio.members`` in a worker
process (:mod:`solvers.workers`), runs the first search here meanwhile (after the bound), and
returns every member's result; the cheapest plan wins. Each member is deterministic under its
work budget, so the plan is the same whether the workers ran in parallel or here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .limits import cap_seconds
from .model import Problem
from .options import SearchSettings, SolveOptions
from .search import MemberRun, run_member
from .workers import Pending, start


def portfolio_members(n_tasks: int, options: SolveOptions = SolveOptions()) -> list[SearchSettings]:
    """The searches :func:`solvers.fast.solve_fast` runs for ``n_tasks`` tasks: the in-process
    one first (``options.search``), then ``options.portfolio.members`` when ``n_tasks`` is at
    least ``options.portfolio.min_tasks``."""
    port = options.portfolio
    return [options.search.settings] + (list(port.members) if n_tasks >= port.min_tasks else [])


def run_portfolio(p: Problem, plans: list[np.ndarray], deadline_s: float, work: float, net_s: float,
                  members: list[SearchSettings], parallel: bool, options: SolveOptions,
                  meanwhile: Callable[[], None] = lambda: None) -> tuple[list[MemberRun], list[Pending]]:
    """Every member's :func:`solvers.search.run_member` from the starts ``plans`` with
    ``work`` units and the ``net_s`` wall-clock safety net: the first here, the others in
    worker processes when ``parallel``; ``meanwhile()`` (the bound) runs here before the first
    search. Returns the runs, in member order, and the jobs of the others (where they ran)."""
    timeout_s = net_s + options.portfolio.worker_grace_s
    pending = [start(run_member, p, plans, deadline_s, work, net_s, m, options, parallel=parallel,
                     timeout_s=timeout_s) for m in members[1:]]
    try:
        meanwhile()
        # what the bound left of the call's net (solvers.limits.wall_net), if it is sooner
        runs = [run_member(p, plans, deadline_s, work, cap_seconds(net_s), members[0], options)]
        runs += [job.result() for job in pending]
    finally:
        for job in pending:
            job.close()
    return runs, pending


def search_record(work: float, cap_s: float, members: list[SearchSettings], runs: list[MemberRun],
                  energies: list[float], pending: list[Pending],
                  options: SolveOptions = SolveOptions()) -> dict:
    """The plan's ``search`` record: work spent and budgeted over all searches, the safety net
    (of a search with ``work_share`` 1), whether any net fired, and per search its settings,
    plan energy (``energies``, inf when late) and where it ran."""
    where = ["here"] + ["worker" if job.in_worker and job.fallback is None else
                        f"here ({job.fallback})" if job.fallback else "here" for job in pending]
    return {
        "work_units": round(sum(r.work_units for r in runs), 1),
        "work_budget": round(sum(m.work_share for m in members) * work * (1 + options.search.final_shares()), 1),
        "time_cap_s": round(cap_s, 3),
        "capped_by_time": any(r.capped_by_time for r in runs),
        "members": [{"caps": list(m.caps), "seed": m.seed, "work_share": m.work_share,
                     "energy_j": round(e, 3) if math.isfinite(e) else None,   # None: late
                     "work_units": round(r.work_units, 1), "capped_by_time": r.capped_by_time,
                     "ran": w} for m, r, e, w in zip(members, runs, energies, where)],
    }
