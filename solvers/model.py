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
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np

from frontier.dag import find_cycle
from frontier.errors import EnergyCalculusError, FormatError
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature, Term

from .errors import InfeasibleError, ProblemError, ProblemTooLargeError, SolverUnavailableError
from .feasibility import meets_deadline
from .limits import check_tasks

__all__ = ["Problem", "Task", "Option", "LeafTerms", "ConstantTransition", "ProblemError",
           "InfeasibleError", "ProblemTooLargeError", "SolverUnavailableError", "constant_switch",
           "option_from_model"]


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
        for t in tasks:
            if not isinstance(t, Task):
                raise ProblemError(f"{self.name}: tasks must be Task objects, got {t!r}")
            if t.name in seen:
                raise ProblemError(f"{self.name}: duplicate task name {t.name!r}")
            seen.add(t.name)
            if not t.options:
                raise ProblemError(f"task {t.name!r}: no options")
            opts = tuple(_option_from(t.name, i, o) for i, o in enumerate(t.options))
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
        object.__setattr__(self, "_ix", _Index(self))

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
    def index(self) -> _Index:
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
            per_task = [[o.omega.dev for o in t.options] for t in self.tasks]
            devs = sorted({w for ws in per_task for w in ws})
            code = {w: i for i, w in enumerate(devs)}
            kmax = max(ix.k)
            times = np.full((ix.n, kmax), np.inf)
            ids = np.full((ix.n, kmax), -1)
            for v, ws in enumerate(per_task):
                times[v, :len(ws)] = ix.time[v]
                ids[v, :len(ws)] = [code[w] for w in ws]
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


