"""Problem files: a Perseus profile CSV or the JSON problem format below.

JSON problem format (``schema_version: "ecal.problem/1"``)::

    {
      "schema_version": "ecal.problem/1",
      "name": "two-gpus",
      "devices": {
        "gpu0": {"idle_power_w": 75.0,
                 "transitions": {"constant": {"time_s": 0.002, "energy_j": 0.1}}},
        "gpu1": {"idle_power_w": 75.0,
                 "transitions": {"format": "energy-calculus/transitions", ...}}
      },
      "tasks": [
        {"name": "a", "device": "gpu0",
         "options": [{"time_s": 0.010, "energy_j": 2.0, "s_w": 75.0, "sm_clock_mhz": 1980,
                      "sd_time_s": 1e-5, "sd_energy_j": 0.01}, ...]},
        ...
      ],
      "edges": [["a", "b"], ...]
    }

Per option: ``time_s``; ``energy_j`` (total) or ``d_j`` (dynamic); optional ``s_w`` (static
power while busy, default 0), ``sm_clock_mhz`` or ``omega`` (an operating point: switches are
priced between different ω_dev), ``sd_time_s``/``sd_energy_j`` (standard errors), ``label``,
``key`` (same key = same measurement). Same-device order = order of listing. ``transitions``
per device: ``{"constant": {...}}`` or a ``frontier.transition.TransitionTable`` dict.
A Perseus CSV (``stage,instruction,frequency,time,energy``) becomes a 1F1B problem
(:func:`solvers.pipeline.load_perseus_profile`; options ``p2p_power_w``, ``n_microbatches``,
``transitions``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from frontier.errors import EnergyCalculusError, FormatError
from frontier.io import read_json, write_json_atomic
from frontier.transition import TransitionTable

from .model import ConstantTransition, Problem
from .pipeline import load_perseus_profile

PROBLEM_SCHEMA = "ecal.problem/1"


def _rule(d: Any, file: str, path: str) -> Any:
    if d is None:
        return None
    if not isinstance(d, Mapping):
        raise FormatError(file, path, "must be an object")
    if set(d) == {"constant"}:
        c = d["constant"]
        if not isinstance(c, Mapping) or "time_s" not in c:
            raise FormatError(file, f"{path}.constant", "needs time_s (and optional energy_j)")
        try:
            return ConstantTransition(float(c["time_s"]), float(c.get("energy_j", 0.0)))
        except (TypeError, ValueError, EnergyCalculusError) as exc:
            raise FormatError(file, f"{path}.constant", str(exc)) from None
    return TransitionTable.from_dict(d, file)


def problem_from_dict(d: Any, file: str = "<dict>") -> Problem:
    """Build a Problem from the JSON problem format; errors name the file and the field."""
    if not isinstance(d, Mapping):
        raise FormatError(file, "$", "a problem must be a JSON object")
    if d.get("schema_version") != PROBLEM_SCHEMA:
        raise FormatError(file, "schema_version", f"expected {PROBLEM_SCHEMA!r}, got {d.get('schema_version')!r}")
    devs = d.get("devices", {})
    if not isinstance(devs, Mapping):
        raise FormatError(file, "devices", "must be an object keyed by device name")
    idle, trans = {}, {}
    for name, dv in devs.items():
        if not isinstance(dv, Mapping):
            raise FormatError(file, f"devices.{name}", "must be an object")
        try:
            idle[name] = float(dv.get("idle_power_w", 0.0))
        except (TypeError, ValueError):
            raise FormatError(file, f"devices.{name}.idle_power_w", "must be a number") from None
        r = _rule(dv.get("transitions"), file, f"devices.{name}.transitions")
        if r is not None:
            trans[name] = r
    tasks_in = d.get("tasks")
    if not isinstance(tasks_in, list) or not tasks_in:
        raise FormatError(file, "tasks", "must be a non-empty list")
    tasks = []
    for i, t in enumerate(tasks_in):
        if not isinstance(t, Mapping):
            raise FormatError(file, f"tasks[{i}]", "must be an object")
        for k in ("name", "device", "options"):
            if k not in t:
                raise FormatError(file, f"tasks[{i}].{k}", "missing")
        if not isinstance(t["options"], list):
            raise FormatError(file, f"tasks[{i}].options", "must be a list")
        tasks.append((str(t["name"]), str(t["device"]), list(t["options"])))
    edges = d.get("edges", [])
    if not isinstance(edges, list):
        raise FormatError(file, "edges", "must be a list of [before, after] pairs")
    try:
        return Problem.build(tasks, [tuple(e) for e in edges], idle, trans or None,
                             str(d.get("name", os.path.basename(file))))
    except EnergyCalculusError as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(file, "$", str(exc)) from None


def problem_to_dict(p: Problem) -> dict[str, Any]:
    """The JSON problem format of ``p`` (transition rules with a ``to_dict``)."""
    devs: dict[str, Any] = {}
    for dev in p.index.devices:
        dv: dict[str, Any] = {"idle_power_w": p.index.power[dev]}
        r = p.rule(dev)
        if r is not None and hasattr(r, "to_dict"):
            dv["transitions"] = r.to_dict()
        devs[dev] = dv
    tasks = []
    for t in p.tasks:
        opts = []
        for o in t.options:
            od = {"time_s": o.time_s, "d_j": o.d_j, "s_w": o.s_w, "omega": o.omega.to_dict(),
                  "var_time_s2": o.var_time_s2, "var_d_j2": o.var_d_j2, "key": o.key, "label": o.label}
            opts.append(od)
        tasks.append({"name": t.name, "device": t.device, "options": opts})
    return {"schema_version": PROBLEM_SCHEMA, "name": p.name, "devices": devs, "tasks": tasks,
            "edges": [list(e) for e in p.edges]}


def save_problem(p: Problem, path: str | os.PathLike) -> None:
    """Write ``p`` in the JSON problem format, atomically."""
    write_json_atomic(path, problem_to_dict(p))


def load_problem(path: str | os.PathLike, **opts: Any) -> Problem:
    """Load a Perseus profile CSV (``**opts`` go to ``load_perseus_profile``) or a JSON problem."""
    file = str(path)
    if file.lower().endswith(".csv"):
        return load_perseus_profile(file, **opts)
    if opts:
        raise FormatError(file, "$", f"options {sorted(opts)} apply to Perseus CSV profiles only")
    return problem_from_dict(read_json(file), file)
