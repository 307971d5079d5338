"""Exact Pareto-frontier DP for series–parallel DAGs without switch costs (solver-notes §5.1).

The precedence order (dependencies plus same-device order) is decomposed recursively: a set
of tasks is a *parallel* composition when its comparability graph is disconnected, and a
*series* composition when it splits into a prefix and a suffix with every prefix task before
every suffix task. An order that splits all the way down to single tasks is series–parallel
(N-free); otherwise :func:`sp_tree` returns None.

Each part's frontier is its non-dominated set of (duration, Σ effective energy): series is
the Minkowski sum, parallel takes the max of the durations and the sum of the costs. Plans
whose duration exceeds the deadline are dropped as soon as they appear (durations only grow
upward in the tree). The plan energy is ``P_total·M + Σ cost``; the optimum is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from frontier.pareto import nondominated

from .model import Problem


@dataclass
class _Node:
    kind: str                    # "leaf", "series", "parallel"
    task: int = -1
    kids: tuple = ()
    t: np.ndarray | None = None
    c: np.ndarray | None = None
    pick: np.ndarray | None = None     # leaf: option; series/parallel: (n, 2) child indices


def _closure(p: Problem) -> list[int]:
    """Descendant bitmask of each task (precedence incl. same-device order)."""
    ix = p.index
    desc = [0] * ix.n
    for v in reversed(ix.order):
        m = 0
        succ = list(ix.succs[v]) + ([ix.dev_next[v]] if ix.dev_next[v] >= 0 else [])
        for w in succ:
            m |= desc[w] | (1 << w)
        desc[v] = m
    return desc


def sp_tree(p: Problem, max_tasks: int = 2000) -> _Node | None:
    """The series–parallel decomposition of ``p``'s precedence order, or None."""
    ix = p.index
    if ix.n > max_tasks:
        return None
    desc = _closure(p)
    anc = [0] * ix.n
    for v in range(ix.n):
        m = desc[v]
        while m:
            low = m & -m
            anc[low.bit_length() - 1] |= 1 << v
            m ^= low
    pos = {v: i for i, v in enumerate(ix.order)}

    def build(nodes: list[int]) -> _Node | None:
        if len(nodes) == 1:
            return _Node("leaf", task=nodes[0])
        mask = 0
        for v in nodes:
            mask |= 1 << v
        # parallel: components of the comparability graph
        comps = []
        left = set(nodes)
        while left:
            v = left.pop()
            comp_mask = 1 << v
            frontier = [v]
            while frontier:
                u = frontier.pop()
                nb = (desc[u] | anc[u]) & mask & ~comp_mask
                comp_mask |= nb
                while nb:
                    low = nb & -nb
                    w = low.bit_length() - 1
                    frontier.append(w)
                    left.discard(w)
                    nb ^= low
            comps.append(sorted((w for w in nodes if comp_mask >> w & 1), key=pos.get))
        if len(comps) > 1:
            kids = [build(c) for c in comps]
            return None if any(k is None for k in kids) else _Node("parallel", kids=tuple(kids))
        # series: the first prefix (in topological order) that precedes all the rest
        nodes = sorted(nodes, key=pos.get)
        common = mask
        rest = mask
        for k, v in enumerate(nodes[:-1]):
            common &= desc[v]
            rest &= ~(1 << v)
            if common & rest == rest:
                a, b = build(nodes[:k + 1]), build(nodes[k + 1:])
                return None if a is None or b is None else _Node("series", kids=(a, b))
        return None

    return build(list(ix.order))


def _prune(t: np.ndarray, c: np.ndarray, pick: np.ndarray, max_points: int):
    keep = nondominated(t, c)            # by increasing t; exact ties keep the first
    if len(keep) > max_points:
        raise OverflowError("frontier too large")
    return t[keep], c[keep], pick[keep]


def _solve(node: _Node, p: Problem, D: float, max_points: int) -> None:
    from .feasibility import latest_makespan_s  # the one feasibility predicate

    ix = p.index
    tol = latest_makespan_s(D)
    if node.kind == "leaf":
        v = node.task
        ok = ix.time[v] <= tol
        idx = np.flatnonzero(ok)
        node.t, node.c, node.pick = _prune(ix.time[v][idx], ix.cost[v][idx], idx, max_points)
        return
    a = node.kids[0]
    _solve(a, p, D, max_points)
    for k in node.kids[1:]:
        _solve(k, p, D, max_points)
    # fold the kids pairwise (parallel nodes may have more than two)
    cur_t, cur_c = a.t, a.c
    picks: list[np.ndarray] = []
    for k in node.kids[1:]:
        if node.kind == "series":
            T = (cur_t[:, None] + k.t[None, :]).ravel()
            C = (cur_c[:, None] + k.c[None, :]).ravel()
            ia, ib = np.divmod(np.arange(T.size), k.t.size)
            ok = T <= tol
            pk = np.stack([ia[ok], ib[ok]], axis=1)
            cur_t, cur_c, pk = _prune(T[ok], C[ok], pk, max_points)
        else:
            times = np.union1d(cur_t, k.t)
            ia = np.searchsorted(cur_t, times, side="right") - 1
            ib = np.searchsorted(k.t, times, side="right") - 1
            ok = (ia >= 0) & (ib >= 0)
            ia, ib = ia[ok], ib[ok]
            T = np.maximum(cur_t[ia], k.t[ib])
            C = cur_c[ia] + k.c[ib]
            cur_t, cur_c, pk = _prune(T, C, np.stack([ia, ib], axis=1), max_points)
        picks.append(pk)
    node.t, node.c = cur_t, cur_c
    node.pick = picks          # one (n, 2) array per fold step


def _assign(node: _Node, i: int, out: list[int]) -> None:
    if node.kind == "leaf":
        out[node.task] = int(node.pick[i])
        return
    # unfold the folds from the last to the first
    idx = [0] * len(node.kids)
    for s in range(len(node.kids) - 1, 0, -1):
        ia, ib = node.pick[s - 1][i]
        idx[s] = int(ib)
        i = int(ia)
    idx[0] = i
    for k, j in zip(node.kids, idx):
        _assign(k, j, out)


def solve_sp(p: Problem, deadline_s: float, tree: _Node | None = None,
             max_points: int = 200_000) -> tuple[list[int], float] | None:
    """Exact (choice, energy) for a series–parallel problem without switch costs; None when the
    order is not series–parallel, switches cost something, or a frontier exceeds ``max_points``."""
    if p.has_transitions:
        return None
    tree = tree or sp_tree(p)
    if tree is None:
        return None
    try:
        _solve(tree, p, deadline_s, max_points)
    except OverflowError:
        return None
    if tree.t is None or len(tree.t) == 0:
        return None
    tot = tree.c + p.index.p_total * tree.t
    i = int(np.argmin(tot))
    out = [0] * p.index.n
    _assign(tree, i, out)
    e = p.index.objective(out)
    return out, float(e) if math.isfinite(e) else math.inf
