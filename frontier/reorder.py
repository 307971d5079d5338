"""Reordering as an energy lever: search the orders of tasks whose order is free (spec §7,
Property 5.1), evaluated with the context-carrying composition of :mod:`frontier.context`.

In the context-independent algebra ⊗ commutes, so order cannot matter. With a mechanism that
carries state (the thermal one: Θ' = Θ∞ + (Θ − Θ∞)·e^{−T/τ}) it can: an element entered hot
costs what its signature at that entry temperature says. :func:`reorder` evaluates every
order of a *group* of elements (exhaustively up to ``max_orders`` distinct orders, else by a
bounded local search) inside the device's whole step::

    before ⊗ (group, in some order) ⊗ after

with :func:`~frontier.context.seq_in_context`, from a given entry temperature (a single pass)
or at the **periodic** fixed point (the step repeats back to back, so its entry temperature
is its own exit temperature: what ``ecal run`` measures). The predicted saving is the step's,
given order minus chosen order, with σ.

**Substitution (Property 5.1 (ii)).** An order is substituted for the given one only if its
exit context is *equivalent downstream*. Two exit temperatures Θ_a (given order) and Θ_b
(candidate) are equivalent when either

1. they agree within the mechanism's resolution, ``|Θ_a − Θ_b| ≤ c_α·σ_Θ`` (σ_Θ: the RMS
   residual of the thermal fit, :func:`temperature_sigma_c`), or
2. every element downstream of the group is *insensitive* to the difference:
   ``|E_k(Θ_a,k) − E_k(Θ_b,k)| ≤ c_α·σ_{E_k}``, walked in order (the ``after`` elements,
   and for a periodic step the next step's ``before`` elements) until the two temperatures
   have come within c_α·σ_Θ of each other (the RC rule only shrinks the difference, so
   nothing further on can see it). A downstream element given as a plain
   :class:`~frontier.signature.Signature` is context-free by the caller's declaration and
   counts as insensitive.

In a single pass the step is followed by work this function does not know, so a difference
still above c_α·σ_Θ at the step's end refuses the order. In a periodic step what follows is
the next step, whose entry is the fixed point: already in the prediction.

A refused order is reported with its reason (:class:`Refusal`) and the best *admissible*
order is substituted instead (the given order always is), provided its predicted saving
exceeds c_α times its σ (else the given order is kept and :attr:`ReorderResult.kept` says
why: order is not changed for a saving the measurements cannot tell from zero). Uncertainty: the saving's σ
propagates each characterized point's variance through the interpolation weights of both
orders, so a point used by both cancels where its weight does (the entry temperatures are
taken as exact: the error of the thermal model enters the refusal test, not the σ).

Example (two elements, hot first or cold first, from 40 °C)::

    >>> from frontier.context import ContextualSignature, ThermalMechanism
    >>> from frontier.signature import Signature
    >>> th = ThermalMechanism(ambient_c=30.0, r_th_c_per_w=0.1, tau_s=2.0)
    >>> def el(name, e_cold, e_hot):
    ...     return ContextualSignature(name, {40.0: Signature(name, 0.0, 1.0, e_cold),
    ...                                       80.0: Signature(name, 0.0, 1.0, e_hot)})
    >>> r = reorder([el("hot", 600.0, 640.0), el("cold", 100.0, 140.0)], mechanism=th,
    ...             entry_c=40.0, sigma_temp_c=0.5)
    >>> r.chosen.names, r.refused[0].names
    (('hot', 'cold'), ('cold', 'hot'))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .context import (
    ContextualSignature,
    Element,
    ThermalMechanism,
    ThermalObservation,
    seq_in_context,
)
from .errors import InputError
from .signature import Signature

#: Distinct orders evaluated exhaustively at most (7! = 5040); beyond, a bounded local search.
MAX_ORDERS = 5040


def c_alpha(alpha: float) -> float:
    """The two-sided Gaussian critical value z_{1−α/2} (1.96 at α = 0.05)."""
    from statistics import NormalDist

    if not 0.0 < alpha < 1.0:
        raise InputError(f"alpha must be in (0, 1), got {alpha!r}")
    return NormalDist().inv_cdf(1.0 - alpha / 2.0)


def temperature_sigma_c(mechanism: ThermalMechanism, obs: Sequence[ThermalObservation]) -> float:
    """σ_Θ of a mechanism against observed windows: the RMS of predicted minus observed exit
    temperature, °C (it includes the readings' own rounding). Needs one window or more."""
    if not obs:
        raise InputError("temperature_sigma_c needs at least one observed window")
    res = [mechanism.exit_temp_c(o.entry_c, o.time_s, o.power_w * o.time_s) - o.exit_c for o in obs]
    return float(math.sqrt(sum(r * r for r in res) / len(res)))


@dataclass(frozen=True)
class OrderEval:
    """One order of the group, evaluated in the step.

    ``order``: indices into the given group; ``names`` their element names; ``step`` the
    composite of before ⊗ group ⊗ after; ``group`` the group's own composite; ``entry_temp_c``
    the step's entry temperature (periodic: its fixed point); ``group_exit_temp_c`` the
    temperature the group leaves; ``entry_temps_c`` per element of the step (before, group in
    this order, after), ``None`` where it was composed at the null context; ``energies_j``
    per element of the step; ``exit_temp_c`` the step's exit temperature."""

    order: tuple[int, ...]
    names: tuple[str, ...]
    step: Signature
    group: Signature
    entry_temp_c: float
    group_exit_temp_c: float
    exit_temp_c: float
    entry_temps_c: tuple[float | None, ...]
    energies_j: tuple[float, ...]
    sd_energies_j: tuple[float, ...]


@dataclass(frozen=True)
class Refusal:
    """Why an order better than the chosen one was not substituted (Property 5.1 (ii)):
    its exit temperature differs from the given order's by ``exit_diff_c`` (> the
    tolerance) and ``element`` downstream moves by ``delta_energy_j`` (> its tolerance
    ``tolerance_j``), or (``element`` None) unknown work follows a single pass."""

    order: tuple[int, ...]
    names: tuple[str, ...]
    saving_j: float
    exit_diff_c: float
    element: str | None
    delta_energy_j: float
    tolerance_j: float
    reason: str


@dataclass(frozen=True)
class ReorderResult:
    """What :func:`reorder` found: the given order, the order substituted (``chosen``), the
    best order by predicted energy (``best``, maybe refused), the step's predicted saving
    given − chosen in energy and time with σ, the group's own saving (what a group-only
    evaluation would claim), the refused orders better than the chosen one, how the search
    went, and the equivalence tolerance (°C)."""

    given: OrderEval
    chosen: OrderEval
    best: OrderEval
    saving_j: float
    sd_saving_j: float
    saving_time_s: float
    sd_saving_time_s: float
    group_saving_j: float
    refused: tuple[Refusal, ...]
    orders_evaluated: int
    exhaustive: bool
    periodic: bool
    tolerance_c: float
    c_alpha: float
    #: σ of the given order's energy minus the best order's (refused or not)
    sd_best_saving_j: float = 0.0
    #: why the given order was kept although an admissible order predicts less energy (its
    #: saving is within c_α·σ), else None
    kept: str | None = None

    @property
    def substituted(self) -> bool:
        """Whether the chosen order differs from the given one."""
        return self.chosen.order != self.given.order


# -- evaluation ------------------------------------------------------------------------------

def _sig_at(e: Element, temp: float | None) -> Signature:
    if isinstance(e, ContextualSignature):
        return e.at(temp) if temp is not None else e.by_entry_c[min(e.by_entry_c)]
    return e


def _point_weights(e: Element, temp: float | None) -> list[tuple[object, float, Signature]]:
    """The characterized points an element's value at ``temp`` is a weighted sum of
    (matching :meth:`ContextualSignature.at`): (leaf key, weight, point)."""
    if not isinstance(e, ContextualSignature):
        return [(id(e), 1.0, e)]
    return [((id(e), t), w, e.by_entry_c[t]) for t, w in e.weights(temp).items()]


def _steady_bracket(elems: Sequence[Element], mechanism: ThermalMechanism) -> tuple[float, float]:
    """Temperatures between which every element's steady temperature lies (and ambient)."""
    temps = [mechanism.ambient_c]
    for e in elems:
        pts = e.by_entry_c.values() if isinstance(e, ContextualSignature) else [e]
        for s in pts:
            if s.time_s > 0:
                temps.append(mechanism.steady_temp_c(s.energy_j / s.time_s))
    return min(temps) - 1.0, max(temps) + 1.0


def periodic_entry_c(elems: Sequence[Element], mechanism: ThermalMechanism) -> float:
    """The entry temperature of a step that repeats back to back: the Θ with
    exit(Θ) = Θ (regula falsi, Illinois variant, on a bracket of the elements' steady
    temperatures; exit(Θ) − Θ is monotone decreasing there)."""
    def f(t: float) -> float:
        run = seq_in_context(elems, entry_c=t, mechanism=mechanism)
        assert run.exit_temp_c is not None
        return run.exit_temp_c - t

    lo, hi = _steady_bracket(elems, mechanism)
    f_lo, f_hi = f(lo), f(hi)
    if f_lo <= 0:
        return lo
    if f_hi >= 0:
        return hi
    side = 0
    t = lo
    for _ in range(100):
        t = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        ft = f(t)
        if abs(ft) < 1e-9 or hi - lo < 1e-9:
            break
        if ft > 0:
            lo, f_lo = t, ft
            if side == 1:
                f_hi /= 2
            side = 1
        else:
            hi, f_hi = t, ft
            if side == -1:
                f_lo /= 2
            side = -1
    return t


def evaluate_order(group: Sequence[Element], order: Sequence[int], *, mechanism: ThermalMechanism,
                   before: Sequence[Element] = (), after: Sequence[Element] = (),
                   entry_c: float | None = None, periodic: bool = False) -> OrderEval:
    """The step ``before ⊗ group[order] ⊗ after`` composed with the temperature carried, from
    ``entry_c`` (default: the mechanism's ambient) or, ``periodic``, at its fixed point."""
    seq_elems = [*before, *(group[i] for i in order), *after]
    if periodic:
        entry = periodic_entry_c(seq_elems, mechanism)
    else:
        entry = mechanism.ambient_c if entry_c is None else float(entry_c)
    run = seq_in_context(seq_elems, entry_c=entry, mechanism=mechanism)
    sigs = [_sig_at(e, t) for e, t in zip(seq_elems, run.entry_temps_c)]
    nb, ng = len(before), len(order)
    grp = seq_in_context(list(seq_elems[nb:nb + ng]), entry_c=_entry_of(sigs, nb, entry, mechanism),
                         mechanism=mechanism)
    assert run.exit_temp_c is not None and grp.exit_temp_c is not None
    return OrderEval(tuple(order), tuple(_name(group[i]) for i in order), run.signature,
                     grp.signature, float(entry), float(grp.exit_temp_c), float(run.exit_temp_c),
                     run.entry_temps_c, tuple(s.energy_j for s in sigs),
                     tuple(s.sd_energy_j for s in sigs))


def _entry_of(sigs: Sequence[Signature], k: int, entry: float, mech: ThermalMechanism) -> float:
    """The temperature element ``k`` of the step enters at (after the first k elements)."""
    temp = entry
    for s in sigs[:k]:
        temp = mech.exit_temp_c(temp, s.time_s, s.energy_j)
    return temp


def _name(e: Element) -> str:
    return e.name


def _weights(group: Sequence[Element], ev: OrderEval, before: Sequence[Element],
             after: Sequence[Element]) -> dict[object, tuple[float, Signature]]:
    """Leaf key → (summed weight, point) of the step's energy and time in ``ev``."""
    elems = [*before, *(group[i] for i in ev.order), *after]
    out: dict[object, tuple[float, Signature]] = {}
    for e, t in zip(elems, ev.entry_temps_c):
        for key, w, pt in _point_weights(e, t):
            prev = out.get(key, (0.0, pt))[0]
            out[key] = (prev + w, pt)
    return out


def _saving_sd(group: Sequence[Element], a: OrderEval, b: OrderEval, before: Sequence[Element],
               after: Sequence[Element]) -> tuple[float, float]:
    """σ of (E_a − E_b) and (T_a − T_b): each characterized point's variance times the square
    of the difference of its weights in the two orders."""
    wa, wb = _weights(group, a, before, after), _weights(group, b, before, after)
    var_e = var_t = 0.0
    for key in set(wa) | set(wb):
        pt = (wa.get(key) or wb[key])[1]
        dw = wa.get(key, (0.0, pt))[0] - wb.get(key, (0.0, pt))[0]
        var_e += dw * dw * pt.var_energy_j2
        var_t += dw * dw * pt.var_time_s2
    return math.sqrt(var_e), math.sqrt(var_t)


# -- the equivalence test (Property 5.1 (ii)) ----------------------------------------------

def check_exit_equivalence(given: OrderEval, cand: OrderEval, *, group_len: int, before: Sequence[Element],
                           after: Sequence[Element], periodic: bool, tolerance_c: float,
                           c_a: float) -> Refusal | None:
    """None when ``cand``'s exit context is equivalent downstream to ``given``'s (module
    docstring: within ``tolerance_c``, or every downstream element insensitive); else the
    :class:`Refusal` that says why."""
    saving = given.step.energy_j - cand.step.energy_j
    diff = cand.group_exit_temp_c - given.group_exit_temp_c
    if abs(diff) <= tolerance_c:
        return None
    nb = len(before)
    first_after = nb + group_len
    # downstream: the after elements, then (periodic) the next step's before elements
    idx = list(range(first_after, first_after + len(after)))
    elems = list(after)
    if periodic:
        idx += list(range(nb))
        elems += list(before)
    for k, e in zip(idx, elems):
        ta, tb = given.entry_temps_c[k], cand.entry_temps_c[k]
        if ta is not None and tb is not None and abs(ta - tb) <= tolerance_c:
            return None                     # the difference has faded below resolution
        if not isinstance(e, ContextualSignature):
            continue                        # context-free by declaration
        de = cand.energies_j[k] - given.energies_j[k]
        tol = c_a * given.sd_energies_j[k]
        if abs(de) > tol:
            return Refusal(cand.order, cand.names, saving, diff, e.name, de, tol,
                           f"exit temperature {diff:+.1f} °C from the given order's (tolerance "
                           f"{tolerance_c:.1f} °C) moves downstream {e.name!r} by {de:+.1f} J "
                           f"(tolerance c_α·σ = {tol:.1f} J)")
    if periodic:
        return None                         # the next step's entry: in the fixed point
    end = cand.exit_temp_c - given.exit_temp_c
    if abs(end) <= tolerance_c:
        return None
    return Refusal(cand.order, cand.names, saving, diff, None, 0.0, 0.0,
                   f"the step ends {end:+.1f} °C from the given order's (tolerance "
                   f"{tolerance_c:.1f} °C) and what follows a single pass is not known")


# -- search ------------------------------------------------------------------------------------

def _distinct_orders(keys: Sequence[object]) -> list[tuple[int, ...]]:
    """Every order of the indices that differs in the sequence of keys (identical elements
    keep their given relative order), the given order first; generated as multiset
    permutations, so the work is the number of distinct orders, not n!."""
    pools: dict[object, list[int]] = {}
    for i, k in enumerate(keys):
        pools.setdefault(k, []).append(i)
    kinds = list(pools)
    left = {k: len(v) for k, v in pools.items()}
    out: list[tuple[int, ...]] = []
    seq: list[object] = []

    def rec() -> None:
        if len(seq) == len(keys):
            used: dict[object, int] = {}
            order = []
            for k in seq:
                j = used.get(k, 0)
                order.append(pools[k][j])
                used[k] = j + 1
            out.append(tuple(order))
            return
        for k in kinds:
            if left[k]:
                left[k] -= 1
                seq.append(k)
                rec()
                seq.pop()
                left[k] += 1

    rec()
    given = tuple(range(len(keys)))
    out.sort(key=lambda o: o != given)          # stable: the given order first
    return out


def _count_distinct(keys: Sequence[object]) -> int:
    counts: dict[object, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    n = math.factorial(len(keys))
    for c in counts.values():
        n //= math.factorial(c)
    return n


def _neighbours(order: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Orders one swap or one move away."""
    n = len(order)
    out = []
    for i in range(n):
        for j in range(i + 1, n):
            o = list(order)
            o[i], o[j] = o[j], o[i]
            out.append(tuple(o))
    for i in range(n):
        for j in range(n):
            if i != j:
                o = list(order)
                o.insert(j, o.pop(i))
                out.append(tuple(o))
    return out


def reorder(group: Sequence[Element], *, mechanism: ThermalMechanism, sigma_temp_c: float,
            before: Sequence[Element] = (), after: Sequence[Element] = (),
            entry_c: float | None = None, periodic: bool = False, alpha: float = 0.05,
            max_orders: int = MAX_ORDERS) -> ReorderResult:
    """Search the orders of ``group`` (given in its current order) in the step
    ``before ⊗ group ⊗ after`` on one device; see the module docstring.

    ``sigma_temp_c``: σ_Θ of the mechanism (:func:`temperature_sigma_c`); the equivalence
    tolerance is c_α·σ_Θ. ``entry_c``: the step's entry temperature for a single pass
    (default ambient); ``periodic``: the step repeats back to back (its entry is its fixed
    point). Up to ``max_orders`` distinct orders are evaluated exhaustively; more are
    searched by first-improvement local search (swaps and moves) from the given order,
    evaluating at most ``max_orders`` orders.
    """
    if not group:
        raise InputError("reorder needs at least one element in the group")
    if not (math.isfinite(sigma_temp_c) and sigma_temp_c >= 0):
        raise InputError(f"sigma_temp_c must be a finite number >= 0, got {sigma_temp_c!r}")
    if max_orders < 1:
        raise InputError(f"max_orders must be >= 1, got {max_orders!r}")
    c_a = c_alpha(alpha)
    tol_c = c_a * sigma_temp_c
    group = list(group)
    keys = [id(e) for e in group]
    cache: dict[tuple[int, ...], OrderEval] = {}

    def ev(order: tuple[int, ...]) -> OrderEval:
        if order not in cache:
            cache[order] = evaluate_order(group, order, mechanism=mechanism, before=before,
                                          after=after, entry_c=entry_c, periodic=periodic)
        return cache[order]

    given_order = tuple(range(len(group)))
    given = ev(given_order)
    exhaustive = _count_distinct(keys) <= max_orders
    if exhaustive:
        for o in _distinct_orders(keys):
            ev(o)
    else:
        cur = given
        improved = True
        while improved and len(cache) < max_orders:
            improved = False
            for o in _neighbours(cur.order):
                if len(cache) >= max_orders:
                    break
                cand = ev(o)
                if cand.step.energy_j < cur.step.energy_j - 1e-12:
                    cur, improved = cand, True
                    break
    ranked = sorted(cache.values(), key=lambda e: (e.step.energy_j, e.step.time_s))
    refused: list[Refusal] = []
    chosen = given
    eps = 1e-9 * abs(given.step.energy_j)       # rounding of a sum taken in another order
    for cand in ranked:
        if cand.step.energy_j >= given.step.energy_j - eps:
            break
        why = check_exit_equivalence(given, cand, group_len=len(group), before=before, after=after,
                                     periodic=periodic, tolerance_c=tol_c, c_a=c_a)
        if why is None:
            chosen = cand
            break
        refused.append(why)
    sd_e, sd_t = _saving_sd(group, given, chosen, before, after)
    kept = None
    if chosen is not given and given.step.energy_j - chosen.step.energy_j <= c_a * sd_e:
        kept = (f"the best admissible order ({', '.join(chosen.names)}) saves "
                f"{given.step.energy_j - chosen.step.energy_j:.2f} ± {sd_e:.2f} J, within "
                f"c_α·σ: not substituted")
        chosen, sd_e, sd_t = given, 0.0, 0.0
    return ReorderResult(
        given=given, chosen=chosen, best=ranked[0],
        saving_j=given.step.energy_j - chosen.step.energy_j, sd_saving_j=sd_e,
        saving_time_s=given.step.time_s - chosen.step.time_s, sd_saving_time_s=sd_t,
        group_saving_j=given.group.energy_j - chosen.group.energy_j,
        refused=tuple(refused), orders_evaluated=len(cache), exhaustive=exhaustive,
        periodic=periodic, tolerance_c=tol_c, c_alpha=c_a,
        sd_best_saving_j=_saving_sd(group, given, ranked[0], before, after)[0], kept=kept)


def saving_sd(group: Sequence[Element], a: OrderEval, b: OrderEval, before: Sequence[Element] = (),
              after: Sequence[Element] = ()) -> tuple[float, float]:
    """σ of the predicted energy and time difference between two evaluated orders (public
    form of the propagation :func:`reorder` uses)."""
    return _saving_sd(group, a, b, before, after)
