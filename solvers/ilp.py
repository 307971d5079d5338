"""Exact MILP through PuLP for general DAGs (solver-notes §3.1, §4, §8).

Compact "mode + start time" model: binary x[v,a] (task v uses option a), continuous start S_v
and makespan M ≤ D; minimise P_total·M + Σ cost·x + Σ switch extra. Switches between
consecutive same-device tasks use the tight *transportation* linearisation (continuous
y[a,b] with row sums x[u,a] and column sums x[w,b]), which is integral whenever x is. Where
every switch on a pair costs the same (a :class:`~solvers.model.ConstantTransition`, the usual
case), the pair instead gets one continuous z per operating point, z_ω ≥ X_u,ω − X_w,ω
(solver-notes §4's cheaper special case, per ω): the same LP bound as the transport matrix
(both price a switch at c·Σ_ω max(0, X_u,ω − X_w,ω)) with K instead of K² columns.
A steady-state problem adds one more such pair per device, its last task → its first (the
next iteration's): the same linearisation, its latency a lower bound on the first task's start.
Options that cannot meet the deadline given critical-path bounds with the fastest options are
fixed out; without switches, options dominated in (T, effective energy) are dropped too.

Solvers: HiGHS (``highspy``) wherever it is importable, CBC (bundled with PuLP 3,
``pulp[cbc]`` in PuLP 4) as the fallback, found with ``pulp.listSolvers(onlyAvailable=True)``;
when HiGHS answers without a solution (neither one nor a proof of infeasibility), the same
model is solved by CBC. HiGHS runs with ``mip_rel_gap`` 0 and ``mip_abs_gap`` 1e-9 J (its
defaults, 1e-4 and 1e-6 J, would call a 0.01 % gap "optimal"). A solve is budgeted by
branch-and-bound nodes (:meth:`solvers.options.IlpOptions.nodes`, work: the same on any
machine); the backend's own time limit (``backend_time_limit_s``, which :func:`solvers.solve`
derives from the caller's wall-clock safety net) only stops a runaway solve, and
``ILPResult.time_capped`` says when it fired. The status is read from ``sol_status``: a time limit with an incumbent is
*not* optimal. The lower bound is reported as the solver gives it (HiGHS' dual bound), never
clamped to the plan's energy.

A command-line solver (CBC) runs as a child process on files PuLP writes (``*-pulp.mps``,
``.sol``, ...). :func:`solver_sandbox` gives each solve a private temp folder, removed
afterwards whatever happens, and on an interrupt or error kills the solver process still
working in it (found through ``/proc`` on Linux; elsewhere only the folder is removed). CBC
counts its ``-sec`` in elapsed time (``timeMode elapsed``: in CPU time it overran by minutes
on a loaded machine) and is killed :data:`HARD_KILL_GRACE_S` after the net's end if it is
still running. HiGHS runs in this process (:func:`guarded_highs_class`): in a thread with its
MIP interrupt callback on, so that a signal or the net stops it, after resetting HiGHS'
process-wide thread scheduler (an earlier HiGHS solve with another thread count, such as the
hull LP's, made every later one answer "not solved", issue 32).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .guarded import run_cancellable
from .index import constant_switch
from .limits import NetFired, cap_seconds
from .model import Problem, SolverUnavailableError
from .options import IlpOptions
from .quiet import c_stdout_quiet

# HiGHS first (issue 22: on 4x8 1F1B with 1 ms switches it beat our plan and bound in 60 s);
# CBC is the fallback. PuLP 3.3.2's in-process HiGHS was once seen to answer "not solved":
# solve_ilp then re-solves with the next solver, so such an answer never ends the solve.
_PREFERENCE = ("HiGHS", "HiGHS_CMD", "PULP_CBC_CMD", "COIN_CMD")

def available_solvers() -> list[str]:
    """MILP solvers PuLP can run here, in our order of preference."""
    import pulp

    have = set(pulp.listSolvers(onlyAvailable=True))
    return [s for s in _PREFERENCE if s in have]


def make_solver(name: str | None = None, backend_time_limit_s: float | None = None, gap_rel: float = 0.0,
                threads: int = 1, warm_start: bool = False, max_nodes: int | None = None):
    """A PuLP solver object: ``name`` or the first available (HiGHS, then CBC), with the
    backend's own time limit (a safety net, s; CBC counts it in elapsed time, not CPU time), a
    relative gap (0: solve to optimality) and a node budget. HiGHS comes as
    :func:`guarded_highs_class`: it runs where a signal or the net can stop it, in one
    thread, whatever thread scheduler an earlier HiGHS solve in this process left."""
    import pulp

    avail = available_solvers()
    if not avail:
        raise SolverUnavailableError(
            "no MILP solver available to PuLP (PuLP 4 bundles none): install 'pulp[cbc]' or "
            "'highspy' (energy-calculus[highs])")
    if name is None:
        name = avail[0]
    elif name not in avail:
        raise SolverUnavailableError(f"solver {name!r} is not available; available: {avail}")
    kw = {"msg": False}
    if backend_time_limit_s is not None:
        kw["timeLimit"] = float(backend_time_limit_s)
    if gap_rel > 0:
        kw["gapRel"] = float(gap_rel)
    if name in ("PULP_CBC_CMD", "COIN_CMD"):
        kw["threads"] = threads
        kw["warmStart"] = warm_start
        # CBC's -sec counts CPU seconds by default: on a loaded machine it ran minutes past
        # its limit (issue 32). Elapsed time is what a safety net means.
        kw["timeMode"] = "elapsed"
        if max_nodes is not None:
            kw["maxNodes"] = int(max_nodes)
    elif name == "HiGHS":
        kw["threads"] = threads
        kw["gapRel"] = float(gap_rel)          # HiGHS' default 1e-4 is no proof of optimality
        kw["gapAbs"] = 1e-9                    # its default 1e-6 J shows as a gap of ~1e-8
        if max_nodes is not None:
            kw["mip_max_nodes"] = int(max_nodes)
        # PuLP 3.3.2's HiGHS returned "Not Solved" at once with msg=False on switch-cost models
        # (seen here); msg=True with HiGHS' own console log off solves them and stays quiet.
        kw["msg"] = True
        kw["log_to_console"] = False
    if name == "HiGHS":
        return guarded_highs_class()(**kw)
    with warnings.catch_warnings():
        # PuLP 3.3 warns that PULP_CBC_CMD goes away in PuLP 4; we already detect what exists.
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.getSolver(name, **kw)


_GUARDED_HIGHS = None


def guarded_highs_class():
    """PuLP's in-process ``HiGHS`` solver, run so that it can be stopped and is not spoilt by
    an earlier HiGHS solve in this process.

    * HiGHS keeps one thread scheduler per process, sized by the first solve's ``threads``;
      a later solve asking for another count failed at once with "not solved" (issue 32:
      after the hull LP's warm model, every MILP fell back to CBC). Before each run the
      scheduler is reset (``Highs.resetGlobalScheduler``), so the ``threads`` asked for hold.
    * The run happens in a thread (:func:`solvers.guarded.run_cancellable`) with HiGHS'
      interrupt callback on: a signal, or the safety net passing its end by
      :data:`HARD_KILL_GRACE_S`, stops it (``highspy``'s own ``time_limit`` normally ends it
      first). ``self.stopped`` then says so."""
    global _GUARDED_HIGHS
    if _GUARDED_HIGHS is None:
        import pulp

        base = pulp.HiGHS
        if not all(hasattr(base, m) for m in ("callSolver", "findSolutionValues", "actualSolve")):
            return lambda **kw: pulp.getSolver("HiGHS", **kw)     # another PuLP: as it comes

        class GuardedHiGHS(base):
            name = "HiGHS"
            hard_end: float | None = None
            stopped = False

            def callSolver(self, lp):
                h = lp.solverModel
                _reset_highs_scheduler()
                cancel = _highs_canceller(h)
                _, self.stopped = run_cancellable(h.run, cancel, end=self.hard_end)

            def findSolutionValues(self, lp):
                return _highs_solution(lp)

        _GUARDED_HIGHS = GuardedHiGHS
    return _GUARDED_HIGHS


def _highs_solution(lp) -> tuple[int, int]:
    """PuLP 3's reading of an in-process HiGHS solve, for every model status: PuLP 3.3.2 has
    no entry for ``kSolutionLimit`` (what HiGHS answers when ``mip_max_nodes`` ends the
    search: a KeyError there) and takes ``kInterrupt`` without an incumbent for a solution.
    A limit (nodes, time, interrupt) with a feasible incumbent reads "optimal" with solution
    status "integer feasible", as a time limit does in PuLP; without one, "not solved"."""
    import highspy
    from pulp import constants as C

    h = lp.solverModel
    status = h.getModelStatus()
    MS = highspy.HighsModelStatus
    solution = h.getSolution()
    for var in lp.variables():
        var.varValue = solution.col_value[var.index]
        var.dj = solution.col_dual[var.index]
    for con in lp._constraints.values():
        con.slack = -(con.constant + solution.row_value[con.index])
        if con.sense != C.LpConstraintLE:
            con.slack = -con.slack
        con.pi = solution.row_dual[con.index]
    if status == MS.kOptimal:
        return C.LpStatusOptimal, C.LpSolutionOptimal
    if status in (MS.kInfeasible, MS.kUnboundedOrInfeasible):
        return C.LpStatusInfeasible, C.LpSolutionInfeasible
    if status == MS.kUnbounded:
        return C.LpStatusUnbounded, C.LpSolutionUnbounded
    try:
        feasible = int(h.getInfo().primal_solution_status) == 2     # kSolutionStatusFeasible
    except (AttributeError, TypeError, ValueError):
        feasible = False
    if feasible and math.isfinite(h.getObjectiveValue()):
        return C.LpStatusOptimal, C.LpSolutionIntegerFeasible
    return C.LpStatusNotSolved, C.LpSolutionNoSolutionFound


def _reset_highs_scheduler() -> None:
    """Drop HiGHS' process-wide thread scheduler (the next run builds one with its own
    ``threads``); nothing on a ``highspy`` without that call."""
    try:
        import highspy

        reset = getattr(highspy.Highs, "resetGlobalScheduler", None)
        if reset is not None:
            reset(True)
    except Exception:            # an old or odd highspy: the solve may still work
        pass


def _highs_canceller(h):
    """A function that asks the running HiGHS model ``h`` to stop, through its MIP interrupt
    callback (checked at every branch-and-bound node; the simplex one, checked at every
    iteration, cost 10 % of a 40-task MILP's time and is not needed at these sizes)."""
    flag = threading.Event()
    if hasattr(type(h), "cbMipInterrupt"):       # highspy 1.8 on: checked at every node
        def on_mip(event) -> None:
            if flag.is_set():
                event.interrupt()

        try:
            h.cbMipInterrupt += on_mip
            return flag.set
        except Exception:
            pass
    try:
        import highspy

        kinds = highspy.cb.HighsCallbackType

        def callback(kind, message, data_out, data_in, user_data):
            if flag.is_set():
                data_in.user_interrupt = True

        h.setCallback(callback, None)
        for k in ("kCallbackSimplexInterrupt", "kCallbackIpmInterrupt", "kCallbackMipInterrupt"):
            h.startCallback(getattr(kinds, k))
    except Exception:            # no callbacks: a signal then waits for HiGHS' own limits
        pass
    return flag.set


def _children_using(folder: str) -> list[int]:
    """PIDs of this process's children whose command line names ``folder`` (Linux /proc)."""
    me, out = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for d in entries:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                if folder.encode() in fh.read():
                    out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue    # the process ended meanwhile
    return out


def _kill_children_using(folder: str) -> None:
    """Kill and reap the solver processes still working in ``folder``."""
    for pid in _children_using(folder):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


#: Seconds past its end that the safety net gives a backend before it is killed (CBC) or
#: interrupted (HiGHS): their own time limits normally end them first.
HARD_KILL_GRACE_S = 1.0


@dataclass
class Sandbox:
    """What :func:`solver_sandbox` saw: whether it had to kill the solver at ``kill_at``."""

    killed: bool = False


@contextmanager
def solver_sandbox(slv, kill_at: float | None = None) -> Iterator[Sandbox]:
    """Run a PuLP command-line solver in a private temp folder: on any exception (Ctrl-C and
    SIGTERM included) kill its child process, and always remove the folder and its files.
    ``kill_at`` (a ``time.perf_counter()`` instant): kill the solver process then if it is
    still running (CBC's own ``-sec`` was seen to overrun by minutes); ``.killed`` says it
    was. An in-process HiGHS gets ``kill_at`` as the moment to interrupt it."""
    box = Sandbox()
    if not hasattr(slv, "tmpDir"):      # in-process solvers (highspy) write no files
        if hasattr(slv, "hard_end"):
            slv.hard_end = kill_at
        yield box
        if getattr(slv, "stopped", False):
            box.killed = True
        return
    folder = tempfile.mkdtemp(prefix="ecal-solver-")
    old_dir, old_keep = slv.tmpDir, getattr(slv, "keepFiles", False)
    slv.tmpDir, slv.keepFiles = folder, False
    timer = None
    if kill_at is not None:

        def kill() -> None:
            box.killed = True
            _kill_children_using(folder)

        timer = threading.Timer(max(kill_at - time.perf_counter(), 0.0), kill)
        timer.daemon = True
        timer.start()
    try:
        yield box
    except BaseException:
        _kill_children_using(folder)
        raise
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
        slv.tmpDir, slv.keepFiles = old_dir, old_keep
        shutil.rmtree(folder, ignore_errors=True)


def _var(prob, name: str, low: float | None, up: float | None, cat: str):
    """Create a variable the PuLP-4 way when available (``prob.add_variable``), else 3.x."""
    import pulp

    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, lowBound=low, upBound=up, cat=cat)
    return pulp.LpVariable(name, lowBound=low, upBound=up, cat=cat)  # pragma: no cover


