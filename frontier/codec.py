"""The one JSON codec of a :class:`~frontier.signature.Signature`, and the field readers behind it.

:func:`signature_to_dict` writes every field, so a signature read back is the same signature
(same leaf identity, same variances); a composite also keeps its per-leaf sensitivities
(``composed``, ``terms``) and bias bookkeeping, so it still shares error with its leaves when
composed further. :func:`signature_from_dict` reads that, and every form a person writes by
hand or an older file holds (all field names carry SI units)::

    {"name": "gemm",                  # optional: the key or the path names it otherwise
     "s_w": 80.0,                     # static (ready) power of its device(s), W (required)
     "time_s": 0.0015,                # T, s
     "energy_j": 0.42,                # E, J   -- or "d_j" (E = s_w·T + d_j), or both (they
                                      #           must agree; d_j is then used as written)
     "sd_time_s": 1e-5,               # standard error of T, s   -- or var_time_s2, or
                                      #   run_sd_time_s (per-run spread, divided by sqrt(n));
                                      #   sd_* and var_* together must agree (var_* wins)
     "sd_energy_j": 0.004,            # the same for E (sd_energy_j / var_energy_j2 / run_sd_energy_j)
     "sd_s_w": 2.5,                   # optional: σ_s, the drift of the static power, W (or
                                      #   var_s_w2; written only when not 0)
     "n": 5, "devices": ["gpu0"], "omega": {"sm_clock_mhz": 1410},
     "kappa": "cuBLAS", "theta": "bf16 8192^3", "meta": {...},
     "composed": true, "terms": {leaf key: {var_time_s2, var_d_j2, dT_dT, dE_dT, dE_dd}},
     "static_terms": {leaf key: {var_s_w2, dE_ds, dd_ds}},   # only leaves with a known σ_s
     "extra_var_time_s2": 0.0, ...}   # composites only (what the writer adds)

or raw runs instead of the values: ``{"s_w": 123.0, "runs": {"times_s": [...], "energies_j":
[...]}}`` (per-invocation T and E of each run, see :meth:`Signature.from_runs`).

Every problem is a :class:`~frontier.errors.FormatError` naming the file, the path of the field
inside it (``signatures.gemm.time_s``) and what is wrong with it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from .errors import EnergyCalculusError, FormatError, InvalidSignatureError
from .operating_point import OperatingPoint
from .signature import Signature, StaticTerm, Term

_TERM_FIELDS = ("var_time_s2", "var_d_j2", "dT_dT", "dE_dT", "dE_dd")
#: A static term's fields (``static_terms``: written only for leaves with a known σ_s).
_STATIC_FIELDS = ("var_s_w2", "dE_ds", "dd_ds")
_COMPOSED_FLOATS = ("extra_var_time_s2", "extra_var_energy_j2", "bias_sigma_j", "head_sigma_j",
                    "all_sigma_j", "runtime_sigma_j")

#: Fields of a measured (leaf) signature, as a person writes them.
LEAF_FIELDS = frozenset({
    "name", "s_w", "time_s", "energy_j", "d_j", "sd_time_s", "sd_energy_j", "var_time_s2",
    "var_energy_j2", "run_sd_time_s", "run_sd_energy_j", "n", "devices", "omega", "kappa",
    "theta", "meta", "runs", "description", "var_s_w2", "sd_s_w"})
#: Every field :func:`signature_from_dict` reads: the leaf fields plus what a composite carries.
SIGNATURE_FIELDS = LEAF_FIELDS | {"composed", "terms", "static_terms", *_COMPOSED_FLOATS}


# -- field readers (shared with frontier.io's workbook reader) ----------------------------------

def _got(v: Any) -> str:
    """A short rendering of a bad value for an error message."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**30:
        return f"an integer of {len(str(abs(v))) if abs(v) < 10**4000 else 'over 4000'} digits"
    try:
        return json.dumps(v)[:80]
    except (TypeError, ValueError):
        return repr(v)[:80]


def _num(file: str, path: str, v: Any, nonneg: bool = True, positive: bool = False) -> float:
    kind = "a positive" if positive else "a non-negative" if nonneg else "a"
    # numpy scalars come from in-memory dicts (not JSON); bools are never numbers here.
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise FormatError(file, path, f"must be {kind} number, got {_got(v)}")
    try:
        fv = float(v)
    except OverflowError:
        raise FormatError(file, path, f"must be {kind} number, got {_got(v)} (overflows a float)") from None
    if not math.isfinite(fv):
        raise FormatError(file, path, f"must be {kind} finite number, got {_got(v)}")
    if (positive and fv <= 0) or (nonneg and fv < 0):
        raise FormatError(file, path, f"must be {kind} number, got {_got(v)}")
    return fv


