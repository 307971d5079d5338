"""The hull LP of a long pipeline, solved at a size independent of its microbatches.

A pipeline schedule (1F1B, GPipe, interleaved 1F1B: :mod:`solvers.pipeline`) repeats itself:
away from the warm-up and the drain, microbatch m+1 does on every stage what microbatch m did,
one period later. The hull LP's optimum there is periodic too: on a 16-stage 1F1B profile
the LP times of every (stage, instruction) are constant from about 1.5 x stages microbatches
after the start to as many before the end. Two small LPs use this (:class:`PeriodicHullLP`):

* **The restriction** (the plan's times). The first and last ``margin`` microbatches keep a
  variable per task; every task of the middle microbatches of one (stage, instruction) takes
  one common time and starts at ``a + m·P``, one period ``P`` for all. Every precedence row of
  the full LP becomes a row of this LP (identical ones once), so its solution, expanded, is a
  feasible solution of the full LP: its value is an upper bound on the LP's optimum.
* **The periodic dual** (the bound). Every row with a middle task at one end carries the flow
  of its group (tail kind, head kind, microbatch offset), the same on every edge of the group;
  every member of a class then has the same flows in and out, so one conservation row stands
  for all of them. The LP maximizes the Lagrangian of the full LP over such flows; its value is
  a valid lower bound and its flow, expanded, conserves at every task.

When the two meet (within :data:`CERTIFY_REL_TOL`) the full LP is solved:
:meth:`PeriodicHullLP.solve` returns the expanded restriction's times, the expanded flow as
duals, and the bound evaluated on the full problem (:func:`hull_lagrangian`), which
:meth:`solvers.hull_lp.HullLP.solve` returns as its :class:`~solvers.hull_lp.LPResult`.
Otherwise it returns None and the caller solves the full LP. Both LPs grow with the stages and
``margin``, not with the microbatches; the rest (building, expanding, evaluating) is linear
in the tasks. Measured on 1F1B profiles at 1.05x: the full LP's bound to 1e-13 (16 stages,
3,072 and 8,192 tasks; 32,768 to 3e-8 against the min-cost flow) and 5e-7 below it (32
stages, 8,192 tasks); 16 stages take 2–4 s at any microbatch count, 32 stages about 11 s.

Which tasks repeat is read from the pipeline builders' task names
(``s{stage}[v{chunk}]/{forward|backward}/{microbatch}``); a middle task whose options or
edges differ from its class's first member's keeps variables of its own.
:func:`periodic_classes` returns None when there is nothing to compress (other names, or too
few microbatches).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix, hstack

from .guarded import ChildFailed, ChildServer
from .model import Problem

log = logging.getLogger(__name__)

__all__ = ["PeriodicClasses", "PeriodicHullLP", "periodic_classes", "hull_lagrangian", "hull_rows",
           "CERTIFY_REL_TOL", "MIN_MIDDLE"]

_NAME = re.compile(r"^(s\d+(?:v\d+)?/(?:forward|backward))/(\d+)$")

#: The fewest middle microbatches worth compressing.
MIN_MIDDLE = 4
#: The restriction's value and the periodic dual's bound must meet this closely (relative) for
#: :meth:`PeriodicHullLP.solve` to answer; far below the ~1 % energy measurements carry.
CERTIFY_REL_TOL = 1e-5


@dataclass(frozen=True)
class PeriodicClasses:
    """Which tasks repeat: ``cls[i]`` is task i's class (−1: a task with variables of its own),
    ``mb[i]`` its microbatch and ``kind[i]`` its (stage, instruction)'s id; ``rep[c]`` is class
    c's first member (its options stand for all), ``count[c]`` its members."""

    cls: np.ndarray
    mb: np.ndarray
    rep: np.ndarray
    count: np.ndarray
    kind: np.ndarray
    margin: int

    @property
    def n_classes(self) -> int:
        """How many classes (repeating (stage, instruction)s) there are."""
        return len(self.rep)

    @property
    def compressed(self) -> int:
        """How many tasks are members of a class."""
        return int((self.cls >= 0).sum())