@dataclass(frozen=True)
class SolveStatus:
    """What a PuLP solve returned, read the same way on PuLP 3 and 4."""

    name: str
    has_solution: bool
    optimal: bool
    infeasible: bool
    best_bound: float | None = None


def read_status(prob, ret) -> SolveStatus:
    """PuLP 4: ``solve()`` returns ``LpSolveStats`` (``status``, ``has_solution``,
    ``best_bound``). PuLP 3: ``prob.status`` and ``prob.sol_status``; a time limit with an
    incumbent reads status 1 ("Optimal") but sol_status 2 (integer feasible) — not optimal."""
    import pulp

    if hasattr(ret, "has_solution"):                                   # PuLP 4
        name = getattr(ret.status, "name", str(ret.status))
        bb = getattr(ret, "best_bound", None)
        return SolveStatus(name, bool(ret.has_solution), name.lower() == "optimal",
                           "infeasible" in name.lower(), float(bb) if bb is not None else None)
    sol = getattr(prob, "sol_status", None)
    name = pulp.LpStatus.get(prob.status, str(prob.status))
    if prob.status == pulp.LpStatusInfeasible:
        return SolveStatus(name, False, False, True)
    has = sol in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible) or (
        sol is None and prob.status == pulp.LpStatusOptimal)
    return SolveStatus(name, has, sol == pulp.LpSolutionOptimal, False)


