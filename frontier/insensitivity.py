"""Mutual context-insensitivity tests of a pair of elements (spec §6.2; the paper's §4.1).

Given measured signatures, decide whether a pair (e₁, e₂) may be composed at the null context
in isolation (Reduction Theorem, spec §6.3) or must be characterized jointly (spec §6.6):

* **entry context**: e₂ measured right after e₁ (``after``) against e₂ alone in the null
  context (``alone``). One entry substitution (m₂ = 1 under ⊗, spec §6.3).
* **runtime context**: e₁ ∥ e₂ measured as one composite against the context-independent
  prediction ``par(e₁, e₂)`` (same device) or ``par_multi(e₁, e₂)`` (disjoint devices). One
  runtime substitution for each element (m₁ = m₂ = 1).

**What decides.** For X ∈ {E, T}, with c_α from :func:`~frontier.deviation.critical_value`
(α and the Bonferroni count ``n_tests``), a context test *rejects* insensitivity when

    |X_meas − X_pred| > c_α·sqrt(σ²_X,pred + σ²_X,meas) + c_α·Σ_i m_i·σ_X,i

The first term is the Eq. 23 noise band (:func:`~frontier.deviation.deviation`, both σ are
standard errors of the estimates). The second is the bias the Reduction Theorem *grants* for
the substitutions this test makes: the Eq. 13 bound. For E it is exactly the prediction's
``bias_bound_j(c_α)`` (what ``deviation(..., bias_aware=True)`` adds, spec §8.3); for the
entry test, whose prediction is a measured leaf without Eq. 13 bookkeeping, it is c_α·σ_E₂.
T gets the same allowance from the σ_T of the substituted elements (spec §6.2 asks for
X ∈ {E, T}; §6.7 explains why a parallel composite needs the T side too). So an accepted
pair is one whose measured perturbation is indistinguishable, at α, from a perturbation
within its bias tolerance; a rejected pair perturbs beyond what Eq. 13 accounts for and
must be characterized jointly. No Bonferroni correction is applied by default: a false
rejection costs one joint characterization, a false acceptance an unaccounted bias.

Pure math: no devices, no files. :mod:`measure.pairs` measures the signatures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .compose import par, par_multi
from .deviation import DeviationResult, deviation
from .errors import CompositionError
from .signature import Signature

ContextKind = Literal["entry", "runtime"]


def _json_num(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


@dataclass(frozen=True)
class ContextTest:
    """One context test (entry or runtime) of a pair: prediction, measurement, verdict.

    ``allowance_*`` is the Eq. 13 bias granted to the substitutions (c_α Σ m_i σ_X,i);
    ``tolerance_*`` = ``deviation.threshold_*`` (c_α·σ_combined) + ``allowance_*``;
    ``insensitive`` is True when both |error_time_s| ≤ tolerance_time_s and
    |error_energy_j| ≤ tolerance_energy_j.
    """

    kind: ContextKind
    name: str
    deviation: DeviationResult
    substitutions: int
    allowance_time_s: float
    allowance_energy_j: float
    tolerance_time_s: float
    tolerance_energy_j: float
    insensitive: bool

    @property
    def error_time_s(self) -> float:
        """Measured − predicted T, s."""
        return self.deviation.error_time_s

    @property
    def error_energy_j(self) -> float:
        """Measured − predicted E, J."""
        return self.deviation.error_energy_j

    @property
    def verdict(self) -> str:
        """``"insensitive"`` or ``"SENSITIVE on T"`` / ``"on E"`` / ``"on T and E"``."""
        if self.insensitive:
            return "insensitive"
        sides = [s for s, bad in (("T", abs(self.error_time_s) > self.tolerance_time_s),
                                  ("E", abs(self.error_energy_j) > self.tolerance_energy_j)) if bad]
        return "SENSITIVE on " + " and ".join(sides)

    def summary(self) -> str:
        """One line: predicted and measured T and E, errors against tolerances, z, verdict."""
        d = self.deviation
        return (f"{self.kind:<7} {self.name}: T pred {d.predicted_time_s * 1e3:.4g} ms meas "
                f"{d.measured_time_s * 1e3:.4g} ms ({d.error_time_pct:+.2f}%, z={d.z_time:+.2f}, "
                f"tol ±{self.tolerance_time_s * 1e3:.3g} ms)  E pred {d.predicted_energy_j:.4g} J meas "
                f"{d.measured_energy_j:.4g} J ({d.error_energy_pct:+.2f}%, z={d.z_energy:+.2f}, "
                f"tol ±{self.tolerance_energy_j:.3g} J)  {self.verdict}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the Eq. 23 numbers under ``deviation``)."""
        return {"kind": self.kind, "name": self.name, "substitutions": self.substitutions,
                "allowance_time_s": self.allowance_time_s,
                "allowance_energy_j": self.allowance_energy_j,
                "tolerance_time_s": self.tolerance_time_s,
                "tolerance_energy_j": self.tolerance_energy_j,
                "insensitive": self.insensitive, "verdict": self.verdict,
                "deviation": {k: _json_num(v) for k, v in self.deviation.to_dict().items()}}