def periodic_classes(p: Problem, margin: int | None = None) -> PeriodicClasses | None:
    """The repeating tasks of a pipeline problem (module doc). Microbatches at least
    ``margin`` from either end (default 1.5 x the devices, plus 2) are the middle. None when
    a name is not a pipeline builder's or fewer than :data:`MIN_MIDDLE` microbatches are in
    the middle."""
    ix = p.index
    n = ix.n
    keys: list[str] = []
    mb = np.full(n, -1, dtype=np.int64)
    for i, name in enumerate(ix.names):
        m = _NAME.match(name)
        if m is None:
            return None
        keys.append(m.group(1))
        mb[i] = int(m.group(2))
    n_mb = int(mb.max()) + 1 if n else 0
    if margin is None:
        margin = math.ceil(1.5 * len(ix.dev_seq)) + 2
    lo, hi = margin, n_mb - margin
    if hi - lo < MIN_MIDDLE:
        return None
    kinds: dict[str, int] = {}
    kind = np.array([kinds.setdefault(k, len(kinds)) for k in keys], dtype=np.int64)
    cls = np.full(n, -1, dtype=np.int64)
    rep: dict[int, int] = {}            # kind -> its class's first member
    for i in np.flatnonzero((mb >= lo) & (mb < hi)).tolist():
        r = rep.setdefault(int(kind[i]), i)
        if r == i or (ix.device[i] == ix.device[r] and np.array_equal(ix.time[i], ix.time[r])
                      and np.array_equal(ix.cost[i], ix.cost[r])):
            cls[i] = int(kind[i])
    _demote_irregular(p, cls, mb, kind)
    used = sorted(set(cls[cls >= 0].tolist()))
    if not used:
        return None
    renum = np.full(len(kinds), -1, dtype=np.int64)
    renum[used] = np.arange(len(used))
    cls = np.where(cls >= 0, renum[np.maximum(cls, 0)], -1)
    reps = np.array([rep[k] for k in used], dtype=np.int64)
    return PeriodicClasses(cls, mb, reps, np.bincount(cls[cls >= 0], minlength=len(used)), kind,
                           int(margin))


def _demote_irregular(p: Problem, cls: np.ndarray, mb: np.ndarray, kind: np.ndarray) -> None:
    """Members whose edges differ from their class's first member's (another partner kind or
    microbatch offset) get variables of their own, in place: every member then has one edge
    of each of its class's edge groups, which the periodic dual needs."""
    pattern: list[set] = [set() for _ in range(len(cls))]
    for u, w in hull_rows(p):
        pattern[u].add(("out", int(kind[w]) if w >= 0 else -1, int(mb[w] - mb[u]) if w >= 0 else 0))
        if w >= 0:
            pattern[w].add(("in", int(kind[u]), int(mb[w] - mb[u])))
    ref: dict[int, set] = {}
    for i in np.flatnonzero(cls >= 0).tolist():
        c = int(cls[i])
        if ref.setdefault(c, pattern[i]) != pattern[i]:
            cls[i] = -1


def hull_rows(p: Problem) -> list[tuple[int, int]]:
    """The hull LP's precedence rows (:attr:`solvers.hull_lp.HullLP.rows` is this list): (u, w) for
    S_u + T_u ≤ S_w over the edges, then the same-device pairs, then (v, −1) for T_v ≤ M."""
    ix = p.index
    pairs = list(ix.edges) + [(ix.dev_prev[b], b) for b in range(ix.n) if ix.dev_prev[b] >= 0]
    return pairs + [(v, -1) for v in range(ix.n) if not ix.succs[v] and ix.dev_next[v] < 0]


def hull_lagrangian(lp: Any, duals: np.ndarray, deadline_s: float) -> tuple[float, float]:
    """(bound J, its slope in the deadline J/s) of the hull LP ``lp`` at multipliers ``duals``
    (μ ≥ 0 per row of ``lp.rows``), without switch costs: Σ over tasks of min over the hull of
    cost + outflow·time, plus the start-time and makespan terms of
    :func:`solvers.lagrangian.flow_from_duals`. Valid for every μ ≥ 0."""
    from .lagrangian import flow_from_duals

    fl = flow_from_duals(lp.p, lp, duals, deadline_s)
    gain = np.minimum(0.0, lp.seg_slope_j_per_s - fl.f[lp.seg_owner]) * lp.seg_len_s
    tasks = lp.c_slow + fl.f * lp.t_slow + np.bincount(lp.seg_owner, weights=gain,
                                                       minlength=len(fl.f))
    return float(tasks.sum()) + fl.const_j, fl.slope_j_per_s