@dataclass(frozen=True)
class ILPResult:
    """Choice (None if no solution), objective, lower bound, status, optimality."""

    choice: list[int] | None
    energy_j: float
    lower_bound_j: float
    status: str
    optimal: bool
    solver: str
    time_capped: bool = False    # the time limit (a safety net) ended the solve


def allowed_options(p: Problem, deadline_s: float) -> list[list[int]]:
    """Options not excluded by critical-path bounds (and dominance when switches are free)."""
    ix = p.index
    fast = ix.fastest_choice()
    start, end, _ = ix.schedule(fast)
    lf = ix.latest(fast, deadline_s)
    # Without switch latencies ES/tail are exact bounds for any plan; with them the fastest
    # plan's latencies are not a bound, so only the fastest-time bounds are used.
    es = start if not ix.has_transitions else _bounds_without_tau(ix, fast)[0]
    lfin = lf if not ix.has_transitions else _bounds_without_tau(ix, fast, deadline_s)[1]
    out = []
    for v in range(ix.n):
        room = lfin[v] - es[v]
        ok = [a for a in range(ix.k[v]) if ix.time[v][a] <= room * (1 + 1e-12) + 1e-15]
        if not ix.has_transitions:
            t, c = ix.time[v], ix.cost[v]
            ok = [a for a in ok if not any((t[b] <= t[a] and c[b] < c[a]) or (t[b] < t[a] and c[b] <= c[a])
                                           for b in ok)]
            # keep one of exact duplicates
            seen = set()
            ok = [a for a in ok if not ((t[a], c[a]) in seen or seen.add((t[a], c[a])))]
        out.append(ok or [int(fast[v])])
    return out


