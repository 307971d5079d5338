"""The convex-hull LP of a task DAG: the fast method's relaxation and first lower bound.

Each task's options are replaced by the lower convex hull of its (time, effective energy)
points, so a task may take any time on the hull; precedence and same-device order are kept,
switch costs dropped. The LP's optimum is a valid lower bound on every plan, its task times
are what the roundings (:mod:`solvers.rounding`) start from, and its duals are the flow the
Lagrangian bound (:mod:`solvers.lagrangian`) prices switches with. :class:`HullLP` builds the
LP once per problem and re-solves it for each deadline (warm, when ``highspy`` is installed).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix

from frontier.errors import InputError

from .guarded import ChildFailed, ChildServer
from .hull_flow import FlowInexact, FlowNet, flow_available, flow_net, solve_hull_flow
from .model import Problem
from .options import LimitOptions
from .periodic import PeriodicHullLP, hull_rows, periodic_classes
from .quiet import c_stdout_quiet

log = logging.getLogger(__name__)

#: How :meth:`HullLP.solve` solves: "flow" (:mod:`solvers.hull_flow`, its dual min-cost flow,
#: about linear in the tasks) or "lp" (a general LP code, the reference).
METHODS = ("flow", "lp")
#: From this many tasks on, a pipeline's hull LP is first solved through its periodic
#: restriction and dual (:mod:`solvers.periodic`; the full LP when they do not meet). Below
#: it the full LP is as fast (16 stages, 3,072 tasks: 0.9 s full, 3.9 s periodic).
PERIODIC_MIN_TASKS = 6144


def lower_hull(t: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Indices of the lower-left convex hull of points (t, c), by increasing t (decreasing c)."""
    o = np.lexsort((c, t))
    hull: list[int] = []
    for i in o:
        if hull and c[i] >= c[hull[-1]]:
            continue                          # slower and not cheaper: dominated
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # keep b only if it lies strictly below the segment a–i
            cross = (t[b] - t[a]) * (c[i] - c[a]) - (c[b] - c[a]) * (t[i] - t[a])
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(int(i))
    return np.array(hull, dtype=int)


def _hulls(times: list[np.ndarray], costs: list[np.ndarray]) -> list[np.ndarray]:
    """:func:`lower_hull` of every task, computed once per distinct option set (a pipeline's
    tasks share a few: 131,072 tasks of 16 stages have 32)."""
    seen: dict[bytes, np.ndarray] = {}
    out = []
    for t, c in zip(times, costs):
        key = t.tobytes() + b"|" + c.tobytes()
        h = seen.get(key)
        if h is None:
            h = seen[key] = lower_hull(t, c)
        out.append(h)
    return out


@dataclass(frozen=True)
class LPResult:
    """The relaxation at one deadline: bound, per-task LP time, makespan and edge duals."""

    bound_j: float
    time_s: np.ndarray
    makespan_s: float
    duals: np.ndarray          # μ ≥ 0 per row of the precedence block (see HullLP.rows)
    slope_j_per_s: float = 0.0  # d bound / d deadline (≤ 0): the LP value is convex in D


