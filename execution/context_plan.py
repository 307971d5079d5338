"""A workload's entry context for the planner: its tasks' contextual signatures (issue 29).

``ecal contexts`` (or ``ecal reorder --save-contexts``) writes an ``ecal.contexts/1`` file:
per device a fitted thermal model and, per ``element@ω``, the element's signatures at two or
more entry temperatures. :func:`plan_context` matches it to a workload's tasks and options
(:class:`solvers.context.PlanContext`), with each option's reference temperature (the die
temperature its own signature was measured at, which the workload's signature files record),
so that ``ecal plan/tune --contexts FILE`` compose every plan with its entry context.
"""

from __future__ import annotations

import logging
import os

from frontier.context import ContextualSignature
from frontier.errors import InputError
from solvers.context import PlanContext

from .reorder import _element_key, read_contexts
from .workload import Workload

log = logging.getLogger(__name__)


#: Two-sided z an option's change from its coolest to its warmest entry must pass, on time or
#: on energy, to be composed in context (Eq. 23's c_α at α = 0.05).
MIN_Z = 1.96


def sensitive(cs: ContextualSignature, min_z: float = MIN_Z) -> bool:
    """Whether ``cs`` changes with its entry temperature beyond its own error: the warmest
    point against the coolest, |Δ|/sqrt(σ²_cold + σ²_warm) ≥ ``min_z`` on time or on energy.
    An option that does not is composed at the null context (the Reduction Theorem's use: drop
    the context where it is not measured to matter). Without the test a planner prefers the
    options whose noise happens to favour them (a shift 1σ faster when warm is chosen, then
    runs as fast as cold)."""
    lo, hi = cs.by_entry_c[cs.temps_c[0]], cs.by_entry_c[cs.temps_c[-1]]
    for d, v in ((hi.time_s - lo.time_s, lo.var_time_s2 + hi.var_time_s2),
                 (hi.energy_j - lo.energy_j, lo.var_energy_j2 + hi.var_energy_j2)):
        if v <= 0.0 and d != 0.0 or v > 0.0 and abs(d) >= min_z * v ** 0.5:
            return True
    return False


def plan_context(wl: Workload, contexts_file: str | os.PathLike, entry: str | float = "periodic",
                 min_z: float = MIN_Z) -> PlanContext:
    """The entry context of ``wl``'s tasks from ``contexts_file``: every option whose
    ``element@ω`` has signatures at two or more entry temperatures on its task's device and
    changes with them beyond its error (:func:`sensitive`; ``min_z`` 0 keeps every one).
    InputError when none of the workload's options is there (the file is of another
    workload or device); devices and options it lacks are composed at the null context (the
    plan says which)."""
    file = os.fspath(contexts_file)
    chars = read_contexts(file)
    devices = set(wl.problem.index.devices)
    tasks: dict[str, dict[int, ContextualSignature]] = {}
    refs: dict[str, dict[int, float]] = {}
    missing: set[str] = set()
    insensitive: set[str] = set()
    for t in wl.problem.tasks:
        dev = chars.get(t.device)
        if dev is None:
            continue
        el = wl.task_elements.get(t.name, t.name)
        for j, o in enumerate(t.options):
            key = _element_key(el, o.omega.dev)
            cs = dev.contexts.get(key)
            if cs is None or len(cs.temps_c) < 2:
                missing.add(key)
                continue
            if not sensitive(cs, min_z):
                insensitive.add(key)
                continue
            tasks.setdefault(t.name, {})[j] = cs
            ref = wl.characterized_temp_c.get(key)
            if ref is not None:
                refs.setdefault(t.name, {})[j] = ref
    if insensitive:
        log.info("%s: %d element@ω option(s) change with the entry temperature within their error "
                 "(z < %g): composed at the null context", file, len(insensitive), min_z)
    if not tasks and insensitive:
        log.warning("%s: no option of %s changes with its entry temperature beyond its error: "
                    "every task is composed at the null context", file, wl.file)
    elif not tasks:
        have = sorted({k for c in chars.values() for k in c.contexts})[:4]
        raise InputError(f"{file}: none of {wl.file}'s task options is characterized at two or more "
                         f"entry temperatures on its device (the file has {', '.join(have) or 'nothing'} "
                         f"on {', '.join(sorted(chars)) or 'no device'}); run ecal contexts {wl.file}")
    lacking = sorted(devices - set(chars))
    if lacking:
        log.warning("%s: no thermal model for %s: their tasks are composed at the null context",
                    file, ", ".join(lacking))
    if missing:
        log.warning("%s: %d element@ω option(s) not characterized in context (e.g. %s): composed at "
                    "the null context when chosen", file, len(missing), sorted(missing)[0])
    return PlanContext({d: c.mechanism for d, c in chars.items() if d in devices}, tasks, entry,
                       source=file, reference_c=refs)


__all__ = ["plan_context", "sensitive", "MIN_Z"]
