"""General DAG composition with per-device static accounting (spec §4.4–§4.5, §8.1, §9.4).

A DAG composite is a set of *tasks* (each a signature — a measured element or any composite),
precedence edges, and optional start offsets. Each task runs on its signature's device set
(all of them at once for a multi-device task). The schedule is deterministic:

* **Order on a device.** Tasks are first put in one topological order of the edges, ties
  broken by insertion order (Kahn's algorithm taking the earliest-inserted ready task). Each
  device runs its tasks in that order, one at a time. So tasks sharing a device that no edge
  orders run in the order they were given; an edge overrides that.
* **Start times.** start = max(offset, end of every predecessor, end of the previous task on
  each of its devices + the transition time between them); end = start + T. The makespan is
  the largest end (time 0 is the common start).
* **Energy** (DESIGN.md "static power belongs to devices"):

      E = Σ_i E_i  +  Σ_devices Σ_gaps p_gap · gap  +  Σ_transitions ε

  where E_i = s_i·T_i + d_i pays the device's static power while task i runs, a *gap* is
  time in [0, makespan] a device spends neither running a task nor switching, and p_gap is
  the device's idle (ready) power during it. With ``idle_power_w[k]`` given, device k idles at
  that constant power; otherwise it idles at the static power of the task it last ran (it
  holds that task's clocks), and before its first task at that task's. A multi-device task's
  static power is split evenly over its devices for this purpose. Devices listed in
  ``idle_power_w`` but used by no task idle for the whole makespan.

  When every task on device k has s = idle_k this is the spec's E = Σ_k s_k·makespan + Σ d_i
  (+ transitions), and a chain equals ``seq``; independent tasks on different devices equal
  ``par_multi``; ``(e₁ ⊕multi ι_B(T₁)) ⊗ (ι_A(T₂) ⊕multi e₂)`` equals the two-task DAG e₁→e₂.
* **Transitions** (spec §9.5). ``transitions`` is any object with
  ``cost(from_omega_dev, to_omega_dev) -> (time_s, energy_j)``; it is called when consecutive
  tasks on a device have different ω_dev. The switch occupies the device for ``time_s`` right
  after the earlier task and costs ``energy_j`` in total, but at least the device's idle power
  × ``time_s`` (a stall costs its static energy). It is an element composed with ⊗, as
  ``TransitionTable.element`` builds it, so the device is not also charged idle power then.
* **Uncertainty**: first order (delta method) at the realised schedule: each max is
  linearised at its dominant argument, so σ²_T sums along the critical path and
  σ²_E ≈ (Σ s)²σ²_T + Σ σ²_d when static power is uniform (spec §8.1). Sensitivities are kept
  per distinct measured leaf, so shared leaves contribute k²·var as in ``compose``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from .compose import _common_omega
from .errors import CompositionError
from .signature import Signature, StaticTerm, Term, static_variances, variances_from_terms


class TransitionCost(Protocol):
    """Anything that prices switching a device's ω_dev (e.g. ``frontier.transition.TransitionTable``)."""

    def cost(self, frm: Any, to: Any) -> tuple[float, float]:  # pragma: no cover - protocol
        """(time_s, energy_j) of switching from ``frm`` to ``to``."""
        ...