def _judge(kind: ContextKind, name: str, predicted: Signature, measured: Signature,
           substituted: Sequence[Signature], alpha: float, n_tests: int,
           eq13_from_prediction: bool = False) -> ContextTest:
    dev = deviation(predicted, measured, alpha=alpha, bias_aware=False, n_tests=n_tests, name=name)
    c = dev.c_alpha
    allow_t = c * math.fsum(e.sd_time_s for e in substituted)
    allow_e = (predicted.bias_bound_j(c) if eq13_from_prediction
               else c * math.fsum(e.sd_energy_j for e in substituted))
    tol_t = dev.threshold_time_s + allow_t
    tol_e = dev.threshold_energy_j + allow_e
    ok = abs(dev.error_time_s) <= tol_t and abs(dev.error_energy_j) <= tol_e
    return ContextTest(kind, name, dev, len(substituted), allow_t, allow_e, tol_t, tol_e, ok)


def entry_test(alone: Signature, after: Signature, alpha: float = 0.05, n_tests: int = 1,
               name: str | None = None) -> ContextTest:
    """Entry-context test of e₂: ``after`` (e₂ measured right after e₁) against ``alone``
    (e₂ in the null context). One substitution: allowance c_α·σ_X of ``alone``.

    >>> a = Signature("e2", s_w=100, time_s=1.0, d_j=50, var_time_s2=1e-6, var_energy_j2=0.25)
    >>> entry_test(a, a.with_(d_j=51.0)).insensitive     # +1 J < 1.96·(0.71 + 0.5) J
    True
    >>> entry_test(a, a.with_(d_j=53.0)).verdict
    'SENSITIVE on E'
    """
    _check(alone, after)
    return _judge("entry", name or f"{alone.name} after predecessor", alone, after, [alone],
                  alpha, n_tests)


def predict_corun(first: Signature, second: Signature, sm_total: int | None = None) -> Signature:
    """The context-independent prediction of e₁ ∥ e₂: ``par`` on one device (static power once,
    SM allocations checked against ``sm_total``), ``par_multi`` on disjoint devices."""
    _check(first, second)
    name = f"{first.name} || {second.name}"
    if first.devices == second.devices:
        return par(first, second, sm_total=sm_total, name=name)
    if first.devices & second.devices:
        raise CompositionError(f"{first.name!r} on {sorted(first.devices)} and {second.name!r} on "
                               f"{sorted(second.devices)} share some devices but not all")
    return par_multi(first, second, name=name)