class HullLP:
    """The convex-hull LP of a problem, built once and re-solved for several deadlines.

    Each task's cost is the lower convex hull of its options, piecewise linear in its time.
    The LP is written in *incremental* form: a task starts at its slowest hull vertex and
    buys time on the hull's segments, δ_k ∈ [0, length_k] s at slope_k J/s (slopes rise
    toward the fast end, so the LP fills them in order without binaries). Columns: start
    times S_0..S_{n-1}, the makespan M (M ≤ D), then the δ's; rows: one per precedence pair,
    S_u + t_slow_u − Σ δ_u − S_w ≤ 0, and S_v + t_slow_v − Σ δ_v − M ≤ 0 for tasks without
    successors. Same optimum as the convex-combination form (a λ per hull vertex and one
    equality row per task), in fewer rows: measured 2.4× faster per solve on 8x32 1F1B.

    With ``method="flow"``, :meth:`solve` solves the LP's dual, a minimum-cost flow
    (:mod:`solvers.hull_flow`, needs OR-Tools), and the LP itself only when the flow cannot
    certify the optimum; :meth:`linprog` always solves the LP. The LP stays the default: the
    flow is 2-3x faster on 1F1B but no closer to linear, and slower on chains
    (``experiments/bench_hull_flow.py``)."""

    def __init__(self, p: Problem, warm: bool = True, *, process_min_tasks: int | None = None,
                 method: str | None = None, periodic_min_tasks: int | None = PERIODIC_MIN_TASKS):
        """The LP of ``p``; ``warm``: re-solve a warm HiGHS model when ``highspy`` is
        installed (False: a cold ``scipy.optimize.linprog`` solve every time).
        ``process_min_tasks`` (default :attr:`solvers.options.LimitOptions.lp_process_min_tasks`):
        from this many tasks on, the LP is solved in a child process (:mod:`solvers.guarded`)
        that a signal or the safety net (:func:`solvers.limits.wall_net`) stops at once; the
        same code solves it there, so the results are the same. ``method``: "lp" (default) or
        "flow" (InputError when OR-Tools is not installed). ``periodic_min_tasks`` (None: never):
        from this many tasks on, a pipeline's LP is solved through its periodic restriction and
        dual first (:mod:`solvers.periodic`), in time that grows with its stages, not its
        microbatches; the full LP when they do not certify each other."""
        if method is None:
            method = "lp"
        if method not in METHODS:
            raise InputError(f"hull LP method {method!r}: expected one of {', '.join(METHODS)}")
        if method == "flow" and not flow_available():
            raise InputError("hull LP method 'flow' needs OR-Tools (pip install ortools)")
        self.method = method
        ix = p.index
        self.p = p
        n = ix.n
        self.hulls = _hulls(ix.time, ix.cost)
        # Segments of task i, from its slowest vertex toward its fastest.
        self.t_slow = np.array([float(ix.time[i][h[-1]]) for i, h in enumerate(self.hulls)])
        self.c_slow = np.array([float(ix.cost[i][h[-1]]) for i, h in enumerate(self.hulls)])
        lengths, slopes, owner = [], [], []
        for i, h in enumerate(self.hulls):
            t, c = ix.time[i][h], ix.cost[i][h]
            seg_t = t[1:] - t[:-1]
            seg_c = c[:-1] - c[1:]
            lengths.append(seg_t[::-1])
            slopes.append((seg_c / seg_t)[::-1])
            owner.append(np.full(len(seg_t), i))
        self.seg_len_s = np.concatenate(lengths) if n else np.zeros(0)
        self.seg_slope_j_per_s = np.concatenate(slopes) if n else np.zeros(0)
        self.seg_owner = np.concatenate(owner).astype(int) if n else np.zeros(0, dtype=int)
        self.off = np.searchsorted(self.seg_owner, np.arange(n + 1))   # segments of i: off[i]:off[i+1]
        nd = len(self.seg_len_s)
        self.ncol = n + 1 + nd
        self.rows = hull_rows(p)
        #: the rows as an (rows × 2) integer array (w = −1: the makespan row)
        self.row_pairs = np.asarray(self.rows, dtype=np.int64).reshape(-1, 2)
        r, cidx, val = [], [], []
        for k, (u, w) in enumerate(self.rows):
            cols = np.arange(self.off[u], self.off[u + 1]) + n + 1
            r.extend([k] * (len(cols) + 2))
            cidx.extend([u, w if w >= 0 else n, *cols.tolist()])
            val.extend([1.0, -1.0] + [-1.0] * len(cols))
        self.A_ub = coo_matrix((val, (r, cidx)), shape=(len(self.rows), self.ncol)).tocsr()
        self.row_owner = np.array([u for u, _ in self.rows], dtype=int)
        self.c = np.concatenate([np.zeros(n), [ix.p_total], self.seg_slope_j_per_s])
        if process_min_tasks is None:
            process_min_tasks = LimitOptions().lp_process_min_tasks
        net = flow_net(n, self.rows, self.off) if method == "flow" else None
        args = (self.c, self.A_ub, self._rhs(), self._upper(0.0), n, bool(warm), net)
        self._engine: _LPEngine | None = None
        self._child: ChildServer | None = None
        if n >= process_min_tasks:
            self._child = ChildServer(_LPEngine, args, replay=("set_rows",))
        else:
            self._engine = _LPEngine(*args)
        self._args = args
        self._periodic_min = math.inf if periodic_min_tasks is None else periodic_min_tasks
        self._periodic: PeriodicHullLP | None | bool = None    # False: none, or no longer valid
        self._guard_periodic = n >= process_min_tasks

    def _rhs(self, row_latency_s: np.ndarray | None = None) -> np.ndarray:
        b = -self.t_slow[self.row_owner] if len(self.rows) else np.zeros(0)
        return b if row_latency_s is None else b - np.asarray(row_latency_s, dtype=float)

    def _upper(self, deadline_s: float) -> np.ndarray:
        n = self.p.index.n
        return np.r_[np.full(n, np.inf), float(deadline_s), self.seg_len_s]

    def _times(self, x: np.ndarray) -> np.ndarray:
        n = self.p.index.n
        bought = np.bincount(self.seg_owner, weights=x[n + 1:], minlength=n) if n else np.zeros(0)
        return self.t_slow - bought

    @property
    def in_child(self) -> bool:
        """Whether this LP is solved in a child process (:mod:`solvers.guarded`)."""
        return self._child is not None

    def _call(self, name: str, *args):
        """``_LPEngine.name(*args)`` where the LP lives: in the child process, or here (also
        when the child could not run: the same code, the calls that changed it replayed)."""
        if self._child is not None:
            try:
                return self._child.call(name, *args)
            except ChildFailed:
                history = self._child.history
                self._child.close()
                self._child = None
                self._engine = _LPEngine(*self._args)
                for nm, a in history:
                    getattr(self._engine, nm)(*a)
        return getattr(self._engine, name)(*args)

    def close(self) -> None:
        """Stop the LP's child processes, if it has any (they also end with this object)."""
        if self._child is not None:
            self._child.close()
        if isinstance(self._periodic, PeriodicHullLP):
            self._periodic.close()

    def _solve_periodic(self, deadline_s: float) -> LPResult | None:
        """The LP through its periodic restriction and dual (:mod:`solvers.periodic`), or None
        when it is not a long pipeline or they do not certify each other; a margin twice the
        default is tried before giving up."""
        if self._periodic is False or self.p.index.n < self._periodic_min:
            return None
        if self._periodic is None:
            pc = periodic_classes(self.p)
            self._periodic = PeriodicHullLP(self, pc, self._guard_periodic) if pc else False
        if not isinstance(self._periodic, PeriodicHullLP):
            return None
        res = self._periodic.solve(deadline_s)
        if res is None and not self._periodic.retried:
            margin = 2 * self._periodic.pc.margin
            self._periodic.close()
            pc = periodic_classes(self.p, margin)
            self._periodic = PeriodicHullLP(self, pc, self._guard_periodic, retried=True) if pc else False
            if isinstance(self._periodic, PeriodicHullLP):
                res = self._periodic.solve(deadline_s)
        if res is None:
            log.info("hull LP at D=%s: the periodic restriction did not certify; solving it whole",
                     deadline_s)
            return None
        return LPResult(*res)

    def set_single_options(self, values: dict[int, tuple[float, float]]) -> None:
        """Give tasks that have a single option a new (time s, effective energy J), in place and
        in the warm HiGHS model, so that the next :meth:`solve` starts from the last basis.
        Used to screen held levels (:func:`solvers.search.replan_hold`): the held problems of different
        levels differ only there. The LP then describes the problem with those options."""
        rows, vals = [], []
        for v, (t, c) in values.items():
            if self.off[v + 1] != self.off[v]:
                raise InputError(f"task {v} has more than one hull vertex")
            self.t_slow[v] = t
            self.c_slow[v] = c
            for k in np.flatnonzero(self.row_owner == v):
                rows.append(int(k))
                vals.append(float(-t))
        if rows:
            self._call("set_rows", np.array(rows, dtype=int), np.array(vals))
        if values:        # the periodic classes were read from the options as they were
            if isinstance(self._periodic, PeriodicHullLP):
                self._periodic.close()
            self._periodic = False

    def linprog(self, deadline_s: float, row_latency_s: np.ndarray | None = None):
        """A cold ``scipy.optimize.linprog`` solve at ``deadline_s`` (M ≤ D), every precedence
        row optionally tightened by ``row_latency_s`` (S_u + T_u + latency ≤ S_w). Returns
        linprog's ``status``, ``message``, ``fun``, ``x``, ``ineqlin.marginals`` and
        ``upper.marginals``; its ``fun`` leaves out the constant Σ (slowest vertex's cost)
        (:meth:`solve` adds it)."""
        lat = None if row_latency_s is None else np.asarray(row_latency_s, dtype=float)
        return self._call("linprog", float(deadline_s), lat)

    def solve(self, deadline_s: float) -> LPResult:
        """Solve at ``deadline_s`` (M ≤ D). In a child process (large LPs) a signal or the
        safety net stops it at once (:class:`solvers.limits.NetFired` for the net)."""
        n = self.p.index.n
        res = self._solve_periodic(float(deadline_s))
        if res is not None:
            return res
        const = float(self.c_slow.sum())
        fun, x, duals, slope = self._call("solve", float(deadline_s))
        return LPResult(fun + const, self._times(x), float(x[n]), np.maximum(duals, 0.0), min(slope, 0.0))