def _bounds_without_tau(ix, fast, horizon: float | None = None):
    dur = ix.durations(fast)
    es = np.zeros(ix.n)
    for v in ix.order:
        s = 0.0
        for u in ix.preds[v]:
            s = max(s, es[u] + dur[u])
        u = ix.dev_prev[v]
        if u >= 0:
            s = max(s, es[u] + dur[u])
        es[v] = s
    lf = np.full(ix.n, horizon if horizon is not None else float((es + dur).max()))
    for v in reversed(ix.order):
        f = lf[v]
        for w in ix.succs[v]:
            f = min(f, lf[w] - dur[w])
        w = ix.dev_next[v]
        if w >= 0:
            f = min(f, lf[w] - dur[w])
        lf[v] = f
    return es, lf


def build_model(p: Problem, deadline_s: float, allowed: list[list[int]] | None = None,
                relaxed: bool = False, transport: bool = False):
    """The MILP at ``deadline_s`` as ``(pulp.LpProblem, x, S, M)`` (x[v][a]: task v uses
    option a), over each task's ``allowed`` options (default :func:`allowed_options`).
    ``relaxed`` makes x continuous (the LP relaxation); ``transport`` uses the full transport
    matrix even where switch costs are constant (to compare the two linearisations)."""
    import pulp

    ix = p.index
    allowed = allowed_options(p, deadline_s) if allowed is None else allowed
    prob = pulp.LpProblem("ecal_plan", pulp.LpMinimize)
    cat = "Continuous" if relaxed else "Binary"
    x = [{a: _var(prob, f"x_{v}_{a}", 0, 1, cat) for a in allowed[v]} for v in range(ix.n)]
    S = [_var(prob, f"S_{v}", 0, deadline_s, "Continuous") for v in range(ix.n)]
    M = _var(prob, "M", 0, deadline_s, "Continuous")
    dur = [pulp.lpSum(float(ix.time[v][a]) * xv for a, xv in x[v].items()) for v in range(ix.n)]
    obj = [ix.p_total * M] + [pulp.lpSum(float(ix.cost[v][a]) * xv for a, xv in x[v].items())
                              for v in range(ix.n)]
    for v in range(ix.n):
        prob += pulp.lpSum(x[v].values()) == 1, f"one_{v}"
    for u, w in ix.edges:
        prob += S[w] >= S[u] + dur[u], f"e_{u}_{w}"
    # consecutive same-device pairs, and a steady state's wrap pairs (last -> first: its
    # latency delays the first task from 0, its energy is charged like any switch)
    pairs = [(ix.dev_prev[w], w, False) for w in range(ix.n) if ix.dev_prev[w] >= 0]
    pairs += [(ix.wrap_prev[w], w, True) for w in range(ix.n) if ix.wrap_tau[w] is not None]
    for u, w, wrap in pairs:
        tag = f"w{w}" if wrap else f"{w}"
        mats = (ix.wrap_tau[w], ix.wrap_extra[w]) if wrap else (ix.tau[w], ix.extra[w])
        lat = 0
        const = None if transport else constant_switch(p, u, w)
        if const is not None:
            tau0, ext0, groups_u, groups_w = const
            z = []
            for om, aa in groups_u.items():
                if not any(a in x[u] for a in aa):
                    continue
                zv = _var(prob, f"z_{tag}_{len(z)}", 0, 1, "Continuous")
                prob += (zv >= pulp.lpSum(x[u][a] for a in aa if a in x[u])
                         - pulp.lpSum(x[w][b] for b in groups_w.get(om, ()) if b in x[w])), f"z_{tag}_{len(z)}"
                z.append(zv)
            sigma = pulp.lpSum(z)       # ≥ 1 exactly when ω changes (x integral), else can be 0
            lat = tau0 * sigma if tau0 > 0 else 0
            if ext0 > 0:
                obj.append(ext0 * sigma)
        elif mats[0] is not None:
            tau, ext = mats
            # the full transport matrix, zero-cost pairs included: its marginals are x[u], x[w]
            y = {(a, b): _var(prob, f"y_{tag}_{a}_{b}", 0, 1, "Continuous")
                 for a in allowed[u] for b in allowed[w]}
            for a in allowed[u]:
                prob += pulp.lpSum(y[a, b] for b in allowed[w]) == x[u][a], f"yr_{tag}_{a}"
            for b in allowed[w]:
                prob += pulp.lpSum(y[a, b] for a in allowed[u]) == x[w][b], f"yc_{tag}_{b}"
            lat = pulp.lpSum(float(tau[a, b]) * yv for (a, b), yv in y.items() if tau[a, b] > 0)
            obj.append(pulp.lpSum(float(ext[a, b]) * yv for (a, b), yv in y.items() if ext[a, b] > 0))
        if not wrap:
            prob += S[w] >= S[u] + dur[u] + lat, f"d_{u}_{w}"
        elif not isinstance(lat, int):
            prob += S[w] >= lat, f"dw_{u}_{w}"
    for v in range(ix.n):
        if not ix.succs[v] and ix.dev_next[v] < 0:
            prob += M >= S[v] + dur[v], f"m_{v}"
    prob += pulp.lpSum(obj)
    return prob, x, S, M


