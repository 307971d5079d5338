"""Large-neighbourhood search for plans with switch costs: re-plan one path of tasks exactly.

A *path* is a sequence of tasks, each a successor of the one before (by a dependency or by
device order). Holding every other task at a feasible start time, the cheapest option
sequence for the path is a chain DP with time windows: each task may start once its fixed
predecessors are done (plus the switch latency from a fixed device neighbour, which depends on
the option) and must finish before its fixed successors start; switch costs to fixed
neighbours are part of its own cost, switches between consecutive path tasks on one device
are exact. Two families of paths are used:

* **device chains**: all tasks of one device in order (the device's ω sequence, switches exact);
* **dependency paths**: tasks linked by cross-device dependencies (in 1F1B, one microbatch's
  forwards down the stages and its backwards back up), which move slack *between* devices,
  something no single-device neighbourhood can do.

:func:`polish` cycles over both until nothing improves or its :class:`Budget` is spent.
Budgets (:class:`Budget`) count *work* (DP labels, schedule passes, kicks) so that a search is
reproducible: the same problem and budget give the same plan on any machine, unless the
wall-clock cap that comes with every budget fires first (on a machine much slower than the one
the defaults were measured on; the budget then says so).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from frontier.errors import InputError

from .feasibility import meets_deadline, plan_meets_deadline
from .model import Problem
from .options import SearchOptions
from .repair import relax_repeatedly
from .workers import available_cpus, start

log = logging.getLogger(__name__)


@dataclass
class Budget:
    """What a search may still spend: ``work`` units and wall time until ``t_end``
    (``time.perf_counter()``). One unit is about 1,000 DP labels (about 0.07 ms of work here); see
    :func:`path_cost` and :func:`kick_cost`. Work decides when a search stops, so the result
    does not depend on the machine's speed; the wall-clock cap is only a safety net, and
    ``capped`` records that it fired. A :meth:`part` charges its parent too.

    >>> b = Budget.of(work=100, seconds=60.0)
    >>> b.spend(40); b.left
    60.0
    """

    work: float
    t_end: float
    used: float = 0.0
    parent: Budget | None = None
    capped: bool = False       # the wall-clock cap ended a search before its work was spent

    @classmethod
    def of(cls, work: float = math.inf, seconds: float = math.inf) -> Budget:
        """A budget of ``work`` units and ``seconds`` of wall time from now."""
        return cls(float(work), time.perf_counter() + seconds)

    @property
    def left(self) -> float:
        """Work units left (never negative)."""
        return max(self.work - self.used, 0.0)

    def seconds_left(self) -> float:
        """Wall time left before the cap, in seconds (never negative)."""
        return max(self.t_end - time.perf_counter(), 0.0)

    def spend(self, units: float) -> None:
        """Charge ``units`` here and to every parent."""
        b: Budget | None = self
        while b is not None:
            b.used += units
            b = b.parent

    def done(self) -> bool:
        """True once the work is spent or the wall-clock cap has passed (then ``capped`` is
        set here and on every parent: the result may differ on a faster machine)."""
        if self.used >= self.work:
            return True
        if time.perf_counter() < self.t_end:
            return False
        b: Budget | None = self
        while b is not None:
            b.capped = True
            b = b.parent
        return True

    def part(self, work: float, seconds: float | None = None) -> Budget:
        """A child budget of at most ``work`` units (within what is left). It shares this
        budget's safety net (or, given ``seconds``, a tighter one)."""
        t_end = self.t_end if seconds is None else min(time.perf_counter() + seconds, self.t_end)
        return Budget(min(work, self.left), t_end, parent=self)


#: The definition of a work unit: :func:`chain_dp` labels per unit (about 0.07 ms of work).
#: Every budget in :class:`solvers.options.SolveOptions` is counted in these units, so this
#: is a unit, not a tuning knob.
LABELS_PER_UNIT = 1000


def path_cost(p: Problem, labels: int) -> float:
    """Work units of one path re-planned: the labels its DP generated plus the schedule,
    latest-finish and makespan passes over the whole problem around it (about n/90 units)
    and a fixed unit of Python overhead."""
    return labels / LABELS_PER_UNIT + p.index.n / 90 + 1.0


