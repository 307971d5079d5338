"""Composition workbooks (``ecal.workbook/1``; ``ecal compose`` / ``ecal check``).

**Workbook** (``ecal compose`` / ``ecal check``): a signature file plus an optional
``"defaults"`` object (fields merged under every signature, e.g. ``{"s_w": 80, "devices":
["gpu0"]}``) and ``"compositions"``, a list of ``{"name", "expr", "measured"?, "description"?}``.
An expression is a signature name, the name of an earlier composition, or one object:

* ``{"seq": [e, ...]}`` -- back to back on one device (⊗)
* ``{"par": [e, ...], "offsets_s": [...], "sm_total": 108, "max_method": "clark"}`` -- overlap on
  one device (⊕); options optional
* ``{"par_multi": [e, ...]}`` -- at once on disjoint devices (⊕multi)
* ``{"repeat": e, "times": k}`` -- e ⊗ e ⊗ … k times (one shared measurement: σ grows as k),
  in closed form (:func:`frontier.compose.repeat`); k is a JSON integer, 1 <= k <= 10**12
* ``{"on": "gpu1", "expr": e}`` -- e (which may name an earlier composition) with every leaf
  moved to device(s) ``gpu1`` (a string or a list). The moved leaves keep their identity, so
  their estimation error is shared with the original (the same characterization reused on
  another GPU)
* ``{"idle": {"device": "gpu1", "duration_s": 2e-4, "s_w": 80}}`` -- an idle element
* ``{"dag": {"tasks": {name: e}, "deps": [[a, b], ...], "idle_power_w": {...},
  "offsets_s": {...}}}`` -- see :func:`frontier.dag.dag`

``measured`` is ``{"time_s", "energy_j", "sd_time_s", "sd_energy_j", "n"}`` (standard errors, as
for signatures; or ``run_sd_*`` with ``n``) or ``{"runs": {"times_s": [...], "energies_j":
[...]}}``; an optional ``s_w`` (default: the prediction's, capped at E/T) only splits E into s·T+d.

Every problem raises :class:`FormatError` naming the file, the path inside it (e.g.
``signatures.gemm.time_s``) and the problem. Files are UTF-8 (a BOM is accepted); binary files,
NaN/Infinity literals and numbers that overflow a float are refused. A workbook may evaluate at
most ``MAX_EVALUATIONS`` expression nodes nested at most ``MAX_EXPR_DEPTH`` deep: nothing in
it expands without bound (``repeat`` is closed-form, ``on`` re-evaluates each named
composition once per target).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from .codec import (
    _got,
    _int,
    _list,
    _num,
    _obj,
    _runs,
    _sd_pair,
    _unknown,
    )
from .compose import MAX_REPEAT, par, par_multi, repeat, seq
from .compose import idle as idle_element
from .deviation import DeviationResult, critical_value, deviation
from .errors import EnergyCalculusError, FormatError, UnknownNameError
from .files import read_json
from .io import UNITS, parse_signatures, signature_file_body
from .signature import Signature
from .units import energy_unit, pm, time_unit

#: The ``schema_version`` of signature files and workbooks before ``"format"`` (still read).

# -- expressions ------------------------------------------------------------------------------------

_OPS = {"seq", "par", "par_multi", "repeat", "on", "idle", "dag"}
_OP_OPTIONS = {"seq": {"name"}, "par": {"name", "offsets_s", "sm_total", "max_method"},
               "par_multi": {"name", "max_method"}, "repeat": {"name", "times"},
               "on": {"expr"}, "idle": set(), "dag": {"name"}}


def _moved(sig: Signature, devices: frozenset[str]) -> Signature:
    # Same leaf (same terms/identity of its error), other device: dataclasses.replace keeps
    # every field, including the per-leaf sensitivities.
    return dataclasses.replace(sig, devices=devices)


#: Most expression nodes one workbook may evaluate (``on`` re-evaluates a named composition
#: with its leaves moved; memoized, but a file could still ask for more work than it is long).
MAX_EVALUATIONS = 1_000_000
#: Deepest nesting of expressions.
MAX_EXPR_DEPTH = 100


@dataclass
class _Env:
    file: str
    sigs: Mapping[str, Signature]
    comps: dict[str, Signature] = field(default_factory=dict)
    exprs: dict[str, Any] = field(default_factory=dict)
    # (composition name, devices) -> that composition re-evaluated with its leaves moved.
    moved: dict[tuple[str, frozenset[str]], Signature] = field(default_factory=dict)
    evaluations: int = 0
    depth: int = 0


def _eval(env: _Env, expr: Any, path: str, place: frozenset[str] | None) -> Signature:
    """Evaluate one expression node within the workbook's limits on work and depth."""
    env.evaluations += 1
    if env.evaluations > MAX_EVALUATIONS:
        raise FormatError(env.file, path, f"the workbook expands to more than {MAX_EVALUATIONS} "
                                          "expression evaluations; use repeat for k-fold repeats "
                                          "and name shared sub-expressions once")
    if env.depth >= MAX_EXPR_DEPTH:
        raise FormatError(env.file, path, f"expressions (with the compositions they name) nest "
                                          f"deeper than {MAX_EXPR_DEPTH} levels")
    env.depth += 1
    try:
        return _eval_node(env, expr, path, place)
    finally:
        env.depth -= 1


