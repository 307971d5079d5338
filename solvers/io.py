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

The JSON format's shape is declared once, by :class:`solvers.format_models.ProblemFile`
(``ecal schema problem``); what its values mean is checked by :class:`solvers.model.Problem`.
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
from frontier.files import read_json, write_json_atomic
from frontier.formats import KINDS, content, validate
from frontier.transition import TransitionTable

from .limits import check_tasks
from .model import ConstantTransition, Problem, ProblemError, option_from_model
from .options import DEFAULT_MAX_TASKS
from .perseus import load_perseus_profile


def _rule(d: Any, file: str, path: str) -> Any:
    if d is None:
        return None
    if not isinstance(d, Mapping):
        raise FormatError(file, path, "must be an object: {\"constant\": {...}} or a transition table")
    if set(d) == {"constant"}:
        from .format_models import ConstantRule

        c = validate(ConstantRule, d, file, path).constant
        return ConstantTransition(c.time_s, c.energy_j)
    return TransitionTable.from_dict(d, file)


def problem_from_dict(d: Any, file: str = "<dict>", *,
                      max_tasks: int | None = DEFAULT_MAX_TASKS) -> Problem:
    """Build a Problem from the JSON problem format; errors name the file and the field. More
    than ``max_tasks`` tasks (None: no limit) raise
    :class:`~solvers.model.ProblemTooLargeError` before any task is built."""
    from .format_models import ProblemFile

    _, body = content(file, d, "problem")
    if isinstance(body.get("tasks"), list):      # before a task is validated
        check_tasks(len(body["tasks"]), max_tasks, file)
    m = validate(ProblemFile, body, file)
    idle = {name: dv.idle_power_w for name, dv in m.devices.items()}
    trans = {name: r for name, dv in m.devices.items()
             if (r := _rule(dv.transitions, file, f"devices.{name}.transitions")) is not None}
    tasks = []
    for i, t in enumerate(m.tasks):
        opts = []
        for j, o in enumerate(t.options):
            try:
                opts.append(option_from_model(o))
            except ProblemError as exc:     # what a value means, named at its option
                raise FormatError(file, f"tasks[{i}].options[{j}]", str(exc)) from None
        tasks.append((t.name, t.device, opts))
    try:
        return Problem.build(tasks, [(a, b) for a, b in m.edges], idle, trans or None,
                             m.name if m.name is not None else os.path.basename(file),
                             steady_state=m.steady_state)
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
            if o.terms:
                od.update(o.terms.to_dict())
            opts.append(od)
        tasks.append({"name": t.name, "device": t.device, "options": opts})
    out: dict[str, Any] = {"format": KINDS["problem"].tag, "name": p.name, "devices": devs, "tasks": tasks,
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
