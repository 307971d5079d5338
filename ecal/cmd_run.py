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

**Your own plan: ``ecal run plan.json --workload workload.json [--device nvml:N]``.** A plan
``ecal plan workload.json -o plan.json`` wrote is run with the workload it was made for: each
task runs its element's ``work`` (``module:factory``, imported from the working folder; the
factory is called once, outside every window; a simulated preset on ``--device sim``) at the
plan's ω, step after step, measured with the tick-aligned protocol until the target relative
standard error; then the same step with every task at the top clock and power limit (the
baseline, ``--no-baselines`` skips it): measured T and E ± σ against the prediction, Eq. 23,
and the measured saving. A real GPU runs single-device plans (a chain or a DAG on one
device); a multi-GPU plan runs in your own launcher (``measure.PlanApplier.from_schedule``).

**What happened.** Below the table: ``deadline D ms: met, X ms to spare`` or ``deadline D ms:
MISSED by X ms (Y %)`` — the measured step (mean over the measured steps) against the deadline
the plan was made to keep (``Plan.target_deadline_s``: the one asked for, before a confidence
tightened it), how many measured steps ran over, and the plan's own P(makespan ≤ deadline);
then the last line, ``result: ...``, says what went wrong or that nothing did.

Exit status: 0 when the plan's measured step met its deadline and none of the plan's Eq. 23
tests flagged (its step, its devices); 1 when the deadline was missed or one of them flagged
(the run itself completed: a deviation is a result, and ``-o`` is written); 2 on bad input; 3
when your work raised (the GPU restored). A baseline's own flags are shown (and noted on the
last line) but are not the plan's: they do not change the status.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frontier.errors import FormatError, InputError

BASELINES_FORMAT = "energy-calculus/baselines"
_WORKLOAD_FIELDS = ("problem", "work", "baselines")


class RunInputError(InputError):
    """A plan file that cannot be run (no workload, a missing file, another device)."""


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ecal run`` arguments (the parser itself is made by ``ecal.cli``)."""
    p.add_argument("plan", help="plan file naming its workload (e.g. demo/plan.json from ecal demo)")
    p.add_argument("--device", default="sim",
                   help="sim: one simulated H200 per plan device (default); nvml:INDEX: a real "
                        "GPU (with --workload; single-device plans)")
    p.add_argument("--workload", default=None,
                   help="the workload file the plan was made from (ecal plan WORKLOAD -o PLAN): "
                        "its elements' work is what runs")
    p.add_argument("--microbatches", type=int, default=None,
                   help="with --workload: the same override ecal plan was given, if any")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (default 0, as ecal demo)")
    p.add_argument("--target-rse", type=float, default=0.01,
                   help="repeat steps until the step energy's relative standard error is this")
    p.add_argument("--no-baselines", action="store_true",
                   help="run the plan only, not the baselines its workload names")
    p.add_argument("-o", "--output", default=None, help="execution result to write (JSON)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")


def _check_device(device: str, workload: str | None) -> None:
    if device == "sim":
        return
    if device.startswith("nvml:"):
        if workload is None:
            raise RunInputError(f"--device {device}: a real run needs the plan's workload "
                                "(--workload FILE, whose elements name their work); the demo's "
                                "plans run on --device sim")
        return
    raise RunInputError(f"--device {device!r}: use sim (simulated H200s) or nvml:INDEX")


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


def _open_run_devices(names: list[str], spec: str, seed: int, nvml: Any = None) -> dict[str, Any]:
    import measure
    from measure.execute import simulated_devices

    if spec == "sim":
        return simulated_devices(names, seed)
    if len(names) != 1:
        raise RunInputError(f"--device {spec}: this plan spans {len(names)} devices "
                            f"({', '.join(names)}); a real GPU runs single-device plans here; run a "
                            "multi-GPU plan in your launcher with measure.PlanApplier.from_schedule")
    return {names[0]: measure.open_device(spec, nvml=nvml)}


def workload_table(wl: Any, gpus: Mapping[str, Any], workload_file: str) -> dict[str, tuple]:
    """The work table of a workload's problem: each task runs its element's work
    (:class:`measure.execute.CallableWork`; every option the same code, at its own ω).
    Each element's work is resolved once (a factory called once, on the first device)."""
    import measure
    from measure.execute import CallableWork

    first = next(iter(gpus.values()))
    resolved: dict[str, Any] = {}
    for el in dict.fromkeys(wl.task_elements.values()):
        spec = wl.works.get(el)
        if spec is None:
            raise RunInputError(f"{workload_file}: elements.{el}: no work to run; add "
                                '"work": "module:factory" (what ecal characterize measured)')
        work = measure.load_work(spec, device=first).work
        if isinstance(work, Mapping):
            raise RunInputError(f"{workload_file}: elements.{el}: work {spec!r} gives one callable "
                                "per implementation (kappa); name one implementation's work")
        resolved[el] = CallableWork(work, el)
    return {t.name: tuple(resolved[wl.task_elements[t.name]] for _ in t.options)
            for t in wl.problem.tasks}