#: Largest integer a count field (n, sm_total) takes: integers beyond 2**53 lose exactness
#: as floats, and no count of runs or SMs comes near it.
_INT_MAX = 2**53


def number_field(file: str, path: str, v: Any, nonneg: bool = True, positive: bool = False) -> float:
    """A JSON number field as a finite float (>= 0 when ``nonneg``, > 0 when ``positive``).
    Bools, strings, NaN, inf and integers that overflow a float are a :class:`FormatError`
    naming ``file`` and ``path``."""
    return _num(file, path, v, nonneg, positive)


def _int(file: str, path: str, v: Any, minimum: int = 1, maximum: int = _INT_MAX,
         integral_float: bool = True) -> int:
    """An integer field in [``minimum``, ``maximum``]; ``integral_float`` also accepts 3.0 for
    3. Bools, NaN, inf and overflowing values are refused."""
    bound = f" and <= {maximum:.3g}"
    bad = FormatError(file, path, f"must be an integer >= {minimum}{bound}, got {_got(v)}")
    if isinstance(v, bool):
        raise bad
    if isinstance(v, float):
        if not (integral_float and math.isfinite(v) and v == int(v)):
            raise bad
        v = int(v)
    if not isinstance(v, int) or v < minimum or v > maximum:
        raise bad
    return v


def _obj(file: str, path: str, v: Any) -> dict:
    if not isinstance(v, dict):
        raise FormatError(file, path, f"must be an object, got {_got(v)}")
    return v


def _list(file: str, path: str, v: Any, nonempty: bool = True) -> list:
    if not isinstance(v, list) or (nonempty and not v):
        raise FormatError(file, path, f"must be a {'non-empty ' if nonempty else ''}list, got {_got(v)}")
    return v


def _unknown(file: str, path: str, d: Mapping, allowed: Iterable[str]) -> None:
    extra = sorted(set(d) - set(allowed))
    if extra:
        raise FormatError(file, f"{path}.{extra[0]}" if path else extra[0],
                          f"unknown field (known: {', '.join(sorted(allowed))})")


def _runs(file: str, path: str, runs: Any) -> tuple[list[float], list[float]]:
    """(times_s, energies_j) of a ``runs`` object, one value per run, of equal length."""
    runs = _obj(file, path, runs)
    _unknown(file, path, runs, ("times_s", "energies_j"))
    for k in ("times_s", "energies_j"):
        if k not in runs:
            raise FormatError(file, f"{path}.{k}", "missing")
    t = [_num(file, f"{path}.times_s[{i}]", v)
         for i, v in enumerate(_list(file, f"{path}.times_s", runs["times_s"]))]
    e = [_num(file, f"{path}.energies_j[{i}]", v)
         for i, v in enumerate(_list(file, f"{path}.energies_j", runs["energies_j"]))]
    if len(t) != len(e):
        raise FormatError(file, path, f"times_s has {len(t)} runs but energies_j has {len(e)}")
    return t, e


def _sd_pair(file: str, path: str, d: Mapping, what: str, unit: str, n: int) -> float:
    """Variance of one estimate from ``sd_*``, ``var_*`` or ``run_sd_*`` (with n). ``sd_*``
    beside ``var_*`` (what the writer gives) must agree with it, and the exact ``var_*`` wins."""
    sd_k, var_k, run_k = f"sd_{what}_{unit}", f"var_{what}_{unit}2", f"run_sd_{what}_{unit}"
    keys = [k for k in (sd_k, var_k, run_k) if k in d]
    if set(keys) == {sd_k, var_k}:
        sd, var = _num(file, f"{path}.{sd_k}", d[sd_k]), _num(file, f"{path}.{var_k}", d[var_k])
        if abs(sd * sd - var) > 1e-9 * max(var, sd * sd) + 1e-300:
            raise FormatError(file, f"{path}.{sd_k}", f"{sd!r} disagrees with {var_k} = {var!r}")
        return var
    if len(keys) > 1:
        raise FormatError(file, f"{path}.{keys[1]}", f"give only one of {', '.join(keys)}")
    if not keys:
        return 0.0
    k = keys[0]
    v = _num(file, f"{path}.{k}", d[k])
    var = v if k == var_k else v * v / n if k == run_k else v * v
    if not math.isfinite(var):
        raise FormatError(file, f"{path}.{k}", f"{_got(d[k])} squared overflows a float")
    return var