def solve_ilp(p: Problem, deadline_s: float, backend_time_limit_s: float | None = 60.0, gap_rel: float = 0.0,
              warm_start: list[int] | np.ndarray | None = None, solver: str | None = None,
              fallback_bound_j: float = -math.inf, opts: IlpOptions = IlpOptions()) -> ILPResult:
    """Solve the compact MILP (:func:`build_model`) at ``deadline_s`` with ``solver`` or, by
    default, HiGHS and then (when HiGHS gives no answer) CBC; ``warm_start`` is an incumbent
    choice (handed to the backend only with ``opts.mip_starts``); ``opts.nodes(...)`` the node
    budget (its work, by the model's size); ``backend_time_limit_s`` the backend's own time limit, a safety net
    for the whole call (HiGHS and then CBC share it), never past the end of an enclosing
    :func:`solvers.limits.wall_net`. A backend still running :data:`HARD_KILL_GRACE_S` after
    it is killed (CBC) or interrupted (HiGHS): the result then has no plan and says
    ``time_capped``; no solver process or temp file is left behind."""
    limit = cap_seconds(backend_time_limit_s)
    end = None if limit is None else time.perf_counter() + limit
    names = [solver] if solver else (available_solvers() or [None])
    r = None
    for name in names:
        left = None if end is None else end - time.perf_counter()
        if left is not None and left <= 0:
            return r or ILPResult(None, math.inf, fallback_bound_j, "time_limit", False,
                                  name or "none", True)
        r = _solve_ilp_with(p, deadline_s, left, gap_rel, warm_start, name, fallback_bound_j, opts)
        if r.choice is not None or r.status == "infeasible":
            return r
    return r


