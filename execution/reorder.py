"""Reorder a workload's free groups of tasks (``reorderable``): characterize, predict, write.

For each group of a workload (:attr:`execution.workload.Workload.reorderable`) this module

1. characterizes, on the device, every element that runs on the group's device at two or
   more entry temperatures (:mod:`measure.entry_probe`: cooled to the null context, and
   pre-heated to each warm target), one operating point per element (its only signature);
2. fits the device's first-order thermal model to the windows those runs and cooldowns
   gave (:func:`frontier.context.fit_thermal`) and its resolution σ_Θ
   (:func:`frontier.reorder.temperature_sigma_c`);
3. searches the group's orders with the context-carrying composition of the device's whole
   step (:func:`frontier.reorder.reorder`): at the periodic fixed point (``entry="periodic"``,
   the default: steps run back to back, as ``ecal run`` runs them) or a single pass from the
   cold entry (``"cold"``) or a given temperature;
4. writes the workload with each group in the order substituted (an order whose exit context
   is not equivalent downstream is refused, Property 5.1 (ii)).

Every task of the device is composed with its entry context (the record says so per task);
tasks on other devices are not touched (thermal state is per device).
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier.context import ContextualSignature, ThermalMechanism, ThermalObservation, fit_thermal
from frontier.errors import InputError
from frontier.files import read_json
from frontier.operating_point import OperatingPoint
from frontier.reorder import MAX_ORDERS, ReorderResult, reorder, temperature_sigma_c
from measure.device import Device, restoring
from measure.entry_probe import entry_runs, entry_signature
from measure.factory import load_work
from measure.progress import ProgressCallback, ProgressEvent, eta_s, report
from measure.protocol import Protocol, measure_ready_power_w

from .workload import Workload, load_workload

log = logging.getLogger(__name__)

#: Default warm entry target, °C (the simulated H200's hottest steady die is ~64 °C).
DEFAULT_WARM_C = 60.0
#: The heater a simulated device is pre-heated with (its hottest calibrated kernel).
SIM_HEATER = "gemm_bf16_8192"


@dataclass(frozen=True)
class Characterized:
    """Elements characterized at entry temperatures on one device: the contextual signature
    of each (element, ω) key, the fitted mechanism, its σ_Θ and the windows it came from."""

    contexts: Mapping[str, ContextualSignature]
    mechanism: ThermalMechanism
    sigma_temp_c: float
    observations: tuple[ThermalObservation, ...]


@dataclass(frozen=True)
class GroupReorder:
    """One group's outcome: its device, its tasks (given order), the order substituted, the
    search result, and per task of the device how it was composed (``"context"`` with its
    entry temperature in the chosen order, or ``"null"``)."""

    device: str
    group: tuple[str, ...]
    chosen: tuple[str, ...]
    result: ReorderResult
    composed: tuple[tuple[str, str, float | None], ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        r = self.result
        return {
            "device": self.device, "group": list(self.group), "chosen": list(self.chosen),
            "substituted": r.substituted, "kept": r.kept, "periodic": r.periodic,
            "given_energy_j": r.given.step.energy_j, "given_time_s": r.given.step.time_s,
            "chosen_energy_j": r.chosen.step.energy_j, "chosen_time_s": r.chosen.step.time_s,
            "sd_step_energy_j": r.given.step.sd_energy_j,
            "saving_j": r.saving_j, "sd_saving_j": r.sd_saving_j,
            "saving_time_s": r.saving_time_s, "sd_saving_time_s": r.sd_saving_time_s,
            "group_saving_j": r.group_saving_j,
            "best_order": [self.group[i] for i in r.best.order],
            "best_saving_j": r.given.step.energy_j - r.best.step.energy_j,
            "sd_best_saving_j": r.sd_best_saving_j,
            "best_saving_time_s": r.given.step.time_s - r.best.step.time_s,
            "entry_temp_c": {"given": r.given.entry_temp_c, "chosen": r.chosen.entry_temp_c},
            "group_exit_temp_c": {"given": r.given.group_exit_temp_c, "chosen": r.chosen.group_exit_temp_c},
            "tolerance_c": r.tolerance_c, "c_alpha": r.c_alpha,
            "orders_evaluated": r.orders_evaluated, "exhaustive": r.exhaustive,
            "refused": [{"order": list(x.names), "saving_j": x.saving_j, "exit_diff_c": x.exit_diff_c,
                         "element": x.element, "delta_energy_j": x.delta_energy_j,
                         "tolerance_j": x.tolerance_j, "reason": x.reason} for x in r.refused],
            "composed": [{"task": t, "composed": how, "entry_temp_c": temp} for t, how, temp in self.composed],
        }


@dataclass(frozen=True)
class WorkloadReorder:
    """:func:`reorder_workload`'s result: the groups, the characterization, and the
    reordered workload document (paths relative to ``output``'s folder)."""

    groups: tuple[GroupReorder, ...]
    characterized: Mapping[str, Characterized]
    document: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {"groups": [g.to_dict() for g in self.groups],
                "thermal": {d: {"ambient_c": c.mechanism.ambient_c,
                                "r_th_c_per_w": c.mechanism.r_th_c_per_w,
                                "tau_s": c.mechanism.tau_s, "sigma_temp_c": c.sigma_temp_c,
                                "windows": len(c.observations),
                                "entry_temps_c": {k: cs.temps_c for k, cs in c.contexts.items()},
                                "signatures": {k: [{"entry_temp_c": t, "time_s": sg.time_s,
                                                    "energy_j": sg.energy_j, "sd_energy_j": sg.sd_energy_j}
                                                   for t, sg in cs.by_entry_c.items()]
                                               for k, cs in c.contexts.items()}}
                            for d, c in self.characterized.items()}}


def _element_key(element: str, omega: OperatingPoint) -> str:
    return f"{element}@{omega.label()}"


def _device_tasks(wl: Workload, device: str) -> list[tuple[str, str, OperatingPoint]]:
    """(task, element, ω) of every task on ``device`` in its order; one ω per element."""
    out = []
    for t in wl.problem.tasks:
        if t.device != device:
            continue
        el = wl.task_elements[t.name]
        omegas = sorted({o.omega.dev for o in t.options}, key=lambda o: o.label())
        if len(omegas) != 1:
            raise InputError(f"{wl.file}: element {el!r} (task {t.name!r}) has {len(omegas)} operating "
                             "points; reorder evaluates one per element: keep one (its kappa, or a "
                             "signature file of one point)")
        out.append((t.name, el, omegas[0]))
    # A knob left unset keeps what the previous task set: its value would depend on the order
    knobs = {tuple(k for k in ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w")
                   if getattr(om, k) is not None) for _t, _el, om in out}
    if len(knobs) > 1:
        shown = " and ".join(f"{{{', '.join(k) or 'none'}}}" for k in sorted(knobs))
        raise InputError(f"{wl.file}: the operating points of the tasks on {device} set different "
                         f"knobs ({shown}): a knob a task leaves unset keeps the previous task's "
                         "value, which reordering would change; characterize every element with "
                         "the same knobs set (e.g. --grid \"sm_clock_mhz=...,power_limit_w=...\")")
    return out


def option_keys(wl: Workload, device: str) -> dict[str, tuple[str, OperatingPoint]]:
    """Every distinct ``element@ω`` key of the options of the tasks on ``device`` (in task
    order, then option order) → (element, ω)."""
    keys: dict[str, tuple[str, OperatingPoint]] = {}
    for t in wl.problem.tasks:
        if t.device != device:
            continue
        el = wl.task_elements[t.name]
        for o in t.options:
            keys.setdefault(_element_key(el, o.omega.dev), (el, o.omega.dev))
    return keys


def _task_keys(wl: Workload, device: str) -> dict[str, tuple[str, OperatingPoint]]:
    """The ``element@ω`` keys of the tasks on ``device``, one ω per element (reorder's)."""
    keys: dict[str, tuple[str, OperatingPoint]] = {}
    for _t, el, om in _device_tasks(wl, device):
        keys.setdefault(_element_key(el, om), (el, om))
    return keys


def _works(wl: Workload, keys: Mapping[str, tuple[str, OperatingPoint]], device: Device,
           search_dir: str | os.PathLike | None) -> dict[str, Any]:
    """The work of each key's element (loaded once per element); every element must name one."""
    loaded: dict[str, Any] = {}
    for el, _om in keys.values():
        if el in loaded:
            continue
        spec = wl.works.get(el)
        if spec is None:
            raise InputError(f"{wl.file}: elements.{el}: no work to run; add \"work\" (what ecal "
                             "characterize measured)")
        loaded[el] = load_work(spec, device=device, search_dir=search_dir).work
    return {k: loaded[el] for k, (el, _om) in keys.items()}


def _pick_heater(device: Device, works: Mapping[str, Any],
                 by_key: Mapping[str, Mapping[float, Any]]) -> Any:
    """The simulated device's hottest calibrated kernel; on a GPU the hottest element's own
    work (highest mean power entered cold)."""
    if getattr(device, "simulated", False):
        from measure.sim import preset

        return preset(SIM_HEATER)
    hot = max(works, key=lambda k: next(iter(by_key[k].values())).power_w)
    return works[hot]


def characterize_device(wl: Workload, device: Device, dev_name: str, *, warm_c: Sequence[float],
                        repeats: int, protocol: Protocol = Protocol(), heater: Any = None,
                        search_dir: str | os.PathLike | None = None, all_options: bool = False,
                        progress: ProgressCallback | None = None) -> Characterized:
    """Every element on ``dev_name`` at ω, entered cold (null context) and at each ``warm_c``
    target, ``repeats`` runs each; the thermal model fitted to all windows.

    ``all_options=False`` (reorder's): the one ω of each task (a task with several is
    refused); ``True``: every distinct ``element@ω`` of every option of the device's tasks
    (:func:`option_keys`), each measured once. ``progress`` gets one event per key and entry
    target (operation ``"contexts DEVICE"``)."""
    if repeats < 2:
        raise InputError(f"repeats must be >= 2 (a σ needs two runs), got {repeats}")
    if not warm_c:
        raise InputError("give at least one warm entry temperature (two entry contexts in all)")
    keys = option_keys(wl, dev_name) if all_options else _task_keys(wl, dev_name)
    works = _works(wl, keys, device, search_dir)
    obs: list[ThermalObservation] = []
    ready: dict[str, float] = {}
    by_key: dict[str, dict[float, Any]] = {k: {} for k in keys}
    total, done, t0 = len(keys) * (1 + len(warm_c)), [0], time.perf_counter()

    def measure(key: str, target: float | None, heat: Any) -> None:
        el, om = keys[key]
        runs = entry_runs(device, works[key], om, target, repeats, heat, protocol, ready[key], obs)
        temp, sig = entry_signature(key, runs, ready[key], om, {"element": el, "work": wl.works[el]})
        by_key[key][temp] = sig
        log.info("%s: %s entered at %.1f °C: T %.4f s, E %.2f ± %.2f J", dev_name, key, temp,
                 sig.time_s, sig.energy_j, sig.sd_energy_j)
        done[0] += 1
        elapsed = time.perf_counter() - t0
        report(progress, ProgressEvent(done[0], total, f"{dev_name} {key} at {temp:.1f} °C", elapsed,
                                       eta_s(elapsed, done[0], total - done[0]), True, sig,
                                       f"contexts {dev_name}"))

    for key, (_el, om) in keys.items():          # cold first: every element from the null context
        device.set_operating_point(om)
        ready[key] = measure_ready_power_w(device, protocol)
        measure(key, None, None)
    heat = heater if heater is not None else _pick_heater(device, works, by_key)
    for key in keys:
        for target in warm_c:
            measure(key, float(target), heat)
    contexts = {k: ContextualSignature(k, v) for k, v in by_key.items()}
    mech = fit_thermal(obs)
    return Characterized(contexts, mech, temperature_sigma_c(mech, obs), tuple(obs))


def reorder_groups(wl: Workload, chars: Mapping[str, Characterized], *, entry: str | float = "periodic",
                   alpha: float = 0.05, max_orders: int = MAX_ORDERS) -> tuple[GroupReorder, ...]:
    """Search every group's orders with the characterized contexts of its device."""
    out = []
    for group in wl.reorderable:
        dev = wl.problem.tasks[wl.problem.index.pos[group[0]]].device
        ch = chars[dev]
        seq = _device_tasks(wl, dev)
        names = [t for t, _, _ in seq]
        elem = {t: ch.contexts[_element_key(el, om)] for t, el, om in seq}
        i0 = names.index(group[0])
        before = [elem[t] for t in names[:i0]]
        after = [elem[t] for t in names[i0 + len(group):]]
        periodic = entry == "periodic"
        if entry == "cold":
            entry_c: float | None = min(min(c.temps_c) for c in elem.values())
        elif periodic:
            entry_c = None
        else:
            entry_c = float(entry)
        res = reorder([elem[t] for t in group], mechanism=ch.mechanism, sigma_temp_c=ch.sigma_temp_c,
                      before=before, after=after, entry_c=entry_c, periodic=periodic, alpha=alpha,
                      max_orders=max_orders)
        chosen = tuple(group[i] for i in res.chosen.order)
        order_names = names[:i0] + list(chosen) + names[i0 + len(group):]
        composed = tuple((t, "context" if temp is not None else "null", temp)
                         for t, temp in zip(order_names, res.chosen.entry_temps_c))
        out.append(GroupReorder(dev, tuple(group), chosen, res, composed))
    return tuple(out)


# -- the contexts file (ecal.contexts/1) ---------------------------------------------------------

def contexts_document(chars: Mapping[str, Characterized], device: str = "",
                      simulated: bool = False) -> dict[str, Any]:
    """The ``ecal.contexts/1`` document of characterized devices (what ``--save-contexts``
    writes): each device's thermal model and every element at its entry temperatures."""
    from frontier.codec import signature_to_dict
    from frontier.formats import KINDS

    return {"format": KINDS["contexts"].tag, "device": device, "simulated": simulated,
            "devices": {d: {"thermal": {"ambient_c": c.mechanism.ambient_c,
                                        "r_th_c_per_w": c.mechanism.r_th_c_per_w,
                                        "tau_s": c.mechanism.tau_s, "sigma_temp_c": c.sigma_temp_c,
                                        "windows": len(c.observations)},
                            "elements": {k: [{"entry_temp_c": t, "signature": signature_to_dict(sg)}
                                             for t, sg in cs.by_entry_c.items()]
                                         for k, cs in c.contexts.items()}}
                        for d, c in chars.items()}}


def read_contexts(path: str | os.PathLike) -> dict[str, Characterized]:
    """The devices of an ``ecal.contexts/1`` file (:func:`contexts_document`)."""
    from frontier.codec import signature_from_dict
    from frontier.formats import content, validate

    from .format_models import ContextsFile

    file = os.fspath(path)
    m = validate(ContextsFile, content(file, read_json(file), "contexts")[1], file)
    out = {}
    for d, dev in m.devices.items():
        ctx = {}
        for k, pts in dev.elements.items():
            by = {p.entry_temp_c: signature_from_dict(p.signature, file,
                                                      f"devices.{d}.elements.{k}[{i}].signature", name=k)
                  for i, p in enumerate(pts)}
            ctx[k] = ContextualSignature(k, by)
        th = dev.thermal
        out[d] = Characterized(ctx, ThermalMechanism(th.ambient_c, th.r_th_c_per_w, th.tau_s),
                               th.sigma_temp_c, ())
    return out


def _check_contexts(wl: Workload, chars: Mapping[str, Characterized], file: str) -> None:
    """Every element on every group's device is in ``chars`` (its ``element@ω`` key)."""
    for g in wl.reorderable:
        dev = wl.problem.tasks[wl.problem.index.pos[g[0]]].device
        if dev not in chars:
            raise InputError(f"{file}: no device {dev!r} (has: {', '.join(sorted(chars)) or 'none'})")
        for t, el, om in _device_tasks(wl, dev):
            key = _element_key(el, om)
            if key not in chars[dev].contexts:
                raise InputError(f"{file}: devices.{dev}: no element {key!r} (task {t!r}); "
                                 "characterize it again (without --contexts)")
            if len(chars[dev].contexts[key].temps_c) < 2:
                raise InputError(f"{file}: devices.{dev}.elements.{key}: one entry temperature; "
                                 "two or more are needed")


# -- the reordered workload document -----------------------------------------------------------

def _rebase(path: str, src_dir: Path, out_dir: Path) -> str:
    p = Path(path)
    if p.is_absolute():
        return path
    return os.path.relpath((src_dir / p).resolve(), out_dir.resolve())


def reordered_document(doc: Mapping[str, Any], workload_file: str | os.PathLike,
                       groups: Sequence[GroupReorder], wl: Workload,
                       output: str | os.PathLike) -> dict[str, Any]:
    """The workload document with each group in its chosen order; relative paths rewritten
    for ``output``'s folder. Chain tasks are written as ``{"name", "element"}`` (a bare
    name's task name depends on its position)."""
    new = copy.deepcopy(dict(doc))
    src_dir, out_dir = Path(workload_file).resolve().parent, Path(output).resolve().parent
    elements = new.get("elements", {})
    for k, v in list(elements.items()):
        if isinstance(v, str):
            elements[k] = _rebase(v, src_dir, out_dir)
        elif isinstance(v, dict) and isinstance(v.get("source"), str):
            v["source"] = _rebase(v["source"], src_dir, out_dir)
    rules = [new.get("transitions")] + [d.get("transitions") for d in new.get("devices", {}).values()
                                        if isinstance(d, dict)]
    for r in rules:
        if isinstance(r, dict) and isinstance(r.get("file"), str):
            r["file"] = _rebase(r["file"], src_dir, out_dir)
    shape = new["shape"]
    names = [t.name for t in wl.problem.tasks]
    if shape["kind"] == "chain":
        entries = [{"name": nm, "element": wl.task_elements[nm]} for nm in names]
        pos = {e["name"]: i for i, e in enumerate(entries)}
        for g in groups:
            slots = sorted(pos[t] for t in g.group)
            by_name = {e["name"]: e for e in entries}
            for slot, t in zip(slots, g.chosen):
                entries[slot] = by_name[t]
        shape["tasks"] = entries
    else:
        tasks = shape["tasks"]
        pos = {t["name"]: i for i, t in enumerate(tasks)}
        for g in groups:
            slots = sorted(pos[t] for t in g.group)
            by_name = {t["name"]: t for t in tasks}
            for slot, t in zip(slots, g.chosen):
                tasks[slot] = by_name[t]
    if groups:
        chosen = {g.group: list(g.chosen) for g in groups}
        new["reorderable"] = [chosen.get(tuple(grp), list(grp)) for grp in wl.reorderable]
    return new


def reorder_workload(workload_file: str | os.PathLike, output: str | os.PathLike, *,
                     device: str = "sim", seed: int = 0, entry: str | float = "periodic",
                     warm_c: Sequence[float] = (DEFAULT_WARM_C,), repeats: int = 5,
                     alpha: float = 0.05, max_orders: int = MAX_ORDERS,
                     contexts: str | os.PathLike | None = None) -> WorkloadReorder:
    """Characterize (on ``device``: ``sim`` or ``nvml:N``; or read ``contexts``, an
    ``ecal.contexts/1`` file, instead), search, and build the reordered workload document
    for ``output`` (not written here)."""
    from measure.factory import open_device

    wl = load_workload(workload_file)
    if not wl.reorderable:
        raise InputError(f"{workload_file}: no \"reorderable\" groups: name the tasks whose order "
                         "is free, e.g. \"reorderable\": [[\"a\", \"b\", \"c\"]] (docs/workload.md)")
    devices = sorted({wl.problem.tasks[wl.problem.index.pos[g[0]]].device for g in wl.reorderable})
    chars: dict[str, Characterized] = {}
    if contexts is not None:
        chars = read_contexts(contexts)
        _check_contexts(wl, chars, os.fspath(contexts))
        devices = []
    for i, d in enumerate(devices):
        gpu = open_device(device, seed=seed + i)
        try:
            with restoring(gpu):
                chars[d] = characterize_device(wl, gpu, d, warm_c=warm_c, repeats=repeats)
        finally:
            gpu.close()
    groups = reorder_groups(wl, chars, entry=entry, alpha=alpha, max_orders=max_orders)
    doc = read_json(str(workload_file))
    return WorkloadReorder(groups, chars, reordered_document(doc, workload_file, groups, wl, output))