def _common_kwargs(file: str, path: str, d: Mapping) -> dict[str, Any]:
    """Signature keywords beside the numbers: devices, omega, kappa, theta, meta."""
    kw: dict[str, Any] = {}
    if "devices" in d:
        devs = d["devices"]
        devs = [devs] if isinstance(devs, str) else devs
        devs = _list(file, f"{path}.devices", devs)
        if not all(isinstance(x, str) and x for x in devs):
            raise FormatError(file, f"{path}.devices", f"must be a list of device names, got {_got(d['devices'])}")
        kw["devices"] = frozenset(devs)
    if "omega" in d:
        om = _obj(file, f"{path}.omega", d["omega"])
        for k, v in om.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                _num(file, f"{path}.omega.{k}", v, nonneg=False)   # NaN/inf/overflow, by field
        try:
            kw["omega"] = OperatingPoint.from_dict(om)
        except ValueError as exc:
            raise FormatError(file, f"{path}.omega", str(exc)) from None
    for k in ("kappa", "theta"):
        if d.get(k) is not None:
            if not isinstance(d[k], str):
                raise FormatError(file, f"{path}.{k}", f"must be a string, got {_got(d[k])}")
            kw[k] = d[k]
    if "meta" in d:
        kw["meta"] = dict(_obj(file, f"{path}.meta", d["meta"]))
    return kw


# -- the codec ----------------------------------------------------------------------------------

