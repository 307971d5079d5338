"""Characterize every option of a workload at two or more entry temperatures (``ecal contexts``).

For each device of a workload (or those named), every distinct ``element@ω`` of its tasks'
options (:func:`execution.reorder.option_keys`) is run entered cold (cooled to the null
context) and pre-heated to each warm target (:mod:`measure.entry_probe`), and the device's
first-order thermal model is fitted to the windows those runs and cooldowns gave
(:func:`execution.reorder.characterize_device` with ``all_options=True``). The result is
what :func:`execution.reorder.contexts_document` writes as ``ecal.contexts/1`` and a
planner composing with the entry context reads (:func:`execution.reorder.read_contexts`).

Devices are opened as ``ecal reorder`` opens them: ``sim`` gives each plan device its own
simulated H200, seeded ``seed + i`` (``i``: the device's place among the workload's devices,
sorted), ``nvml:N`` characterizes every plan device in turn on that GPU; each is put back as
found (:func:`measure.device.restoring`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from frontier.errors import InputError
from measure.progress import ProgressCallback

from .reorder import DEFAULT_WARM_C, Characterized, characterize_device, option_keys
from .workload import Workload, load_workload

__all__ = ["EntryChange", "characterize_contexts", "plan_contexts_keys", "relative_changes"]

log = logging.getLogger(__name__)


def plan_contexts_keys(wl: Workload) -> dict[str, set[str]]:
    """Per device of ``wl``: the ``element@ω`` keys a contexts file must hold for it (every
    option of every task on it)."""
    devices = sorted({t.device for t in wl.problem.tasks})
    return {d: set(option_keys(wl, d)) for d in devices}


def _devices(wl: Workload, named: Iterable[str] | None) -> list[str]:
    """The workload's devices (sorted), or those ``named`` (each must be one of them)."""
    every = sorted({t.device for t in wl.problem.tasks})
    if named is None:
        return every
    out = list(dict.fromkeys(named))
    unknown = [d for d in out if d not in every]
    if unknown or not out:
        raise InputError(f"{wl.file}: no device {', '.join(map(repr, unknown)) or '(none named)'} "
                         f"(has: {', '.join(every)})")
    return out


def _check(wl: Workload, devices: Sequence[str], warm_c: Sequence[float], repeats: int) -> None:
    """What would fail after a device was opened, checked before: the runs, the warm targets
    and every element's work."""
    if repeats < 2:
        raise InputError(f"repeats must be >= 2 (a σ needs two runs), got {repeats}")
    if not warm_c:
        raise InputError("give at least one warm entry temperature (two entry contexts in all)")
    for d in devices:
        for el in sorted({el for el, _om in option_keys(wl, d).values()}):
            if el not in wl.works:
                raise InputError(f"{wl.file}: elements.{el}: no work to run; add \"work\" (what "
                                 "ecal characterize measured, e.g. \"module:factory\")")


def characterize_contexts(workload_file: str | os.PathLike, *, device: str = "sim", seed: int = 0,
                          warm_c: Sequence[float] = (DEFAULT_WARM_C,), repeats: int = 2,
                          devices: Iterable[str] | None = None,
                          progress: ProgressCallback | None = None) -> dict[str, Characterized]:
    """Every option of every device of ``workload_file`` (or of ``devices``) characterized on
    ``device`` (``sim`` or ``nvml:N``) entered cold and at each ``warm_c`` target, ``repeats``
    runs each; per device its contexts and fitted thermal model. ``progress`` gets one event
    per key and entry target."""
    from measure.device import restoring
    from measure.factory import open_device

    wl = load_workload(workload_file, require_transitions=False)
    every = sorted({t.device for t in wl.problem.tasks})
    names = _devices(wl, devices)
    _check(wl, names, warm_c, repeats)
    chars: dict[str, Characterized] = {}
    for d in names:
        log.info("%s: characterizing %d option(s) at entry cold and %s °C", d,
                 len(option_keys(wl, d)), ", ".join(f"{t:g}" for t in warm_c))
        gpu = open_device(device, seed=seed + every.index(d))
        try:
            with restoring(gpu):
                chars[d] = characterize_device(wl, gpu, d, warm_c=warm_c, repeats=repeats,
                                               all_options=True, progress=progress)
        finally:
            gpu.close()
        m = chars[d].mechanism
        log.info("%s: thermal model ambient %.1f °C, R_th %.4f °C/W, tau %.2f s", d, m.ambient_c,
                 m.r_th_c_per_w, m.tau_s)
    return chars


@dataclass(frozen=True)
class EntryChange:
    """One key's change from its coldest entry to its warmest: relative changes of time and
    energy (warm / cold − 1) with their σ (first order, the two entries independent)."""

    time: float
    sd_time: float
    energy: float
    sd_energy: float
    cold_c: float
    warm_c: float


def _ratio(warm: float, var_warm: float, cold: float, var_cold: float) -> tuple[float, float]:
    """warm / cold − 1 and its σ (first order)."""
    if cold <= 0:
        return 0.0, 0.0
    r = warm / cold
    return r - 1.0, math.sqrt(var_warm / cold**2 + r**2 * var_cold / cold**2)


def relative_changes(ch: Characterized) -> dict[str, EntryChange]:
    """Per key of ``ch``: its :class:`EntryChange` from the coldest entry to the warmest."""
    out = {}
    for k, cs in ch.contexts.items():
        temps = sorted(cs.by_entry_c)
        c, w = cs.by_entry_c[temps[0]], cs.by_entry_c[temps[-1]]
        t = _ratio(w.time_s, w.var_time_s2, c.time_s, c.var_time_s2)
        e = _ratio(w.energy_j, w.var_energy_j2, c.energy_j, c.var_energy_j2)
        out[k] = EntryChange(t[0], t[1], e[0], e[1], temps[0], temps[-1])
    return out