def kick_cost(p: Problem, tried: bool) -> float:
    """Work units of one kick: a makespan check (about n/500 units) and, when the kick meets
    the deadline and is ``tried``, two relax passes (about n/8 units each). The re-planning
    after it is charged by :func:`path_cost`; plus a fixed unit of Python overhead."""
    return p.index.n * (1 / 500 + (1 / 4 if tried else 0.0)) + 1.0


def _pareto_thin(f: np.ndarray, c: np.ndarray, cap: int) -> np.ndarray:
    """Indices of the (min f, min c) Pareto set of the points, by increasing f, thinned to at
    most ``cap`` evenly spread points (the fastest and the cheapest always kept)."""
    o = np.lexsort((c, f))
    cs = c[o]
    cm = np.minimum.accumulate(cs)
    keep = np.ones(len(o), dtype=bool)
    keep[1:] = cs[1:] < cm[:-1] - 1e-12
    idx = o[keep]
    if len(idx) > cap:
        idx = idx[np.unique(np.linspace(0, len(idx) - 1, cap).round().astype(int))]
    return idx


@dataclass(frozen=True)
class PathWindow:
    """One path with everything else fixed: per position and option, duration ``time_s``,
    cost ``cost_j`` (effective energy + switch extras to fixed neighbours), earliest start
    ``release_s`` and latest finish ``due_s``; ``links[i]`` is the (latency, extra) switch
    matrix between positions i−1 and i when they are consecutive on one device, else None."""

    tasks: list[int]
    time_s: list[np.ndarray]
    cost_j: list[np.ndarray]
    release_s: list[np.ndarray]
    due_s: list[np.ndarray]
    links: list[tuple[np.ndarray, np.ndarray] | None]


def path_window(p: Problem, path: list[int], choice: np.ndarray, start_s: np.ndarray,
                dur_s: np.ndarray, deadline_s: float, tol_s: float = 0.0) -> PathWindow:
    """The :class:`PathWindow` of ``path`` when every other task keeps its option in ``choice``
    and starts at ``start_s`` (durations ``dur_s``); tasks must end by ``deadline_s``; every
    latest finish is relaxed by ``tol_s`` (rounding of the fixed start times)."""
    ix = p.index
    on = set(path)
    times, costs, rels, dues, links = [], [], [], [], []
    for i, v in enumerate(path):
        T = ix.time[v]
        C = ix.cost[v].copy()
        rel = np.zeros(len(T))
        due = np.full(len(T), float(deadline_s))
        for u in ix.preds[v]:
            if u not in on:
                rel = np.maximum(rel, start_s[u] + dur_s[u])
        for w in ix.succs[v]:
            if w not in on:
                due = np.minimum(due, start_s[w])
        link = None
        u = ix.dev_prev[v]
        if u >= 0:
            if u not in on:
                rel = np.maximum(rel, start_s[u] + dur_s[u]
                                 + (ix.tau[v][choice[u], :] if ix.tau[v] is not None else 0.0))
                if ix.extra[v] is not None:
                    C += ix.extra[v][choice[u], :]
            elif i > 0 and path[i - 1] == u:
                if ix.tau[v] is not None:
                    link = (ix.tau[v], ix.extra[v])
            else:
                raise InputError(f"path: task {ix.names[v]} follows its device neighbour "
                                 f"{ix.names[u]} without being next to it in the path")
        w = ix.dev_next[v]
        if w >= 0 and w not in on:
            due = np.minimum(due, start_s[w] - (ix.tau[w][:, choice[w]] if ix.tau[w] is not None else 0.0))
            if ix.extra[w] is not None:
                C += ix.extra[w][:, choice[w]]
        times.append(T)
        costs.append(C)
        rels.append(rel)
        dues.append(due + tol_s)
        links.append(link)
    return PathWindow(list(path), times, costs, rels, dues, links)


def chain_dp(w: PathWindow, cap: int = 48, gcap: int = 160) -> np.ndarray | None:
    """Cheapest option sequence for a :class:`PathWindow` (option index per position), or None
    when none fits. Labels (finish time, cost) per option are Pareto-pruned and thinned to
    ``cap`` per option (``gcap`` overall as predecessors of a change), so the result is a good
    feasible sequence, not always the optimum."""
    return _chain_dp(w, cap, gcap)[0]