def _jsonable(v: Any) -> Any:
    """A JSON-ready copy of metadata (numpy scalars/arrays, tuples, sets, mappings, ω)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else str(f)
    if isinstance(v, OperatingPoint):
        return v.to_dict()
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        return sorted((_jsonable(x) for x in v), key=str)
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return repr(v)


def signature_to_dict(sig: Signature) -> dict[str, Any]:
    """A JSON-ready dict holding every field of ``sig`` (read back by :func:`signature_from_dict`).

    ``energy_j`` and the standard deviations are included for readers (and checked on load).
    A composite also carries its per-leaf sensitivities (``terms``) and bias bookkeeping, so a
    composite loaded back still propagates shared-leaf error correctly when composed further.

    >>> d = signature_to_dict(Signature("g", s_w=100.0, time_s=2.0, d_j=50.0))
    >>> d["energy_j"], d["devices"], d["omega"]["sm_clock_mhz"]
    (250.0, ['gpu0'], None)
    """
    out: dict[str, Any] = {
        "name": sig.name,
        "s_w": sig.s_w,
        "time_s": sig.time_s,
        "d_j": sig.d_j,
        "energy_j": sig.energy_j,
        "var_time_s2": sig.var_time_s2,
        "var_energy_j2": sig.var_energy_j2,
        "sd_time_s": sig.sd_time_s,
        "sd_energy_j": sig.sd_energy_j,
        "n": sig.n,
        "devices": sorted(sig.devices),
        "omega": sig.omega.to_dict(),
        "kappa": sig.kappa,
        "theta": sig.theta,
        "meta": _jsonable(dict(sig.meta)),
        "composed": bool(sig.composed),
    }
    if sig.var_s_w2:
        out["var_s_w2"] = sig.var_s_w2
        out["sd_s_w"] = sig.sd_s_w
    if sig.composed:
        out["terms"] = {k: {f: getattr(t, f) for f in _TERM_FIELDS} for k, t in sig.terms.items()}
        if sig.static_terms:
            out["static_terms"] = {k: {f: getattr(t, f) for f in _STATIC_FIELDS}
                                   for k, t in sig.static_terms.items()}
        for f in _COMPOSED_FLOATS:
            out[f] = getattr(sig, f)
    return out


def _var_s(file: str, path: str, d: Mapping) -> dict[str, float]:
    """``{"var_s_w2": σ²_s}`` from ``var_s_w2`` (wins) or ``sd_s_w``; {} when neither."""
    if d.get("var_s_w2") is not None:
        return {"var_s_w2": _num(file, f"{path}.var_s_w2", d["var_s_w2"])}
    if d.get("sd_s_w") is not None:
        return {"var_s_w2": _num(file, f"{path}.sd_s_w", d["sd_s_w"]) ** 2}
    return {}


def _d_j(file: str, path: str, d: Mapping, s: float, t: float) -> float:
    """Dynamic energy from ``energy_j`` (d = E − s·T), ``d_j``, or both (they must agree; d_j
    is used as written, so a written signature reads back as the same leaf)."""
    if "d_j" in d:
        dj = _num(file, f"{path}.d_j", d["d_j"], nonneg=False)
        if "energy_j" in d:
            e = _num(file, f"{path}.energy_j", d["energy_j"])
            expect = s * t + max(dj, 0.0)
            if abs(e - expect) > 1e-6 * max(1.0, abs(e)):
                raise FormatError(file, f"{path}.energy_j",
                                  f"{e!r} J disagrees with s_w*time_s + d_j = {expect!r} J")
        return dj
    if "energy_j" in d:
        return _num(file, f"{path}.energy_j", d["energy_j"]) - s * t
    raise FormatError(file, f"{path}.energy_j", "missing (give energy_j or d_j)")


def _leaf(file: str, path: str, d: Mapping, nm: str) -> Signature:
    if "s_w" not in d:
        raise FormatError(file, f"{path}.s_w", "missing (static power of the device(s), W)")
    s = _num(file, f"{path}.s_w", d["s_w"])
    kw = _common_kwargs(file, path, d)
    kw.update(_var_s(file, path, d))
    if "runs" in d:
        clash = sorted(set(d) & {"time_s", "energy_j", "d_j", "n", "sd_time_s", "sd_energy_j"})
        if clash:
            raise FormatError(file, f"{path}.{clash[0]}", "give either runs or values, not both")
        t_runs, e_runs = _runs(file, f"{path}.runs", d["runs"])
        return Signature.from_runs(nm, t_runs, e_runs, s_w=s, **kw)
    if "time_s" not in d:
        raise FormatError(file, f"{path}.time_s", "missing")
    t = _num(file, f"{path}.time_s", d["time_s"])
    n = _int(file, f"{path}.n", d.get("n", 1))
    dj = _d_j(file, path, d, s, t)
    return Signature(nm, s_w=s, time_s=t, d_j=dj, var_time_s2=_sd_pair(file, path, d, "time", "s", n),
                     var_energy_j2=_sd_pair(file, path, d, "energy", "j", n), n=n, **kw)


def _composite(file: str, path: str, d: Mapping, leaf: Signature) -> Signature:
    composed = d.get("composed", False)
    if not isinstance(composed, bool):
        raise FormatError(file, f"{path}.composed", f"must be true or false, got {_got(composed)}")
    if d.get("terms") is not None and not composed:
        raise FormatError(file, f"{path}.terms", "only a composed signature carries terms")
    if not composed:
        return leaf
    raw = d.get("terms")
    if not isinstance(raw, Mapping) or not raw:
        raise FormatError(file, f"{path}.terms", "a composed signature needs its terms: a non-empty "
                                                 "object keyed by measured leaf")
    terms = {}
    for k, tv in raw.items():
        tp = f"{path}.terms.{k}"
        tv = _obj(file, tp, tv)
        for f in _TERM_FIELDS:
            if f not in tv:
                raise FormatError(file, f"{tp}.{f}", "missing")
        terms[str(k)] = Term(*(_num(file, f"{tp}.{f}", tv[f], nonneg=False) for f in _TERM_FIELDS))
    static = {}
    raw_s = d.get("static_terms")
    if raw_s is not None:
        for k, tv in _obj(file, f"{path}.static_terms", raw_s).items():
            tp = f"{path}.static_terms.{k}"
            tv = _obj(file, tp, tv)
            for f in _STATIC_FIELDS:
                if f not in tv:
                    raise FormatError(file, f"{tp}.{f}", "missing")
            static[str(k)] = StaticTerm(*(_num(file, f"{tp}.{f}", tv[f], nonneg=f == "var_s_w2")
                                          for f in _STATIC_FIELDS))
    # A bookkeeping value the JSON writer could not hold (inf/NaN become null) keeps its default.
    extra = {f: _num(file, f"{path}.{f}", d[f], nonneg=False)
             for f in _COMPOSED_FLOATS if d.get(f) is not None}
    try:
        return replace(leaf, composed=True, terms=terms, static_terms=static, **extra)
    except InvalidSignatureError as exc:  # pragma: no cover - leaf already validated
        raise FormatError(file, path, str(exc)) from None


def signature_from_dict(d: Any, file: str = "<dict>", path: str = "signature",
                        name: str | None = None) -> Signature:
    """Parse one signature in any form the module docstring lists, validating every field.

    The name is ``name``, else the dict's ``name``, else the last part of ``path``. Errors are
    :class:`FormatError` naming ``file`` and the path of the bad field, e.g.
    ``points[3].time_s: must be a non-negative number, got "fast"``.
    """
    if not isinstance(d, Mapping):
        raise FormatError(file, path, f"must be an object (a signature), got {_got(d)}")
    _unknown(file, path, d, SIGNATURE_FIELDS)
    nm = name if name is not None else d.get("name", path.rsplit(".", 1)[-1])
    if not isinstance(nm, str) or not nm:
        raise FormatError(file, f"{path}.name", f"must be a non-empty string, got {_got(nm)}")
    try:
        return _composite(file, path, d, _leaf(file, path, d, nm))
    except FormatError:
        raise
    except EnergyCalculusError as exc:
        raise FormatError(file, path, str(exc)) from None
