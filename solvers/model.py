"""The planning problem: tasks on devices, a DAG, per-task operating points, idle power and
switching costs (spec §4.5, §9.3, §9.5; DESIGN.md "static power belongs to devices").

Energy of an assignment (one option per task), with makespan M:

    E = Σ_dev P_dev·(M − busy_dev − switch_time_dev)      idle: ready power held while waiting
      + Σ_task s·T                                        static while busy
      + Σ_task d                                          dynamic
      + Σ_switch max(ε, P_dev·τ)                          transitions (as ``frontier.dag``)

which the solvers use in the equivalent form
``E = P_total·M + Σ_task (E_task − P_dev·T_task) + Σ_switch (max(ε, P_dev·τ) − P_dev·τ)``:
per-task *effective energy* (Perseus) plus a charge on the makespan. Same-device order is the
order in which tasks of a device are listed; consecutive tasks on one device become edges, and a
switch of ω_dev between them costs (τ, ε) from that device's transition rule.

A steady-state problem (``Problem(steady_state=True)``) is one iteration of a loop: each
device also pays the switch from its last task back to its first (iteration k → k + 1), as a
latency before its first task (which then starts no earlier than that) and its energy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from frontier.errors import FormatError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature, Term

from .errors import InfeasibleError, ProblemError, ProblemTooLargeError, SolverUnavailableError
from .feasibility import meets_deadline
from .index import ProblemIndex
from .limits import check_tasks

__all__ = ["Problem", "Task", "Option", "LeafTerms", "ConstantTransition", "ProblemError",
           "InfeasibleError", "ProblemTooLargeError", "SolverUnavailableError", "option_from_model"]


@dataclass(frozen=True)
class ConstantTransition:
    """Every change of ω_dev costs ``time_s`` and ``energy_j`` (total energy of the switch);
    no change costs nothing. A :class:`frontier.dag.TransitionCost`, like
    ``frontier.transition.TransitionTable``."""

    time_s: float
    energy_j: float = 0.0

    def __post_init__(self) -> None:
        for what, v in (("time_s", self.time_s), ("energy_j", self.energy_j)):
            if not math.isfinite(float(v)) or float(v) < 0:
                raise ProblemError(f"ConstantTransition: {what} must be finite and >= 0, got {v!r}")

    def cost(self, frm: Any, to: Any) -> tuple[float, float]:
        """(time_s, energy_j) of switching from ``frm`` to ``to``."""
        if frm is None or frm == to:
            return (0.0, 0.0)
        return (float(self.time_s), float(self.energy_j))

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``{"constant": {"time_s", "energy_j"}}``)."""
        return {"constant": {"time_s": self.time_s, "energy_j": self.energy_j}}