def _chain_dp(w: PathWindow, cap: int, gcap: int) -> tuple[np.ndarray | None, int]:
    """:func:`chain_dp` and the number of labels it generated (its work).

    Each layer's labels sit in a (option × candidate) array, one row per option, so the
    per-option Pareto sets come from small row sorts instead of one sort of every label by
    (option, finish, cost); the labels kept, their order and the work counted are the same
    (about 2× faster on 16x64 1F1B windows)."""
    layers = []
    made = 0
    pf = pc = po = None
    free: dict[tuple[int, int], np.ndarray | None] = {}     # per switch matrix: the one free move per option
    for pos in range(len(w.tasks)):
        T, C, rel, due = w.time_s[pos], w.cost_j[pos], w.release_s[pos], w.due_s[pos]
        K = len(T)
        if pos == 0:
            f = (rel + T)[:, None]
            c = C[:, None]
            b = np.full((K, 1), -1)
        else:
            G = _pareto_thin(pf, pc, gcap)
            gf, gc, go = pf[G], pc[G], po[G]
            link = w.links[pos]
            if link is None:
                f = np.maximum(rel[:, None], gf[None, :]) + T[:, None]
                c = gc[None, :] + C[:, None]
            else:
                tau, ext = link
                f = np.maximum(rel[:, None], gf[None, :] + tau[go, :].T) + T[:, None]
                c = gc[None, :] + C[:, None] + ext[go, :].T
            b = np.broadcast_to(G[None, :], f.shape)
            if link is not None:
                # keeping the clock (a free transition) from any label, even one thinned away
                # above; by the cost matrix, not by index: the two tasks' option lists may
                # differ in length and order. Each goes to its option's row, after the others.
                idx, nxt = _free_moves(tau, ext, po, free)
                if idx.size:
                    f, c, b = _append_per_row(K, nxt, (f, c, b), (np.maximum(rel[nxt], pf[idx]) + T[nxt],
                                                                 pc[idx] + C[nxt], idx))
        made += int(np.isfinite(f).sum())
        ok = f <= due[:, None]             # padding (inf) is never ok
        n_ok = ok.sum(axis=1)
        if not n_ok.any():
            return None, made
        f = np.where(ok, f, np.inf)
        c = np.where(ok, c, np.inf)
        # per option: sort by (finish, cost), ties in the order made; keep the Pareto labels
        width = f.shape[1]
        rows = np.arange(K)[:, None] * width
        i1 = np.argsort(c, axis=1, kind="stable") + rows
        perm = (i1.ravel()[np.argsort(f.ravel()[i1], axis=1, kind="stable") + rows]).ravel()
        f, c, b = (x.ravel()[perm].reshape(K, width) for x in (f, c, b))
        real = np.arange(f.shape[1])[None, :] < n_ok[:, None]
        cv = c[real]
        # the same arithmetic as one running minimum over all options in a row, whose keys
        # are offset per option (kept so that plans do not move by rounding)
        key = c - np.arange(K)[:, None] * (4.0 * (cv.max() - cv.min()) + 1.0)
        cm = np.minimum.accumulate(key, axis=1)
        keep = real.copy()
        keep[:, 1:] &= key[:, 1:] < cm[:, :-1] - 1e-12
        size = keep.sum(axis=1)
        if size.max() > cap:
            # ≤ cap evenly spread labels per option, its first and last always kept
            r = np.cumsum(keep, axis=1) - 1
            span = np.maximum(size - 1, 1)[:, None]
            keep &= ((size <= cap)[:, None] | (r == 0)
                     | ((r * (cap - 1)) // span != ((r - 1) * (cap - 1)) // span))
        o = np.nonzero(keep)[0]
        f, c, b = f[keep], c[keep], b[keep]
        layers.append((o, b))
        pf, pc, po = f, c, o
    j = int(np.argmin(pc))
    out = np.zeros(len(w.tasks), dtype=int)
    for pos in range(len(w.tasks) - 1, -1, -1):
        o, b = layers[pos]
        out[pos] = o[j]
        j = int(b[j])
    return out, made


def _free_moves(tau: np.ndarray, ext: np.ndarray, po: np.ndarray,
                cache: dict[tuple[int, int], np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """(label, option) pairs, by label, for every free move (no latency, no extra energy)
    from a label with option ``po[label]``: ``np.nonzero(free[po])``, without building that
    array when each option has exactly one free move (one clock per option, as in 1F1B)."""
    key = (id(tau), id(ext))      # both live for the whole DP, so ids are stable
    if key not in cache:
        fm = (tau == 0) & (ext == 0)
        cache[key] = fm.argmax(axis=1) if (fm.sum(axis=1) == 1).all() else None
    one = cache[key]
    if one is None:
        return np.nonzero(((tau == 0) & (ext == 0))[po])
    return np.arange(po.size), one[po]


def _append_per_row(rows: int, row: np.ndarray, arrays: tuple, values: tuple) -> tuple:
    """``arrays`` (rows × m) widened with ``values`` (1-D, one entry per ``row`` index): each
    row gets its values after its m columns, in their order; padding is inf (the last array,
    back-pointers, gets 0)."""
    count = np.bincount(row, minlength=rows)
    first = np.r_[0, np.cumsum(count)[:-1]]
    if (row[1:] >= row[:-1]).all():           # the usual case: labels come sorted by option
        col = np.arange(row.size) - first[row]
    else:
        order = np.argsort(row, kind="stable")
        col = np.empty(row.size, dtype=int)
        col[order] = np.arange(row.size) - first[row[order]]
    out = []
    for a, v in zip(arrays, values):
        pad = np.full((rows, int(count.max())), 0 if a.dtype.kind == "i" else np.inf, dtype=a.dtype)
        pad[row, col] = v
        out.append(np.hstack([a, pad]))
    return tuple(out)


def windowed_rounding(p: Problem, time_s: np.ndarray, deadline_s: float, alpha: float = 0.5,
                      cap: int = 64, gcap: int = 256) -> np.ndarray | None:
    """A feasible plan near a fractional schedule (e.g. the hull LP's task times ``time_s``),
    switch costs included: every device chain is planned by :func:`chain_dp` on its own,
    inside the windows the fractional schedule leaves it. Each task with a cross-device
    successor must end by its cut time X (α·earliest + (1 − α)·latest end under ``time_s``,
    no switch latencies) and each task starts after the cut times of its cross predecessors;
    as X_u ≤ start of u's successors in that schedule, the device plans fit together and the
    makespan is at most ``deadline_s``. None when some device cannot fit its windows (or the
    fractional schedule itself misses the deadline). ``cap``/``gcap``: :func:`chain_dp`'s
    label caps (measured: 16/64 is up to 40 % faster and up to 0.05 % dearer). On 16x64 1F1B
    with 1 ms switches it gives a start about 1.1 % above the bound in 1 s, better after the
    search than the other starts together."""
    ix = p.index
    D = float(deadline_s)
    _, end = ix.earliest(time_s)
    if not meets_deadline(max(end, default=0.0), D):
        return None
    cut = alpha * np.array(end) + (1 - alpha) * np.array(ix.latest_finish(time_s, D))
    wins = []
    for seq in ix.dev_seq.values():
        rels, dues, links = [], [], []
        for i, v in enumerate(seq):
            rel = max((cut[u] for u in ix.preds[v]), default=0.0)
            due = min(cut[v], D) if ix.succs[v] else D
            rels.append(np.full(ix.k[v], rel))
            dues.append(np.full(ix.k[v], due + 1e-12 * D))
            links.append((ix.tau[v], ix.extra[v]) if i > 0 and ix.tau[v] is not None else None)
        wins.append(PathWindow(list(seq), [ix.time[v] for v in seq], [ix.cost[v] for v in seq], rels, dues, links))
    subs = _chain_dps_split(wins, cap, gcap, parallel=ix.n >= PARALLEL_WINDOWS_MIN_TASKS)
    if any(sub is None for sub in subs):
        return None
    choice = np.zeros(ix.n, dtype=int)
    for win, sub in zip(wins, subs):
        choice[win.tasks] = sub
    if not plan_meets_deadline(p, choice, D):
        return None
    return choice


#: From this many tasks on, :func:`windowed_rounding` plans half of the devices in a worker
#: process (:mod:`solvers.workers`) when a second CPU is there: on 32x512 1F1B (32,768 tasks,
#: 60 clocks) its 32 device DPs take about 12 s, and a worker costs about 1 s to start.
PARALLEL_WINDOWS_MIN_TASKS = 8192


def chain_dps(windows: list[PathWindow], cap: int, gcap: int) -> list[np.ndarray | None]:
    """:func:`chain_dp` of each window (module level, so a worker process can run it)."""
    return [chain_dp(w, cap, gcap) for w in windows]


def _chain_dps_split(windows: list[PathWindow], cap: int, gcap: int,
                     parallel: bool) -> list[np.ndarray | None]:
    """:func:`chain_dps`, the first half of ``windows`` in a worker process when ``parallel``
    and a second CPU is there; the same answer either way (a failed worker's half is planned
    here)."""
    half = len(windows) // 2 if parallel and available_cpus() >= 2 else 0
    with start(chain_dps, windows[:half], cap, gcap, parallel=half > 0) as job:
        rest = chain_dps(windows[half:], cap, gcap)
        first = job.result()
        if job.fallback:
            log.info("windowed rounding: %s; its devices were planned here", job.fallback)
    return first + rest


def dependency_paths(p: Problem, device_hops: int = 1) -> list[list[int]]:
    """Cover the tasks with paths that follow cross-device dependencies first and device order
    (at most ``device_hops`` times per path) when a task has no free cross successor (in
    1F1B: each microbatch's forwards, then its backwards). A path never holds two tasks
    adjacent on a device unless they are next to each other in it (the switch between them
    must be exact). Cached on the problem's index."""
    ix = p.index
    cache = ix.__dict__.setdefault("_dep_paths", {})
    if device_hops in cache:
        return cache[device_hops]
    used = np.zeros(ix.n, dtype=bool)
    paths = []
    for v in ix.order:
        if used[v]:
            continue
        path = [v]
        used[v] = True
        on = {v}
        hops = 0
        while True:
            cur = path[-1]
            nxt = [w for w in ix.succs[cur] if not used[w]]
            dn = ix.dev_next[cur]
            if not nxt and hops < device_hops and dn >= 0 and not used[dn]:
                nxt.append(dn)
                hops += 1
            ok = [w for w in nxt if _joinable(ix, w, cur, on)]
            if not ok:
                break
            w = ok[0]
            path.append(w)
            on.add(w)
            used[w] = True
        if len(path) > 1:
            paths.append(path)
    cache[device_hops] = paths
    return paths


def _joinable(ix, w: int, last: int, on: set[int]) -> bool:
    """``w`` may follow ``last`` in a path holding ``on``: its device neighbours in the path,
    if any, are ``last`` (before it) only."""
    u = ix.dev_prev[w]
    if u in on and u != last:
        return False
    return ix.dev_next[w] not in on


def neighbourhoods(p: Problem) -> list[list[int]]:
    """Device chains (with more than one task) followed by dependency paths."""
    ix = p.index
    return [seq for seq in ix.dev_seq.values() if len(seq) > 1] + dependency_paths(p)


def polish(p: Problem, choice: np.ndarray, deadline_s: float, budget_s: float = 600.0,
           alphas: tuple[float, ...] = SearchOptions().alphas, paths: list[list[int]] | None = None,
           cap: int = 48, gcap: int = 160, work: float = 2_000.0,
           budget: Budget | None = None) -> np.ndarray:
    """Large-neighbourhood search: re-plan one path at a time (device chains and dependency
    paths, :func:`neighbourhoods`) with every other task held at a feasible start; keep the
    new plan when it meets the deadline and costs less. Sweeps cycle ``alphas`` (where the
    other tasks are held: α·ASAP + (1 − α)·ALAP start, a convex combination of two feasible
    schedules) until a whole cycle finds nothing or the budget is spent: ``work`` units
    (:func:`path_cost`; the ``budget_s`` seconds are a wall-clock safety net), or ``budget``
    when given. Never returns a worse plan.
    ``paths`` restricts the neighbourhoods; ``cap``/``gcap`` are :func:`chain_dp`'s label caps."""
    ix = p.index
    budget = Budget.of(work, budget_s) if budget is None else budget
    ch = np.asarray(choice).copy()
    best = ix.objective(ch)
    D = deadline_s
    paths = neighbourhoods(p) if paths is None else paths
    idle = 0
    k = 0
    while idle < len(alphas) and paths:
        a = alphas[k % len(alphas)]
        k += 1
        improved = False
        for path in paths:
            if budget.done():
                return ch
            start, end, _ = ix.schedule(ch)
            dur = end - start
            S = a * start + (1 - a) * (ix.latest(ch, D) - dur)
            win = path_window(p, path, ch, S, dur, D, tol_s=1e-13 * D)
            sub, labels = _chain_dp(win, cap, gcap)
            budget.spend(path_cost(p, labels))
            if sub is None or np.array_equal(sub, ch[path]):
                continue
            new = ch.copy()
            new[path] = sub
            if not plan_meets_deadline(p, new, D):
                continue
            e = ix.objective(new)
            if e < best - 1e-9 * abs(best):
                best, ch, improved = e, new, True
        idle = 0 if improved else idle + 1
    return ch


def _hold(p: Problem, choice: np.ndarray, segment: list[int], omega) -> np.ndarray:
    """``choice`` with every task of ``segment`` moved to its cheapest option at ``omega``
    (:func:`held_options`)."""
    new = choice.copy()
    new[segment] = held_options(p, choice[segment], segment, omega)
    return new


def held_options(p: Problem, current: np.ndarray, segment: list[int], omega) -> np.ndarray:
    """The options of ``segment``'s tasks (now ``current``) when a kick holds it at ``omega``:
    each task's cheapest option at that ω_dev; a task without one keeps its own."""
    ix = p.index
    new = np.array(current, copy=True)
    for n, v in enumerate(segment):
        opts = [j for j, o in enumerate(p.tasks[v].options) if o.omega.dev == omega]
        if opts:
            new[n] = min(opts, key=lambda j: ix.cost[v][j])
    return new


def _touching(p: Problem, segment: list[int]) -> list[list[int]]:
    """Neighbourhoods around ``segment``: its device chain, the device chains its cross
    dependencies reach, and the dependency paths through it."""
    ix = p.index
    on = set(segment)
    devs = {ix.device[segment[0]]}
    for v in segment:
        devs.update(ix.device[u] for u in ix.preds[v])
        devs.update(ix.device[w] for w in ix.succs[v])
    # in the index's device order: a set of names iterates in a per-process (hash) order
    out = [ix.dev_seq[d] for d in ix.dev_seq if d in devs and len(ix.dev_seq[d]) > 1]
    return out + [q for q in dependency_paths(p) if on.intersection(q)]


def iterated_polish(p: Problem, choice: np.ndarray, deadline_s: float,
                    budget_s: float = 600.0, seed: int = 0, max_segment: int = 32,
                    work: float = 2_000.0,
                    budget: Budget | None = None, caps: tuple[int, int] = (16, 64)) -> np.ndarray:
    """Iterated local search on top of :func:`polish`: a *kick* makes a random segment of one
    device hold one ω (that of a random task in it; runs of one clock are what switch costs
    favour and what one-path moves cannot build); a kick that still meets the deadline has
    its freed slack used (:func:`solvers.repair.relax_repeatedly`) and the paths around the segment
    re-planned, and is kept when it costs less. Stops when the budget is spent (``work``
    units, :func:`kick_cost` and :func:`path_cost`, with ``budget_s`` seconds as a safety net,
    or ``budget``); ``seed`` makes the result reproducible. ``caps``:
    :func:`chain_dp`'s label caps (``cap``, ``gcap``) in the re-planning after a kick."""
    ix = p.index
    budget = Budget.of(work, budget_s) if budget is None else budget
    rng = np.random.default_rng(seed)
    ch = np.asarray(choice).copy()
    best = ix.objective(ch)
    D = deadline_s
    seqs = [s for s in ix.dev_seq.values() if len(s) > 1]
    while seqs and not budget.done():
        seq = seqs[int(rng.integers(len(seqs)))]
        length = int(rng.integers(2, min(max_segment, len(seq)) + 1))
        i = int(rng.integers(0, len(seq) - length + 1))
        seg = seq[i:i + length]
        v = seg[int(rng.integers(length))]
        new = _hold(p, ch, seg, p.tasks[v].options[ch[v]].omega.dev)
        # A kick that misses the deadline is dropped, not crashed: crashing took half the
        # search's time and ended higher (measured on 16x64 1F1B).
        if np.array_equal(new, ch) or not plan_meets_deadline(p, new, D):
            budget.spend(kick_cost(p, tried=False))
            continue
        budget.spend(kick_cost(p, tried=True))
        new = relax_repeatedly(p, new, D, rounds=2)
        new = polish(p, new, D, alphas=(0.5,), paths=_touching(p, seg), cap=caps[0], gcap=caps[1],
                     budget=budget)
        e = ix.objective(new)
        if e < best - 1e-9 * abs(best) and plan_meets_deadline(p, new, D):
            best, ch = e, new
    return ch
