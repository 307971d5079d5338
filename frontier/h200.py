"""Signatures and composition predictions from the real H200 measurements (``data/h200``).

Pure functions over the parsed ``measurements.json`` dict (see ``data/README.md``), or the
path of that file given to :func:`load_measurements`; this module never looks for the file
(:func:`measure.replay.shared_data_dir` does):

* each element's per-invocation signature comes from its measurement windows (T and E per
  invocation = window totals / n) with :meth:`Signature.from_runs`, so its variances are those
  of the mean over windows;
* static power is the ready power with a CUDA context alive at 1980 MHz (≈123 W), *not* the
  deep-idle 79 W;
* each of the four ``compositions`` is predicted from its ``parts`` (element → invocation
  count): sequential runs are ⊗ of all invocations, same-device parallel runs are ⊕ of the
  two per-element ⊗ chains. A signature repeated k times adds k²·var (shared estimation error).

Only the SM allocation is an ω_elem knob here (``sm_count`` is set when an element was given
fewer than all 132 SMs); the card was never reconfigured, so every element shares ω_dev
(700 W limit, default clocks).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .compose import par, seq
from .errors import FormatError
from .operating_point import OperatingPoint
from .signature import Signature


def load_measurements(path: str | os.PathLike) -> dict[str, Any]:
    """Read the H200 measurement file at ``path`` (errors are :class:`FormatError`). Finding
    it is the caller's business: ``measure.replay.data_path(measure.replay.H200_MEASUREMENTS)``
    locates the shared copy."""
    from .files import read_json

    p = Path(path)
    data = read_json(p)
    for key in ("elements", "compositions", "static_power_W"):
        if key not in data:
            raise FormatError(str(p), key, "missing (is this data/h200/measurements.json?)")
    return data


def static_power_w(data: Mapping[str, Any]) -> float:
    """Ready power (context alive, no kernels, 1980 MHz): mean of the ``ready_idle_*`` readings."""
    sp = data["static_power_W"]
    vals: list[float] = []
    for k, v in sp.items():
        if k.startswith("ready_idle"):
            vals.extend(v if isinstance(v, list) else [v])
    if not vals:
        raise FormatError("measurements.json", "static_power_W", "no ready_idle_* reading")
    return float(np.mean(vals))


def _omega(el: Mapping[str, Any], sm_total: int) -> OperatingPoint:
    om = el.get("omega", {})
    sm = om.get("sm_alloc")
    return OperatingPoint(
        power_limit_w=om.get("power_limit_W"),
        sm_count=int(sm) if sm is not None and int(sm) < sm_total else None,
    )


def element_signature(el: Mapping[str, Any], s_w: float, sm_total: int = 132,
                      device: str = "gpu0") -> Signature:
    """Per-invocation signature of one element entry from its windows."""
    name = el["name"]
    wins = el["windows"]
    t = [w["T_s"] for w in wins]
    e = [w["E_J"] for w in wins]
    meta = {"protocol": el.get("protocol"), "invocations_per_window": el.get("invocations_per_window"),
            "sm_alloc": el.get("omega", {}).get("sm_alloc"),
            "window_clocks_mhz": [w.get("sm_clock_MHz_at_end") for w in wins],
            "variance": "of the mean over windows of per-invocation values"}
    meta = {k: v for k, v in meta.items() if v is not None}
    return Signature.from_runs(name, t, e, s_w=s_w, devices={device}, omega=_omega(el, sm_total),
                               kappa=el.get("kappa"), theta=el.get("theta"), meta=meta)


def element_signatures(data: Mapping[str, Any], s_w: float | None = None) -> dict[str, Signature]:
    """name → per-invocation signature for every element (static power from the data)."""
    s = static_power_w(data) if s_w is None else float(s_w)
    sm_total = int(data.get("device", {}).get("sm_count", 132))
    return {el["name"]: element_signature(el, s, sm_total) for el in data["elements"]}


def is_parallel(comp: Mapping[str, Any]) -> bool:
    """True for a same-device parallel composite (its ``how`` says so), False for sequential."""
    how = str(comp.get("how", "")).lower()
    if "parallel" in how:
        return True
    if "sequential" in how:
        return False
    raise FormatError("measurements.json", f"compositions.{comp.get('name')}.how",
                      f"neither sequential nor parallel: {comp.get('how')!r}")


def predict_composition(data: Mapping[str, Any], comp: Mapping[str, Any],
                        sigs: Mapping[str, Signature]) -> Signature:
    """Context-independent prediction of one composite from its ``parts`` (element → count).

    Sequential: ⊗ of every invocation (order does not change T or E in this algebra).
    Parallel: ⊕ of the per-element ⊗ chains, started together on one device.
    """
    chains = []
    for el, count in comp["parts"].items():
        if el not in sigs:
            raise FormatError("measurements.json", f"compositions.{comp['name']}.parts.{el}",
                              "no element signature with this name")
        chains.append(seq([sigs[el]] * int(count), name=f"{el}x{int(count)}"))
    if is_parallel(comp):
        return par(chains, name=comp["name"])
    return seq(chains, name=comp["name"])


def measured_signature(comp: Mapping[str, Any], s_w: float = 123.0) -> Signature:
    """The directly measured composite, from its windows (variance of the mean). ``s_w`` only
    splits E into s·T + d (pass :func:`static_power_w` of the data; 123 W is the H200's)."""
    t = [w["T_s"] for w in comp["windows"]]
    e = [w["E_J"] for w in comp["windows"]]
    return Signature.from_runs(f"{comp['name']} (measured)", t, e, s_w=s_w,
                               meta={"protocol": comp.get("protocol")})


def composition_expr(comp: Mapping[str, Any]) -> dict[str, Any]:
    """The workbook expression (``frontier.io``) of one composite."""
    reps = [{"repeat": el, "times": int(k)} for el, k in comp["parts"].items()]
    return {"par": reps} if is_parallel(comp) else {"seq": reps}


def workbook_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """A ``frontier.io`` workbook with every element (as raw windows) and the four composites
    with their measured windows: the bundled ``h200_compositions.json``."""
    s = static_power_w(data)
    sm_total = int(data.get("device", {}).get("sm_count", 132))
    sigs = {}
    for el in data["elements"]:
        d: dict[str, Any] = {
            "s_w": s, "kappa": el.get("kappa"), "theta": el.get("theta"),
            "runs": {"times_s": [w["T_s"] for w in el["windows"]],
                     "energies_j": [w["E_J"] for w in el["windows"]]},
            "meta": {"protocol": el.get("protocol"),
                     "invocations_per_window": el.get("invocations_per_window"),
                     "sm_alloc": el.get("omega", {}).get("sm_alloc")},
        }
        om = {k: v for k, v in _omega(el, sm_total).to_dict().items() if v is not None}
        if om:
            d["omega"] = om
        sigs[el["name"]] = d
    comps = []
    for c in data["compositions"]:
        comps.append({
            "name": c["name"], "description": c.get("how"), "expr": composition_expr(c),
            "measured": {"s_w": s, "runs": {"times_s": [w["T_s"] for w in c["windows"]],
                                            "energies_j": [w["E_J"] for w in c["windows"]]}},
        })
    return {
        "schema_version": 1,
        "units": {"time": "s", "energy": "J", "power": "W"},
        "description": ("Real NVIDIA H200 measurements (data/h200/measurements.json, measured for this "
                        "project, free to copy): per-invocation element signatures from NVML "
                        f"energy-counter windows, static power {s:.1f} W (ready, context alive), "
                        "and four measured composites. Variances are of the window means."),
        "defaults": {"devices": ["gpu0"]},
        "signatures": sigs,
        "compositions": comps,
    }