def _eval_node(env: _Env, expr: Any, path: str, place: frozenset[str] | None) -> Signature:
    f = env.file
    if isinstance(expr, str):
        if expr in env.sigs:
            sig = env.sigs[expr]
            return _moved(sig, place) if place is not None else sig
        if expr in env.comps:
            if place is not None:
                # Re-evaluate the composition's expression with its leaves moved (once per
                # target: without the memo, nested moves re-evaluate exponentially often).
                memo = (expr, place)
                if memo not in env.moved:
                    sig = _eval(env, env.exprs[expr], path, place)
                    # Named like the original (as parse_workbook names it), so names of nested
                    # moves do not grow with every level.
                    env.moved[memo] = dataclasses.replace(sig, name=expr) if sig.composed else sig
                return env.moved[memo]
            return env.comps[expr]
        known = sorted(env.sigs) + sorted(env.comps)
        raise FormatError(f, path, f"unknown element {expr!r} (known: {', '.join(known[:20])}"
                                   f"{', ...' if len(known) > 20 else ''})")
    expr = _obj(f, path, expr)
    ops = [k for k in expr if k in _OPS]
    if len(ops) != 1:
        raise FormatError(f, path, f"must have exactly one operator of {', '.join(sorted(_OPS))}; got keys {sorted(expr)}")
    op = ops[0]
    _unknown(f, path, expr, {op} | _OP_OPTIONS[op])
    p = f"{path}.{op}"
    name = expr.get("name")
    if name is not None and not isinstance(name, str):
        raise FormatError(f, f"{path}.name", f"must be a string, got {_got(name)}")
    try:
        if op in ("seq", "par", "par_multi"):
            kids = [_eval(env, e, f"{p}[{i}]", place) for i, e in enumerate(_list(f, p, expr[op]))]
            if op == "seq":
                return seq(kids, name=name)
            if op == "par_multi":
                return par_multi(kids, name=name, max_method=expr.get("max_method", "dominant"))
            kw: dict[str, Any] = {"max_method": expr.get("max_method", "dominant")}
            if "offsets_s" in expr:
                offs = _list(f, f"{path}.offsets_s", expr["offsets_s"])
                kw["offsets_s"] = [_num(f, f"{path}.offsets_s[{i}]", v) for i, v in enumerate(offs)]
            if "sm_total" in expr:
                kw["sm_total"] = _int(f, f"{path}.sm_total", expr["sm_total"])
            return par(kids, name=name, **kw)
        if op == "repeat":
            if "times" not in expr:
                raise FormatError(f, f"{path}.times", "missing (how many repeats)")
            k = _int(f, f"{path}.times", expr["times"], maximum=MAX_REPEAT, integral_float=False)
            base = _eval(env, expr[op], p, place)
            return repeat(base, k, name=name or f"{base.name}x{k}")   # closed form, no expansion
        if op == "on":
            if "expr" not in expr:
                raise FormatError(f, f"{path}.expr", "missing (the expression to move)")
            devs = expr[op]
            devs = [devs] if isinstance(devs, str) else _list(f, p, devs)
            if not all(isinstance(x, str) and x for x in devs):
                raise FormatError(f, p, f"must be a device name or list of names, got {_got(expr[op])}")
            return _eval(env, expr["expr"], f"{path}.expr", frozenset(devs))
        if op == "idle":
            body = _obj(f, p, expr[op])
            _unknown(f, p, body, ("device", "duration_s", "s_w", "name"))
            for key in ("device", "duration_s", "s_w"):
                if key not in body:
                    raise FormatError(f, f"{p}.{key}", "missing")
            dev = str(body["device"])
            if place is not None and len(place) == 1:
                dev = next(iter(place))   # an idle element moves with the expression around it
            return idle_element(dev, _num(f, f"{p}.duration_s", body["duration_s"]),
                                _num(f, f"{p}.s_w", body["s_w"]), name=body.get("name"))
        return _eval_dag(env, expr, p, place, name)
    except FormatError:
        raise
    except EnergyCalculusError as exc:
        raise FormatError(f, path, str(exc)) from None