class _Index:
    """Integer view of a :class:`Problem`: topological order, predecessor lists, per-task arrays,
    device sequences and transition matrices between consecutive same-device tasks."""

    def __init__(self, p: Problem):
        self.names = [t.name for t in p.tasks]
        self.pos = {k: i for i, k in enumerate(self.names)}
        n = len(self.names)
        self.n = n
        self.device = [t.device for t in p.tasks]
        devs = list(dict.fromkeys(self.device))
        self.devices = devs + sorted(set(p.idle_power_w) - set(devs))
        self.power = {d: float(p.idle_power_w.get(d, 0.0)) for d in self.devices}
        self.p_total = sum(self.power.values())
        self.time = [np.array([o.time_s for o in t.options]) for t in p.tasks]
        self._omegas = [[o.omega.dev for o in t.options] for t in p.tasks]
        self.energy = [np.array([o.energy_j for o in t.options]) for t in p.tasks]
        # Effective energy: what a task adds beyond the device's idle power over its duration.
        self.cost = [self.energy[i] - self.power[self.device[i]] * self.time[i] for i in range(n)]
        self.k = [len(t.options) for t in p.tasks]
        dev_seq: dict[str, list[int]] = {d: [] for d in devs}
        for i, d in enumerate(self.device):
            dev_seq[d].append(i)
        self.dev_seq = dev_seq
        edge_set: dict[tuple[int, int], None] = {}
        for a, b in p.edges:
            edge_set[(self.pos[a], self.pos[b])] = None
        self.dev_prev = [-1] * n
        self.dev_next = [-1] * n
        for seq in dev_seq.values():
            for a, b in zip(seq, seq[1:]):
                self.dev_prev[b] = a
                self.dev_next[a] = b
                edge_set.pop((a, b), None)
        self.edges = list(edge_set)          # cross (non device-order) edges
        self.preds: list[list[int]] = [[] for _ in range(n)]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for a, b in self.edges:
            self.preds[b].append(a)
            self.succs[a].append(b)
        self.order = self._topo(p.name)
        # Switch matrices for each consecutive same-device pair (a, b): tau[b], extra[b]
        # (extra = max(ε, P·τ) − P·τ, what the switch costs beyond idle power).
        self.tau: list[np.ndarray | None] = [None] * n
        self.extra: list[np.ndarray | None] = [None] * n
        # Steady state: the wrap pair (last -> first) of each device with two tasks or more;
        # wrap_tau[first], wrap_extra[first] price it as tau/extra do a consecutive pair
        # (None where it never costs anything). Kept apart from tau/extra, whose pairs are
        # always (dev_prev[b], b): the wrap is not a precedence edge (it would be a cycle).
        self.steady_state = bool(p.steady_state)
        self.wrap_prev = [-1] * n
        self.wrap_tau: list[np.ndarray | None] = [None] * n
        self.wrap_extra: list[np.ndarray | None] = [None] * n
        if self.steady_state:
            for seq in dev_seq.values():
                if len(seq) >= 2:
                    self.wrap_prev[seq[0]] = seq[-1]
        self.has_transitions = False
        cache: dict[tuple[str, Any, Any], tuple[float, float]] = {}
        for d, seq in dev_seq.items():
            rule = p.rule(d)
            if rule is None:
                continue
            pw = self.power[d]
            mats: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
            pairs = list(zip(seq, seq[1:]))
            if self.wrap_prev[seq[0]] >= 0:
                pairs.append((seq[-1], seq[0]))
            for a, b in pairs:
                wrap = a == seq[-1] and b == seq[0]
                oa = [o.omega.dev for o in p.tasks[a].options]
                ob = [o.omega.dev for o in p.tasks[b].options]
                mkey = (tuple(oa), tuple(ob))
                if mkey not in mats:         # 1F1B: every pair on a device shares its ω lists
                    mats[mkey] = self._switch_mats(d, rule, pw, oa, ob, cache)
                tau, ext = mats[mkey]
                if tau.any() or ext.any():
                    self.has_transitions = True
                    if wrap:
                        self.wrap_tau[b], self.wrap_extra[b] = tau, ext
                    else:
                        self.tau[b], self.extra[b] = tau, ext

    @staticmethod
    def _switch_mats(d: str, rule: Any, pw: float, oa: list, ob: list,
                     cache: dict) -> tuple[np.ndarray, np.ndarray]:
        """(τ, extra) matrices of switching from options with ω_dev ``oa`` to ``ob`` on ``d``."""
        tau = np.zeros((len(oa), len(ob)))
        ext = np.zeros((len(oa), len(ob)))
        for i, wa in enumerate(oa):
            for j, wb in enumerate(ob):
                if wa == wb:
                    continue
                key = (d, wa, wb)
                c = cache.get(key)
                if c is None:
                    try:
                        c = tuple(float(x) for x in rule.cost(wa, wb))
                    except EnergyCalculusError as exc:      # names the pair already
                        raise ProblemError(f"device {d!r}: {exc}") from None
                    except (TypeError, ValueError) as exc:
                        raise ProblemError(f"device {d!r}: transition {wa.label()} -> "
                                           f"{wb.label()}: {exc}") from None
                    if len(c) != 2 or not all(math.isfinite(x) and x >= 0 for x in c):
                        raise ProblemError(f"device {d!r}: transition {wa.label()} -> "
                                           f"{wb.label()} cost {c!r} must be (time_s >= 0, energy_j >= 0)")
                    cache[key] = c
                tau[i, j] = c[0]
                ext[i, j] = max(c[1], pw * c[0]) - pw * c[0]
        return tau, ext

    def _topo(self, name: str) -> list[int]:
        n = self.n
        succ = [list(s) for s in self.succs]
        for a in range(n):
            if self.dev_next[a] >= 0:
                succ[a].append(self.dev_next[a])
        indeg = [0] * n
        for a in range(n):
            for b in succ[a]:
                indeg[b] += 1
        stack = [i for i in range(n) if indeg[i] == 0][::-1]
        order = []
        while stack:
            v = stack.pop()
            order.append(v)
            for w in succ[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    stack.append(w)
        if len(order) < n:
            cyc = find_cycle(range(n), succ)
            path = " -> ".join(self.names[i] for i in cyc + cyc[:1])
            raise ProblemError(f"{name}: dependencies (with same-device order) form a cycle: {path}")
        return order

    # -- evaluation -------------------------------------------------------------------------
    def fastest_choice(self) -> np.ndarray:
        """Index of each task's fastest option (cheapest among ties)."""
        return np.array([int(np.lexsort((c, t))[0]) for t, c in zip(self.time, self.cost)])

    @cached_property
    def _flat(self):
        """Option times flattened with per-task offsets, and the switch matrices grouped by
        identity (1F1B shares one matrix per device), for vectorised lookups."""
        off = np.zeros(self.n + 1, dtype=int)
        np.cumsum(self.k, out=off[1:])
        tflat = np.concatenate(self.time) if self.n else np.zeros(0)
        groups: dict[int, tuple[np.ndarray, list[int]]] = {}
        for b in range(self.n):
            m = self.tau[b]
            if m is not None:
                groups.setdefault(id(m), (m, []))[1].append(b)
        prev = np.array(self.dev_prev, dtype=int)
        tau_groups = [(m, np.array(bs), prev[np.array(bs)]) for m, bs in groups.values()]
        # the wrap pairs of a steady state (never the same task as a consecutive pair's b)
        tau_groups += [(self.wrap_tau[b], np.array([b]), np.array([self.wrap_prev[b]]))
                       for b in range(self.n) if self.wrap_tau[b] is not None]
        return off[:-1], tflat, tau_groups

    @cached_property
    def time_flat(self) -> tuple[np.ndarray, np.ndarray]:
        """(offset of each task's first option, all option times flattened)."""
        off, tflat, _ = self._flat
        return off, tflat

    @cached_property
    def cost_flat(self) -> np.ndarray:
        """Effective energies of all options, flattened like :attr:`time_flat`'s times."""
        return np.concatenate(self.cost) if self.n else np.zeros(0)

    @cached_property
    def option_owner(self) -> np.ndarray:
        """Task index of each flattened option."""
        return np.repeat(np.arange(self.n), self.k)

    @cached_property
    def switch_free_devices(self) -> frozenset[str]:
        """Devices where no switch costs anything (the steady-state wrap included)."""
        return frozenset(d for d, seq in self.dev_seq.items()
                         if all(self.tau[u] is None and self.wrap_tau[u] is None for u in seq))

    @cached_property
    def switch_free_tasks(self) -> np.ndarray:
        """Tasks on :attr:`switch_free_devices` (sorted)."""
        return np.array(sorted(v for d in self.switch_free_devices for v in self.dev_seq[d]), dtype=int)

    @cached_property
    def stairs(self) -> list[tuple[list[float], list[int], list[float]]]:
        """Per task, its option times ascending, and for each prefix the cheapest option
        (effective energy) among those no slower: the cheapest option within a time limit is
        one ``bisect`` away."""
        st = []
        for v in range(self.n):
            o = np.argsort(self.time[v], kind="stable")
            c = self.cost[v][o]
            best = np.minimum.accumulate(c)
            new_min = np.r_[True, c[1:] < best[:-1]]          # ties: the faster option
            arg = o[np.maximum.accumulate(np.where(new_min, np.arange(len(o)), 0))]
            st.append((self.time[v][o].tolist(), arg.tolist(), best.tolist()))
        return st

    def durations(self, choice: Sequence[int]) -> np.ndarray:
        """Duration of each task under ``choice``."""
        off, tflat, _ = self._flat
        return tflat[off + np.asarray(choice, dtype=int)]

    def switch_tau(self, choice: Sequence[int]) -> np.ndarray:
        """Switch latency before each task (0 when none); in a steady state a device's first
        task carries the wrap switch from its last task."""
        out = np.zeros(self.n)
        ch = np.asarray(choice, dtype=int)
        for m, bs, prev in self._flat[2]:
            out[bs] = m[ch[prev], ch[bs]]
        return out

    def schedule(self, choice: Sequence[int]) -> tuple[np.ndarray, np.ndarray, float]:
        """Earliest start and end of each task and the makespan (ASAP list schedule)."""
        start, end = self.earliest(self.durations(choice), self.switch_tau(choice))
        return np.array(start), np.array(end), max(end) if self.n else 0.0

    def critical_chain(self, start: Sequence[float] | np.ndarray, end: Sequence[float] | np.ndarray,
                       tau: Sequence[float] | np.ndarray,
                       last: int | None = None) -> list[int]:
        """Tasks on one critical chain of a schedule, from ``last`` (default: the task that ends
        last) back to a task that starts at 0 (or after its steady-state wrap switch), walking
        through tight edges (same-device order, with its switch latency, first; then
        dependencies). Tight means within 1e-12 relative to the makespan."""
        if self.n == 0:
            return []
        tol = 1e-12 * max(float(max(end)), 1.0)
        v = int(np.argmax(end)) if last is None else int(last)
        out = []
        while v >= 0:
            out.append(v)
            nxt, ready = -1, -math.inf
            if start[v] > 0:
                # Of the tight predecessors, the one that really binds (latest ready time; two
                # ends a rounding error apart are not a tie); on an exact tie the device order,
                # as frontier.dag_schedule breaks it, so σ_T follows the same chain.
                u = self.dev_prev[v]
                if u >= 0 and abs(end[u] + tau[v] - start[v]) <= tol:
                    nxt, ready = u, end[u] + tau[v]
                for u in self.preds[v]:
                    if abs(end[u] - start[v]) <= tol and end[u] > ready:
                        nxt, ready = u, end[u]
            v = nxt
        return out

    def earliest(self, dur_s: Sequence[float], tau_s: Sequence[float] | None = None) -> tuple[list, list]:
        """ASAP start and end of each task (Python lists) for given durations and switch
        latencies before each task (none when ``tau_s`` is None); durations may be fractional.
        A latency before a device's first task (the steady-state wrap) delays it from 0."""
        # Python floats and lists: scalar numpy indexing would dominate this loop.
        dur = np.asarray(dur_s, dtype=float).tolist()
        tau = [0.0] * self.n if tau_s is None else np.asarray(tau_s, dtype=float).tolist()
        start = [0.0] * self.n
        end = [0.0] * self.n
        preds, dev_prev = self.preds, self.dev_prev
        for v in self.order:
            s = 0.0
            for u in preds[v]:
                if end[u] > s:
                    s = end[u]
            u = dev_prev[v]
            if u >= 0:
                if end[u] + tau[v] > s:
                    s = end[u] + tau[v]
            elif tau[v] > s:
                s = tau[v]
            start[v] = s
            end[v] = s + dur[v]
        return start, end

    @cached_property
    def _levels(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per DAG level (device order included): its tasks and their predecessors, padded
        with the index ``n`` (a column that stays 0)."""
        level = [0] * self.n
        preds = [list(self.preds[v]) + ([self.dev_prev[v]] if self.dev_prev[v] >= 0 else [])
                 for v in range(self.n)]
        for v in self.order:
            level[v] = 1 + max((level[u] for u in preds[v]), default=-1)
        width = max((len(x) for x in preds), default=0) or 1
        pad = np.full((self.n, width), self.n)
        for v, ps in enumerate(preds):
            pad[v, :len(ps)] = ps
        lv = []
        for L in range(max(level) + 1):
            idx = np.array([v for v in range(self.n) if level[v] == L])
            lv.append((idx, pad[idx]))
        return lv

    def batch_makespan(self, dur: np.ndarray) -> np.ndarray:
        """Makespans of many plans at once (rows of task durations; no switch latencies),
        processing the DAG level by level with numpy."""
        end = np.zeros((dur.shape[0], self.n + 1))
        for idx, pp in self._levels:
            end[:, idx] = end[:, pp].max(axis=2) + dur[:, idx]
        return end[:, :self.n].max(axis=1)

    def makespan(self, choice: Sequence[int]) -> float:
        """Makespan of ``choice``."""
        return self.schedule(choice)[2]

    def latest(self, choice: Sequence[int], horizon_s: float) -> np.ndarray:
        """Latest finish of each task so that everything ends by ``horizon_s``."""
        return np.array(self.latest_finish(self.durations(choice), horizon_s, self.switch_tau(choice)))

    def latest_finish(self, dur_s: Sequence[float], horizon_s: float,
                      tau_s: Sequence[float] | None = None) -> list:
        """ALAP finish of each task (a Python list) by ``horizon_s`` for given durations and
        switch latencies (none when ``tau_s`` is None); durations may be fractional."""
        dur = np.asarray(dur_s, dtype=float).tolist()
        tau = [0.0] * self.n if tau_s is None else np.asarray(tau_s, dtype=float).tolist()
        lf = [float(horizon_s)] * self.n
        succs, dev_next = self.succs, self.dev_next
        for v in reversed(self.order):
            f = lf[v]
            for w in succs[v]:
                x = lf[w] - dur[w]
                if x < f:
                    f = x
            w = dev_next[v]
            if w >= 0:
                x = lf[w] - dur[w] - tau[w]
                if x < f:
                    f = x
            lf[v] = f
        return lf

    def switch_extra(self, choice: Sequence[int]) -> tuple[float, int]:
        """Σ extra switch energy beyond idle power, and the number of switches that cost
        something (time or energy); the steady-state wraps included."""
        tot, n_sw = 0.0, 0
        for b in range(self.n):
            for m, ext, a in ((self.tau[b], self.extra[b], self.dev_prev[b]),
                              (self.wrap_tau[b], self.wrap_extra[b], self.wrap_prev[b])):
                if m is not None:
                    i, j = choice[a], choice[b]
                    if m[i, j] > 0 or ext[i, j] > 0:
                        n_sw += 1
                        tot += ext[i, j]
        return tot, n_sw

    def switch_counts(self, choice: Sequence[int]) -> dict[str, int]:
        """Per device, how many times ω_dev changes in one iteration under ``choice``: between
        consecutive tasks, plus (in a steady state) from the last task back to the first.
        Counts changes of the operating point, priced or free."""
        out = {d: 0 for d in self.dev_seq}
        omega = self._omegas
        for d, seq in self.dev_seq.items():
            pairs = list(zip(seq, seq[1:]))
            if self.wrap_prev[seq[0]] >= 0:
                pairs.append((seq[-1], seq[0]))
            out[d] = sum(1 for a, b in pairs if omega[a][int(choice[a])] != omega[b][int(choice[b])])
        return out

    def device_energies_j(self, choice: Sequence[int], makespan_s: float | None = None
                          ) -> dict[str, float]:
        """Per device, its share of :meth:`objective` (J): idle power over the makespan, its
        tasks' energy beyond idle power, and its switches' extra energy (a steady state's
        wrap included). The values sum to ``objective(choice, makespan_s)``."""
        m = self.makespan(choice) if makespan_s is None else makespan_s
        out = {d: self.power[d] * m for d in self.devices}
        for b in range(self.n):
            d = self.device[b]
            out[d] += float(self.cost[b][choice[b]])
            for tau, ext, a in ((self.tau[b], self.extra[b], self.dev_prev[b]),
                                (self.wrap_tau[b], self.wrap_extra[b], self.wrap_prev[b])):
                if tau is not None:
                    out[d] += float(ext[choice[a], choice[b]])
        return out

    def objective(self, choice: Sequence[int], makespan_s: float | None = None) -> float:
        """Total energy of ``choice`` (J) with the device horizon at its makespan."""
        m = self.makespan(choice) if makespan_s is None else makespan_s
        c = sum(float(self.cost[i][choice[i]]) for i in range(self.n))
        return self.p_total * m + c + self.switch_extra(choice)[0]


def constant_switch(p: Problem, u: int, w: int):
    """``(time_s, extra_j, options of u by ω, options of w by ω)`` when every switch between
    consecutive tasks ``u`` → ``w`` costs the same time and extra energy (and staying on one ω
    costs nothing), else None (no switch cost on the pair, or costs that depend on the pair
    of operating points). ``u`` → ``w`` is a consecutive pair (``dev_prev[w] == u``) or, in a
    steady state, a device's wrap pair (``wrap_prev[w] == u``: last task → first)."""
    ix = p.index
    if ix.dev_prev[w] == u:
        tau, ext = ix.tau[w], ix.extra[w]
    elif ix.wrap_prev[w] == u:
        tau, ext = ix.wrap_tau[w], ix.wrap_extra[w]
    else:
        return None
    if tau is None:
        return None
    om_u = [o.omega.dev for o in p.tasks[u].options]
    om_w = [o.omega.dev for o in p.tasks[w].options]
    ids: dict = {}
    iu = np.array([ids.setdefault(om, len(ids)) for om in om_u])
    iw = np.array([ids.setdefault(om, len(ids)) for om in om_w])
    # _Index leaves same-ω entries at 0 and sets tau only when some entry is not 0, so the
    # pairs with different ω are not empty and all that is left to check is that they agree
    same = iu[:, None] == iw[None, :]
    diff_t, diff_e = tau[~same], ext[~same]
    if np.ptp(diff_t) > 0 or np.ptp(diff_e) > 0:
        return None
    groups_u: dict = {}
    groups_w: dict = {}
    for a, om in enumerate(om_u):
        groups_u.setdefault(om, []).append(a)
    for b, om in enumerate(om_w):
        groups_w.setdefault(om, []).append(b)
    return float(diff_t[0]), float(diff_e[0]), groups_u, groups_w
