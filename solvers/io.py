"""Problem files: a Perseus profile CSV or the JSON problem format below.

JSON problem format (``"format": "ecal.problem/1"``; older files with
``"schema_version": "ecal.problem/1"`` read too)::

    {
      "format": "ecal.problem/1",
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
      "edges": [["a", "b"], ...],
      "steady_state": true
    }

Per option: ``time_s``; ``energy_j`` (total) or ``d_j`` (dynamic); optional ``s_w`` (static
power while busy, default 0), ``sm_clock_mhz`` or ``omega`` (an operating point: switches are
priced between different ω_dev), ``sd_time_s``/``sd_energy_j`` (standard errors), ``label``,
``key`` (same key = same measurement); ``terms`` (an option composed from measured leaves:
``{leaf key: {"var_time_s2", "var_d_j2", "dT_dT", "dE_dT", "dE_dd"}}``, as
``frontier.signature.Term``; a leaf shared by options is then correlated in a plan's σ) with
optional ``extra_var_time_s2``/``extra_var_energy_j2`` (Clark's remainder). An option without
``terms`` is its own leaf, keyed by ``key``. Same-device order = order of listing. ``transitions``
per device: ``{"constant": {...}}`` or a ``frontier.transition.TransitionTable`` dict.
``steady_state`` (optional, default false; written only when true): the tasks are one
iteration of a loop, and each device's switch from its last task back to its first is charged
(:class:`solvers.model.Problem`).
A Perseus CSV (``stage,instruction,frequency,time,energy``) becomes a 1F1B problem
(:func:`solvers.perseus.read_perseus_profile`, then :func:`solvers.pipeline.one_f_one_b`; options
``p2p_power_w``, ``n_microbatches``, ``transitions``).

Bad input is a :class:`~frontier.errors.FormatError` naming the file and the field (JSON path,
or CSV line and column): NaN/Infinity, numbers that overflow a float, negative times or
energies, binary or non-UTF-8 files (a UTF-8 BOM is accepted), and in a Perseus CSV a second
row for one (stage, instruction, frequency) — a profile has one measurement per key, so a
repeat is a merge error, never silently averaged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from frontier.errors import EnergyCalculusError, FormatError
from frontier.formats import KINDS, check_format
from frontier.io import (
    number_field,
    read_json,
    write_json_atomic,
)
from frontier.transition import TransitionTable

from .limits import check_tasks
from .model import ConstantTransition, Problem
from .options import DEFAULT_MAX_TASKS
from .perseus import load_perseus_profile

#: Numeric fields of a problem option, and whether they may be negative.
_OPTION_NUMBERS = {"time_s": False, "energy_j": False, "s_w": False, "d_j": True,
                   "sd_time_s": False, "sd_energy_j": False, "var_time_s2": False,
                   "var_d_j2": False, "sm_clock_mhz": False, "extra_var_time_s2": True,
                   "extra_var_energy_j2": True}
#: Fields of a per-leaf term and whether they may be negative (sensitivities may).
_TERM_NUMBERS = {"var_time_s2": False, "var_d_j2": False, "dT_dT": True, "dE_dT": True,
                 "dE_dd": True}


def _rule(d: Any, file: str, path: str) -> Any:
    if d is None:
        return None
    if not isinstance(d, Mapping):
        raise FormatError(file, path, "must be an object")
    if set(d) == {"constant"}:
        c = d["constant"]
        if not isinstance(c, Mapping) or "time_s" not in c:
            raise FormatError(file, f"{path}.constant", "needs time_s (and optional energy_j)")
        t = number_field(file, f"{path}.constant.time_s", c["time_s"])
        e = number_field(file, f"{path}.constant.energy_j", c.get("energy_j", 0.0))
        try:
            return ConstantTransition(t, e)
        except EnergyCalculusError as exc:
            raise FormatError(file, f"{path}.constant", str(exc)) from None
    return TransitionTable.from_dict(d, file)


def problem_from_dict(d: Any, file: str = "<dict>", *,
                      max_tasks: int | None = DEFAULT_MAX_TASKS) -> Problem:
    """Build a Problem from the JSON problem format; errors name the file and the field. More
    than ``max_tasks`` tasks (None: no limit) raise
    :class:`~solvers.model.ProblemTooLargeError` before any task is built."""
    if not isinstance(d, Mapping):
        raise FormatError(file, "$", "a problem must be a JSON object")
    check_format(file, d, "problem")
    devs = d.get("devices", {})
    if not isinstance(devs, Mapping):
        raise FormatError(file, "devices", "must be an object keyed by device name")
    idle, trans = {}, {}
    for name, dv in devs.items():
        if not isinstance(dv, Mapping):
            raise FormatError(file, f"devices.{name}", "must be an object")
        idle[name] = number_field(file, f"devices.{name}.idle_power_w", dv.get("idle_power_w", 0.0))
        r = _rule(dv.get("transitions"), file, f"devices.{name}.transitions")
        if r is not None:
            trans[name] = r
    tasks_in = d.get("tasks")
    if not isinstance(tasks_in, list) or not tasks_in:
        raise FormatError(file, "tasks", "must be a non-empty list")
    check_tasks(len(tasks_in), max_tasks, file)
    tasks = []
    for i, t in enumerate(tasks_in):
        if not isinstance(t, Mapping):
            raise FormatError(file, f"tasks[{i}]", "must be an object")
        for k in ("name", "device", "options"):
            if k not in t:
                raise FormatError(file, f"tasks[{i}].{k}", "missing")
        if not isinstance(t["options"], list):
            raise FormatError(file, f"tasks[{i}].options", "must be a list")
        for j, o in enumerate(t["options"]):
            _check_option_numbers(file, f"tasks[{i}].options[{j}]", o)
        tasks.append((str(t["name"]), str(t["device"]), list(t["options"])))
    edges = d.get("edges", [])
    if not isinstance(edges, list):
        raise FormatError(file, "edges", "must be a list of [before, after] pairs")
    steady = d.get("steady_state", False)
    if not isinstance(steady, bool):
        raise FormatError(file, "steady_state", f"must be true or false, got {steady!r}")
    try:
        return Problem.build(tasks, [tuple(e) for e in edges], idle, trans or None,
                             str(d.get("name", os.path.basename(file))), steady_state=steady)
    except EnergyCalculusError as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(file, "$", str(exc)) from None


def _check_option_numbers(file: str, path: str, o: Any) -> None:
    # The model checks meaning (d >= 0, known fields); this names the file and field of a
    # number that is not one (NaN, inf, overflow, a string) or is negative.
    if isinstance(o, Mapping):
        for k, signed in _OPTION_NUMBERS.items():
            if o.get(k) is not None:
                number_field(file, f"{path}.{k}", o[k], nonneg=not signed)
        _check_terms(file, f"{path}.terms", o.get("terms"))
    elif isinstance(o, (list, tuple)) and len(o) == 2:
        number_field(file, f"{path}[0] (time_s)", o[0])
        number_field(file, f"{path}[1] (energy_j)", o[1])


def _check_terms(file: str, path: str, terms: Any) -> None:
    if terms is None:
        return
    if not isinstance(terms, Mapping) or not terms:
        raise FormatError(file, path, "must be a non-empty object keyed by measured leaf")
    for k, t in terms.items():
        if not isinstance(t, Mapping):
            raise FormatError(file, f"{path}.{k}", "must be an object")
        missing = sorted(set(_TERM_NUMBERS) - set(t))
        unknown = sorted(set(t) - set(_TERM_NUMBERS))
        if missing or unknown:
            raise FormatError(file, f"{path}.{k}", f"needs exactly {sorted(_TERM_NUMBERS)}"
                              + (f"; missing {missing}" if missing else "")
                              + (f"; unknown {unknown}" if unknown else ""))
        for f, signed in _TERM_NUMBERS.items():
            number_field(file, f"{path}.{k}.{f}", t[f], nonneg=not signed)


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
            if o.terms:
                od.update(o.terms.to_dict())
            opts.append(od)
        tasks.append({"name": t.name, "device": t.device, "options": opts})
    out = {"format": KINDS["problem"].tag, "name": p.name, "devices": devs, "tasks": tasks,
           "edges": [list(e) for e in p.edges]}
    if p.steady_state:           # only when set: files without it read as before
        out["steady_state"] = True
    return out


def save_problem(p: Problem, path: str | os.PathLike) -> None:
    """Write ``p`` in the JSON problem format, atomically."""
    write_json_atomic(path, problem_to_dict(p))


def load_problem(path: str | os.PathLike, *, max_tasks: int | None = DEFAULT_MAX_TASKS,
                 **opts: Any) -> Problem:
    """Load a Perseus profile CSV (``**opts`` go to :func:`solvers.perseus.load_perseus_profile`) or a JSON problem;
    more than ``max_tasks`` tasks (None: no limit) raise
    :class:`~solvers.model.ProblemTooLargeError` before any task is built."""
    file = str(path)
    if file.lower().endswith(".csv"):
        return load_perseus_profile(file, max_tasks=max_tasks, **opts)
    if opts:
        raise FormatError(file, "$", f"options {sorted(opts)} apply to Perseus CSV profiles only")
    return problem_from_dict(read_json(file), file, max_tasks=max_tasks)
