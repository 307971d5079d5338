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


def plan_context(wl: Workload, contexts_file: str | os.PathLike, entry: str | float = "periodic") -> PlanContext:
    """The entry context of ``wl``'s tasks from ``contexts_file``: every option whose
    ``element@ω`` has signatures at two or more entry temperatures on its task's device.
    InputError when none of the workload's options is there (the file is of another
    workload or device); devices and options it lacks are composed at the null context (the
    plan says which)."""
    file = os.fspath(contexts_file)
    chars = read_contexts(file)
    devices = set(wl.problem.index.devices)
    tasks: dict[str, dict[int, ContextualSignature]] = {}
    refs: dict[str, dict[int, float]] = {}
    missing: set[str] = set()
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
            tasks.setdefault(t.name, {})[j] = cs
            ref = wl.characterized_temp_c.get(key)
            if ref is not None:
                refs.setdefault(t.name, {})[j] = ref
    if not tasks:
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


__all__ = ["plan_context"]
