"""Baselines a plan is measured against: the all-top-clock plan, and the baselines file that
names further plan files (``{"format": "ecal.baselines/1", "baselines": {name: plan file}}``;
the older ``"format": "energy-calculus/baselines", "version": 1`` is still read)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frontier.files import read_json
from frontier.formats import KINDS, content, validate
from solvers.model import Problem
from solvers.plan import Plan, make_plan

from .work import ExecutionError

#: ``format`` of a baselines file (the one definition; ``ecal demo`` writes it).
BASELINES_FORMAT = KINDS["baselines"].tag


def all_max_plan(problem: Problem, deadline_s: float) -> Plan:
    """Every task at the top clock and power limit among its own options, with its fastest SM
    split: the baseline ``ecal run`` measures savings against. (Per task: an element given as
    a frontier may lack the device's top point, where another point dominates it.)"""
    choice = []
    for t in problem.tasks:
        top = max(o.omega.dev for o in t.options)
        cands = [j for j, o in enumerate(t.options) if o.omega.dev == top]
        choice.append(min(cands, key=lambda j: (t.options[j].time_s, t.options[j].energy_j)))
    # The top clock is not always the fastest point (a capped element can run as fast lower),
    # so this baseline may miss a deadline the plan keeps: it is judged by the deadline or its
    # own makespan, whichever is later, and its report says when it missed.
    makespan_s = problem.index.schedule(choice)[2]
    return make_plan(problem, choice, max(deadline_s, makespan_s), method="baseline: all max clock",
                     lower_bound_j=0.0, wall_s=0.0)


def baselines_to_dict(baselines: Mapping[str, str], *, simulated: bool | str = False
                      ) -> dict[str, Any]:
    """The baselines file naming ``baselines`` (name → plan file, relative to this file)."""
    return {"format": BASELINES_FORMAT, "simulated": simulated, "baselines": dict(baselines)}


def read_baselines(path: str | os.PathLike) -> dict[str, Path]:
    """Name → plan file of a baselines file (paths resolved against its folder); every fault
    is a one-line :class:`FormatError` or :class:`ExecutionError` naming the file. The shape
    is :class:`execution.format_models.BaselinesFile`; checked here: each plan file exists."""
    from .format_models import BaselinesFile

    path = Path(path)
    file = os.fspath(path)
    _, body = content(file, read_json(path), "baselines")
    out = {}
    for name, f in validate(BaselinesFile, body, file).baselines.items():
        p = Path(f) if Path(f).is_absolute() else path.parent / f
        if not p.is_file():
            raise ExecutionError(f"{file}: baselines.{name}: {os.fspath(p)}: no such file")
        out[name] = p
    return out