@dataclass(frozen=True)
class TransitionUse:
    """One ω_dev switch the schedule inserted on a device, between two consecutive tasks."""

    device: str
    after: str
    before: str
    start_s: float
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class DagSchedule:
    """The realised schedule of a DAG composite and its energy breakdown.

    ``signature`` is the composite (what :func:`dag` returns). ``critical_path`` lists the
    tasks whose times set the makespan, first to last. ``idle_energy_j`` is per device;
    ``task_energy_j`` is Σ E_i (each task's own static + dynamic energy).
    """

    signature: Signature
    start_s: Mapping[str, float]
    end_s: Mapping[str, float]
    makespan_s: float
    critical_path: tuple[str, ...]
    device_order: Mapping[str, tuple[str, ...]]
    transitions: tuple[TransitionUse, ...]
    task_energy_j: float
    idle_energy_j: Mapping[str, float]
    transition_energy_j: float

    @property
    def energy_j(self) -> float:
        """Total energy, J (equals ``signature.energy_j``)."""
        return self.signature.energy_j

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the schedule (the signature as T, E and their σ)."""
        sig = self.signature
        return {
            "name": sig.name, "makespan_s": self.makespan_s, "energy_j": sig.energy_j,
            "sd_time_s": sig.sd_time_s, "sd_energy_j": sig.sd_energy_j,
            "critical_path": list(self.critical_path),
            "tasks": {k: {"start_s": self.start_s[k], "end_s": self.end_s[k]} for k in self.start_s},
            "device_order": {k: list(v) for k, v in self.device_order.items()},
            "transitions": [vars(t).copy() for t in self.transitions],
            "task_energy_j": self.task_energy_j, "idle_energy_j": dict(self.idle_energy_j),
            "transition_energy_j": self.transition_energy_j,
        }


# -- validation ---------------------------------------------------------------------------------

def _check_tasks(tasks: Mapping[str, Signature]) -> list[str]:
    names = [str(k) for k in tasks]
    if not names:
        raise CompositionError("dag() needs at least one task")
    for k in names:
        if not isinstance(tasks[k], Signature):
            raise CompositionError(f"dag: task {k!r} is a {type(tasks[k]).__name__}, not a Signature")
    return names


def _check_deps(deps: Iterable[tuple[str, str]], known: set[str]) -> list[tuple[str, str]]:
    out = []
    for edge in deps:
        try:
            a, b = edge
        except (TypeError, ValueError):
            raise CompositionError(f"dag: dependency {edge!r} must be a pair (before, after)") from None
        a, b = str(a), str(b)
        for x in (a, b):
            if x not in known:
                raise CompositionError(f"dag: dependency ({a!r} -> {b!r}) names unknown task {x!r}")
        if a == b:
            raise CompositionError(f"dag: task {a!r} depends on itself")
        out.append((a, b))
    return out


def _nonneg(what: str, v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise CompositionError(f"dag: {what} must be a number, got {v!r}") from None
    if not math.isfinite(x) or x < 0:
        raise CompositionError(f"dag: {what} must be finite and >= 0, got {v!r}")
    return x


def _check_map(m: Mapping[str, float] | None, what: str, known: set[str] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in (m or {}).items():
        if known is not None and str(k) not in known:
            raise CompositionError(f"dag: {what} given for unknown task {k!r}")
        out[str(k)] = _nonneg(f"{what} of {k!r}", v)
    return out


def find_cycle(nodes: Iterable[Any], succ: Mapping[Any, Iterable[Any]] | Sequence[Iterable[Any]]
               ) -> list[Any]:
    """A directed cycle ``[v0, v1, ..., vk]`` (``vk → v0`` closes it) of the graph whose
    successors of ``v`` are ``succ[v]``, searched depth first from ``nodes`` in order; ``[]``
    when there is none. Iterative, so a long chain needs no recursion.

    >>> find_cycle(["a", "b", "c"], {"a": ["b"], "b": ["c"], "c": ["b"]})
    ['b', 'c']
    """
    on_path, done = set(), set()
    parent: dict[Any, Any] = {}
    end = object()
    for root in nodes:
        if root in done:
            continue
        on_path.add(root)
        stack = [(root, iter(succ[root]))]
        while stack:
            v, it = stack[-1]
            w = next(it, end)
            if w is end:
                on_path.discard(v)
                done.add(v)
                stack.pop()
            elif w in on_path:
                cyc = [v]
                while cyc[-1] != w:
                    cyc.append(parent[cyc[-1]])
                return cyc[::-1]
            elif w not in done:
                on_path.add(w)
                parent[w] = v
                stack.append((w, iter(succ[w])))
    return []


def _topo_order(names: list[str], deps: list[tuple[str, str]]) -> list[str]:
    idx = {k: i for i, k in enumerate(names)}
    succ: dict[str, list[str]] = {k: [] for k in names}
    indeg = dict.fromkeys(names, 0)
    for a, b in deps:
        succ[a].append(b)
        indeg[b] += 1
    ready = [idx[k] for k in names if indeg[k] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        k = names[heapq.heappop(ready)]
        order.append(k)
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, idx[s])
    if len(order) < len(names):
        cyc = find_cycle(names, succ)
        raise CompositionError(f"dag: dependency cycle {' -> '.join(repr(c) for c in cyc + cyc[:1])}")
    return order


def _transition(transitions: Any, dev: str, a: str, sa: Signature, b: str, sb: Signature):
    if transitions is None or sa.omega.dev == sb.omega.dev:
        return 0.0, 0.0
    try:
        tau, eps = transitions.cost(sa.omega.dev, sb.omega.dev)
    except AttributeError:
        raise CompositionError("dag: transitions must have a cost(from_omega_dev, to_omega_dev) method") from None
    what = f"transition on {dev!r} between {a!r} and {b!r}"
    return _nonneg(f"{what}: time_s", tau), _nonneg(f"{what}: energy_j", eps)


# -- first-order bookkeeping ------------------------------------------------------------------------

def _add(acc: dict[str, float], grad: Mapping[str, float], w: float = 1.0) -> None:
    if w == 0.0:
        return
    for k, v in grad.items():
        acc[k] = acc.get(k, 0.0) + w * v


def _own_time_grad(sig: Signature) -> dict[str, float]:
    return {k: t.dT_dT for k, t in sig.terms.items() if t.dT_dT != 0.0}


# -- the schedule -------------------------------------------------------------------------------------

@dataclass
class _State:
    start: dict[str, float] = field(default_factory=dict)
    end: dict[str, float] = field(default_factory=dict)
    g_start: dict[str, dict[str, float]] = field(default_factory=dict)
    g_end: dict[str, dict[str, float]] = field(default_factory=dict)
    crit_pred: dict[str, str | None] = field(default_factory=dict)


def _gap_power(dev: str, idle_power: Mapping[str, float], before: Signature) -> float:
    """Idle power of ``dev`` right after task ``before``: the given constant, else the static
    power (per-device share) of the task whose clocks it still holds."""
    p = idle_power.get(dev)
    return p if p is not None else _idle_share(before)


def _schedule_times(order, tasks, preds, offsets, dev_order, transitions, idle_power):
    """Start/end times, their sensitivities, and the switches inserted (list schedule)."""
    st = _State()
    prev_on: dict[tuple[str, str], str] = {}
    for dev, seq_ in dev_order.items():
        for a, b in zip(seq_, seq_[1:]):
            prev_on[(b, dev)] = a
    switches: list[TransitionUse] = []
    for k in order:
        sig = tasks[k]
        best, arg = offsets.get(k, 0.0), None
        cands = [(st.end[p], p) for p in preds[k]]
        for dev in sorted(sig.devices):
            p = prev_on.get((k, dev))
            if p is None:
                continue
            tau, eps = _transition(transitions, dev, p, tasks[p], k, sig)
            if tau > 0 or eps > 0:
                eps = max(eps, _gap_power(dev, idle_power, tasks[p]) * tau)
                switches.append(TransitionUse(dev, p, k, st.end[p], tau, eps))
            cands.append((st.end[p] + tau, p))
        for t, p in cands:
            if t > best:
                best, arg = t, p
        st.start[k] = best
        st.end[k] = best + sig.time_s
        st.crit_pred[k] = arg
        st.g_start[k] = dict(st.g_end[arg]) if arg is not None else {}
        g = dict(st.g_start[k])
        _add(g, _own_time_grad(sig))
        st.g_end[k] = g
    return st, switches


def _idle_share(sig: Signature) -> float:
    return sig.s_w / len(sig.devices)


def _idle_energy(devices, dev_order, tasks, idle_power, st, switches, makespan, g_mk, dE_dT):
    """Σ over gaps of p·gap per device; adds p·∂gap to ``dE_dT``."""
    sw_time = {(u.device, u.after): u.time_s for u in switches}
    out: dict[str, float] = {}
    for dev in devices:
        seq_ = dev_order.get(dev, ())
        const = idle_power.get(dev)
        total = 0.0
        # (gap start, its gradient, gap end, its gradient, power)
        gaps = []
        if not seq_:
            gaps.append((0.0, {}, makespan, g_mk, const or 0.0))
        else:
            first = seq_[0]
            gaps.append((0.0, {}, st.start[first], st.g_start[first],
                         const if const is not None else _idle_share(tasks[first])))
            for a, b in zip(seq_, seq_[1:]):
                p = const if const is not None else _idle_share(tasks[a])
                gaps.append((st.end[a] + sw_time.get((dev, a), 0.0), st.g_end[a],
                             st.start[b], st.g_start[b], p))
            last = seq_[-1]
            gaps.append((st.end[last], st.g_end[last], makespan, g_mk,
                         const if const is not None else _idle_share(tasks[last])))
        for t0, g0, t1, g1, p in gaps:
            total += p * max(t1 - t0, 0.0)
            _add(dE_dT, g1, p)
            _add(dE_dT, g0, -p)
        out[dev] = total
    return out


def _overlapping(names, st) -> set[str]:
    ivs = sorted((st.start[k], st.end[k], k) for k in names)
    hit: set[str] = set()
    for i, (_s0, e0, k0) in enumerate(ivs):
        for s1, e1, k1 in ivs[i + 1:]:
            if s1 >= e0:
                break
            if min(e0, e1) > s1:   # positive-length intersection
                hit.update((k0, k1))
    return hit


def _bias(names, tasks, dev_order, overlap):
    """Eq. 13 bookkeeping as in ``compose``: a task with a device predecessor takes a
    substituted entry context (+σ_E of its head); one overlapping another task takes a
    substituted runtime context (+σ_E of its leaves not already in a shared one)."""
    has_pred = {b for seq_ in dev_order.values() for b in seq_[1:]}
    bias = sum(tasks[k].bias_sigma_j for k in names)
    bias += sum(tasks[k].head_sigma_j for k in names if k in has_pred)
    bias += sum(tasks[k].all_sigma_j - tasks[k].runtime_sigma_j for k in names if k in overlap)
    head = sum(tasks[k].head_sigma_j for k in names if k not in has_pred)
    all_s = sum(tasks[k].all_sigma_j for k in names)
    runtime = sum(tasks[k].all_sigma_j if k in overlap else tasks[k].runtime_sigma_j for k in names)
    return bias, head, all_s, runtime


def dag_schedule(
    tasks: Mapping[str, Signature],
    deps: Iterable[tuple[str, str]] = (),
    idle_power_w: Mapping[str, float] | None = None,
    offsets_s: Mapping[str, float] | None = None,
    transitions: TransitionCost | None = None,
    name: str | None = None,
) -> DagSchedule:
    """Schedule a DAG of tasks on their devices and account its time and energy.

    See the module docstring for the rules. ``deps`` are (before, after) pairs of task names.
    Raises :class:`CompositionError` naming the task for unknown names, cycles, and negative
    or non-finite offsets or idle powers.

    >>> a = Signature("a", s_w=80, time_s=1.0, d_j=10, devices={"gpu0"})
    >>> b = Signature("b", s_w=80, time_s=2.0, d_j=20, devices={"gpu1"})
    >>> sch = dag_schedule({"a": a, "b": b}, [("a", "b")])
    >>> sch.makespan_s, sch.energy_j, sch.critical_path    # each GPU idles 80 W while the other works
    (3.0, 510.0, ('a', 'b'))
    """
    names = _check_tasks(tasks)
    tasks = {k: tasks[k] for k in names}
    known = set(names)
    edges = _check_deps(deps, known)
    offsets = _check_map(offsets_s, "start offset", known)
    idle_power = _check_map(idle_power_w, "idle power", None)
    order = _topo_order(names, edges)
    preds: dict[str, list[str]] = {k: [] for k in names}
    for a, b in edges:
        preds[b].append(a)
    devices = sorted(set().union(*(tasks[k].devices for k in names)) | set(idle_power))
    dev_order = {d: tuple(k for k in order if d in tasks[k].devices) for d in devices}
    dev_order = {d: v for d, v in dev_order.items() if v}

    st, switches = _schedule_times(order, tasks, preds, offsets, dev_order, transitions, idle_power)
    last = max(order, key=lambda k: st.end[k])   # first task (in order) reaching the makespan
    makespan = st.end[last]
    g_mk = st.g_end[last]
    path = []
    k: str | None = last
    while k is not None:
        path.append(k)
        k = st.crit_pred[k]
    path.reverse()

    # Energy and its first-order sensitivities to each distinct leaf's T and d.
    dE_dT: dict[str, float] = {}
    dE_dd: dict[str, float] = {}
    leaf_var: dict[str, tuple[float, float]] = {}
    for k in names:
        for key, t in tasks[k].terms.items():
            leaf_var[key] = (t.var_time_s2, t.var_d_j2)
            dE_dT[key] = dE_dT.get(key, 0.0) + t.dE_dT
            dE_dd[key] = dE_dd.get(key, 0.0) + t.dE_dd
    # σ_s: the tasks' own ∂E/∂s and ∂d/∂s add (an idle gap is priced at the idle power given
    # or a task's s taken as a value: its dependence on that s is not followed)
    static: dict[str, StaticTerm] = {}
    for k in names:
        for key, t in tasks[k].static_terms.items():
            was = static.get(key, StaticTerm(t.var_s_w2, 0.0, 0.0))
            static[key] = StaticTerm(t.var_s_w2, was.dE_ds + t.dE_ds, was.dd_ds + t.dd_ds)
    task_e = math.fsum(tasks[k].energy_j for k in names)
    idle_e = _idle_energy(devices, dev_order, tasks, idle_power, st, switches, makespan, g_mk, dE_dT)
    sw_e = math.fsum(u.energy_j for u in switches)
    energy = task_e + math.fsum(idle_e.values()) + sw_e
    terms = {key: Term(leaf_var[key][0], leaf_var[key][1], g_mk.get(key, 0.0), dE_dT[key], dE_dd[key])
             for key in leaf_var}

    # Dynamic part: tasks' d plus what a switch costs beyond idling through it.
    sw_dyn = math.fsum(u.energy_j - _gap_power(u.device, idle_power, tasks[u.after]) * u.time_s
                       for u in switches)
    d_tot = math.fsum(tasks[k].d_j for k in names) + sw_dyn
    s_eff = (energy - d_tot) / makespan if makespan > 0 else sum(_idle_share(tasks[k]) for k in names)
    s_eff = max(s_eff, 0.0)

    extra_t = sum(tasks[k].extra_var_time_s2 for k in path)
    extra_e = sum(tasks[k].extra_var_energy_j2 for k in names)
    vt, ve = variances_from_terms(terms, extra_t, extra_e)
    vs, ve_s = static_variances(static, makespan)
    overlap = _overlapping(names, st)
    bias, head, all_s, runtime = _bias(names, tasks, dev_order, overlap)
    label = name or ("dag(" + ", ".join(names[:4]) + (", ..." if len(names) > 4 else "") + ")")
    sig = Signature(
        name=label, s_w=s_eff, time_s=makespan, d_j=energy - s_eff * makespan,
        var_time_s2=vt, var_energy_j2=ve + ve_s, n=min(tasks[k].n for k in names),
        var_s_w2=vs, static_terms=static, devices=frozenset(devices), omega=_common_omega([tasks[k] for k in names]), composed=True,
        meta={"source": "composed", "op": "dag", "parts": list(names), "critical_path": path,
              "schedule": {k: [st.start[k], st.end[k]] for k in order}},
        terms=terms, extra_var_time_s2=extra_t, extra_var_energy_j2=extra_e,
        bias_sigma_j=bias, head_sigma_j=head, all_sigma_j=all_s, runtime_sigma_j=runtime,
    )
    return DagSchedule(
        signature=sig, start_s=MappingProxyType({k: st.start[k] for k in order}),
        end_s=MappingProxyType({k: st.end[k] for k in order}), makespan_s=makespan,
        critical_path=tuple(path), device_order=MappingProxyType(dev_order),
        transitions=tuple(switches), task_energy_j=task_e,
        idle_energy_j=MappingProxyType(idle_e), transition_energy_j=sw_e,
    )


def dag(
    tasks: Mapping[str, Signature],
    deps: Iterable[tuple[str, str]] = (),
    idle_power_w: Mapping[str, float] | None = None,
    offsets_s: Mapping[str, float] | None = None,
    transitions: TransitionCost | None = None,
    name: str | None = None,
) -> Signature:
    """The composite signature of a DAG of tasks (see :func:`dag_schedule` for the schedule).

    >>> a = Signature("a", s_w=50, time_s=1.0, d_j=100)
    >>> b = Signature("b", s_w=50, time_s=2.0, d_j=150)
    >>> dag({"a": a, "b": b}, [("a", "b")]).energy_j      # a chain is seq(a, b)
    400.0
    """
    return dag_schedule(tasks, deps, idle_power_w, offsets_s, transitions, name).signature