def _eval_dag(env: _Env, expr: Mapping, p: str, place, name) -> Signature:
    from .dag import dag

    f = env.file
    body = _obj(f, p, expr["dag"])
    _unknown(f, p, body, ("tasks", "deps", "idle_power_w", "offsets_s"))
    tasks_d = _obj(f, f"{p}.tasks", body.get("tasks"))
    if not tasks_d:
        raise FormatError(f, f"{p}.tasks", "must name at least one task")
    tasks = {k: _eval(env, e, f"{p}.tasks.{k}", place) for k, e in tasks_d.items()}
    deps = []
    for i, edge in enumerate(_list(f, f"{p}.deps", body.get("deps", []), nonempty=False)):
        if not (isinstance(edge, list) and len(edge) == 2 and all(isinstance(x, str) for x in edge)):
            raise FormatError(f, f"{p}.deps[{i}]", f"must be [before, after] task names, got {_got(edge)}")
        deps.append((edge[0], edge[1]))
    idle_w = {k: _num(f, f"{p}.idle_power_w.{k}", v)
              for k, v in _obj(f, f"{p}.idle_power_w", body.get("idle_power_w", {})).items()}
    offs = {k: _num(f, f"{p}.offsets_s.{k}", v)
            for k, v in _obj(f, f"{p}.offsets_s", body.get("offsets_s", {})).items()}
    return dag(tasks, deps, idle_power_w=idle_w or None, offsets_s=offs or None, name=name)


def _measured(file: str, path: str, d: Any, predicted: Signature, name: str) -> Signature:
    d = _obj(file, path, d)
    _unknown(file, path, d, {"time_s", "energy_j", "sd_time_s", "sd_energy_j", "var_time_s2",
                             "var_energy_j2", "run_sd_time_s", "run_sd_energy_j", "n", "runs", "s_w"})
    nm = f"{name} (measured)"
    try:
        if "runs" in d:
            times, energies = _runs(file, f"{path}.runs", d["runs"])
            mean_t, mean_e = float(np.mean(times)), float(np.mean(energies))
            s = _measured_s(file, path, d, predicted, mean_t, mean_e)
            return Signature.from_runs(nm, times, energies, s_w=s, devices=predicted.devices)
        for k in ("time_s", "energy_j"):
            if k not in d:
                raise FormatError(file, f"{path}.{k}", "missing")
        t = _num(file, f"{path}.time_s", d["time_s"])
        e = _num(file, f"{path}.energy_j", d["energy_j"])
        n = _int(file, f"{path}.n", d.get("n", 1))
        s = _measured_s(file, path, d, predicted, t, e)
        return Signature(nm, s_w=s, time_s=t, d_j=max(e - s * t, 0.0),
                         var_time_s2=_sd_pair(file, path, d, "time", "s", n),
                         var_energy_j2=_sd_pair(file, path, d, "energy", "j", n), n=n,
                         devices=predicted.devices, meta={"source": "measured"})
    except FormatError:
        raise
    except EnergyCalculusError as exc:
        raise FormatError(file, path, str(exc)) from None


