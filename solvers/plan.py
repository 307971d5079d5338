"""Plans: one option per task with start/end times, energy breakdown, propagated σ and the
proven optimality gap; and Pareto curves (energy vs deadline) made of plans."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from frontier.errors import FormatError, InputError
from frontier.files import read_json, write_json_atomic
from frontier.formats import KINDS, content, validate
from frontier.signature import Term, variances_from_terms

from .calibration import Calibration, combined_sd, plan_calibration
from .feasibility import (
    CertificateError,
    bound_proves,
    check_bound,
    latest_makespan_s,
    meets_deadline,
    p_meets,
)
from .model import InfeasibleError, Problem


@dataclass(frozen=True)
class TaskPlan:
    """One task's choice: option index and label, times and predicted T/E."""

    name: str
    device: str
    option: int
    label: str
    start_s: float
    end_s: float
    time_s: float
    energy_j: float
    power_w: float
    slack_s: float
    sm_clock_mhz: float | None = None


@dataclass(frozen=True)
class Plan:
    """A chosen operating point per task and what it costs.

    ``energy_j`` = ``static_busy_j + idle_j + dynamic_j + transition_j``; ``sd_*`` are the
    delta-method σ over the distinct measured leaves behind the chosen options (a leaf used k
    times contributes k²·var; see :func:`plan_terms`), the σ ``frontier.dag`` gives for the
    chosen signatures on the plan's schedule. ``lower_bound_j`` is the method's lower bound on
    the optimum at this deadline as it computed it (never clamped to the plan's energy; one
    above it by more than :data:`solvers.feasibility.BOUND_REL_TOL` raises) and ``gap`` =
    max(0, (energy − bound)/energy) (0 below :data:`solvers.feasibility.PROOF_REL_TOL`: float
    rounding). ``status`` is ``optimal`` (the method proved it),
    ``feasible`` (gap not closed) or ``time_limit``. ``time_capped`` is True when a wall-clock
    safety net (``time_limit_s``) fired while this plan was made: then another machine, or
    the same one under another load, may return another plan; otherwise the plan depends
    only on the input (every search is budgeted by work).
    """

    problem: str
    method: str
    status: str
    deadline_s: float
    makespan_s: float
    sd_makespan_s: float
    energy_j: float
    sd_energy_j: float
    static_busy_j: float
    idle_j: float
    dynamic_j: float
    transition_j: float
    n_switches: int
    lower_bound_j: float
    gap: float
    wall_s: float
    tasks: tuple[TaskPlan, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)
    time_capped: bool = False

    @property
    def choice(self) -> dict[str, int]:
        """Task name → option index."""
        return {t.name: t.option for t in self.tasks}

    @property
    def target_deadline_s(self) -> float:
        """The deadline asked for: ``deadline_s``, unless :mod:`solvers.confidence` tightened
        it to keep it at a confidence (then ``deadline_s`` is the tightened deadline the
        method solved, and this one is in ``meta["confidence"]``)."""
        c = self.meta.get("confidence") if isinstance(self.meta, Mapping) else None
        return float(c["deadline_s"]) if isinstance(c, Mapping) and "deadline_s" in c else self.deadline_s

    @property
    def p_meets_deadline(self) -> float:
        """P(makespan ≤ :attr:`target_deadline_s`) = Φ((D − T)/σ_T) from the propagated σ_T
        (σ_T = 0: 1.0 or 0.0); :func:`solvers.feasibility.p_meets`. A plan made with a
        calibration (``ecal tune``) states it for its calibrated makespan (T + b_T, σ of both)."""
        return p_meets(self.target_deadline_s, *self.calibrated_makespan_s)

    @property
    def context(self) -> Mapping[str, Any] | None:
        """What the plan records of its entry context (``meta["context"]``,
        :func:`solvers.context.context_record`), or None: composed at the null context."""
        c = self.meta.get("context") if isinstance(self.meta, Mapping) else None
        return c if isinstance(c, Mapping) else None

    @property
    def in_context_makespan_s(self) -> tuple[float, float]:
        """(makespan, σ) of the plan composed with its entry context (:mod:`solvers.context`);
        the null-context makespan when it was not."""
        c = self.context
        if c is None:
            return self.makespan_s, self.sd_makespan_s
        return float(c["makespan_s"]), float(c["sd_makespan_s"])

    @property
    def calibrated_makespan_s(self) -> tuple[float, float]:
        """(makespan, σ) in its entry context (when composed with it) plus the measured offset
        of the calibration the plan was made with (:mod:`solvers.calibration`); the model's own
        when it has neither."""
        off = plan_calibration(self).step
        t, sd = self.in_context_makespan_s
        return t + off.time_s, combined_sd(sd, off.sd_time_s)

    def summary(self) -> str:
        """A short human table."""
        per_dev: dict[str, list[str]] = {}
        for t in self.tasks:
            per_dev.setdefault(t.device, []).append(t.label)
        lines = [
            f"plan for {self.problem}  (method {self.method}, {self.status})",
            *deadline_lines(self),
            f"  makespan   {self.makespan_s * 1e3:10.3f} ms ± {self.sd_makespan_s * 1e3:.3f}",
            f"  energy     {self.energy_j:10.3f} J  ± {self.sd_energy_j:.3f}",
            f"    static busy {self.static_busy_j:10.3f} J   idle {self.idle_j:10.3f} J",
            f"    dynamic     {self.dynamic_j:10.3f} J   transitions {self.transition_j:8.3f} J",
            f"  switches   {self.n_switches}",
            f"  bound      {self.lower_bound_j:10.3f} J   gap {self.gap * 100:.3f} %",
            f"  wall time  {self.wall_s:.3f} s",
        ]
        lines += context_lines(self)
        assumed = self.meta.get("assumptions") if isinstance(self.meta, Mapping) else None
        lines += [f"  assumption: {a}" for a in assumed or ()]
        if self.time_capped:
            search = self.meta.get("search")
            done = (f" after {search.get('work_units')} of {search.get('work_budget')} work units"
                    if isinstance(search, Mapping) else "")
            lines.append(f"  note: the wall-clock safety net (time limit) fired{done}, so another "
                         f"machine or load may return another plan")
        for dev, labels in list(per_dev.items())[:8]:
            uniq = list(dict.fromkeys(labels))
            shown = ", ".join(uniq[:4]) + (f", … ({len(uniq)} distinct)" if len(uniq) > 4 else "")
            lines.append(f"  {dev}: {len(labels)} tasks at {shown}")
        if len(per_dev) > 8:
            lines.append(f"  … {len(per_dev) - 8} more devices")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``"format": "ecal.plan/1"``)."""
        d: dict[str, Any] = {"format": KINDS["plan"].tag}
        d.update({k: getattr(self, k) for k in self.__dataclass_fields__
                  if k not in ("tasks", "meta")})
        d["p_meets_deadline"] = self.p_meets_deadline
        d["meta"] = dict(self.meta)
        d["tasks"] = [dict(vars(t)) for t in self.tasks]
        return d

    @classmethod
    def from_dict(cls, d: Any, file: str = "<dict>") -> Plan:
        """Inverse of :meth:`to_dict` (shape: :class:`solvers.format_models.PlanFile`); errors
        name the file and field. Older plans (``"schema_version": "ecal.plan/1"``, no
        ``time_capped``) read too; a bound or gap a file holds as null (it was inf) reads as
        inf."""
        from .format_models import PlanFile

        _, body = content(file, d, "plan")
        m = validate(PlanFile, body, file)
        kw: dict[str, Any] = {k: getattr(m, k) for k in cls.__dataclass_fields__
                              if k not in ("tasks", "meta")}
        kw["lower_bound_j"] = -math.inf if m.lower_bound_j is None else m.lower_bound_j
        kw["gap"] = math.inf if m.gap is None else m.gap
        tasks = tuple(TaskPlan(**t.model_dump()) for t in m.tasks)
        if "calibration" in m.meta:       # checked now, not when a run first uses it
            Calibration.from_dict(m.meta["calibration"], file)
        return cls(**kw, tasks=tasks, meta=dict(m.meta))

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as JSON atomically."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        """Read a plan written by :meth:`save`."""
        return cls.from_dict(read_json(path), str(path))


def _gap(energy: float, bound: float) -> float:
    if not math.isfinite(bound) or energy <= 0:
        return math.inf
    return max(0.0, (energy - bound) / energy)


def make_plan(problem: Problem, choice: Sequence[int], deadline_s: float, *, method: str,
              lower_bound_j: float, wall_s: float, proven: bool = False,
              status: str | None = None, meta: Mapping[str, Any] | None = None,
              time_capped: bool = False) -> Plan:
    """Evaluate ``choice`` on ``problem`` into a :class:`Plan`.

    ``lower_bound_j`` is reported as given; the gap is measured against it. ``proven`` says
    the method itself proved the plan optimal (exhaustive DP or enumeration, a MILP solved to
    optimality, a bound that reaches the energy): status ``optimal``. Raises
    :class:`~solvers.feasibility.CertificateError` when the plan misses ``deadline_s``
    (:func:`~solvers.feasibility.meets_deadline`) or the bound exceeds its energy.
    """
    ix = problem.index
    choice = [int(c) for c in choice]
    start, end, mk = ix.schedule(choice)
    if not meets_deadline(mk, deadline_s):
        raise CertificateError(f"{problem.name}: {method} plan's makespan {mk!r} s misses its "
                               f"deadline {deadline_s!r} s (internal error)")
    lf = ix.latest(choice, max(deadline_s, mk))
    dur = end - start
    tau = ix.switch_tau(choice)
    extra, _ = ix.switch_extra(choice)
    opts = [problem.tasks[i].options[choice[i]] for i in range(ix.n)]
    static_busy = float(sum(o.s_w * o.time_s for o in opts))
    dynamic = float(sum(o.d_j for o in opts))
    busy = {d: 0.0 for d in ix.devices}
    sw_time = {d: 0.0 for d in ix.devices}
    # ω_dev changes per iteration (a steady state's wrap included)
    n_sw = sum(ix.switch_counts(choice).values())
    for i in range(ix.n):
        busy[ix.device[i]] += dur[i]
        sw_time[ix.device[i]] += tau[i]
    idle = float(sum(ix.power[d] * max(mk - busy[d] - sw_time[d], 0.0) for d in ix.devices))
    trans = float(sum(ix.power[ix.device[i]] * tau[i] for i in range(ix.n))) + extra
    energy = static_busy + idle + dynamic + trans

    crit = [False] * ix.n
    for v in ix.critical_chain(start, end, tau):
        crit[v] = True
    var_t, var_e = plan_terms(problem, choice, crit).variances()

    tasks = tuple(
        TaskPlan(ix.names[i], ix.device[i], choice[i], opts[i].label, float(start[i]), float(end[i]),
                 float(dur[i]), float(opts[i].energy_j),
                 float(opts[i].energy_j / dur[i]) if dur[i] > 0 else float(opts[i].s_w),
                 float(max(lf[i] - end[i], 0.0)), opts[i].omega.sm_clock_mhz)
        for i in range(ix.n))
    bound = float(lower_bound_j)
    check_bound(bound, energy, f"{problem.name}: {method} plan")
    gap = 0.0 if bound_proves(bound, energy) else _gap(energy, bound)   # below 1e-9: rounding
    if status is None:
        status = "optimal" if proven else "feasible"
    return Plan(problem.name, method, status, float(deadline_s), float(mk), math.sqrt(var_t),
                float(energy), math.sqrt(var_e), static_busy, idle, dynamic, trans, n_sw,
                bound, gap, float(wall_s), tasks, dict(meta or {}), bool(time_capped))


@dataclass(frozen=True)
class PlanTerms:
    """First-order sensitivities of a plan's makespan and energy to each distinct measured leaf
    (``Term.dT_dT`` = ∂M/∂T_leaf, ``dE_dT`` = ∂E/∂T_leaf, ``dE_dd`` = ∂E/∂d_leaf), plus the
    non-linear variance Clark-composed options add."""

    terms: Mapping[str, Term]
    extra_var_time_s2: float = 0.0
    extra_var_energy_j2: float = 0.0

    def variances(self) -> tuple[float, float]:
        """(σ²_M, σ²_E) by the delta method (``frontier.signature.variances_from_terms``)."""
        return variances_from_terms(self.terms, self.extra_var_time_s2, self.extra_var_energy_j2)


def plan_terms(problem: Problem, choice: Sequence[int], path: Sequence[bool],
               devices: Sequence[str] | None = None) -> PlanTerms:
    """Per-leaf sensitivities of the energy of ``devices`` (all by default) and of the end of
    ``path`` (one flag per task: the tasks of a chain that sets that end, e.g. the critical
    path) under ``choice``.

    First-order model, the plan's energy formula differentiated at the realised schedule: a
    device's energy is Σ_i E_i + P_dev·(M − busy_dev − switch time), so a task's T moves its
    own energy by ∂E_i, its device's idle time by −∂T_i, and, on the path, the makespan M
    and with it every device's idle energy by P_total·∂T_i (for a subset of devices, by the
    sum of their idle powers). Each option contributes through its leaves
    (:attr:`solvers.model.Option.leaf_terms`), so a leaf shared by options is counted once
    with the summed sensitivity: k uses of identical sensitivity give k²·var. The max in
    each start time is linearised at the chain ``path`` follows; Clark's extra time variance
    is added for options on the path and its extra energy variance for options on
    ``devices``, as ``frontier.dag`` does.
    """
    ix = problem.index
    devs = set(ix.devices if devices is None else devices)
    p_path = sum(ix.power[d] for d in ix.devices if d in devs)   # ix.p_total's order when all
    d_t: dict[str, float] = {}
    d_e_t: dict[str, float] = {}
    d_e_d: dict[str, float] = {}
    var: dict[str, tuple[float, float]] = {}
    extra_t = extra_e = 0.0
    for i in range(ix.n):
        o = problem.tasks[i].options[int(choice[i])]
        mine = ix.device[i] in devs
        if not (mine or path[i]):
            continue
        lt = o.leaf_terms
        pw = ix.power[ix.device[i]]
        for k, t in lt.items():
            var[k] = (t.var_time_s2, t.var_d_j2)
            d_e_t.setdefault(k, 0.0)
            d_e_d.setdefault(k, 0.0)
            if mine:
                d_e_d[k] += t.dE_dd
                d_e_t[k] += t.dE_dT - pw * t.dT_dT
            if path[i]:
                d_t[k] = d_t.get(k, 0.0) + t.dT_dT
                d_e_t[k] += p_path * t.dT_dT
        if mine:
            extra_e += lt.extra_var_energy_j2
        if path[i]:
            extra_t += lt.extra_var_time_s2
    terms = {k: Term(v[0], v[1], d_t.get(k, 0.0), d_e_t[k], d_e_d[k]) for k, v in var.items()}
    return PlanTerms(terms, extra_t, extra_e)


def choice_dtype(problem: Problem) -> np.dtype:
    """The smallest unsigned integer type that holds every option index of ``problem``: a
    curve keeps its interpolated plans' choices in it (8x32 1F1B, 60 options: 1 byte a task)."""
    top = max((len(t.options) for t in problem.tasks), default=1) - 1
    return np.dtype(np.min_scalar_type(max(top, 0)))