class _LPEngine:
    """The hull LP's numbers (min c·x, A x ≤ b, 0 ≤ x ≤ u with u[n] = the deadline) and how
    they are solved: a warm HiGHS model when ``warm`` and ``highspy`` is installed, else a cold
    ``scipy.optimize.linprog`` each time. It runs in this process or, for large LPs, in a
    child process (:class:`solvers.guarded.ChildServer`): the same calls in the same order
    give the same answers in both."""

    def __init__(self, c: np.ndarray, A: csr_matrix, rhs: np.ndarray, upper: np.ndarray, n: int,
                 warm: bool, net: FlowNet | None = None):
        self.c, self.A, self.rhs, self.upper, self.n = c, A, np.array(rhs, dtype=float), upper, n
        self.warm = warm
        self.net = net                          # the min-cost flow's structure, or None: LP only
        self._h = None if warm else False       # None: not built yet; False: cold solves only

    def _highs(self):
        """A warm HiGHS model (``highspy``, the optional ``highs`` extra) or None: re-solving
        after changing only M's upper bound starts from the previous basis (dual simplex),
        several times faster than a cold ``linprog`` per deadline on 1F1B curves."""
        if self._h is not None:
            return self._h or None
        self._h = False
        try:
            import highspy
        except ImportError:
            return None
        n = self.n
        A = self.A.tocsc()
        ncol = len(self.c)
        lp = highspy.HighsLp()
        lp.num_col_ = ncol
        lp.num_row_ = A.shape[0]
        lp.col_cost_ = self.c
        lp.col_lower_ = np.zeros(ncol)
        up = np.array(self.upper, dtype=float)
        up[:n] = highspy.kHighsInf
        up[n] = 0.0
        lp.col_upper_ = up
        lp.row_lower_ = np.full(A.shape[0], -highspy.kHighsInf)
        lp.row_upper_ = self.rhs
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = A.indptr
        lp.a_matrix_.index_ = A.indices
        lp.a_matrix_.value_ = A.data
        with c_stdout_quiet():      # its constructor prints a banner on the C-level stdout
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        # One thread, as the MILP asks for: HiGHS keeps one thread scheduler per process, and
        # a later solve asking for another count than the first one's fails (issue 32).
        h.setOptionValue("threads", 1)
        h.passModel(lp)
        self._h = (h, highspy)
        return self._h

    def set_rows(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Set the right-hand sides of ``rows`` (also in the warm model)."""
        self.rhs[rows] = values
        if self._h:
            h, highspy = self._h
            for k, b in zip(rows.tolist(), values.tolist()):
                h.changeRowBounds(int(k), -highspy.kHighsInf, float(b))

    def linprog(self, deadline_s: float, row_latency_s: np.ndarray | None = None) -> SimpleNamespace:
        """A cold linprog solve (see :meth:`HullLP.linprog`)."""
        up = np.array(self.upper, dtype=float)
        up[self.n] = float(deadline_s)
        b = self.rhs if row_latency_s is None else self.rhs - row_latency_s
        res = linprog(self.c, A_ub=self.A, b_ub=b, bounds=np.c_[np.zeros(len(self.c)), up],
                      method="highs")
        ok = res.status == 0
        return SimpleNamespace(status=int(res.status), message=str(res.message),
                               fun=float(res.fun) if ok else math.nan, x=res.x if ok else None,
                               ineqlin=SimpleNamespace(marginals=np.asarray(res.ineqlin.marginals) if ok else None),
                               upper=SimpleNamespace(marginals=np.asarray(res.upper.marginals) if ok else None))

    def solve(self, deadline_s: float) -> tuple[float, np.ndarray, np.ndarray, float]:
        """(objective without the constant, x, edge duals μ (not yet clipped at 0), slope
        d value / d deadline) at ``deadline_s``; RuntimeError when it has no optimum. With a
        flow structure, the min-cost flow first (the LP when it cannot certify the optimum)."""
        n = self.n
        if self.net is not None:
            try:
                sol = solve_hull_flow(self.net, -self.rhs[self.net.owner_row], self.upper[n + 1:],
                                      self.c[n + 1:], float(self.c[n]), deadline_s)
                return sol.value_j, sol.x, sol.duals, sol.slope_j_per_s
            except FlowInexact as exc:
                log.info("hull LP at D=%s: the min-cost flow did not certify (%s); solving the LP",
                         deadline_s, exc)
        hs = self._highs()
        if hs is not None:
            h, highspy = hs
            h.changeColBounds(n, 0.0, float(deadline_s))
            h.run()
            if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
                sol = h.getSolution()
                return (float(h.getInfo().objective_function_value), np.asarray(sol.col_value),
                        -np.asarray(sol.row_dual), float(np.asarray(sol.col_dual)[n]))
            self._h = False                     # fall back to cold linprog solves
        res = self.linprog(deadline_s)
        if res.status != 0:
            raise RuntimeError(f"hull LP at D={deadline_s}: {res.message}")
        return res.fun, res.x, -res.ineqlin.marginals, float(res.upper.marginals[n])
