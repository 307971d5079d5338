"""Deviation detection (Eq. 23) and anomaly localisation by prefix scan (spec §8.2–§8.4).

A composed prediction and a direct measurement of the same composite disagree when

    |X_meas − X_pred| > c_α · sqrt(σ²_X,pred + σ²_X,meas)  [+ B(C) for E, bias-aware]

for X ∈ {E, T}. ``c_α`` is the two-sided normal quantile z_{1−α/(2K)} with a Bonferroni
correction for K tests. Both σ² must be variances of the *estimates* (squared standard errors),
which is what :class:`~frontier.signature.Signature` stores; use the same choice on both sides.

The bias-aware variant (§8.3) adds the Eq. 13 bound ``predicted.bias_bound_j(c_α)`` to the
energy tolerance only. Time gets no bias term: the signatures carry no Eq. 13 bookkeeping for T
and a T bias is not implied by the E bound (an element can shift T and d in opposite
directions, §6.7), so adding one would be a guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

from .compose import seq
from .errors import CompositionError, InputError
from .signature import Signature


def critical_value(alpha: float = 0.05, n_tests: int = 1) -> float:
    """c_α = z_{1−α/(2·n_tests)}: two-sided normal quantile with Bonferroni correction.

    >>> round(critical_value(0.05), 3)
    1.96
    """
    a = float(alpha)
    if not (0.0 < a < 1.0) or not math.isfinite(a):
        raise InputError(f"alpha must be in (0, 1), got {alpha!r}")
    k = int(n_tests)
    if k < 1:
        raise InputError(f"n_tests must be >= 1, got {n_tests!r}")
    return float(NormalDist().inv_cdf(1.0 - a / (2.0 * k)))


def _z(err: float, sd: float) -> float:
    if sd > 0:
        return err / sd
    return 0.0 if err == 0 else math.copysign(math.inf, err)


def _pct(err: float, ref: float) -> float:
    return 100.0 * err / ref if ref != 0 else (0.0 if err == 0 else math.copysign(math.inf, err))


def _json_num(v: Any) -> Any:
    # JSON has no infinities: write them as null (z is infinite only when both σ are 0).
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


@dataclass(frozen=True)
class DeviationResult:
    """Outcome of Eq. 23 on time and energy for one composite.

    Errors are measured − predicted (absolute and in % of the prediction); ``z_*`` is the error
    over the combined standard deviation; a side is flagged when |error| exceeds
    ``threshold_*`` = c_α·σ_combined (+ the bias bound for E when ``bias_aware``).
    """

    name: str
    predicted_time_s: float
    predicted_energy_j: float
    measured_time_s: float
    measured_energy_j: float
    sd_predicted_time_s: float
    sd_predicted_energy_j: float
    sd_measured_time_s: float
    sd_measured_energy_j: float
    error_time_s: float
    error_energy_j: float
    error_time_pct: float
    error_energy_pct: float
    z_time: float
    z_energy: float
    c_alpha: float
    alpha: float
    n_tests: int
    bias_aware: bool
    bias_bound_j: float
    threshold_time_s: float
    threshold_energy_j: float
    flagged_time: bool
    flagged_energy: bool

    @property
    def flagged(self) -> bool:
        """True when either time or energy deviates beyond tolerance."""
        return self.flagged_time or self.flagged_energy

    def summary(self) -> str:
        """One line: errors in %, z scores, and the verdict.

        >>> a = Signature("x", s_w=100, time_s=1.0, d_j=50, var_time_s2=1e-4, var_energy_j2=1.0)
        >>> deviation(a, a).summary()
        'x: T +0.00% (z=+0.00)  E +0.00% (z=+0.00)  c_a=1.96  ok'
        """
        verdict = "ok"
        if self.flagged:
            sides = [s for s, f in (("T", self.flagged_time), ("E", self.flagged_energy)) if f]
            verdict = "FLAGGED on " + " and ".join(sides)
        bias = f" +B={self.bias_bound_j:.3g}J" if self.bias_aware else ""
        return (f"{self.name}: T {self.error_time_pct:+.2f}% (z={self.z_time:+.2f})  "
                f"E {self.error_energy_pct:+.2f}% (z={self.z_energy:+.2f})  "
                f"c_a={self.c_alpha:.3g}{bias}  {verdict}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (infinite z written as null), with ``flagged`` included."""
        d = {k: _json_num(v) for k, v in asdict(self).items()}
        d["flagged"] = self.flagged
        return d