#: ``Plan.method`` of a plan interpolated between two grid plans of a curve.
INTERPOLATED = "fast/interpolated"


@dataclass(frozen=True)
class ParetoCurve:
    """Energy vs deadline: one plan per deadline (``plans``, sorted by deadline), and, for the
    fast method without switch costs, plans interpolated between neighbouring grid plans
    (``dense``). ``exact`` says whether the points are proven optima (then ``gap`` is 0 at
    each).

    Every point the curve reports is a plan a user can get back and apply: a grid point is a
    :class:`Plan`; an interpolated one keeps only its choice (a row of ``dense_choices``, one
    byte a task for up to 256 options) and becomes a :class:`Plan` on demand
    (:meth:`point_plan`, :meth:`plan_at`), because building thousands of Plans nobody asked
    for would about double a curve's time and take ~0.16 MB each (8x32 1F1B, 512 tasks).
    :meth:`energy_at` and :meth:`plan_at` pick from the same points, so the energy a curve
    reports at a deadline is the energy of the plan it hands out there.
    """

    problem: str
    method: str
    plans: tuple[Plan, ...]
    wall_s: float
    exact: bool = False
    #: Extra plans between the grid points (fast method): (makespan_s, energy_j, bound_j) of
    #: each, non-dominated; their bound is the LP's tangent bound (convexity in the deadline).
    #: Each one's deadline is its makespan.
    dense: tuple[tuple[float, float, float], ...] = ()
    #: The dense points' choices: row j = option index per task (in the order of every
    #: plan's ``tasks``) of ``dense[j]``, read-only; None in a curve file that lacks them.
    dense_choices: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: The :class:`~solvers.model.Problem` the curve was made from (not written to its file):
    #: the default problem of :meth:`point_plan` and :meth:`plan_at`.
    source: Problem | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        ch = self.dense_choices
        if ch is not None:
            ch = np.asarray(ch)
            if ch.ndim != 2 or ch.shape[0] != len(self.dense):
                raise InputError(f"dense_choices has shape {ch.shape}; expected one row per dense "
                                 f"point ({len(self.dense)})")
            if ch.flags.writeable:
                ch = ch.copy()
                ch.setflags(write=False)
            object.__setattr__(self, "dense_choices", ch)

    @property
    def deadlines_s(self) -> np.ndarray:
        """Deadline of each grid point, s."""
        return np.array([p.deadline_s for p in self.plans])

    @property
    def energies_j(self) -> np.ndarray:
        """Energy of each grid point, J."""
        return np.array([p.energy_j for p in self.plans])

    @property
    def bounds_j(self) -> np.ndarray:
        """Lower bound at each grid point, J."""
        return np.array([p.lower_bound_j for p in self.plans])

    @property
    def time_capped(self) -> bool:
        """Whether a wall-clock safety net fired for any plan of the curve."""
        return any(p.time_capped for p in self.plans)

    @property
    def n_points(self) -> int:
        """Points the curve reports: grid plans, then dense points (:meth:`point_plan` numbering)."""
        return len(self.plans) + len(self.dense)

    @cached_property
    def _lookup(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(makespans ascending, point numbers in that order, best point of each prefix)."""
        mk = np.array([p.makespan_s for p in self.plans] + [m for m, _, _ in self.dense], dtype=float)
        e = np.array([p.energy_j for p in self.plans] + [x for _, x, _ in self.dense], dtype=float)
        order = np.lexsort((np.arange(len(mk)), mk))     # ties: grid points (lower numbers) first
        best = np.empty(len(mk), dtype=np.int64)
        cur, cur_e = -1, math.inf
        for k, i in enumerate(order):
            if e[i] < cur_e:                             # strict: the earlier point wins a tie
                cur, cur_e = int(i), e[i]
            best[k] = cur
        return mk[order], order, best

    def point_at(self, deadline_s: float) -> int | None:
        """Number of the least-energy point whose makespan meets ``deadline_s``
        (:func:`~solvers.feasibility.meets_deadline`; ties: a grid plan, then the faster),
        or None when none does."""
        mk, _, best = self._lookup
        k = int(np.searchsorted(mk, latest_makespan_s(float(deadline_s)), side="right"))
        return int(best[k - 1]) if k else None

    def energy_at(self, deadline_s: float) -> float:
        """Least energy of a point on the curve whose makespan meets ``deadline_s`` (inf if
        none): the energy of the plan :meth:`plan_at` returns there."""
        i = self.point_at(deadline_s)
        if i is None:
            return math.inf
        return self.plans[i].energy_j if i < len(self.plans) else self.dense[i - len(self.plans)][1]

    def point_plan(self, i: int, problem: Problem | None = None) -> Plan:
        """Point ``i`` (``0 ≤ i <`` :attr:`n_points`: grid plans first, then dense points) as a
        :class:`Plan`. A dense point is rebuilt from its choice on ``problem`` (default: the
        problem the curve was made from): deadline = its makespan, its tangent bound, method
        :data:`INTERPOLATED`; raises :class:`~solvers.feasibility.CertificateError` when the
        rebuilt plan's energy differs from the reported one by more than 1e-9 relative on the
        curve's own problem, and ``ValueError`` when no problem is at hand, the curve file holds
        no choices, or the problem's tasks or costs are not the curve's."""
        i = int(i)
        if not 0 <= i < self.n_points:
            raise IndexError(f"point {i} of a curve with {self.n_points} points")
        if i < len(self.plans):
            return self.plans[i]
        j = i - len(self.plans)
        mk, e, b = self.dense[j]
        problem = problem if problem is not None else self.source
        if problem is None:
            raise InputError("an interpolated point becomes a Plan on its problem: pass problem=")
        if self.dense_choices is None:
            raise InputError(f"curve {self.problem!r} keeps no choices for its interpolated points "
                             "(a file written before they were kept): compute the curve again")
        self._check_tasks(problem)
        choice = self.dense_choices[j]
        again = float(problem.index.objective(choice))
        if abs(again - e) > _SAME_ENERGY_REL * max(abs(e), 1.0):
            if problem is self.source:
                raise CertificateError(f"{self.problem}: interpolated point {i} rebuilds to "
                                       f"{again!r} J, reported {e!r} J (internal error)")
            raise InputError(f"point {i} costs {again:.6g} J on problem {problem.name!r}, not the "
                             f"{e:.6g} J the curve reports: made from other signatures or "
                             "options? compute the curve again")
        pl = make_plan(problem, choice, mk, method=INTERPOLATED, lower_bound_j=b,
                       wall_s=0.0, proven=bound_proves(b, e), meta={"curve_point": i},
                       time_capped=self.time_capped)
        if abs(pl.energy_j - e) > _SAME_ENERGY_REL * max(abs(e), 1.0):
            raise CertificateError(f"{self.problem}: interpolated point {i} rebuilds to "
                                   f"{pl.energy_j!r} J, reported {e!r} J (internal error)")
        return pl

    def plan_at(self, deadline: float | str, problem: Problem | None = None) -> Plan:
        """The plan of the least-energy point that meets ``deadline`` (seconds, or ``"1.07x"``
        of the fastest makespan: that needs a problem), as :meth:`point_plan` builds it: its
        energy is :meth:`energy_at`'s, its ``deadline_s`` the point's own (at most the one
        asked for, so its bound certifies that point). Raises
        :class:`~solvers.model.InfeasibleError` when no point meets the deadline."""
        problem = problem if problem is not None else self.source
        if isinstance(deadline, str):
            if problem is None:
                raise InputError(f"deadline {deadline!r} is relative to a problem: pass problem=")
            d = problem.deadline_s(deadline)
        else:
            d = float(deadline)
        if problem is not None:
            self._check_tasks(problem)
        i = self.point_at(d)
        if i is None:
            fastest = float(self._lookup[0][0]) if self.n_points else math.inf
            raise InfeasibleError(f"{self.problem}: no point of the curve meets {d:.6g} s (its "
                                  f"fastest makespan is {fastest:.6g} s)", fastest)
        return self.point_plan(i, problem)

    def all_plans(self, problem: Problem | None = None) -> Iterator[Plan]:
        """Every point the curve reports as a :class:`Plan`, in :meth:`point_plan` order."""
        for i in range(self.n_points):
            yield self.point_plan(i, problem)

    def _check_tasks(self, problem: Problem) -> None:
        names = problem.index.names
        ch = self.dense_choices
        if self.plans and tuple(t.name for t in self.plans[0].tasks) != tuple(names):
            raise InputError(f"problem {problem.name!r} does not have the tasks of curve "
                             f"{self.problem!r}")
        if ch is not None and ch.shape[1] != len(names):
            raise InputError(f"curve {self.problem!r} has {ch.shape[1]} tasks per point; problem "
                             f"{problem.name!r} has {len(names)}")
        if ch is not None and len(ch):
            n_opt = np.array([len(t.options) for t in problem.tasks])
            if (ch.max(axis=0) >= n_opt).any():
                raise InputError(f"curve {self.problem!r} names options problem "
                                 f"{problem.name!r} does not have")

    @property
    def max_gap(self) -> float:
        """Largest relative gap over grid plans and dense points."""
        gaps = [p.gap for p in self.plans] + [max(e - b, 0.0) / e for _, e, b in self.dense if e > 0]
        return max(gaps) if gaps else math.inf

    def summary(self) -> str:
        """A short human table (at most ~12 rows)."""
        n = len(self.plans)
        lines = [f"pareto curve for {self.problem}: {n} points, method {self.method}, "
                 f"{'exact' if self.exact else 'bounded'}, {self.wall_s:.2f} s"
                 + (", time-capped (another machine may differ)" if self.time_capped else ""),
                 f"  {'deadline ms':>12} {'makespan ms':>12} {'energy J':>12} {'gap %':>8} {'switches':>8}"]
        idx = sorted(set(np.linspace(0, n - 1, min(n, 12)).round().astype(int))) if n else []
        for i in idx:
            p = self.plans[i]
            lines.append(f"  {p.deadline_s * 1e3:12.3f} {p.makespan_s * 1e3:12.3f} {p.energy_j:12.3f} "
                         f"{p.gap * 100:8.3f} {p.n_switches:8d}")
        if n:
            lines.append(f"  max gap {max(p.gap for p in self.plans) * 100:.3f} % at the grid plans")
        if self.dense:
            lines.append(f"  + {len(self.dense)} interpolated plans between them, max gap "
                         f"{self.max_gap * 100:.3f} % (each one a plan: ecal pareto --plan-at)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``"format": "ecal.pareto/1"``). Each dense point carries its
        ``choice`` (option index per task, in the order of the plans' tasks) when kept."""
        dense = [{"makespan_s": m, "energy_j": e, "bound_j": b} for m, e, b in self.dense]
        if self.dense_choices is not None:
            for x, row in zip(dense, self.dense_choices.tolist()):
                x["choice"] = row
        return {"format": KINDS["pareto"].tag, "problem": self.problem, "method": self.method,
                "wall_s": self.wall_s, "exact": self.exact, "time_capped": self.time_capped,
                "plans": [p.to_dict() for p in self.plans], "dense": dense}

    @classmethod
    def from_dict(cls, d: Any, file: str = "<dict>") -> ParetoCurve:
        """Inverse of :meth:`to_dict` (shape: :class:`solvers.format_models.ParetoFile`; each
        plan read by :meth:`Plan.from_dict`). Dense points without ``choice``, from older
        files, read as points without choices."""
        from .format_models import ParetoFile

        _, body = content(file, d, "pareto")
        m = validate(ParetoFile, body, file)
        plans = tuple(Plan.from_dict(p, f"{file}:plans[{i}]") for i, p in enumerate(m.plans))
        dense = tuple((x.makespan_s, x.energy_j, x.bound_j) for x in m.dense)
        rows = [x.choice for x in m.dense if x.choice is not None]
        choices = None
        if rows and len(rows) < len(m.dense):
            raise FormatError(file, "dense[].choice", "present at some points and not at others")
        if rows:
            # each point's choice is an option index per task of the curve's plans
            n = len(plans[0].tasks) if plans else len(rows[0])
            if any(len(r) != n for r in rows):
                raise FormatError(file, "dense[].choice", f"each must be a list of {n} option "
                                  "indices (integers >= 0), one per task")
            top = max((max(r) for r in rows if r), default=0)
            choices = np.array(rows, dtype=np.min_scalar_type(top)).reshape(len(rows), n)
        return cls(m.problem, m.method, plans, m.wall_s, m.exact, dense, choices)

    def save(self, path: str | os.PathLike) -> None:
        """Write the curve as JSON atomically."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> ParetoCurve:
        """Read a curve written by :meth:`save`."""
        return cls.from_dict(read_json(path), str(path))


#: An interpolated point's rebuilt Plan must reproduce its reported energy to this relative
#: precision (both sum the same terms in another order: float rounding only).
_SAME_ENERGY_REL = 1e-9


def deadline_lines(plan: Plan) -> list[str]:
    """The plan summary's deadline lines: the deadline and P(makespan ≤ deadline); with a
    confidence, what was asked and the tightened deadline the method solved."""
    c = plan.meta.get("confidence") if isinstance(plan.meta, Mapping) else None
    D = plan.target_deadline_s
    p = plan.p_meets_deadline
    head = f"  deadline   {D * 1e3:10.3f} ms   P(makespan <= deadline) {format_probability(p, plan.sd_makespan_s)}"
    if not isinstance(c, Mapping):
        return [head]
    lines = [f"{head} (asked: {c['confidence']:g}, makespan + {c['z']:.3f}·σ_T <= deadline)"]
    cal = plan_calibration(plan)
    if not cal.is_null:
        t, sd = plan.calibrated_makespan_s
        lines.append(f"  calibrated {t * 1e3:10.3f} ms ± {sd * 1e3:.3f}   (makespan + the offset measured "
                     f"on {cal.runs} run(s): {cal.step.time_s * 1e3:+.3f} ± {cal.step.sd_time_s * 1e3:.3f} ms)")
    if plan.deadline_s < D:
        lines.append(f"  solved at  {plan.deadline_s * 1e3:10.3f} ms   (tightened to keep the deadline "
                     f"at {c['confidence']:g}: the method, bound and gap below are for this one)")
    return lines


def context_lines(plan: Plan) -> list[str]:
    """The plan summary's entry-context line (none at the null context)."""
    c = plan.context
    if c is None:
        return []
    entry = c.get("entry")
    entry_s = f"{entry:g} °C" if isinstance(entry, (int, float)) else str(entry)
    return [f"  in context {float(c['makespan_s']) * 1e3:10.3f} ms ± {float(c['sd_makespan_s']) * 1e3:.3f}   "
            f"{float(c['energy_j']):.3f} J ± {float(c['sd_energy_j']):.3f}   (thermal, {entry_s} entry: "
            f"{c.get('in_context', 0)} tasks composed with their entry temperature, "
            f"{c.get('at_null', 0)} at null)"]


def format_probability(p: float, sd_s: float) -> str:
    """P to 4 places: 1.0 and 0.0 only when σ_T is 0 (certain in the model), else never
    rounded to a certainty it is not."""
    if not sd_s > 0:
        return f"{p:.1f}"
    if p > 0.99995:
        return ">0.9999"
    if p < 0.00005:
        return "<0.0001"
    return f"{p:.4f}"