class _Linprog:
    """``scipy.optimize.linprog`` (HiGHS) as an object a :class:`~solvers.guarded.ChildServer`
    can hold: the two LPs are solved in a child process, where a signal or the safety net
    stops them at once."""

    def solve(self, c: np.ndarray, A: csr_matrix, b: np.ndarray, lo: np.ndarray,
              hi: np.ndarray) -> SimpleNamespace:
        res = linprog(c, A_ub=A, b_ub=b, bounds=np.c_[lo, hi], method="highs")
        ok = res.status == 0
        return SimpleNamespace(ok=ok, message=str(res.message),
                               fun=float(res.fun) if ok else math.nan, x=res.x if ok else None,
                               mu=-np.asarray(res.ineqlin.marginals) if ok else None)


class PeriodicHullLP:
    """The restriction and the periodic dual of a hull LP (module doc), built once, solved
    per deadline. ``guarded``: solve both in a child process (:mod:`solvers.guarded`);
    ``retried``: built with a wider margin after the default one did not certify."""

    def __init__(self, lp: Any, pc: PeriodicClasses, guarded: bool = True, retried: bool = False):
        self.lp, self.pc, self.retried = lp, pc, retried
        self._restriction()
        self._dual()
        self._child: ChildServer | None = ChildServer(_Linprog, ()) if guarded else None

    def close(self) -> None:
        """Stop the child process, if any."""
        if self._child is not None:
            self._child.close()

    def _run(self, *args: Any) -> SimpleNamespace:
        if self._child is not None:
            try:
                return self._child.call("solve", *args)
            except ChildFailed:
                self._child.close()
                self._child = None
        return _Linprog().solve(*args)

    # -- the restriction --------------------------------------------------------------------
    def _restriction(self) -> None:
        lp, pc = self.lp, self.pc
        ix = lp.p.index
        n = ix.n
        cls, mb = pc.cls, pc.mb
        own = np.flatnonzero(cls < 0)
        n_cls = pc.n_classes
        # columns: S of own tasks | a of classes | P of classes | M | own segs | class segs
        col_s = np.full(n, -1, dtype=np.int64)
        col_s[own] = np.arange(len(own))
        c_a, c_p = len(own), len(own) + n_cls
        c_m = c_p + n_cls
        own_segs = np.flatnonzero(cls[lp.seg_owner] < 0)
        rep_segs = np.flatnonzero(np.isin(lp.seg_owner, pc.rep))
        seg_col = np.full(len(lp.seg_owner), -1, dtype=np.int64)
        seg_col[own_segs] = c_m + 1 + np.arange(len(own_segs))
        cls_seg_col = c_m + 1 + len(own_segs) + np.arange(len(rep_segs))
        ncol = c_m + 1 + len(own_segs) + len(rep_segs)
        first_seg = np.searchsorted(rep_segs, lp.off[pc.rep])     # each class's first segment
        n_seg = (lp.off[pc.rep + 1] - lp.off[pc.rep]).astype(np.int64)

        def start(i: int, sign: float, coef: dict[int, float]) -> None:
            """Add sign x task i's start: S_i, or a_c + m·P_c for a member of class c."""
            c = int(cls[i])
            if c < 0:
                coef[int(col_s[i])] = coef.get(int(col_s[i]), 0.0) + sign
            else:
                coef[c_a + c] = coef.get(c_a + c, 0.0) + sign
                coef[c_p + c] = coef.get(c_p + c, 0.0) + sign * float(mb[i])

        def segs(i: int) -> np.ndarray:
            c = int(cls[i])
            if c < 0:
                return seg_col[lp.off[i]:lp.off[i + 1]]
            j = int(first_seg[c])
            return cls_seg_col[j:j + int(n_seg[c])]

        # A row between members (or from a member to M) is linear in the microbatch along its
        # group (tail class, head class, offset): it holds for every edge of the group iff it
        # holds at the group's first and last, so only those two are kept.
        rows = lp.row_pairs
        u_all, w_all = rows[:, 0], rows[:, 1]
        w0 = np.maximum(w_all, 0)
        inner = (cls[u_all] >= 0) & ((w_all < 0) | (cls[w0] >= 0))
        keep = ~inner
        if inner.any():
            idx = np.flatnonzero(inner)
            gk = np.c_[cls[u_all[idx]], np.where(w_all[idx] >= 0, cls[w0[idx]], -1),
                       np.where(w_all[idx] >= 0, mb[w0[idx]] - mb[u_all[idx]], 0)]
            _, g = np.unique(gk, axis=0, return_inverse=True)
            g = g.ravel()
            order = np.lexsort((mb[u_all[idx]], g))
            gs = g[order]
            first = np.r_[True, gs[1:] != gs[:-1]]
            last = np.r_[gs[1:] != gs[:-1], True]
            keep[idx[order[first | last]]] = True
        seen: set = set()
        r_i: list[int] = []
        c_i: list[int] = []
        v_i: list[float] = []
        rhs: list[float] = []
        for k in np.flatnonzero(keep).tolist():
            u, w = int(u_all[k]), int(w_all[k])
            coef: dict[int, float] = {}
            start(u, 1.0, coef)
            if w >= 0:
                start(w, -1.0, coef)
            else:
                coef[c_m] = coef.get(c_m, 0.0) - 1.0
            for sc in segs(u).tolist():
                coef[sc] = coef.get(sc, 0.0) - 1.0
            items = tuple(sorted((col, val) for col, val in coef.items() if val))
            key = (items, float(lp.t_slow[u]))
            if key in seen:
                continue
            seen.add(key)
            r = len(rhs)
            for col, val in items:
                r_i.append(r)
                c_i.append(col)
                v_i.append(val)
            rhs.append(-float(lp.t_slow[u]))
        for c in range(n_cls):     # every member starts at or after 0, as all tasks do
            for m in (int(mb[cls == c].min()), int(mb[cls == c].max())):
                r = len(rhs)
                r_i += [r, r]
                c_i += [c_a + c, c_p + c]
                v_i += [-1.0, -float(m)]
                rhs.append(0.0)
        cost = np.zeros(ncol)
        cost[c_m] = ix.p_total
        cost[seg_col[own_segs]] = lp.seg_slope_j_per_s[own_segs]
        weight = np.repeat(pc.count.astype(float), n_seg)
        cost[cls_seg_col] = lp.seg_slope_j_per_s[rep_segs] * weight
        lo = np.zeros(ncol)
        hi = np.full(ncol, np.inf)
        lo[c_a:c_m] = -np.inf         # a: any offset; P: any period (a class may run backwards)
        hi[seg_col[own_segs]] = lp.seg_len_s[own_segs]
        hi[cls_seg_col] = lp.seg_len_s[rep_segs]
        # expansion: the column each task's segment reads its bought time from
        member = cls[lp.seg_owner] >= 0
        k_in = np.arange(len(lp.seg_owner)) - lp.off[lp.seg_owner]
        src = seg_col.copy()
        cm = cls[lp.seg_owner[member]]
        src[member] = cls_seg_col[first_seg[cm] + k_in[member]]
        self.R = SimpleNamespace(
            A=coo_matrix((v_i, (r_i, c_i)), shape=(len(rhs), ncol)).tocsr(), b=np.array(rhs),
            c=cost, lo=lo, hi=hi, c_m=c_m, src=src)

    # -- the periodic dual ------------------------------------------------------------------
    def _dual(self) -> None:
        lp, pc = self.lp, self.pc
        ix = lp.p.index
        n = ix.n
        cls, mb, kind = pc.cls, pc.mb, pc.kind
        rows = lp.row_pairs
        u, w = rows[:, 0], rows[:, 1]
        grouped = (cls[u] >= 0) | ((w >= 0) & (cls[np.maximum(w, 0)] >= 0))
        keys = np.c_[kind[u], np.where(w >= 0, kind[np.maximum(w, 0)], -1),
                     np.where(w >= 0, mb[np.maximum(w, 0)] - mb[u], 0)]
        _, g_of = np.unique(keys[grouped], axis=0, return_inverse=True)
        G = int(g_of.max()) + 1 if len(g_of) else 0
        var = np.empty(len(rows), dtype=np.int64)       # the flow variable of each full row
        var[grouped] = g_of.ravel()
        var[~grouped] = G + np.arange(int((~grouped).sum()))
        nflow = G + int((~grouped).sum())
        trans = np.flatnonzero(cls < 0)
        node = np.full(n, -1, dtype=np.int64)
        node[trans] = np.arange(len(trans))
        node = np.where(cls >= 0, len(trans) + cls, node)
        n_nodes = len(trans) + pc.n_classes

        def incidence(at: np.ndarray, sel: np.ndarray) -> csr_matrix:
            """node × flow-variable: 1 where the node's rows (a class's: one member's) use it."""
            pairs = np.unique(np.c_[node[at[sel]], var[sel]], axis=0)
            return coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])),
                              shape=(n_nodes, nflow)).tocsr()

        OUT = incidence(u, np.ones(len(rows), dtype=bool))
        IN = incidence(np.maximum(w, 0), w >= 0)
        # Solved as its LP dual, in the hull LP's incremental form (fewer rows, as fast as the
        # restriction): node a (its members' sum) takes w_a·t_slow − Σ δ, δ_k ∈ [0, w_a·len_k]
        # at slope_k; one row per flow variable, Σ tails (S + time) − Σ heads S − [into M]·M
        # ≤ 0, whose duals are the flow.
        reps = np.concatenate([trans, pc.rep]).astype(np.int64)
        weight = np.ones(n_nodes)
        weight[len(trans):] = pc.count
        seg_n = (lp.off[reps + 1] - lp.off[reps]).astype(np.int64)
        segs = np.concatenate([np.arange(lp.off[i], lp.off[i + 1]) for i in reps.tolist()]
                              + [np.zeros(0, dtype=np.int64)]).astype(np.int64)
        seg_node = np.repeat(np.arange(n_nodes), seg_n)
        ns = len(segs)
        SEG = coo_matrix((np.ones(ns), (seg_node, np.arange(ns))), shape=(n_nodes, ns)).tocsr()
        into_m = np.zeros(nflow)
        np.add.at(into_m, var[w < 0], 1.0)        # a group's flow reaches M once per edge
        OUTt = OUT.T.tocsr()
        A_ub = hstack([-(IN - OUT).T, -(OUTt @ SEG), csr_matrix(-into_m[:, None])]).tocsr()
        b_ub = -(OUTt @ (weight * lp.t_slow[reps]))
        c = np.concatenate([np.zeros(n_nodes), lp.seg_slope_j_per_s[segs], [ix.p_total]])
        lo = np.zeros(len(c))
        hi = np.concatenate([np.full(n_nodes, np.inf), lp.seg_len_s[segs] * weight[seg_node],
                             [np.inf]])
        self.Dl = SimpleNamespace(A=A_ub, b=b_ub, c=c, lo=lo, hi=hi, var=var)

    # -- solve ------------------------------------------------------------------------------
    def solve(self, deadline_s: float) -> tuple[float, np.ndarray, float, np.ndarray, float] | None:
        """The full hull LP at ``deadline_s``: (bound J, per-task time s, makespan s, μ per row
        of ``lp.rows``, d bound / d deadline J/s), what :class:`~solvers.hull_lp.LPResult`
        holds; or None when the restriction and the periodic dual do not meet (module doc) or
        either LP has no optimum: the caller then solves the full LP."""
        lp, R, Dl = self.lp, self.R, self.Dl
        D = float(deadline_s)
        hi = R.hi.copy()
        hi[R.c_m] = D
        rr = self._run(R.c, R.A, R.b, R.lo, hi)
        hd = Dl.hi.copy()
        hd[-1] = D
        rd = self._run(Dl.c, Dl.A, Dl.b, Dl.lo, hd)
        if not (rr.ok and rd.ok):
            log.info("periodic hull LP at D=%s: %s / %s", D, rr.message, rd.message)
            return None
        bought = rr.x[R.src]
        n = lp.p.index.n
        time_s = lp.t_slow - np.bincount(lp.seg_owner, weights=bought, minlength=n)
        duals = np.maximum(rd.mu[Dl.var], 0.0)
        bound, slope = hull_lagrangian(lp, duals, D)
        upper = rr.fun + float(lp.c_slow.sum())
        gap = (upper - bound) / max(abs(bound), 1e-12)
        log.info("periodic hull LP at D=%.6g: %d of %d tasks in %d classes; restriction %.9g J, "
                 "bound %.9g J (gap %.2e)", D, self.pc.compressed, n, self.pc.n_classes,
                 upper, bound, gap)
        if gap > CERTIFY_REL_TOL:
            return None
        return bound, time_s, float(rr.x[R.c_m]), duals, slope