def deviation(
    predicted: Signature,
    measured: Signature,
    alpha: float = 0.05,
    bias_aware: bool = False,
    n_tests: int = 1,
    name: str | None = None,
) -> DeviationResult:
    """Eq. 23 on E and T: is ``measured`` consistent with ``predicted``?

    ``bias_aware`` adds ``predicted.bias_bound_j(c_α)`` (Eq. 13) to the energy tolerance
    (§8.3). ``n_tests`` applies a Bonferroni correction (α / n_tests).

    >>> p = Signature("p", s_w=100, time_s=1.0, d_j=50, var_time_s2=1e-4, var_energy_j2=1.0)
    >>> m = Signature("m", s_w=100, time_s=1.0, d_j=55, var_energy_j2=1.0)
    >>> r = deviation(p, m); round(r.z_energy, 3), r.flagged_energy, r.flagged_time
    (3.536, True, False)
    """
    if not isinstance(predicted, Signature) or not isinstance(measured, Signature):
        raise CompositionError("deviation() compares two Signature objects")
    c = critical_value(alpha, n_tests)
    err_t = measured.time_s - predicted.time_s
    err_e = measured.energy_j - predicted.energy_j
    sd_t = math.sqrt(predicted.var_time_s2 + measured.var_time_s2)
    sd_e = math.sqrt(predicted.var_energy_j2 + measured.var_energy_j2)
    bias = predicted.bias_bound_j(c)
    thr_t = c * sd_t
    thr_e = c * sd_e + (bias if bias_aware else 0.0)
    return DeviationResult(
        name=name or predicted.name,
        predicted_time_s=predicted.time_s, predicted_energy_j=predicted.energy_j,
        measured_time_s=measured.time_s, measured_energy_j=measured.energy_j,
        sd_predicted_time_s=predicted.sd_time_s, sd_predicted_energy_j=predicted.sd_energy_j,
        sd_measured_time_s=measured.sd_time_s, sd_measured_energy_j=measured.sd_energy_j,
        error_time_s=err_t, error_energy_j=err_e,
        error_time_pct=_pct(err_t, predicted.time_s), error_energy_pct=_pct(err_e, predicted.energy_j),
        z_time=_z(err_t, sd_t), z_energy=_z(err_e, sd_e),
        c_alpha=c, alpha=float(alpha), n_tests=int(n_tests), bias_aware=bool(bias_aware),
        bias_bound_j=bias, threshold_time_s=thr_t, threshold_energy_j=thr_e,
        flagged_time=abs(err_t) > thr_t, flagged_energy=abs(err_e) > thr_e,
    )


# -- localisation ------------------------------------------------------------------------------

MeasuredPrefixes = Mapping[int, Signature] | Callable[[int], Signature]