class LeafTerms(Mapping[str, Term]):
    """How an option's T and E depend on the distinct measured leaves behind it: leaf key →
    :class:`frontier.signature.Term` (the composite signature's own objects, not copies), plus
    the non-linear remainder Clark's max adds (``extra_var_time_s2``/``extra_var_energy_j2``).

    Immutable, hashable and picklable (a :class:`Problem` travels to worker processes), which
    the signature's read-only mapping is not. Empty: the option is its own leaf.
    """

    __slots__ = ("_terms", "extra_var_time_s2", "extra_var_energy_j2")
    _terms: dict[str, Term]
    extra_var_time_s2: float
    extra_var_energy_j2: float

    def __init__(self, terms: Mapping[str, Term] | Iterable[tuple[str, Term]] = (),
                 extra_var_time_s2: float = 0.0, extra_var_energy_j2: float = 0.0):
        items = dict(terms.items() if isinstance(terms, Mapping) else terms)
        for k, t in items.items():
            if not isinstance(t, Term):
                raise ProblemError(f"leaf {k!r}: expected a frontier Term, got {t!r}")
        object.__setattr__(self, "_terms", {str(k): t for k, t in items.items()})
        object.__setattr__(self, "extra_var_time_s2", float(extra_var_time_s2))
        object.__setattr__(self, "extra_var_energy_j2", float(extra_var_energy_j2))

    @classmethod
    def of(cls, sig: Signature) -> LeafTerms:
        """The per-leaf terms of ``sig`` (a leaf has one: itself)."""
        return cls(sig.terms, sig.extra_var_time_s2, sig.extra_var_energy_j2)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("LeafTerms is immutable")

    def __getitem__(self, key: str) -> Term:
        return self._terms[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._terms)

    def __len__(self) -> int:
        return len(self._terms)

    def _ident(self) -> tuple:
        return (tuple(self._terms.items()), self.extra_var_time_s2, self.extra_var_energy_j2)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LeafTerms):
            return NotImplemented
        return self._ident() == other._ident()

    def __hash__(self) -> int:
        return hash(self._ident())

    def __reduce__(self):
        return (LeafTerms, (tuple(self._terms.items()), self.extra_var_time_s2, self.extra_var_energy_j2))

    def __repr__(self) -> str:
        return f"LeafTerms({len(self._terms)} leaves)"

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"terms": {key: {Term fields}}, "extra_var_time_s2", "extra_var_energy_j2"}``."""
        names = [f.name for f in fields(Term)]
        return {"terms": {k: {n: getattr(t, n) for n in names} for k, t in self._terms.items()},
                "extra_var_time_s2": self.extra_var_time_s2,
                "extra_var_energy_j2": self.extra_var_energy_j2}


@dataclass(frozen=True)
class Option:
    """One operating point of a task: T, static power s (while busy), dynamic energy d and the
    variances of the T and d estimates. ``key`` identifies the measurement (a measurement used by
    several tasks has one key, so its error counts k²·var).

    ``terms`` holds, for an option built from a (composite) signature, how its T and E depend
    on each distinct measured leaf (:class:`LeafTerms`); a plan then propagates error per
    leaf, so a leaf shared by several options (``a⊕send``, ``b⊕send``) is correlated as in
    ``frontier``. Without terms the option is its own leaf, keyed by ``key``; ``var_time_s2``
    and ``var_d_j2`` are then its only uncertainty (with terms they are the totals, for show).
    """

    time_s: float
    s_w: float
    d_j: float
    var_time_s2: float = 0.0
    var_d_j2: float = 0.0
    omega: OperatingPoint = OperatingPoint()
    key: str = ""
    label: str = ""
    terms: LeafTerms = field(default=LeafTerms(), repr=False)

    @property
    def energy_j(self) -> float:
        """E = s·T + d, joules."""
        return self.s_w * self.time_s + self.d_j

    @property
    def leaf_terms(self) -> LeafTerms:
        """The terms a plan propagates: ``terms``, or the option as its own leaf
        (∂T/∂T = 1, ∂E/∂T = s, ∂E/∂d = 1) when it has none."""
        if self.terms:
            return self.terms
        return LeafTerms({self.key: Term(self.var_time_s2, self.var_d_j2, 1.0, self.s_w, 1.0)})

    @classmethod
    def from_signature(cls, sig: Signature) -> Option:
        """The option measured or composed as ``sig``: its ω, T, s, d, total variances, and its
        per-leaf terms (so leaves it shares with other options stay correlated in a plan)."""
        return cls(time_s=sig.time_s, s_w=sig.s_w, d_j=sig.d_j, var_time_s2=sig.var_time_s2,
                   var_d_j2=sig.var_d_j2, omega=sig.omega, key=sig.key,
                   label=sig.omega.label() if sig.omega != OperatingPoint() else sig.name,
                   terms=LeafTerms.of(sig))


@dataclass(frozen=True)
class Task:
    """A task on one device with its candidate options."""

    name: str
    device: str
    options: tuple[Option, ...]


def _num(where: str, what: str, v: Any, *, minimum: float | None = 0.0) -> float:
    try:
        f = float(v)
    except OverflowError:      # an int beyond the float range (e.g. 10**400)
        raise ProblemError(f"{where}: {what} overflows a float") from None
    except (TypeError, ValueError):
        raise ProblemError(f"{where}: {what} must be a number, got {v!r}") from None
    if not math.isfinite(f):
        raise ProblemError(f"{where}: {what} is {f!r} (must be finite)")
    if minimum is not None and f < minimum:
        raise ProblemError(f"{where}: {what} = {f!r} is negative")
    return f


def _option_from(task: str, i: int, o: Any) -> Option:
    """Accept an Option, a Signature, a (time_s, energy_j) pair or a mapping."""
    where = f"task {task!r} option {i}"
    if isinstance(o, Option):
        opt = o
    elif isinstance(o, Signature):
        opt = Option.from_signature(o)
    elif isinstance(o, Mapping):
        try:
            opt = option_from_model(_option_model(o))
        except ProblemError as exc:
            raise ProblemError(f"{where}: {exc}") from None
    else:
        try:
            t, e = o
        except (TypeError, ValueError):
            raise ProblemError(f"{where}: expected Option, Signature, (time_s, energy_j) or a "
                               f"mapping, got {o!r}") from None
        opt = Option(_num(where, "time_s", t), 0.0, _num(where, "energy_j", e))
    for what in ("time_s", "s_w", "var_time_s2", "var_d_j2"):
        _num(where, what, getattr(opt, what))
    _num(where, "d_j", opt.d_j, minimum=None)
    if opt.d_j < 0:
        raise ProblemError(f"{where}: dynamic energy d = {opt.d_j:.6g} J is negative (E < s·T)")
    if not isinstance(opt.terms, LeafTerms):
        raise ProblemError(f"{where}: terms must be LeafTerms, got {type(opt.terms).__name__}")
    if not opt.key:
        opt = replace(opt, key=f"{task}#{i}")
    if not opt.label:
        opt = replace(opt, label=opt.omega.label() if opt.omega != OperatingPoint() else f"#{i}")
    return opt


def _option_model(o: Mapping) -> Any:
    """A mapping option validated by :class:`solvers.format_models.ProblemOption` (the one
    declaration of an option's fields); objects a Python caller may put in it (an
    OperatingPoint, LeafTerms, Terms) are given in their JSON form."""
    from frontier.formats import validate

    from .format_models import ProblemOption

    d = dict(o)
    if isinstance(d.get("omega"), OperatingPoint):
        d["omega"] = d["omega"].to_dict()
    if isinstance(d.get("terms"), LeafTerms):
        d.update({k: v for k, v in d["terms"].to_dict().items() if k not in d or k == "terms"})
    if isinstance(d.get("terms"), Mapping):
        names = [f.name for f in fields(Term)]
        d["terms"] = {k: {n: getattr(t, n) for n in names} if isinstance(t, Term) else t
                      for k, t in d["terms"].items()}
    try:
        return validate(ProblemOption, d, "option")
    except FormatError as exc:       # a file's reader names the file; here, _option_from the option
        raise ProblemError(f"{exc.path}: {exc.problem}") from None


def option_from_model(m: Any) -> Option:
    """The :class:`Option` a validated :class:`solvers.format_models.ProblemOption` stands for:
    ``d_j`` given or ``energy_j − s_w·time_s``, ω from ``omega`` or ``sm_clock_mhz``, variances
    given or the squared standard errors, and its per-leaf terms. Raises
    :class:`ProblemError` for an ω that is not an operating point; a negative ``d_j`` is
    refused where every option is checked (:class:`Problem`)."""
    s = m.s_w if m.s_w is not None else 0.0
    d = m.d_j if m.d_j is not None else m.energy_j - s * m.time_s
    omega = m.omega
    if omega is None and m.sm_clock_mhz is not None:
        omega = {"sm_clock_mhz": m.sm_clock_mhz}
    try:
        op = OperatingPoint.from_dict(omega)
    except ValueError as exc:
        raise ProblemError(f"omega: {exc}") from None
    vt = m.var_time_s2 if m.var_time_s2 is not None else (m.sd_time_s or 0.0) ** 2
    vd = m.var_d_j2 if m.var_d_j2 is not None else (m.sd_energy_j or 0.0) ** 2
    terms = LeafTerms() if m.terms is None else LeafTerms(
        {k: Term(t.var_time_s2, t.var_d_j2, t.dT_dT, t.dE_dT, t.dE_dd) for k, t in m.terms.items()},
        m.extra_var_time_s2 or 0.0, m.extra_var_energy_j2 or 0.0)
    return Option(m.time_s, s, d, vt, vd, op, m.key or "", m.label or "", terms)


@dataclass(frozen=True)
class Problem:
    """Choose one option per task; minimise energy under a makespan deadline.

    Parameters
    ----------
    tasks : the tasks; same-device order is the order of listing.
    edges : (before, after) task-name pairs (cross-device dependencies and any others).
    idle_power_w : per-device ready power held while the device waits, W (default 0).
    transitions : per-device switching rule (``cost(frm_dev, to_dev) -> (time_s, energy_j)``);
        a single rule object applies to every device. ``None``: switching is free.
    name : a label used in plans and errors.
    steady_state : the tasks are one iteration of a loop that repeats: each device's switch
        from its last task (iteration k) to its first (iteration k + 1) is charged, as time
        before the first task (it starts no earlier than that switch's latency) and energy.
        False (default): each device starts the iteration at its first task's ω_dev for free.

    Build with :meth:`build` from plain data; the constructor validates and indexes.
    """

    tasks: tuple[Task, ...]
    edges: tuple[tuple[str, str], ...] = ()
    idle_power_w: Mapping[str, float] = field(default_factory=dict)
    transitions: Any = None
    name: str = "problem"
    steady_state: bool = False

    def __post_init__(self) -> None:
        tasks = tuple(self.tasks)
        if not tasks:
            raise ProblemError(f"{self.name}: no tasks")
        if not isinstance(self.steady_state, (bool, np.bool_)):
            raise ProblemError(f"{self.name}: steady_state must be a bool, got {self.steady_state!r}")
        object.__setattr__(self, "steady_state", bool(self.steady_state))
        fixed = []
        seen: set[str] = set()
        # Tasks that list the very same option objects (a pipeline's microbatches share their
        # stage's) are checked and converted once: 131,072 tasks x 60 options took 31 s.
        converted: dict[tuple[int, ...], tuple[Option, ...]] = {}
        for t in tasks:
            if not isinstance(t, Task):
                raise ProblemError(f"{self.name}: tasks must be Task objects, got {t!r}")
            if t.name in seen:
                raise ProblemError(f"{self.name}: duplicate task name {t.name!r}")
            seen.add(t.name)
            if not t.options:
                raise ProblemError(f"task {t.name!r}: no options")
            ids = tuple(map(id, t.options))      # the objects stay alive in t.options
            opts = converted.get(ids)
            if opts is None:
                opts = converted[ids] = tuple(_option_from(t.name, i, o)
                                              for i, o in enumerate(t.options))
            fixed.append(Task(str(t.name), str(t.device), opts))
        object.__setattr__(self, "tasks", tuple(fixed))
        idle = {}
        for dev, p in dict(self.idle_power_w).items():
            idle[str(dev)] = _num(f"device {dev!r}", "idle power", p)
        object.__setattr__(self, "idle_power_w", MappingProxyType(idle))
        edges = []
        for e in self.edges:
            try:
                a, b = e
            except (TypeError, ValueError):
                raise ProblemError(f"{self.name}: an edge must be a (before, after) pair, got {e!r}") from None
            for x in (a, b):
                if x not in seen:
                    raise ProblemError(f"{self.name}: edge {a!r} -> {b!r} names unknown task {x!r}")
            if a == b:
                raise ProblemError(f"{self.name}: edge {a!r} -> {b!r} is a self-loop (a cycle)")
            edges.append((str(a), str(b)))
        object.__setattr__(self, "edges", tuple(edges))
        if isinstance(self.transitions, Mapping):
            tr = dict(self.transitions)
            devs = {t.device for t in self.tasks}
            for dev, rule in tr.items():
                if dev not in devs:
                    raise ProblemError(f"{self.name}: transitions for unknown device {dev!r}; "
                                       f"devices: {sorted(devs)}")
                if rule is not None and not hasattr(rule, "cost"):
                    raise ProblemError(f"device {dev!r}: transition rule needs a cost(frm, to) method")
            object.__setattr__(self, "transitions", MappingProxyType(tr))
        elif self.transitions is not None and not hasattr(self.transitions, "cost"):
            raise ProblemError(f"{self.name}: transitions need a cost(frm, to) method")
        object.__setattr__(self, "_ix", ProblemIndex(self))

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def build(cls, tasks: Mapping[str, tuple[str, Sequence[Any]]] | Iterable[tuple[str, str, Sequence[Any]]],
              edges: Iterable[tuple[str, str]] = (), idle_power_w: Mapping[str, float] | None = None,
              transitions: Any = None, name: str = "problem",
              steady_state: bool = False, *, max_tasks: int | None = None) -> Problem:
        """From plain data: ``tasks`` maps name → (device, options) or is a sequence of
        (name, device, options); options are ``Signature``s, ``Option``s, (time_s, energy_j)
        pairs or mappings (``time_s``, ``energy_j`` or ``d_j``, ``s_w``, ``sd_*``, ``omega``).
        ``steady_state``: charge each device's wrap switch (last task → first task of the next
        iteration; see the class docstring). ``max_tasks``: raise
        :class:`ProblemTooLargeError` for more tasks than that, before any is validated or
        indexed (None: no limit here; :func:`solvers.solve` checks its ``options.limits``).

        >>> p = Problem.build({"a": ("gpu0", [(1.0, 10.0), (2.0, 6.0)])}, idle_power_w={"gpu0": 1})
        >>> p.fastest_makespan_s()
        1.0
        """
        if max_tasks is not None and hasattr(tasks, "__len__"):   # before a copy is made
            check_tasks(len(tasks), max_tasks, name)
        items = [(k, *v) for k, v in tasks.items()] if isinstance(tasks, Mapping) else list(tasks)
        if max_tasks is not None:
            check_tasks(len(items), max_tasks, name)
        ts = []
        for it in items:
            try:
                nm, dev, opts = it
            except (TypeError, ValueError):
                raise ProblemError(f"{name}: a task must be (name, device, options), got {it!r}") from None
            ts.append(Task(str(nm), str(dev), tuple(opts)))
        return cls(tuple(ts), tuple(edges), dict(idle_power_w or {}), transitions, name,
                   steady_state)

    def with_(self, **changes: Any) -> Problem:
        """A copy with some fields changed (re-validated)."""
        d = {k: getattr(self, k)
             for k in ("tasks", "edges", "idle_power_w", "transitions", "name", "steady_state")}
        d["idle_power_w"] = dict(self.idle_power_w)
        if isinstance(d["transitions"], Mapping):
            d["transitions"] = dict(d["transitions"])
        d.update(changes)
        return Problem(**d)

    def __reduce__(self):
        # Pickled as its fields and re-validated on load (the index is rebuilt, not shipped):
        # the read-only mappings do not pickle, and a search in a worker process
        # (:mod:`solvers.workers`) receives its problem this way.
        tr = dict(self.transitions) if isinstance(self.transitions, Mapping) else self.transitions
        return (Problem, (self.tasks, self.edges, dict(self.idle_power_w), tr, self.name,
                          self.steady_state))

    # -- derived ----------------------------------------------------------------------------
    @property
    def index(self) -> ProblemIndex:
        """Integer-indexed arrays the solvers use."""
        return self.__dict__["_ix"]

    @property
    def n_tasks(self) -> int:
        """Number of tasks."""
        return len(self.tasks)

    @property
    def has_transitions(self) -> bool:
        """Whether any consecutive same-device pair can pay a switch."""
        return self.index.has_transitions

    def rule(self, device: str) -> Any:
        """The transition rule of ``device`` (None: free)."""
        if isinstance(self.transitions, Mapping):
            return self.transitions.get(device)
        return self.transitions

    def fastest_makespan_s(self) -> float:
        """Makespan of the fastest of these plans: every task at its fastest option, or every
        task at its fastest option of one ω_dev (one per ω_dev seen), switch latencies included.

        Without switch latencies this is the fastest achievable makespan. With them, holding
        one ω_dev can beat the all-fastest plan (whose per-task fastest points may sit at
        different clocks and pay switches), so both kinds are tried; a mixed switch pattern
        could in rare cases be faster still.
        """
        cached = self.__dict__.get("_fastest_makespan_s")
        if cached is None:
            ch = self.fastest_plan_choice()
            cached = float(self.index.makespan(ch))
            object.__setattr__(self, "_fastest_makespan_s", cached)
        return cached

    def fastest_plan_choice(self) -> np.ndarray:
        """The choice whose makespan is :meth:`fastest_makespan_s` (the first of the candidate
        plans tried there that reaches it): a plan that meets any deadline
        :meth:`check_feasible` accepts."""
        cached = self.__dict__.get("_fastest_plan_choice")
        if cached is not None:
            return cached.copy()
        ix = self.index
        best_ch = ix.fastest_choice()
        best = float(ix.makespan(best_ch))
        if self.has_transitions:
            # per distinct option tuple (a pipeline's tasks share their stage's), its ω_devs
            rows: dict[int, int] = {}
            distinct: list[list] = []
            row = np.empty(ix.n, dtype=np.int64)
            for v, t in enumerate(self.tasks):
                r = rows.get(id(t.options))
                if r is None:
                    r = rows[id(t.options)] = len(distinct)
                    distinct.append([o.omega.dev for o in t.options])
                row[v] = r
            devs = sorted({w for ws in distinct for w in ws})
            code = {w: i for i, w in enumerate(devs)}
            kmax = max(ix.k)
            times = np.full((ix.n, kmax), np.inf)
            codes = np.full((len(distinct), kmax), -1)
            for r, ws in enumerate(distinct):
                codes[r, :len(ws)] = [code[w] for w in ws]
            ids = codes[row]
            for v in range(ix.n):
                times[v, :ix.k[v]] = ix.time[v]
            fastest = np.argmin(times, axis=1)
            for i in range(len(devs)):
                # each task's fastest option at this ω_dev (first among ties), else its fastest
                tm = np.where(ids == i, times, np.inf)
                choice = np.where(np.isfinite(tm.min(axis=1)), np.argmin(tm, axis=1), fastest)
                mk = float(ix.makespan(choice))
                if mk < best:
                    best, best_ch = mk, choice
        object.__setattr__(self, "_fastest_plan_choice", np.asarray(best_ch, dtype=int))
        return np.array(best_ch, dtype=int)

    def deadline_s(self, deadline: float | str) -> float:
        """Resolve a deadline: seconds, or ``"1.05x"`` (a factor of the fastest makespan)."""
        if isinstance(deadline, str):
            m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*[xX]\s*", deadline)
            if m:
                return float(m.group(1)) * self.fastest_makespan_s()
            try:
                deadline = float(deadline.strip().removesuffix("s"))
            except ValueError:
                raise ProblemError(f"deadline {deadline!r}: expected seconds or a factor such as '1.05x'") from None
        d = _num("deadline", "seconds", deadline)
        if d <= 0:
            raise ProblemError(f"deadline must be > 0 s, got {d}")
        return d

    def check_feasible(self, deadline_s: float) -> None:
        """Raise :class:`InfeasibleError` when ``deadline_s`` is below the fastest makespan."""
        fm = self.fastest_makespan_s()   # meets_deadline: the one feasibility predicate
        if not meets_deadline(fm, deadline_s):
            raise InfeasibleError(
                f"{self.name}: deadline {deadline_s:.6g} s is below the fastest achievable "
                f"makespan {fm:.6g} s (all tasks at their fastest option)", fm)
