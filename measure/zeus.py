"""Zeus interop: import what Zeus measured, export plans in the form Zeus deploys.

Zeus (``pip install zeus``, ml-energy/zeus) is optional: nothing here imports it. The forms
read and written are Zeus's own, as of zeus 0.16:

* **ZeusMonitor windows.** ``ZeusMonitor.end_window(name)`` returns a ``Measurement``
  (``time`` s, ``gpu_energy`` {GPU index: J}); with ``log_file=`` the monitor appends one CSV
  row per window: ``start_time,window_name,elapsed_time,gpu{i}_energy,...``.
  :func:`from_measurements` takes ``Measurement`` objects (or anything with ``time`` and
  ``gpu_energy``); :func:`load_zeus_monitor_log` reads the CSV. Both give **one element per
  window name and per GPU**, ``{window}/gpu{i}`` on device ``gpu{i}``; repeated windows of
  one name are runs of one signature (mean, variance of the mean). Zeus records no clocks:
  the signatures carry the ``omega`` given (default: unknown, ``OperatingPoint()``), except the
  power-limit optimizer's windows ``__GlobalPowerLimitOptimizer_{W}``, whose ``W`` becomes
  ``power_limit_w`` of the element ``{name}/gpu{i}`` (``name``: the file stem by default).
* **Power-limit optimizer profiles.** ``GlobalPowerLimitOptimizer(profile_path=...)`` writes
  JSON ``{"measurements": [{"power_limit": W, "energy": J, "time": s}, ...]}``: per power
  limit, the energy of all GPUs of the job summed and the slowest GPU's time over
  ``profile_steps`` steps (default 40). :func:`load_zeus_plo_profile` gives one element with
  one signature per power limit (``steps=`` divides by the steps, for per-step signatures).
* **Pipeline frequency optimizer (Perseus).** Zeus deploys a per-stage schedule through its
  PFO server's ``PointSolution`` scheduler: a Python file holding, per rank, the list of
  ``(instruction, frequency MHz)`` of one iteration in execution order, instruction
  ``"forward"`` or ``"backward"`` (``ZEUS_PFO_SCHEDULER=PointSolution``,
  ``ZEUS_PFO_SCHEDULER_ARGS='{"solution_path": "freqs.py"}'``; ``PointSolution3D`` copies
  each stage's list to its data- and tensor-parallel ranks). :func:`pfo_frequencies` turns
  an ``ecal.schedule/1`` file or an ``ecal.plan/1`` plan into that; :func:`pfo_text` /
  :func:`pfo_json` write it as the ``.py`` solution file or the JSON list of
  ``FrequencySchedule`` objects.

**What Zeus cannot carry.** The PFO sets only the SM clock: it puts the power limit back to
the default and locks the memory clock at its maximum, and has no SM allocation. A plan's
``power_limit_w``, ``mem_clock_mhz`` and ``sm_count`` are dropped, each named in the
warnings :func:`pfo_frequencies` returns (``ecal export zeus-pfo`` prints them on stderr); a
task without an SM clock gets frequency 0, which the PFO skips (the clock stays as it is).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier.errors import FormatError
from frontier.files import check_unique_rows, csv_number, read_csv
from frontier.formats import check_format
from frontier.operating_point import OperatingPoint
from frontier.signature import Signature

from .replay import Signatures, data_path

#: Window names of Zeus's ``GlobalPowerLimitOptimizer`` (the suffix is the power limit, W).
PLO_WINDOW = re.compile(r"^__GlobalPowerLimitOptimizer_(\d+(?:\.\d+)?)$")
_GPU_COL = re.compile(r"^gpu(\d+)_energy$")
_PIPE_TASK = re.compile(r"^s(\d+)(?:v(\d+))?/(forward|backward)/(\d+)$")
_DROPPED = {"power_limit_w": "power limits", "mem_clock_mhz": "memory clocks",
            "sm_count": "SM allocations"}


def _assumption(s_w: float) -> str:
    return (f"given: {s_w:g} W per GPU" if s_w else
            "none recorded: s = 0 W (all energy counted as dynamic)")


def _signatures(groups: Mapping[tuple[str, str, OperatingPoint], list[tuple[float, float]]],
                s_w: float, meta: Mapping[str, Any]) -> Signatures:
    out: Signatures = defaultdict(list)
    for (name, gpu, omega), runs in sorted(groups.items(), key=lambda kv: kv[0]):
        out[name].append(Signature.from_runs(
            name, [r[0] for r in runs], [r[1] for r in runs], s_w=s_w, omega=omega,
            devices=frozenset({gpu}), meta={**meta, "zeus_gpu": gpu}))
    return dict(out)


def _element(window: str, gpu: int, plo_name: str, omega: OperatingPoint
             ) -> tuple[str, OperatingPoint]:
    m = PLO_WINDOW.match(window)
    if m:
        return f"{plo_name}/gpu{gpu}", OperatingPoint(power_limit_w=float(m.group(1)))
    return f"{window}/gpu{gpu}", omega


def from_measurements(windows: Mapping[str, Any], *, omega: OperatingPoint | None = None,
                      static_power_w: float = 0.0, plo_name: str = "power_limit_optimizer",
                      source: str = "<measurements>") -> Signatures:
    """Signatures from ZeusMonitor ``Measurement`` objects: ``windows`` maps a window name
    to one measurement or a list of them (repeated windows: runs). One element per window
    name and per GPU index (``{window}/gpu{i}``; see module doc)."""
    om = omega or OperatingPoint()
    groups: dict[tuple[str, str, OperatingPoint], list[tuple[float, float]]] = defaultdict(list)
    for window, ms in windows.items():
        for k, m in enumerate(ms if isinstance(ms, (list, tuple)) else [ms]):
            where = f"window {window!r} measurement {k}"
            t = getattr(m, "time", None)
            energy = getattr(m, "gpu_energy", None)
            if not isinstance(t, (int, float)) or not t > 0 or not isinstance(energy, Mapping):
                raise FormatError(source, where, "expected a Measurement with time > 0 s and "
                                                 "gpu_energy {GPU index: J}")
            if not energy:
                raise FormatError(source, where, "no GPU energy in it (gpu_energy is empty)")
            for gpu, e in sorted(energy.items()):
                if not isinstance(e, (int, float)) or not e > 0:
                    raise FormatError(source, f"{where} GPU {gpu}",
                                      f"energy must be > 0 J, got {e!r} (a window shorter than "
                                      "the counter period reads 0: use longer windows)")
                name, o = _element(str(window), int(gpu), plo_name, om)
                groups[(name, f"gpu{int(gpu)}", o)].append((float(t), float(e)))
    return _signatures(groups, static_power_w, {
        "source": "zeus-monitor", "source_file": source, "unit": "one measurement window",
        "static_power_assumption": _assumption(static_power_w)})


def load_zeus_monitor_log(path: str | os.PathLike, *, omega: OperatingPoint | None = None,
                          static_power_w: float = 0.0, plo_name: str | None = None) -> Signatures:
    """A ZeusMonitor ``log_file`` CSV (``start_time,window_name,elapsed_time,gpu{i}_energy``):
    one element per window name and per GPU (module doc). The same window at another
    ``start_time`` is another run; at the same start time it is a duplicate (an error naming
    both lines). ``plo_name`` (default: the file stem) names the power-limit optimizer's
    element."""
    p = data_path(path)
    header, rows = read_csv(p, ("window_name", "elapsed_time"))
    gpus = sorted((int(m.group(1)), c) for c in header if (m := _GPU_COL.match(c)))
    if not gpus:
        raise FormatError(str(p), "header", "no gpuN_energy column (a ZeusMonitor log has one "
                                            "per monitored GPU)")
    om = omega or OperatingPoint()
    name = plo_name or p.stem
    groups: dict[tuple[str, str, OperatingPoint], list[tuple[float, float]]] = defaultdict(list)
    keyed = []
    for r in rows:
        window = r["window_name"].strip()
        if not window:
            raise FormatError(str(p), f"line {r.line}, column window_name", "empty window name")
        t = csv_number(str(p), r, "elapsed_time", minimum=0.0, strict=True)
        when = r.cells.get("start_time")
        key = (window, when) if when is not None else tuple(sorted(r.cells.items()))
        keyed.append((r, key, f"window {window!r}" + (f" at start_time {when}" if when else "")))
        for gpu, col in gpus:
            e = csv_number(str(p), r, col, minimum=0.0, strict=True)
            element, o = _element(window, gpu, name, om)
            groups[(element, f"gpu{gpu}", o)].append((t, e))
    check_unique_rows(str(p), keyed, "window")
    return _signatures(groups, static_power_w, {
        "source": "zeus-monitor", "source_file": str(p), "unit": "one measurement window",
        "static_power_assumption": _assumption(static_power_w)})


def load_zeus_plo_profile(path: str | os.PathLike, *, name: str | None = None,
                          static_power_w: float = 0.0, n_gpus: int = 1,
                          steps: int | None = None) -> Signatures:
    """A ``GlobalPowerLimitOptimizer`` profile (JSON ``{"measurements": [{"power_limit",
    "energy", "time"}]}``; a ``.csv`` is read as its monitor log instead). One element
    (``name``, default the file stem) on ``n_gpus`` GPUs, one signature per power limit;
    ``steps`` (the optimizer's ``profile_steps``) makes them per training step."""
    p = data_path(path)
    if p.suffix.lower() == ".csv":
        return load_zeus_monitor_log(p, static_power_w=static_power_w, plo_name=name)
    try:
        doc = json.loads(p.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(str(p), "$", f"not a JSON power-limit profile: {exc}") from None
    ms = doc.get("measurements") if isinstance(doc, Mapping) else None
    if not isinstance(ms, list) or not ms:
        raise FormatError(str(p), "measurements", "expected a non-empty list (the JSON "
                                                  "GlobalPowerLimitOptimizer(profile_path=) writes)")
    if int(n_gpus) < 1 or (steps is not None and int(steps) < 1):
        raise FormatError(str(p), "$", "n_gpus and steps must be >= 1")
    element = name or p.stem
    div = float(steps or 1)
    seen: dict[float, int] = {}
    sigs = []
    for i, m in enumerate(ms):
        vals = {}
        for k in ("power_limit", "energy", "time"):
            v = m.get(k) if isinstance(m, Mapping) else None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise FormatError(str(p), f"measurements[{i}].{k}", f"expected a number > 0, got {v!r}")
            vals[k] = float(v)
        if vals["power_limit"] in seen:
            raise FormatError(str(p), f"measurements[{i}].power_limit",
                              f"{vals['power_limit']:g} W also in measurements[{seen[vals['power_limit']]}]")
        seen[vals["power_limit"]] = i
        devs = frozenset(f"gpu{g}" for g in range(int(n_gpus)))
        sigs.append(Signature.from_runs(
            element, [vals["time"] / div], [vals["energy"] / div], s_w=static_power_w * int(n_gpus),
            omega=OperatingPoint(power_limit_w=vals["power_limit"]), devices=devs,
            meta={"source": "zeus-plo-profile", "source_file": str(p),
                  "unit": f"{int(steps)} training steps / {int(steps)}" if steps else
                          "the optimizer's profile_steps training steps",
                  "static_power_assumption": _assumption(static_power_w),
                  "note": "energy summed over the job's GPUs, time of the slowest"}))
    sigs.sort(key=lambda s: s.omega.power_limit_w or 0.0)
    return {element: sigs}


# -- export: Zeus's pipeline frequency optimizer ---------------------------------------------

@dataclass(frozen=True)
class PFOSchedule:
    """Per rank (pipeline stage, in rank order), one iteration's ``(instruction, MHz)`` list,
    the device each rank came from, and what could not be carried (one line each)."""

    frequencies: tuple[tuple[tuple[str, int], ...], ...]
    devices: tuple[str, ...]
    warnings: tuple[str, ...]


def _instruction(task: str, file: str, where: str) -> str:
    m = _PIPE_TASK.match(task)
    if not m:
        raise FormatError(file, where, f"task {task!r} is not a pipeline task "
                                       "(s{stage}/forward|backward/{microbatch}): Zeus's pipeline "
                                       "frequency optimizer knows only forward and backward")
    return m.group(3)


def _rank_order(devices: Sequence[str], ranks: Any) -> list[str]:
    if isinstance(ranks, list) and ranks and all(r in devices for r in ranks):
        return list(ranks)
    stage = {d: int(m.group(1)) for d in devices if (m := re.fullmatch(r"stage(\d+)", d))}
    if len(stage) == len(devices):
        return sorted(devices, key=lambda d: stage[d])
    return list(devices)


def _plan_kind(doc: Any, file: str) -> str:
    """``"schedule"`` or ``"plan"``: which of the two files ``doc`` is, in its current form or
    an older one (:func:`frontier.formats.check_format`); a one-line error otherwise."""
    for kind in ("schedule", "plan"):
        try:
            check_format(file, doc, kind)
        except FormatError:
            continue
        return kind
    raise FormatError(file, "format", "expected an ecal.schedule/1 file (ecal plan --schedule) "
                                      "or an ecal.plan/1 plan (ecal plan -o)")


def pfo_frequencies(doc: Mapping[str, Any], file: str = "<plan>") -> PFOSchedule:
    """The PFO form of an ``ecal.schedule/1`` document or an ``ecal.plan/1`` plan (tasks
    grouped per device, in start order). Ranks follow the schedule's ``ranks`` list, else
    ``stage{N}`` order, else file order."""
    per_dev: dict[str, list[Mapping[str, Any]]] = {}
    ranks = None
    kind = _plan_kind(doc, file)
    if kind == "schedule":
        devs = doc.get("devices")
        if not isinstance(devs, Mapping) or not devs:
            raise FormatError(file, "devices", "expected a non-empty object of device -> tasks")
        per_dev = {d: list(v) for d, v in devs.items()}
        ranks = doc.get("ranks")
    else:
        tasks = doc.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            raise FormatError(file, "tasks", "expected a non-empty list")
        for t in sorted(tasks, key=lambda t: (str(t.get("device")), float(t.get("start_s", 0.0)))):
            per_dev.setdefault(str(t.get("device")), []).append(
                {"task": t.get("name"), "sm_clock_mhz": t.get("sm_clock_mhz")})
    dropped: dict[str, set[str]] = defaultdict(set)
    no_clock = 0
    out = []
    order = _rank_order(list(per_dev), ranks)
    for dev in order:
        freqs = []
        for i, e in enumerate(per_dev[dev]):
            where = f"devices.{dev}[{i}]"
            if not isinstance(e, Mapping) or not isinstance(e.get("task"), str):
                raise FormatError(file, where, "expected an object with a 'task' name")
            inst = _instruction(e["task"], file, f"{where}.task")
            for k in _DROPPED:
                if e.get(k) is not None:
                    dropped[k].add(dev)
            f = e.get("sm_clock_mhz")
            if f is None:
                no_clock += 1
                freqs.append((inst, 0))
            else:
                freqs.append((inst, int(round(float(f)))))
        out.append(tuple(freqs))
    warns = [f"{_DROPPED[k]} cannot be carried to Zeus's pipeline frequency optimizer (it sets "
             f"only the SM clock; power limit back to default, memory clock at its maximum): "
             f"dropped on {', '.join(sorted(devs))}" for k, devs in dropped.items()]
    if no_clock:
        warns.append(f"{no_clock} task(s) have no SM clock: frequency 0 (the PFO leaves the clock "
                     "as it is)")
    return PFOSchedule(tuple(out), tuple(order), tuple(warns))


def pfo_text(s: PFOSchedule) -> str:
    """The ``PointSolution`` solution file (``solution_path``, a ``.py`` file the PFO server
    evaluates): a list per rank of ``(instruction, frequency)`` tuples."""
    lines = ["# Per-rank (instruction, SM clock MHz) of one iteration, written by `ecal export "
             "zeus-pfo`.", "# Deploy: ZEUS_PFO_SCHEDULER=PointSolution ZEUS_PFO_SCHEDULER_ARGS="
             "'{\"solution_path\": \"<this file>\"}'", "# ranks: " + ", ".join(s.devices), "["]
    for freqs in s.frequencies:
        lines.append("    [" + ", ".join(f"({i!r}, {f})" for i, f in freqs) + "],")
    lines.append("]")
    return "\n".join(lines) + "\n"


def pfo_json(s: PFOSchedule) -> list[dict[str, Any]]:
    """The JSON form: a list of Zeus ``FrequencySchedule`` objects (``{"rank", "frequencies"}``),
    as the PFO server's ``*.sched.json`` dumps hold them."""
    return [{"rank": r, "frequencies": [[i, f] for i, f in freqs]}
            for r, freqs in enumerate(s.frequencies)]


def read_plan_or_schedule(path: str | os.PathLike) -> Mapping[str, Any]:
    """A JSON plan or schedule file, with a one-line :class:`FormatError` when it is not JSON."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(str(p), "$", f"not JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise FormatError(str(p), "$", "expected a JSON object")
    return doc
