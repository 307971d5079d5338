"""The three composition operators ⊗ (``seq``), ⊕ (``par``) and ⊕multi (``par_multi``),
n-ary and nestable, in the context-independent algebra (spec §4, §6.5), with first-order
uncertainty propagation keyed by distinct measured leaf (spec §8.1, DESIGN.md) and the
Eq. 13 bias bookkeeping (spec §6.3).

Every operator returns a :class:`~frontier.signature.Signature` (closure).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from .errors import CompositionError
from .operating_point import OperatingPoint
from .signature import Signature, StaticTerm, Term, static_variances, variances_from_terms

MaxMethod = Literal["dominant", "clark"]

#: Largest k ``repeat`` (and a workbook's ``times``) accepts: 10**12 runs of even a 1 µs
#: kernel is 11 days, and k stays far below 2**53, where float(k) would stop being exact and
#: repeat could no longer equal seq of copies.
MAX_REPEAT = 10**12


def _flat(elems: Sequence[Signature | Iterable[Signature]]) -> list[Signature]:
    out: list[Signature] = []
    for e in elems:
        if isinstance(e, Signature):
            out.append(e)
        else:
            out.extend(_flat(list(e)))
    for e in out:
        if not isinstance(e, Signature):
            raise CompositionError(f"can only compose Signature objects, got {type(e).__name__}")
    return out


def _name(op: str, elems: Sequence[Signature], name: str | None) -> str:
    if name:
        return name
    names = [e.name for e in elems]
    if len(names) > 4:
        names = names[:2] + [f"... {len(names) - 3} more ..."] + names[-1:]
    return f"{op}(" + ", ".join(names) + ")"


def _combine_terms(children: Sequence[Signature], w_time: Sequence[float], s_e: float | None):
    """Sum child sensitivities. ∂T = Σ w_i ∂T_i. ∂E/∂T_leaf = s_e·∂T when ``s_e`` is given
    (parallel: static paid once over the makespan) else Σ ∂E_i/∂T_leaf (sequential).
    ∂E/∂d_leaf = Σ ∂E_i/∂d_leaf always (dynamic energies add)."""
    # Exact sums (fsum): a leaf used k times then has exactly k·∂, which is what the closed
    # form of ``repeat`` computes, so repeat(e, k) and seq([e]*k) agree bit for bit.
    acc: dict[str, tuple[list[float], list[float], list[float]]] = {}
    var: dict[str, tuple[float, float]] = {}
    for c, w in zip(children, w_time):
        for k, t in c.terms.items():
            a = acc.setdefault(k, ([], [], []))
            var[k] = (t.var_time_s2, t.var_d_j2)
            a[0].append(w * t.dT_dT)
            a[1].append(t.dE_dT)
            a[2].append(t.dE_dd)
    terms = {}
    for k, (dts, dets, deds) in acc.items():
        dt = math.fsum(dts)
        de_dt = s_e * dt if s_e is not None else math.fsum(dets)
        terms[k] = Term(var[k][0], var[k][1], dt, de_dt, math.fsum(deds))
    return terms


def _combine_static(children: Sequence[Signature], parallel: bool,
                    s_from: Sequence[Signature] = (), time_s: float = 0.0) -> dict[str, StaticTerm]:
    """Sum child static-power sensitivities (σ_s). ∂d/∂s_leaf = Σ ∂d_i/∂s_leaf always;
    ∂E/∂s_leaf = Σ ∂E_i/∂s_leaf when sequential, and in parallel (E = s·T + d, s the sum of
    the static powers of ``s_from``) ``time_s``·Σ_{i in s_from} ∂s_i/∂s_leaf + ∂d/∂s_leaf."""
    acc: dict[str, tuple[list[float], list[float]]] = {}
    var: dict[str, float] = {}
    ds: dict[str, list[float]] = {}
    for c in children:
        for k, t in c.static_terms.items():
            a = acc.setdefault(k, ([], []))
            var[k] = t.var_s_w2
            a[0].append(t.dE_ds)
            a[1].append(t.dd_ds)
    for c in s_from:
        for k, t in c.static_terms.items():
            ds.setdefault(k, []).append(t.ds_ds(c.time_s))
    out = {}
    for k, (des, dds) in acc.items():
        dd = math.fsum(dds)
        de = time_s * math.fsum(ds.get(k, ())) + dd if parallel else math.fsum(des)
        out[k] = StaticTerm(var[k], de, dd)
    return out


def _composite(name, s_w, time_s, d_j, devices, omega, children, terms, extra_t, extra_e,
               bias, head, all_s, runtime, op, meta=None, static=None) -> Signature:
    vt, ve = variances_from_terms(terms, extra_t, extra_e)
    static = _combine_static(children, False) if static is None else static
    vs, ve_s = static_variances(static, time_s)
    meta = meta or {"source": "composed", "op": op, "parts": [c.name for c in children]}
    return Signature(
        name=name, s_w=s_w, time_s=time_s, d_j=max(d_j, 0.0), var_time_s2=vt,
        var_energy_j2=ve + ve_s, var_s_w2=vs, static_terms=static,
        n=min(c.n for c in children), devices=devices, omega=omega, composed=True,
        meta=meta, terms=terms, extra_var_time_s2=extra_t, extra_var_energy_j2=extra_e,
        bias_sigma_j=bias, head_sigma_j=head, all_sigma_j=all_s, runtime_sigma_j=runtime,
    )


def _common_omega(elems: Sequence[Signature]) -> OperatingPoint:
    first = elems[0].omega
    return first if all(e.omega == first for e in elems) else OperatingPoint()


def seq(*elems: Signature | Iterable[Signature], name: str | None = None) -> Signature:
    """e₁ ⊗ e₂ ⊗ … : back to back on the same device(s) (spec §4.1, §4.4).

    T = ΣT_i, E = ΣE_i, d = Σd_i, s = time-weighted mean of s_i (keeps E = sT + d exact).
    Variances: delta method over distinct leaves (a leaf repeated k times adds k²·var).

    >>> a = Signature("a", s_w=50, time_s=1.0, d_j=100)
    >>> b = Signature("b", s_w=50, time_s=2.0, d_j=150)
    >>> c = seq(a, b); (c.time_s, c.energy_j)
    (3.0, 400.0)
    """
    es = _flat(elems)
    if not es:
        raise CompositionError("seq() needs at least one element")
    if len(es) == 1:
        return es[0]
    devs = es[0].devices
    for e in es[1:]:
        if e.devices != devs:
            raise CompositionError(
                f"seq: {e.name!r} runs on {sorted(e.devices)} but {es[0].name!r} on {sorted(devs)}; "
                "⊗ is back-to-back on the same device(s) — pad with idle() elements inside "
                "par_multi, or use dag() for cross-device dependencies"
            )
    t = math.fsum(e.time_s for e in es)
    e_tot = math.fsum(e.energy_j for e in es)
    d = math.fsum(e.d_j for e in es)
    s = (e_tot - d) / t if t > 0 else max(e.s_w for e in es)
    terms = _combine_terms(es, [1.0] * len(es), None)
    fs = math.fsum
    bias = fs(e.bias_sigma_j for e in es) + fs(e.head_sigma_j for e in es[1:])
    return _composite(
        _name("seq", es, name), s, t, d, devs, _common_omega(es), es, terms,
        fs(e.extra_var_time_s2 for e in es), fs(e.extra_var_energy_j2 for e in es),
        bias, es[0].head_sigma_j, fs(e.all_sigma_j for e in es),
        fs(e.runtime_sigma_j for e in es), "seq",
    )


def _repeat_count(k: Any) -> int:
    if isinstance(k, bool):
        raise CompositionError(f"repeat: the count must be a positive integer, got {k!r}")
    try:
        n = operator.index(k)   # int or numpy integer; 3.0 and "3" are refused
    except TypeError:
        raise CompositionError(f"repeat: the count must be a positive integer, got {k!r}") from None
    if n < 1:
        raise CompositionError(f"repeat: the count must be >= 1, got {n}")
    if n > MAX_REPEAT:
        raise CompositionError(f"repeat: the count {n} exceeds {MAX_REPEAT:.0e}")
    return n


def _seq_name(elem_name: str, k: int) -> str:
    # What _name("seq", [e] * k, None) gives, without building k names.
    if k > 4:
        return f"seq({elem_name}, {elem_name}, ... {k - 3} more ..., {elem_name})"
    return "seq(" + ", ".join([elem_name] * k) + ")"


def repeat(sig: Signature, k: int, name: str | None = None) -> Signature:
    """e ⊗ e ⊗ … k times, of ONE shared measurement, in closed form (no expansion).

    Equals ``seq([sig] * k, name=name)`` exactly: T, E and d scale by k, s is unchanged, every
    per-leaf sensitivity scales by k (so σ² grows as k²: the same estimation error is paid k
    times), and the Eq. 13 bookkeeping is k·Σm σ plus (k−1) entry substitutions. Only ``meta``
    differs: it records ``{"op": "repeat", "parts": [sig.name], "times": k}`` instead of k
    names. ``k = 1`` returns ``sig`` itself, as ``seq`` does.

    >>> a = Signature("a", s_w=50, time_s=1.0, d_j=100, var_time_s2=0.01)
    >>> r = repeat(a, 10**9)
    >>> (r.time_s, r.s_w, round(r.sd_time_s))
    (1000000000.0, 50.0, 100000000)
    """
    if not isinstance(sig, Signature):
        raise CompositionError(f"can only repeat a Signature, got {type(sig).__name__}")
    n = _repeat_count(k)
    if n == 1:
        return sig
    kf = float(n)
    t = kf * sig.time_s
    e_tot = kf * sig.energy_j
    d = kf * sig.d_j
    s = (e_tot - d) / t if t > 0 else sig.s_w
    terms = {key: Term(tm.var_time_s2, tm.var_d_j2, kf * tm.dT_dT, kf * tm.dE_dT, kf * tm.dE_dd)
             for key, tm in sig.terms.items()}
    static = {key: StaticTerm(tm.var_s_w2, kf * tm.dE_ds, kf * tm.dd_ds)
              for key, tm in sig.static_terms.items()}
    bias = kf * sig.bias_sigma_j + (kf - 1.0) * sig.head_sigma_j
    return _composite(
        name or _seq_name(sig.name, n), s, t, d, sig.devices, sig.omega, [sig], terms,
        kf * sig.extra_var_time_s2, kf * sig.extra_var_energy_j2, bias, sig.head_sigma_j,
        kf * sig.all_sigma_j, kf * sig.runtime_sigma_j, "repeat",
        meta={"source": "composed", "op": "repeat", "parts": [sig.name], "times": n},
        static=static,
    )


_SQRT2 = math.sqrt(2.0)
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def clark_max(mu1: float, var1: float, mu2: float, var2: float) -> tuple[float, float, float]:
    """Clark's moment matching for max(X₁, X₂) of independent normals (spec §8.1).

    Returns (mean, variance, Φ(α)) where Φ(α) = P(X₁ > X₂) is the weight of branch 1.

    >>> m, v, _ = clark_max(4.0, 0.01, 3.95, 0.01)
    >>> round(m, 4), round(v, 5)
    (4.0349, 0.00704)
    """
    a2 = var1 + var2
    if a2 <= 0:
        return (mu1, var1, 1.0) if mu1 >= mu2 else (mu2, var2, 0.0)
    a = math.sqrt(a2)
    alpha = (mu1 - mu2) / a
    # erfc keeps the tails accurate (scipy.stats.norm costs ~0.8 s of import for this)
    p1, p2 = 0.5 * math.erfc(-alpha / _SQRT2), 0.5 * math.erfc(alpha / _SQRT2)
    phi = math.exp(-0.5 * alpha * alpha) / _SQRT_2PI
    m1 = mu1 * p1 + mu2 * p2 + a * phi
    m2 = (mu1**2 + var1) * p1 + (mu2**2 + var2) * p2 + (mu1 + mu2) * a * phi
    return float(m1), float(max(m2 - m1 * m1, 0.0)), float(p1)


def _max_times(es: Sequence[Signature], offsets: Sequence[float], method: MaxMethod):
    """Makespan, its variance (or None for the linear rule) and per-branch weights."""
    ends = [o + e.time_s for o, e in zip(offsets, es)]
    if method == "dominant":
        k = max(range(len(es)), key=lambda i: ends[i])
        w = [0.0] * len(es)
        w[k] = 1.0
        return ends[k], None, w, k
    if method != "clark":
        raise CompositionError(f"max_method must be 'dominant' or 'clark', got {method!r}")
    mu, var, w = ends[0], es[0].var_time_s2, [1.0] + [0.0] * (len(es) - 1)
    for i in range(1, len(es)):
        mu, var, p = clark_max(mu, var, ends[i], es[i].var_time_s2)
        w = [x * p for x in w]
        w[i] = 1.0 - p
    k = max(range(len(es)), key=lambda i: ends[i])
    return mu, var, w, k


def _parallel(es, s, offsets, method, name, op, devices, omega, s_from):
    t, clark_var, w, k = _max_times(es, offsets, method)
    d = math.fsum(e.d_j for e in es)
    terms = _combine_terms(es, w, s)
    static = _combine_static(es, True, s_from, t)
    extra_t = extra_e = 0.0
    if clark_var is not None:
        lin_t, _ = variances_from_terms(terms)
        extra_t = clark_var - lin_t
        extra_e = s * s * extra_t
    all_s = sum(e.all_sigma_j for e in es)
    bias = sum(e.bias_sigma_j for e in es) + sum(e.all_sigma_j - e.runtime_sigma_j for e in es)
    c = _composite(name, s, t, d, devices, omega, es, terms, extra_t, extra_e,
                   bias, sum(e.head_sigma_j for e in es), all_s, all_s, op, static=static)
    return c, k


def _offsets(es, offsets_s):
    if offsets_s is None:
        return [0.0] * len(es)
    offs = [float(x) for x in offsets_s]
    if len(offs) != len(es):
        raise CompositionError(f"got {len(offs)} start offsets for {len(es)} elements")
    for o, e in zip(offs, es):
        if not math.isfinite(o) or o < 0:
            raise CompositionError(f"start offset of {e.name!r} must be finite and >= 0, got {o}")
    return offs


def par(
    *elems: Signature | Iterable[Signature],
    offsets_s: Sequence[float] | None = None,
    sm_total: int | None = None,
    max_method: MaxMethod = "dominant",
    name: str | None = None,
) -> Signature:
    """e₁ ⊕ e₂ ⊕ … : overlapped on one device, static power paid once (spec §4.2).

    T = max_i(δ_i + T_i), E = s·T + Σd_i. All elements must be on the same device(s) at the
    same ω_dev, and their SM allocations (``omega.sm_count``) must fit ``sm_total`` (taken
    from the argument, else from any element's ``meta['sm_total']``).

    The max is linearized at the dominant branch by default; ``max_method="clark"`` uses
    Clark's moments (better for near-ties; approximate when branches share leaves).

    >>> s = 80.0
    >>> cmp = Signature("compute", s_w=s, time_s=4.0e-3, d_j=0.78)
    >>> ar = Signature("allreduce", s_w=s, time_s=2.0e-3, d_j=0.04)
    >>> round(par(cmp, ar).energy_j, 6)   # 320 + 780 + 40 mJ
    1.14
    """
    es = _flat(elems)
    if not es:
        raise CompositionError("par() needs at least one element")
    offs = _offsets(es, offsets_s)
    if len(es) == 1 and offs[0] == 0:
        return es[0]
    devs = es[0].devices
    dev_omega = es[0].omega.dev
    for e in es[1:]:
        if e.devices != devs:
            raise CompositionError(
                f"par: {e.name!r} runs on {sorted(e.devices)} but {es[0].name!r} on {sorted(devs)}; "
                "⊕ overlaps elements on one device — use par_multi for different devices"
            )
        if e.omega.dev != dev_omega:
            raise CompositionError(
                f"par: ω_dev differs ({es[0].name!r}: {dev_omega.label()}, {e.name!r}: "
                f"{e.omega.dev.label()}); elements overlapped on one device share its clocks and cap"
            )
    sms = [e.omega.sm_count for e in es]
    if sm_total is None:
        sm_total = next((int(e.meta["sm_total"]) for e in es if "sm_total" in e.meta), None)
    counts = [x for x in sms if x is not None]
    if sm_total is not None and len(counts) == len(sms) and sum(counts) > sm_total:
        alloc = " + ".join(f"{e.name}={x}" for e, x in zip(es, sms))
        raise CompositionError(f"par: SM allocations {alloc} = {sum(counts)} exceed the device's {sm_total} SMs")
    k = max(range(len(es)), key=lambda i: offs[i] + es[i].time_s)
    s = es[k].s_w
    omega = dev_omega.with_(sm_count=sum(sms)) if all(x is not None for x in sms) else dev_omega
    c, _ = _parallel(es, s, offs, max_method, _name("par", es, name), "par", devs, omega, [es[k]])
    return c


def par_multi(
    *elems: Signature | Iterable[Signature],
    max_method: MaxMethod = "dominant",
    name: str | None = None,
) -> Signature:
    """e₁ ⊕multi e₂ … : at the same time on disjoint devices (spec §4.3).

    T = max T_i, s = Σ s_i (every device pays static power over the whole makespan, so the
    device that finishes first idles at its static power), E = s·T + Σd_i.

    >>> a = Signature("a", s_w=80, time_s=5.7e-3, d_j=1.14, devices={"gpu0"})
    >>> b = Signature("b", s_w=80, time_s=5.9e-3, d_j=1.14, devices={"gpu1"})
    >>> round(par_multi(a, b).energy_j - a.energy_j - b.energy_j, 6)   # 80 W x 0.2 ms idle
    0.016
    """
    es = _flat(elems)
    if not es:
        raise CompositionError("par_multi() needs at least one element")
    if len(es) == 1:
        return es[0]
    seen: dict[str, str] = {}
    for e in es:
        for dv in e.devices:
            if dv in seen:
                raise CompositionError(
                    f"par_multi: device {dv!r} is used by both {seen[dv]!r} and {e.name!r}; "
                    "⊕multi needs disjoint devices — use par for overlap on one device"
                )
            seen[dv] = e.name
    s = math.fsum(e.s_w for e in es)
    devs = frozenset().union(*(e.devices for e in es))
    c, _ = _parallel(es, s, [0.0] * len(es), max_method, _name("par_multi", es, name),
                     "par_multi", devs, _common_omega(es), es)
    return c


def idle(device: str, duration_s: float, s_w: float, name: str | None = None) -> Signature:
    """Idle element ι_k(Δ): a device waiting at its ready power (T = Δ, d = 0; spec §4.4)."""
    return Signature(name or f"idle[{device}]", s_w=s_w, time_s=duration_s, d_j=0.0,
                     devices=frozenset({device}), meta={"source": "idle"})