def _measured_s(file: str, path: str, d: Mapping, predicted: Signature, t: float, e: float) -> float:
    # s only splits E into s·T + d; keep d >= 0 so the measured signature is valid.
    s = _num(file, f"{path}.s_w", d["s_w"]) if "s_w" in d else predicted.s_w
    return min(s, e / t) if t > 0 else s


# -- workbooks ----------------------------------------------------------------------------------------

def _fmt_t(t: float, sd: float | None = None, unit: tuple[float, str] | None = None) -> str:
    scale, name = unit or time_unit([t])
    return f"{pm(t, sd, scale)} {name}"


def _fmt_e(e: float, sd: float | None = None, unit: tuple[float, str] | None = None) -> str:
    scale, name = unit or energy_unit([e])
    return f"{pm(e, sd, scale)} {name}"


@dataclass(frozen=True)
class CompositionEntry:
    """One composition of a workbook: its expression, the predicted composite and, when the
    file has one, the direct measurement of the same composite."""

    name: str
    expr: Any
    predicted: Signature
    measured: Signature | None = None
    description: str | None = None

    def deviation(self, alpha: float = 0.05, bias_aware: bool = False, n_tests: int = 1) -> DeviationResult | None:
        """Eq. 23 of the measurement against the prediction (None without a measurement)."""
        if self.measured is None:
            return None
        return deviation(self.predicted, self.measured, alpha, bias_aware, n_tests, name=self.name)

    def summary(self, alpha: float = 0.05, t_unit: tuple[float, str] | None = None,
                e_unit: tuple[float, str] | None = None) -> str:
        """One line: predicted T and E with σ and the Eq. 13 bias bound (``t_unit``/``e_unit``:
        (scale, name) from :mod:`frontier.units`, so that every line of a table shares them)."""
        p = self.predicted
        b = p.bias_bound_j(critical_value(alpha))
        e_unit = e_unit or energy_unit([p.energy_j, b])
        return (f"{self.name}: T = {_fmt_t(p.time_s, p.sd_time_s, t_unit)}  "
                f"E = {_fmt_e(p.energy_j, p.sd_energy_j, e_unit)}"
                f"  bias bound {_fmt_e(b, None, e_unit)} (c_a={critical_value(alpha):.3g})")

    def to_dict(self, alpha: float = 0.05) -> dict[str, Any]:
        """JSON-ready dict: predicted values, σ, bias bound at c_α, measured values if any."""
        p = self.predicted
        c = critical_value(alpha)
        d: dict[str, Any] = {
            "name": self.name, "expr": self.expr,
            "predicted": {"time_s": p.time_s, "energy_j": p.energy_j, "sd_time_s": p.sd_time_s,
                          "sd_energy_j": p.sd_energy_j, "s_w": p.s_w, "d_j": p.d_j,
                          "bias_bound_j": p.bias_bound_j(c), "c_alpha": c,
                          "devices": sorted(p.devices)},
        }
        if self.description:
            d["description"] = self.description
        if self.measured is not None:
            m = self.measured
            d["measured"] = {"time_s": m.time_s, "energy_j": m.energy_j, "sd_time_s": m.sd_time_s,
                             "sd_energy_j": m.sd_energy_j, "n": m.n}
        return d