def _solve_ilp_with(p: Problem, deadline_s: float, backend_time_limit_s: float | None, gap_rel: float,
                    warm_start, solver: str | None, fallback_bound_j: float,
                    opts: IlpOptions) -> ILPResult:
    """:func:`solve_ilp` with one solver."""
    import pulp

    from .feasibility import meets_deadline

    ix = p.index
    prob, x, S, M = build_model(p, deadline_s)
    # Warm start: CBC's MIP start was seen to come back as an "optimal" solution violating
    # the deadline (PuLP 3.3.2), and a warm-started HiGHS solve (highspy 1.16 through PuLP
    # 3.3.2) returned "not solved" and left every later HiGHS solve in the process "not
    # solved". So MIP starts stay off (IlpOptions.mip_starts); the caller keeps the heuristic
    # plan as a fallback and its bound, and every returned plan is re-checked below.
    use_warm = False
    name = solver or (available_solvers() or [None])[0]
    if opts.mip_starts and warm_start is not None and name == "HiGHS" and all(int(warm_start[v]) in x[v] for v in range(ix.n)):
        st, _, mk = ix.schedule(warm_start)
        if meets_deadline(mk, deadline_s):
            for v in range(ix.n):
                for a, xv in x[v].items():
                    xv.setInitialValue(1 if a == int(warm_start[v]) else 0)
                S[v].setInitialValue(float(st[v]))
            M.setInitialValue(float(mk))
            use_warm = True
    # CBC and HiGHS are told 1 s less than the net, so that their own limit ends them
    # (with an incumbent) before the net's kill at its end plus HARD_KILL_GRACE_S
    limit = None if backend_time_limit_s is None else max(float(backend_time_limit_s), 0.0)
    own = None if limit is None else max(limit - 1.0, min(limit, 0.5))
    nodes = opts.nodes(sum(len(xv) for xv in x))
    slv = make_solver(solver, own, gap_rel, warm_start=use_warm, max_nodes=nodes)
    t0 = time.perf_counter()
    kill_at = None if limit is None else t0 + limit + HARD_KILL_GRACE_S
    try:
        with warnings.catch_warnings(), solver_sandbox(slv, kill_at) as box, \
                c_stdout_quiet(slv.name == "HiGHS"):
            warnings.simplefilter("ignore", DeprecationWarning)
            ret = prob.solve(slv)
    except (pulp.PulpSolverError, NetFired) as exc:
        if isinstance(exc, NetFired) or box.killed:     # the net killed it: no answer to read
            return ILPResult(None, math.inf, fallback_bound_j, "time_limit", False, slv.name, True)
        raise
    # Not optimal once the time limit has passed: the safety net (not the node budget) ended it.
    ran_out = box.killed or (limit is not None and time.perf_counter() - t0 >= 0.95 * own)
    st = read_status(prob, ret)
    if st.infeasible:
        return ILPResult(None, math.inf, math.inf, "infeasible", False, slv.name)
    if not st.has_solution:
        return ILPResult(None, math.inf, fallback_bound_j, st.name.lower(), False, slv.name, ran_out)
    choice = []
    for v in range(ix.n):
        vals = {a: (xv.varValue or 0.0) for a, xv in x[v].items()}
        choice.append(max(vals, key=vals.get))
    if not meets_deadline(ix.makespan(choice), deadline_s):
        return ILPResult(None, math.inf, fallback_bound_j, "invalid solution", False, slv.name, ran_out)
    energy = ix.objective(choice)
    optimal = st.optimal and gap_rel == 0.0
    best = st.best_bound if st.best_bound is not None else _highs_dual_bound(prob)
    if best is not None and math.isfinite(best):
        bound = max(fallback_bound_j, best)                  # raw, as the solver proved it
    elif st.optimal:
        bound = max(fallback_bound_j, energy * (1 - gap_rel))   # optimal to within gap_rel
    else:
        bound = fallback_bound_j
    return ILPResult(choice, energy, bound, "optimal" if optimal else
                     ("gap" if st.optimal else "time_limit" if ran_out else "node_limit"),
                     optimal, slv.name, ran_out and not st.optimal)


def _highs_dual_bound(prob) -> float | None:
    """The MIP dual bound of an in-process HiGHS solve through PuLP 3 (None for other solvers)."""
    model = getattr(prob, "solverModel", None)
    try:
        v = float(model.getInfo().mip_dual_bound)
    except (AttributeError, TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