def execute_workload(plan_file: str | os.PathLike, workload_file: str | os.PathLike, *,
                     device: str = "sim", seed: int = 0, target_rse: float = 0.01,
                     baselines: bool = True, microbatches: int | None = None,
                     nvml: Any = None) -> Any:
    """Run a plan ``ecal plan WORKLOAD -o PLAN`` wrote with its workload's own work (see the
    module doc): an ``ExecutionResult``, or a ``PlanComparison`` against the all-top-clock
    baseline. Devices are restored and closed whatever happens."""
    from frontier.io import read_json
    from measure.execute import PlanComparison, run_plan, savings
    from measure.protocol import Protocol
    from solvers.plan import Plan

    from .demo import _all_max
    from .workload import load_workload

    file = os.fspath(plan_file)
    if not Path(file).is_file():
        raise FileNotFoundError(2, "no such file", file)
    plan = Plan.from_dict(read_json(file), file)
    wl = load_workload(workload_file, microbatches=microbatches)
    problem = wl.problem
    gpus = _open_run_devices(list(problem.index.devices), device, seed, nvml)
    try:
        table = workload_table(wl, gpus, os.fspath(workload_file))
        proto = Protocol(target_rse=target_rse)
        main = run_plan(plan, problem, table, seed=seed, protocol=proto, devices=gpus)
        if not baselines:
            return main
        top = _all_max(problem, getattr(plan, "target_deadline_s", plan.deadline_s))
        base = run_plan(top, problem, table, seed=seed, protocol=proto, devices=gpus)
        return PlanComparison(main, {"all_max": base}, (savings(main, base, "all_max"),))
    finally:
        for g in gpus.values():
            g.close()


def cmd_run(args: argparse.Namespace) -> int:
    """``ecal run PLAN``: execute the plan on simulated H200s; print (and with ``-o`` write)
    prediction against measurement with Eq. 23, and measured savings against its baselines."""
    from .commands import UsageError, _finish, check_outputs
    from .output import Outputs

    _check_device(args.device, args.workload)
    if not (args.target_rse > 0 and args.target_rse < 1):
        raise UsageError(f"--target-rse must be in (0, 1), got {args.target_rse:g}")
    check_outputs(args, "-o")
    if args.workload is not None:
        res = execute_workload(args.plan, args.workload, device=args.device, seed=args.seed,
                               target_rse=args.target_rse, baselines=not args.no_baselines,
                               microbatches=args.microbatches)
    else:
        if args.microbatches is not None:
            raise UsageError("--microbatches applies with --workload")
        res = execute(args.plan, seed=args.seed, target_rse=args.target_rse,
                      baselines=not args.no_baselines)
    out = Outputs()
    if args.output:
        out.json(args.output, res.to_dict())
    problems = res.problems()
    notes = res.notes() if hasattr(res, "notes") else []
    _finish(args, out, res.to_dict, lambda: f"{res.summary()}\n{verdict(problems, notes)}")
    return 1 if problems else 0


def verdict(problems: list[str], notes: list[str] = ()) -> str:
    """The last line of ``ecal run``: what went wrong with the plan (exit 1), or that nothing
    did (exit 0); then the baselines' own flags, as notes."""
    text = (f"result: {'; '.join(problems)}: exit 1" if problems else
            "result: deadline met, prediction confirmed (Eq. 23): exit 0")
    if notes:
        text += f" (note, not the plan's: {'; '.join(notes)})"
    return text