@dataclass(frozen=True)
class Workbook:
    """A parsed workbook: its signatures and its compositions, evaluated."""

    file: str
    signatures: Mapping[str, Signature]
    entries: tuple[CompositionEntry, ...]
    description: str | None = None

    def __getitem__(self, name: str) -> CompositionEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise UnknownNameError(f"{self.file}: no composition named {name!r}")

    def check(self, alpha: float = 0.05, bias_aware: bool = False, n_tests: int = 1) -> list[DeviationResult]:
        """Eq. 23 for every composition that has a measurement, in file order."""
        return [r for e in self.entries
                if (r := e.deviation(alpha, bias_aware, n_tests)) is not None]

    def summary_lines(self, alpha: float = 0.05) -> list[str]:
        """One line per composition (predicted T, E ± σ, bias bound): what ``ecal compose`` prints."""
        c = critical_value(alpha)
        t_unit = time_unit(e.predicted.time_s for e in self.entries)
        e_unit = energy_unit([x for e in self.entries
                              for x in (e.predicted.energy_j, e.predicted.bias_bound_j(c))])
        return [e.summary(alpha, t_unit, e_unit) for e in self.entries]

    def to_dict(self, alpha: float = 0.05, bias_aware: bool = False, n_tests: int = 1) -> dict[str, Any]:
        """JSON-ready dict of every composition (prediction, measurement, deviation)."""
        out = []
        for e in self.entries:
            d = e.to_dict(alpha)
            r = e.deviation(alpha, bias_aware, n_tests)
            if r is not None:
                d["deviation"] = r.to_dict()
            out.append(d)
        return {"file": self.file, "units": dict(UNITS), "compositions": out}


def parse_workbook(doc: Any, file: str = "<workbook>",
                   compositions: Sequence[Mapping[str, Any]] = ()) -> Workbook:
    """Build a :class:`Workbook` from an already-parsed JSON document (``ecal.workbook/1``, a
    signature file, or an older ``schema_version`` 1 file). ``compositions`` (``{name, expr}``
    objects, as in a workbook) are evaluated after the file's own: a signature file, which
    has none, can be composed as it is (``ecal compose --expr``)."""
    doc = signature_file_body(file, doc)
    sigs = parse_signatures(file, doc)
    env = _Env(file, sigs)
    entries = []
    own = _list(file, "compositions", doc.get("compositions", []), nonempty=False)
    for i, c in enumerate([*own, *compositions]):
        path = f"compositions[{i}]"
        c = _obj(file, path, c)
        _unknown(file, path, c, ("name", "expr", "measured", "description"))
        nm = c.get("name")
        if not isinstance(nm, str) or not nm:
            raise FormatError(file, f"{path}.name", f"must be a non-empty string, got {_got(nm)}")
        if nm in sigs or nm in env.comps:
            raise FormatError(file, f"{path}.name", f"{nm!r} is already the name of a signature or composition")
        if "expr" not in c:
            raise FormatError(file, f"{path}.expr", "missing")
        pred = _eval(env, c["expr"], f"{path}.expr", None)
        pred = dataclasses.replace(pred, name=nm) if pred.composed else pred
        meas = _measured(file, f"{path}.measured", c["measured"], pred, nm) if "measured" in c else None
        env.comps[nm] = pred
        env.exprs[nm] = c["expr"]
        entries.append(CompositionEntry(nm, c["expr"], pred, meas, c.get("description")))
    desc = doc.get("description")
    return Workbook(file, MappingProxyType(sigs), tuple(entries), desc if isinstance(desc, str) else None)


def load_workbook(path: str | os.PathLike,
                  compositions: Sequence[Mapping[str, Any]] = ()) -> Workbook:
    """Read and evaluate a workbook file (format in the module docstring), with
    ``compositions`` evaluated after its own (see :func:`parse_workbook`)."""
    return parse_workbook(read_json(path), str(path), compositions)