def runtime_test(first: Signature, second: Signature, measured: Signature, alpha: float = 0.05,
                 n_tests: int = 1, sm_total: int | None = None,
                 name: str | None = None) -> ContextTest:
    """Runtime-context test (Eq. 12 on the composite): ``measured`` (e₁ ∥ e₂ co-run) against
    :func:`predict_corun`. Two substitutions (m₁ = m₂ = 1), so the energy allowance is the
    prediction's Eq. 13 bound c_α(σ_E₁ + σ_E₂).

    >>> a = Signature("a", s_w=100, time_s=1.0, d_j=50, var_time_s2=1e-6, var_energy_j2=0.25)
    >>> b = Signature("b", s_w=100, time_s=0.5, d_j=20, var_time_s2=1e-6, var_energy_j2=0.25)
    >>> p = predict_corun(a, b); (p.time_s, p.energy_j)
    (1.0, 170.0)
    >>> runtime_test(a, b, p.with_(time_s=1.3)).verdict   # 30 % slower: contention
    'SENSITIVE on T and E'
    """
    pred = predict_corun(first, second, sm_total=sm_total)
    if not isinstance(measured, Signature):
        raise CompositionError("runtime_test: the measured co-run must be a Signature")
    # The E allowance is the Eq. 13 bound the prediction carries (spec §6.3, m₁ = m₂ = 1 for
    # measured leaves: c_α(σ_E₁ + σ_E₂)), i.e. what deviation(..., bias_aware=True) adds.
    return _judge("runtime", name or pred.name, pred, measured, [first, second], alpha, n_tests,
                  eq13_from_prediction=True)


def _check(*sigs: Any) -> None:
    for s in sigs:
        if not isinstance(s, Signature):
            raise CompositionError(f"insensitivity tests take Signature objects, got {type(s).__name__}")


@dataclass(frozen=True)
class PairVerdict:
    """Mutual context-insensitivity of (e₁, e₂) as measured.

    ``entry`` is None when no entry test applies (the elements are on different devices and
    share no entry state); ``runtime`` is None when no co-run was measured (then ``alone``
    holds e₂ only; otherwise e₁ and e₂ measured alone). ``relation`` is
    ``"same-device"`` or ``"cross-device"``. ``may_use_reduction`` is True when every test
    made accepts: the pair composes at the null context with its Eq. 13 bias; otherwise it
    must be characterized jointly (spec §6.6).
    """

    first: str
    second: str
    relation: str
    entry: ContextTest | None
    runtime: ContextTest | None
    alone: tuple[Signature, ...]
    simulated: bool = False

    def __post_init__(self) -> None:
        if self.entry is None and self.runtime is None:
            raise CompositionError(f"pair ({self.first}, {self.second}): no context test was made")

    @property
    def may_use_reduction(self) -> bool:
        """True when every test made finds the pair insensitive."""
        return all(t.insensitive for t in (self.entry, self.runtime) if t is not None)

    @property
    def label(self) -> str:
        """``e1 -> e2`` (the order of the entry test)."""
        return f"{self.first} -> {self.second}"

    def summary(self) -> str:
        """A verdict line, then one line per test."""
        head = (f"{self.label} ({self.relation}): "
                + ("may use the reduction" if self.may_use_reduction else "CHARACTERIZE JOINTLY"))
        lines = [head]
        if self.entry is not None:
            lines.append("  " + self.entry.summary())
        else:
            lines.append("  entry   n/a (different devices)" if self.relation == "cross-device"
                         else "  entry   not tested")
        lines.append("  " + (self.runtime.summary() if self.runtime is not None
                             else "runtime not tested (the pair does not overlap)"))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: verdict, both tests and the alone signatures' T, E and σ."""
        return {
            "first": self.first, "second": self.second, "relation": self.relation,
            "may_use_reduction": self.may_use_reduction, "simulated": self.simulated,
            "entry": self.entry.to_dict() if self.entry is not None else None,
            "runtime": self.runtime.to_dict() if self.runtime is not None else None,
            "alone": {s.name: {"time_s": s.time_s, "energy_j": s.energy_j, "sd_time_s": s.sd_time_s,
                               "sd_energy_j": s.sd_energy_j, "s_w": s.s_w, "n": s.n,
                               "devices": sorted(s.devices)} for s in self.alone},
        }

