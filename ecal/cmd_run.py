"""``ecal run PLAN --device sim``: execute a plan, measure it, hold it against Eq. 23.

The plan file is one ``ecal demo`` writes (``demo/plan.json``) or any ``ecal plan`` output that
names a runnable workload: a ``"workload"`` object with the problem file the plan was made for
and the work table (what each task's options run; ``measure.execute.save_work``), paths
relative to the plan file::

    {"schema_version": "ecal.plan/1", ..., "tasks": [...],
     "workload": {"problem": "problem.json",        # solvers.io JSON problem format
                  "work": "work.json",              # measure.execute work-table format
                  "baselines": "baselines.json"}}   # optional: plans to measure savings against

``baselines.json`` (``{"format": "energy-calculus/baselines", "version": 1, "baselines":
{name: plan file}}``) names further plan files, each with its own workload; each is run like
the plan and the measured savings (with σ) against each are reported.

``--device sim`` runs every plan device on its own simulated H200 (``measure.run_plan``).
``--device nvml:N`` is refused for now: a real run needs the work as callables (issue 20).
Exit status 0 when run (a flagged deviation is a result, not an error; see ``flagged`` in the
output), 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frontier.errors import EnergyCalculusError, FormatError

BASELINES_FORMAT = "energy-calculus/baselines"
_WORKLOAD_FIELDS = ("problem", "work", "baselines")


class RunInputError(EnergyCalculusError):
    """A plan file that cannot be run (no workload, a missing file, another device)."""


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ecal run`` arguments (the parser itself is made by ``ecal.cli``)."""
    p.add_argument("plan", help="plan file naming its workload (e.g. demo/plan.json from ecal demo)")
    p.add_argument("--device", default="sim",
                   help="sim: one simulated H200 per plan device (default); nvml:INDEX is not yet "
                        "supported (issue 20)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (default 0, as ecal demo)")
    p.add_argument("--target-rse", type=float, default=0.01,
                   help="repeat steps until the step energy's relative standard error is this")
    p.add_argument("--no-baselines", action="store_true",
                   help="run the plan only, not the baselines its workload names")
    p.add_argument("-o", "--output", default=None, help="execution result to write (JSON)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")


def _check_device(device: str) -> None:
    if device == "sim":
        return
    if device.startswith("nvml:"):
        raise RunInputError(f"--device {device}: single-GPU real runs need the plan's work as "
                            "callables, which work tables do not hold yet (issue 20); use --device sim")
    raise RunInputError(f"--device {device!r}: use sim (simulated H200s)")


def _path(base: Path, file: str, field: str, plan_file: str) -> Path:
    if not isinstance(file, str) or not file:
        raise FormatError(plan_file, f"workload.{field}", f"must be a file name, got {file!r}")
    p = Path(file)
    p = p if p.is_absolute() else base / p
    if not p.is_file():
        raise RunInputError(f"{plan_file}: workload.{field}: {os.fspath(p)}: no such file")
    return p


def load_runnable(plan_file: str | os.PathLike) -> tuple[Any, Any, Any, dict[str, Path]]:
    """(plan, problem, work table, {field: path}) of a runnable plan file; every problem is a
    one-line error naming the file and field."""
    from frontier.io import read_json
    from measure.execute import load_work
    from solvers.io import load_problem
    from solvers.plan import Plan

    file = os.fspath(plan_file)
    if not Path(file).is_file():
        raise FileNotFoundError(2, "no such file", file)
    doc = read_json(file)
    if not isinstance(doc, Mapping):
        raise FormatError(file, "$", "a plan must be a JSON object")
    wl = doc.get("workload")
    if wl is None:
        raise RunInputError(f"{file}: the plan names no workload (a 'workload' with its 'problem' "
                            "and 'work' files); ecal demo writes runnable plans (demo/plan.json)")
    if not isinstance(wl, Mapping):
        raise FormatError(file, "workload", "must be an object with 'problem' and 'work'")
    extra = sorted(set(wl) - set(_WORKLOAD_FIELDS))
    if extra:
        raise FormatError(file, f"workload.{extra[0]}", f"unknown field (allowed: {', '.join(_WORKLOAD_FIELDS)})")
    for k in ("problem", "work"):
        if k not in wl:
            raise FormatError(file, f"workload.{k}", "missing")
    plan = Plan.from_dict(doc, file)
    base = Path(file).parent
    paths = {k: _path(base, wl[k], k, file) for k in _WORKLOAD_FIELDS if k in wl}
    problem = load_problem(paths["problem"])
    work = load_work(paths["work"])
    return plan, problem, work, paths


def _baselines(path: Path) -> dict[str, Path]:
    from frontier.io import read_json

    doc = read_json(path)
    file = os.fspath(path)
    if not isinstance(doc, Mapping) or doc.get("format") != BASELINES_FORMAT:
        raise FormatError(file, "format", f"expected {BASELINES_FORMAT!r}")
    if doc.get("version") != 1:
        raise FormatError(file, "version", f"expected 1, got {doc.get('version')!r}")
    extra = sorted(set(doc) - {"format", "version", "simulated", "baselines", "description"})
    if extra:
        raise FormatError(file, extra[0], "unknown field")
    bl = doc.get("baselines")
    if not isinstance(bl, Mapping) or not bl:
        raise FormatError(file, "baselines", "must be a non-empty object: name -> plan file")
    out = {}
    for name, f in bl.items():
        if not isinstance(f, str) or not f:
            raise FormatError(file, f"baselines.{name}", f"must be a plan file name, got {f!r}")
        p = Path(f) if Path(f).is_absolute() else path.parent / f
        if not p.is_file():
            raise RunInputError(f"{file}: baselines.{name}: {os.fspath(p)}: no such file")
        out[str(name)] = p
    return out


def execute(plan_file: str | os.PathLike, *, seed: int = 0, target_rse: float = 0.01,
            baselines: bool = True) -> Any:
    """Run a plan file (and the baselines its workload names) on simulated H200s: an
    ``ExecutionResult``, or a ``PlanComparison`` when there are baselines."""
    from measure.execute import PlanComparison, run_plan, savings
    from measure.protocol import Protocol

    plan, problem, work, paths = load_runnable(plan_file)
    base = _baselines(paths["baselines"]) if baselines and "baselines" in paths else {}
    loaded = {n: load_runnable(p)[:3] for n, p in base.items()}   # all inputs read before any run
    proto = Protocol(target_rse=target_rse)
    main = run_plan(plan, problem, work, seed=seed, protocol=proto)
    if not loaded:
        return main
    runs = {n: run_plan(*b, seed=seed, protocol=proto) for n, b in loaded.items()}
    return PlanComparison(main, runs, tuple(savings(main, r, n) for n, r in runs.items()))


def cmd_run(args: argparse.Namespace) -> int:
    """``ecal run PLAN``: execute the plan on simulated H200s; print (and with ``-o`` write)
    prediction against measurement with Eq. 23, and measured savings against its baselines."""
    from .commands import UsageError, _finish, check_outputs
    from .output import Outputs

    _check_device(args.device)
    if not (args.target_rse > 0 and args.target_rse < 1):
        raise UsageError(f"--target-rse must be in (0, 1), got {args.target_rse:g}")
    check_outputs(args, "-o")
    res = execute(args.plan, seed=args.seed, target_rse=args.target_rse,
                  baselines=not args.no_baselines)
    out = Outputs()
    if args.output:
        out.json(args.output, res.to_dict())
    return _finish(args, out, res.to_dict, res.summary)