@dataclass(frozen=True)
class LocalizationResult:
    """Outcome of a prefix scan along an ⊗ chain.

    ``first_failing_prefix`` is the length k of the shortest tested prefix e₁⊗…⊗e_k that
    fails Eq. 23 (None when the whole chain passes); ``last_passing_prefix`` the longest
    tested passing prefix below it (0 = the empty prefix, which passes by definition). The
    anomaly lies in ``suspects`` = elements last_passing+1 … first_failing (1-based), i.e. in
    the entry context of one of them (a pair with an earlier element, spec §8.4). ``tested``
    lists every prefix measured, in the order tested, with its result.
    """

    n_elements: int
    first_failing_prefix: int | None
    last_passing_prefix: int
    suspects: tuple[str, ...]
    tested: tuple[tuple[int, DeviationResult], ...] = field(repr=False)
    c_alpha: float = 1.96
    n_tests: int = 1

    @property
    def found(self) -> bool:
        """True when some prefix failed."""
        return self.first_failing_prefix is not None

    @property
    def element(self) -> str | None:
        """The implicated element when the anomaly is pinned to exactly one, else None."""
        return self.suspects[0] if len(self.suspects) == 1 else None

    def summary(self) -> str:
        """One line naming the implicated element(s) and the prefixes tested."""
        ks = ", ".join(str(k) for k, _ in self.tested)
        if not self.found:
            return f"no deviation: the whole chain of {self.n_elements} passes (tested prefixes {ks})"
        return (f"first failing prefix {self.first_failing_prefix} of {self.n_elements}; suspects "
                f"{', '.join(self.suspects)} (tested prefixes {ks}; c_a={self.c_alpha:.3g})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "n_elements": self.n_elements, "first_failing_prefix": self.first_failing_prefix,
            "last_passing_prefix": self.last_passing_prefix, "suspects": list(self.suspects),
            "c_alpha": self.c_alpha, "n_tests": self.n_tests,
            "tested": [{"prefix": k, **r.to_dict()} for k, r in self.tested],
        }


def _planned_tests(m: int) -> int:
    # The full chain first, then a binary search over the remaining m−1 candidates.
    return 1 + (math.ceil(math.log2(m)) if m > 1 else 0)


def prefix_scan(
    elements: Sequence[Signature],
    measured_prefixes: MeasuredPrefixes,
    alpha: float = 0.05,
    bias_aware: bool = False,
    n_tests: int | None = None,
) -> LocalizationResult:
    """Localise the first failing element of e₁ ⊗ … ⊗ e_n by binary search over prefixes.

    ``measured_prefixes`` gives the direct measurement of the prefix of length k (1-based):
    either a mapping k → Signature (only those prefixes are candidates) or a callable
    ``k -> Signature`` (called only for the O(log n) prefixes the search needs). It assumes,
    as the spec does, that a deviation persists once it appears. Each test uses a Bonferroni
    correction for the number of tests planned (``n_tests``; default 1 + ⌈log₂ m⌉ for m
    candidate prefixes).
    """
    elems = list(elements)
    n = len(elems)
    if n == 0:
        raise CompositionError("prefix_scan needs at least one element")
    if callable(measured_prefixes):
        candidates = list(range(1, n + 1))
        get = measured_prefixes
    else:
        candidates = sorted(int(k) for k in measured_prefixes)
        bad = [k for k in candidates if not 1 <= k <= n]
        if bad:
            raise CompositionError(f"prefix_scan: measured prefix length {bad[0]} is outside 1..{n}")
        if not candidates:
            raise CompositionError("prefix_scan: no measured prefixes given")
        table = dict(measured_prefixes)

        def get(k: int) -> Signature:
            return table[k]

    k_tests = int(n_tests) if n_tests is not None else _planned_tests(len(candidates))
    c = critical_value(alpha, k_tests)
    tested: list[tuple[int, DeviationResult]] = []

    def fails(idx: int) -> bool:
        k = candidates[idx]
        meas = get(k)
        if not isinstance(meas, Signature):
            raise CompositionError(f"prefix_scan: measurement of prefix {k} is not a Signature")
        pred = seq(elems[:k], name=f"prefix[{k}]")
        r = deviation(pred, meas, alpha=alpha, bias_aware=bias_aware, n_tests=k_tests)
        tested.append((k, r))
        return r.flagged

    lo, hi = -1, len(candidates) - 1   # invariant: candidates[lo] passes (lo=-1: empty prefix)
    if not fails(hi):
        return LocalizationResult(n, None, candidates[hi], (), tuple(tested), c, k_tests)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    first = candidates[hi]
    last_ok = candidates[lo] if lo >= 0 else 0
    suspects = tuple(e.name for e in elems[last_ok:first])
    return LocalizationResult(n, first, last_ok, suspects, tuple(tested), c, k_tests)
