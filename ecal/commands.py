"""Command handlers of ``ecal``: each parses nothing, calls the libraries, prints, writes.

Every handler checks its output paths before any work (:func:`check_outputs`), stages its
files in :class:`~ecal.output.Outputs` and commits them only after all work succeeded — all or
none, never touching an earlier file on failure — and only then prints.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from frontier.errors import InputError

from .common import UsageError, check_outputs, element_of, finish
from .output import (
    Outputs,
    check_output_dir,
    check_output_path,
    dump_json,
    progress_reporter,
)

# -- compose / check ---------------------------------------------------------------------------

def cmd_compose(args: argparse.Namespace) -> int:
    """``ecal compose FILE``: predicted T and E ± σ and the Eq. 13 bias bound per composition."""
    wb = _workbook_with(args.file, getattr(args, "expr", []))
    if not wb.entries:
        raise UsageError(f"{args.file}: has no compositions to predict; give one with --expr "
                         "NAME=EXPR, or add a 'compositions' list of {name, expr} over its "
                         "signatures (docs/cli.md, ecal compose)")
    if args.json:
        dump_json(wb.to_dict(alpha=args.alpha))
        return 0
    if wb.description:
        print(wb.description)
    for line in wb.summary_lines(alpha=args.alpha):
        print(line)
    return 0


def _workbook_with(file: str, exprs: list[str]) -> Any:
    """The workbook ``file`` (a workbook or any signature file) with the compositions given
    on the command line as ``NAME=EXPR`` (EXPR as JSON) evaluated after its own."""
    import json

    from frontier.workbook import load_workbook

    added = []
    for e in exprs:
        name, eq, text = e.partition("=")
        if not eq or not name.strip():
            raise UsageError(f"--expr {e!r}: expected NAME=EXPR, e.g. step={{\"seq\": [\"a\", \"b\"]}}")
        try:
            expr = json.loads(text)
        except json.JSONDecodeError:
            expr = text.strip()            # a bare signature name
        added.append({"name": name.strip(), "expr": expr})
    return load_workbook(file, added)


def cmd_check(args: argparse.Namespace) -> int:
    """``ecal check FILE``: Eq. 23 of each measured composite; exit 1 if any is flagged.
    With ``--pairs``: the context-insensitivity tests of a pair workload (:mod:`ecal.cmd_pairs`)."""
    if getattr(args, "pairs", False):
        from .cmd_pairs import cmd_check_pairs

        return cmd_check_pairs(args)
    from frontier.workbook import load_workbook

    wb = load_workbook(args.file)
    results = wb.check(alpha=args.alpha, bias_aware=args.bias_aware)
    if not results:
        raise UsageError(f"{args.file}: no composition has a 'measured' value to check")
    if args.json:
        dump_json(wb.to_dict(alpha=args.alpha, bias_aware=args.bias_aware))
    else:
        for r in results:
            print(r.summary())
        n = sum(r.flagged for r in results)
        print(f"{n} of {len(results)} composite(s) flagged at alpha={args.alpha:g}"
              + (" (bias-aware)" if args.bias_aware else ""))
    return 1 if any(r.flagged for r in results) else 0


# -- frontier ----------------------------------------------------------------------------------

def cmd_frontier(args: argparse.Namespace) -> int:
    """``ecal frontier FILE``: the Pareto frontier of each element in a signature file."""
    from frontier.io import load_signatures
    from frontier.pareto import pareto_frontier

    check_outputs(args, "-o", "--plot", inputs=(args.file,))
    groups: dict[str, list] = defaultdict(list)
    from measure.store import is_store_path, read_signatures

    if is_store_path(args.file):       # a results store: signatures by element, per GPU model
        if not Path(args.file).exists():
            raise FileNotFoundError(2, "no such file", args.file)
        groups.update(read_signatures(args.file, gpu_model=getattr(args, "gpu_model", None)))
        if not groups:
            raise UsageError(f"{args.file}: no signatures"
                             + (f" of GPU model {args.gpu_model!r}" if args.gpu_model else "")
                             + _models_present(args.file))
    else:
        for key, sig in load_signatures(args.file).items():
            groups[element_of(key)].append(sig)
    if args.element is not None:
        if args.element not in groups:
            raise UsageError(f"{args.file}: no element {args.element!r} (has: {', '.join(sorted(groups))})")
        groups = {args.element: groups[args.element]}
    fronts = {el: pareto_frontier(pts, args.criterion, name=el) for el, pts in groups.items()}
    out = Outputs()
    if args.output:
        out.json(args.output, frontier_file_doc(fronts, groups, args.criterion, args.file))
    if args.plot:
        from frontier.plot import plot_frontier

        if len(fronts) > 1 and args.element is None:
            raise UsageError(f"{args.file}: has {len(fronts)} elements; pick one to plot with --element")
        el = next(iter(fronts))
        out.figure(args.plot, plot_frontier(groups[el], title=f"{el}: achievable set and frontier"))
    return finish(args, out, lambda: {el: f.to_dict() for el, f in fronts.items()},
                   lambda: "\n".join(f"{el}: {len(f)} frontier point(s) of {len(groups[el])} measured "
                                     f"({args.criterion})\n{f.to_table()}" for el, f in fronts.items()))


def _models_present(store_path: str) -> str:
    """``; it has GPU models 'a', 'b'`` (or that it is empty), for a filter that matched nothing."""
    from measure.store import ResultsStore

    with ResultsStore(store_path, create=False) as st:
        models = st.gpu_models()
    if not models:
        return "; the store is empty"
    return "; it has GPU model(s) " + ", ".join(repr(m) for m in models) + " (--gpu-model)"


def frontier_file_doc(fronts: dict[str, Any], groups: dict[str, list], criterion: str,
                      source: str) -> dict[str, Any]:
    """``ecal frontier -o``'s file: a signature file of the frontier points (every command that
    reads signatures reads it, ``ecal frontier`` included), keyed ``element@point`` as
    ``ecal characterize`` writes them, with a ``meta.frontier`` block saying what was kept."""
    from frontier.io import signatures_doc
    from frontier.pareto import point_label

    sigs: dict[str, Any] = {}
    for el, f in fronts.items():
        for p in f.points:
            key = p.name if element_of(p.name) == el and "@" in p.name else f"{el}@{point_label(p)}"
            while key in sigs:          # two points with one label (a store of several GPUs)
                key += "'"
            sigs[key] = p
    meta = {"frontier": {"criterion": criterion, "source": str(source),
                         "elements": {el: {"measured": len(groups[el]), "frontier": len(f)}
                                      for el, f in fronts.items()}}}
    return signatures_doc(sigs, {"meta": meta})


# -- characterize ------------------------------------------------------------------------------

#: The default grid on the simulated H200, as :func:`measure.grid.default_grid` derives it
#: from the simulator's supported clocks and power-limit range (any device gets its own).
DEFAULT_GRID = "sm_clock_mhz=1980:990:-90,power_limit_w=700,500"


def _protocol_of(args: argparse.Namespace) -> Any:
    """The measurement protocol the characterize options ask for (one-line errors naming them)."""
    import measure

    if not args.target_rse > 0:
        raise UsageError(f"--target-rse must be > 0, got {args.target_rse:g}")
    if not args.window_s > 0:
        raise UsageError(f"--window-s must be > 0, got {args.window_s:g}")
    for opt in ("warmup_s", "cooldown_s"):
        if getattr(args, opt) < 0:
            raise UsageError(f"--{opt.replace('_', '-')} must be >= 0, got {getattr(args, opt):g}")
    if not 1 <= args.min_windows <= args.max_windows:
        raise UsageError(f"need 1 <= --min-windows ({args.min_windows}) <= --max-windows "
                         f"({args.max_windows})")
    return measure.Protocol(window_s=args.window_s, warmup_s=args.warmup_s,
                            cooldown_s=args.cooldown_s, min_windows=args.min_windows,
                            max_windows=args.max_windows, target_rse=args.target_rse)


def _recheck_of(args: argparse.Namespace) -> Any:
    """How the sweep re-measures ready power (``--ready-recheck-s``, ``--ready-drift-tol``)."""
    from measure.ready_drift import ReadyRecheck

    every = getattr(args, "ready_recheck_s", 600.0)
    tol = getattr(args, "ready_drift_tol", 0.02)
    if not every >= 0:
        raise UsageError(f"--ready-recheck-s must be >= 0 (0: never), got {every:g}")
    if not tol >= 0:
        raise UsageError(f"--ready-drift-tol must be >= 0, got {tol:g}")
    return ReadyRecheck(every_s=every or None, tolerance=tol)


def _results_paths(base: str | None, names: list[str]) -> list[str | None]:
    """One results file per element: ``base`` itself for one work; ``R.<element>.jsonl`` (the
    element's name made file-safe) beside ``base`` for several."""
    import re

    if base is None:
        return [None] * len(names)
    if len(names) == 1:
        return [base]
    root, dot, ext = base.rpartition(".") if "." in Path(base).name else (base, "", "")
    paths = [f"{root}.{re.sub(r'[^A-Za-z0-9._-]+', '_', n)}{dot}{ext}" for n in names]
    if len(set(paths)) < len(paths):
        raise UsageError(f"--results {base}: elements {names} would share a results file; "
                         "give them distinct --name values")
    return paths


def _open_for(spec: str, works: list[str], **kw: Any) -> Any:
    """Open ``spec``; when it cannot be opened and the works are the user's own code
    (``module:attribute``), say what works without a GPU instead of pointing at the simulator,
    which cannot run them."""
    import re

    import measure
    from measure.factory import WITHOUT_A_GPU

    try:
        return measure.open_device(spec, **kw)
    except measure.DeviceError as exc:
        own = [w for w in works if ":" in w]
        if not own or spec.strip().lower().startswith("sim"):
            raise
        why = re.sub(r"\s*\((use the simulated device|without a GPU)[^)]*\)", "",
                     str(exc).splitlines()[0])
        raise measure.DeviceError(f"{own[0]} is your own code and needs a GPU, but {spec} cannot be "
                                  f"opened here ({why}); {WITHOUT_A_GPU}") from exc


def cmd_characterize(args: argparse.Namespace) -> int:
    """``ecal characterize WORK [WORK ...]``: signatures over a grid, the frontier, optional plot.

    Several works are one campaign on one device: ready power is calibrated once per ω_dev
    (:class:`measure.ReadyPowerCache`) and ``-o`` holds every element's signatures."""
    import measure

    if args.list:
        for name in sorted(measure.PRESETS):
            k = measure.PRESETS[name]
            print(f"{name:<28} {getattr(k, 'theta', '') or ''}")
        print(f"{'traced_compute_<T>us':<28} a traced compute kernel taking T us at the default "
              "operating point (ecal import torch-trace)")
        print(f"{'traced_memory_<T>us':<28} a traced memory kernel, likewise")
        return 0
    check_outputs(args, "-o", "--plot")
    protocol = _protocol_of(args)
    recheck = _recheck_of(args)
    specs = list(args.work)
    if args.name is not None and len(args.name) != len(specs):
        raise UsageError(f"--name given {len(args.name)} time(s) for {len(specs)} work(s): give one "
                         "per work, in order")
    for n in args.name or []:
        if not n or "@" in n:
            raise UsageError(f"--name {n!r}: an element name must be non-empty and have no '@'")
    if args.plot and len(specs) > 1:
        raise UsageError("--plot draws one element: characterize one work, or plot each from -o "
                         "with `ecal frontier FILE --element NAME --plot ...`")
    adaptive = getattr(args, "adaptive", None)
    if getattr(args, "plan_tol", None) is not None and not adaptive:
        raise UsageError("--plan-tol bounds what an adaptive skip may cost: it goes with --adaptive")
    if args.results:
        # appended to, never replaced; checked now so a bad path fails before any device work
        check_output_path(args.results, "--results")
    device = _open_for(args.device, specs, read_only=args.read_only, seed=args.seed)
    try:
        grid = args.grid
        if grid is None:
            grid = measure.default_grid(device.operating_set(), read_only=args.read_only)
        # a bad grid fails before the user's set-up code runs
        parsed = measure.parse_grid(grid)
        parsed.validate(device.operating_set(), read_only=device.read_only)
        if adaptive and len(parsed.axes.get("sm_clock_mhz", ())) < 3:
            raise UsageError("--adaptive refines along the SM clock: --grid needs sm_clock_mhz with "
                             f"at least 3 values, got {parsed.label() or 'none'}")
        loaded = []
        for spec in specs:
            try:
                lw = measure.load_work(spec, device, factory=args.factory)
            except measure.UserCodeError as exc:
                raise WorkFailedError(spec) from exc.__cause__
            work = lw.work
            if ":" in spec:     # the user's own code: its exceptions are exit 3
                from collections.abc import Mapping

                work = ({k: _reported(w, spec) for k, w in work.items()}
                        if isinstance(work, Mapping) else
                        _reported(work, spec) if callable(work) else work)
            loaded.append((spec, work, lw.name))
        names = list(args.name) if args.name is not None else [n for _, _, n in loaded]
        for n in names:
            if not n or "@" in n:
                raise UsageError(f"element name {n!r} must be non-empty and have no '@': give --name")
        if len(set(names)) < len(names):
            raise UsageError(f"two works are named alike ({', '.join(names)}): give each a --name")
        results_paths = _results_paths(args.results, names)
        for rp in results_paths if len(results_paths) > 1 and args.results else ():
            check_output_path(rp, "--results")
        progress = progress_reporter(not args.json)     # a bar on a terminal, else lines
        if adaptive:
            return _characterize_adaptive(args, device, grid, protocol, loaded, names, adaptive,
                                          progress)
        cache = measure.ReadyPowerCache()
        results = [_with_preset_work(measure.characterize(
                       work, device=device, grid=grid, results_path=rp, protocol=protocol,
                       progress=progress, name=name, ready_cache=cache,
                       ready_recheck=recheck), spec)
                   for (spec, work, _), name, rp in zip(loaded, names, results_paths)]
        res = results[0]
        where = "simulated H200" if res.simulated else str(res.meta.get("device", args.device))
        out = Outputs()
        if args.output:
            out.custom(args.output, lambda tmp: measure.save_characterizations(tmp, results))
        if args.plot:
            from frontier.plot import plot_frontier

            out.figure(args.plot, plot_frontier(list(res.signatures),
                                                title=f"{res.element} on {where}: achievable set and frontier"))

        def text() -> str:
            parts = []
            for r in results:
                head = (f"{r.element} on {where}: {len(r.signatures)} point(s) measured, "
                        f"{len(r.frontier_signatures())} on the (T, E) frontier")
                parts.append(head if r.frontier is None else f"{head}\n{r.frontier.to_table()}")
            for r in results:
                for label, d in (r.meta.get("ready_drift") or {}).items():
                    parts.append(f"ready power at {label}: {len(d['readings_w'])} readings, "
                                 f"sigma_s {d['sigma_s_w']:.2f} W, spread {d['spread']:.1%}"
                                 + (f" -- DRIFT beyond {d['tolerance']:.0%}" if d["flagged"] else ""))
            if len(results) > 1:
                parts.append(f"ready power: {cache.calibrations} calibration(s) "
                             f"({cache.calibration_time_s:.1f} s of device time), reused "
                             f"{cache.reuses} time(s) across {len(results)} elements")
            return "\n".join(parts)

        def doc() -> Any:
            if len(results) == 1:
                return res.to_dict()
            return {"format": "energy-calculus/characterization-campaign",
                    "elements": [r.to_dict() for r in results],
                    "ready_power": {"calibrations": cache.calibrations, "reuses": cache.reuses,
                                    "calibration_time_s": cache.calibration_time_s,
                                    "values_w": cache.values()}}

        return finish(args, out, doc, text)
    finally:
        device.close()      # releases the GPU's lock now, not in a finalizer a Ctrl-C can hit


def _with_preset_work(res: Any, spec: str) -> Any:
    """``res`` with each signature's ``meta["work"]`` naming the simulated preset it measured,
    so a workload naming the element runs that preset whatever ``--name`` called it
    (:meth:`execution.workload.Workload.works`). The user's own code is not recorded: a
    workload says which ``module:factory`` to run."""
    import dataclasses

    from measure.sim import PRESETS, traced_kernel

    if (spec not in PRESETS and traced_kernel(spec) is None) or res.element == spec:
        # not renamed: the name is the preset (and the results log, which knows no preset,
        # then holds the very same points as -o)
        return res
    sigs = tuple(s.with_(meta={**s.meta, "work": spec}) for s in res.signatures)
    return dataclasses.replace(res, signatures=sigs)


def _characterize_adaptive(args: argparse.Namespace, device: Any, grid: Any, protocol: Any,
                           loaded: list, names: list[str], criterion: str,
                           progress: Any) -> int:
    """``ecal characterize --adaptive``: :func:`measure.characterize_adaptive` per work; prints
    each element's table (every grid point: measured, or skipped and why); ``-o`` holds the
    measured signatures (not the estimates) in the format the normal path writes. With
    ``--results`` each element's measured points are journaled as they are measured (one file
    per element, as for sweeps) and a rerun resumes them."""
    import measure
    from measure.adaptive import AdaptiveOptions

    journals = _results_paths(args.results, names)
    opts = AdaptiveOptions(grid=grid, criterion=criterion, target_rse=protocol.target_rse,
                           protocol=protocol, plan_tol=getattr(args, "plan_tol", None))
    results = [measure.characterize_adaptive(work, device, opts, name=name, progress=progress,
                                             journal=rp)
               for (_, work, _), name, rp in zip(loaded, names, journals)]
    out = Outputs()
    if args.output:
        out.custom(args.output, lambda tmp: measure.save_characterizations(tmp, results))
    if args.plot:
        from frontier.plot import plot_frontier

        r = results[0]
        where = "simulated H200" if r.simulated else str(r.meta.get("device", args.device))
        out.figure(args.plot, plot_frontier(list(r.signatures),
                                            title=f"{r.element} on {where}: adaptive, measured points"))

    def text() -> str:
        return "\n".join(r.to_table() for r in results)

    def doc() -> Any:
        if len(results) == 1:
            return results[0].to_dict()
        return {"format": "energy-calculus/adaptive-characterization-campaign",
                "elements": [r.to_dict() for r in results]}

    return finish(args, out, doc, text)


class WorkFailedError(Exception):
    """The user's own work raised (not bad input to ecal): exit 3 with its traceback."""

    def __init__(self, spec: str):
        self.spec = spec
        super().__init__(f"your work {spec} raised")


def _reported(work: Any, spec: str) -> Any:
    """``work`` whose exceptions come out as :class:`WorkFailedError` (the original as its
    cause), so a bug in the user's code is neither exit 2 ("bad input") nor exit 1 ("check
    flagged"). Attributes such as ``kappa`` and ``theta`` are kept."""
    import functools

    @functools.wraps(work)
    def call(*a: Any, **kw: Any) -> Any:
        try:
            return work(*a, **kw)
        except Exception as exc:
            raise WorkFailedError(spec) from exc

    return call


# -- demo --------------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace) -> int:
    """``ecal demo``: characterize, compose and plan a 1F1B step on the simulated H200."""
    from .demo import OUTPUT_FILES, DemoConfig, demo_json, report, run_demo, write_demo

    check_output_dir(args.out, "--out")
    for name in OUTPUT_FILES:
        check_output_path(Path(args.out) / name, f"--out {args.out}:")
    _parse_deadline(args.deadline)
    cfg = DemoConfig(deadline=args.deadline, seed=args.seed)
    r = run_demo(cfg, progress=progress_reporter(not args.json))
    written = write_demo(r, args.out)
    if args.json:
        dump_json({**demo_json(r), "files": [str(p) for p in written]})
    else:
        print(report(r), end="")
        print(f"wrote {len(written)} files to {args.out}/: " + ", ".join(p.name for p in written))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """``ecal run PLAN``: execute a plan on simulated H200s (see :mod:`ecal.cmd_run`)."""
    from .cmd_run import cmd_run as run

    return run(args)


def cmd_transitions(args: argparse.Namespace) -> int:
    """``ecal transitions WORKLOAD -o FILE``: measured switch costs (:mod:`ecal.cmd_transitions`)."""
    from .cmd_transitions import cmd_transitions as run

    return run(args)


def cmd_campaign(args: argparse.Namespace) -> int:
    """``ecal campaign FILE``: many elements on many GPUs into one store (:mod:`ecal.cmd_campaign`)."""
    from .cmd_campaign import cmd_campaign as run

    return run(args)


def cmd_export(args: argparse.Namespace) -> int:
    """``ecal export KIND PLAN -o OUT`` (see :mod:`ecal.cmd_export`)."""
    from .cmd_export import cmd_export as export

    return export(args)


# -- plan / pareto -----------------------------------------------------------------------------

def _load_workload(args: argparse.Namespace):
    """A Problem from a Perseus CSV (1F1B with the CLI's pipeline options), a workload file
    (``ecal.workload/1``, :mod:`execution.workload`) or a JSON problem."""
    return _read_workload(args)[0]


def _read_workload(args: argparse.Namespace):
    """(Problem, :class:`execution.workload.Workload` or None) of ``args.workload``: dispatches on
    the file: ``.csv`` is a Perseus profile, JSON on its ``format`` / ``schema_version``."""
    from frontier.files import read_json
    from solvers.io import load_problem, problem_from_dict
    from solvers.model import ConstantTransition

    if not Path(args.workload).exists():
        raise FileNotFoundError(2, "no such file", args.workload)
    trans = None
    if args.transition_time_s < 0 or args.transition_energy_j < 0:
        raise UsageError("--transition-time-s and --transition-energy-j must be >= 0")
    p2p = getattr(args, "p2p_power_w", None)
    if p2p is not None and p2p < 0:
        raise UsageError(f"--idle-power-w (--p2p-power-w) must be >= 0, got {p2p:g}")
    mb = getattr(args, "microbatches", None)
    if mb is not None and mb < 1:
        raise UsageError(f"--microbatches must be >= 1, got {mb}")
    max_tasks = _solve_options(args).limits.max_tasks     # checked before anything is built
    if args.transition_time_s > 0 or args.transition_energy_j > 0:
        trans = ConstantTransition(args.transition_time_s, args.transition_energy_j)
    if args.workload.lower().endswith(".csv"):
        return load_problem(args.workload, p2p_power_w=75.0 if p2p is None else p2p,
                            n_microbatches=8 if mb is None else mb, transitions=trans,
                            max_tasks=max_tasks), None
    doc = read_json(args.workload)
    from execution.workload import is_workload, load_workload

    if is_workload(doc):
        wl = load_workload(args.workload, microbatches=mb, idle_power_w=p2p, transitions=trans,
                           max_tasks=max_tasks)
        return wl.problem, wl
    if isinstance(doc, dict) and "signatures" in doc and "tasks" not in doc:
        raise UsageError(f"{args.workload}: is a signature file, not a workload: name it in a workload "
                         "file (\"format\": \"ecal.workload/1\", see docs/workload.md) and plan that")
    p = problem_from_dict(doc, args.workload, max_tasks=max_tasks)
    return (p.with_(transitions=trans) if trans is not None else p), None


def _solve_options(args: argparse.Namespace) -> Any:
    """The planner's options of ``ecal plan`` / ``ecal pareto``: the shipped ones, with
    ``--max-tasks`` (the most tasks a problem may have, checked before it is built)."""
    from solvers.options import LimitOptions, SolveOptions

    n = getattr(args, "max_tasks", None)
    if n is None:
        return SolveOptions()
    if n < 1:
        raise UsageError(f"--max-tasks must be >= 1, got {n}")
    return SolveOptions(limits=LimitOptions(max_tasks=int(n)))


def _parse_deadline(text: str, option: str = "--deadline") -> float | str:
    t = text.strip().lower()
    try:
        v = float(t[:-1]) if t.endswith("x") else float(t)
    except ValueError:
        raise UsageError(f"{option} {text!r}: give seconds (0.95) or a factor of the fastest "
                         "makespan (1.05x)") from None
    if not v > 0:
        raise UsageError(f"{option} {text!r} must be > 0")
    return t if t.endswith("x") else v


def _check_time_limit(args: argparse.Namespace) -> None:
    """``--time-limit-s`` must be a positive number of seconds."""
    t = args.time_limit_s
    if t is not None and not (t > 0 and math.isfinite(t)):
        raise UsageError(f"--time-limit-s must be a positive number of seconds, got {t}")


def _workload_ref(args: argparse.Namespace) -> Any:
    """What a plan file records of the workload file it was made from: the path as given and
    the options that shaped its problem, so ``ecal run PLAN`` rebuilds the same problem."""
    from execution.runnable import WorkloadRef

    return WorkloadRef.of(args.workload, microbatches=getattr(args, "microbatches", None),
                          idle_power_w=getattr(args, "p2p_power_w", None),
                          transition_time_s=float(args.transition_time_s),
                          transition_energy_j=float(args.transition_energy_j))


def _plan_outputs(args: argparse.Namespace, out: Any, plan: Any, problem: Any, workload: Any) -> None:
    """Queue ``-o`` (the plan) and ``--schedule`` (per-rank schedule, with what a workload
    file adds: ranks, ready power) for ``ecal plan`` and ``ecal pareto --plan-at``. A plan
    made from a workload file records it (:class:`execution.runnable.WorkloadRef`)."""
    from execution.runnable import plan_with_workload

    if args.output:
        out.json(args.output, plan.to_dict() if workload is None else
                 plan_with_workload(plan, _workload_ref(args)))
    if args.schedule:
        from execution.schedule import stage_schedule

        wl_info = {} if workload is None else {"ranks": workload.ranks, "simulated": workload.simulated,
                                                "ready_power_w": workload.ready_power_w}
        out.json(args.schedule, stage_schedule(plan, problem, **wl_info))


def cmd_plan(args: argparse.Namespace) -> int:
    """``ecal plan WORKLOAD --deadline 1.05x``: the minimum-energy plan whose makespan meets
    the deadline at ``--confidence`` (:mod:`solvers.confidence`), and its certificate."""
    from solvers.confidence import solve_at_confidence

    check_outputs(args, "-o", "--schedule", "--plot")
    deadline = _parse_deadline(args.deadline)
    confidence = _confidence(args)
    _check_time_limit(args)
    problem, workload = _read_workload(args)
    if problem.n_tasks > 500 and not args.json:
        # the fast method may spend seconds improving a large plan: say so before going quiet
        how = ""
        if problem.index.has_transitions and args.method in ("auto", "fast"):
            from solvers.fast import polish_budget

            work, net_s = polish_budget(problem.n_tasks, args.time_limit_s)
            how = f" (switch-cost search: {work:g} work units, safety net {net_s:g} s)"
        print(f"planning {problem.n_tasks} tasks on {len(problem.index.dev_seq)} devices{how} ...",
              file=sys.stderr, flush=True)
    context = read_context(args, workload)
    plan = solve_at_confidence(problem, deadline, confidence, method=args.method,
                               time_limit_s=args.time_limit_s, options=_solve_options(args),
                               context=context)
    plan = _with_assumptions(plan, problem, workload, args.workload)
    out = Outputs()
    _plan_outputs(args, out, plan, problem, workload)
    if args.plot:
        from solvers.plot import plot_timeline

        out.custom(args.plot, lambda tmp: plot_timeline(plan, tmp))
    return finish(args, out, plan.to_dict, plan.summary)


def read_context(args: argparse.Namespace, workload: Any) -> Any:
    """The :class:`solvers.context.PlanContext` of ``--contexts`` (None without it)."""
    file = getattr(args, "contexts", None)
    if file is None:
        return None
    if workload is None:
        raise UsageError("--contexts applies to a workload file (ecal.workload/1), whose elements "
                         "the contexts file characterizes")
    if not Path(file).exists():
        raise FileNotFoundError(2, "no such file", file)
    from execution.context_plan import plan_context

    return plan_context(workload, file, context_entry(args))


def context_entry(args: argparse.Namespace) -> str | float:
    """``--context-entry``: periodic, cold or a finite temperature in °C."""
    entry = getattr(args, "context_entry", "periodic")
    if entry in ("periodic", "cold"):
        return str(entry)
    try:
        temp = float(entry)
    except ValueError:
        raise UsageError(f"--context-entry {entry!r}: periodic, cold or a temperature in °C") from None
    if not math.isfinite(temp):
        raise UsageError(f"--context-entry {entry!r}: not a finite temperature")
    return temp


def _confidence(args: argparse.Namespace) -> float:
    """``--confidence P``: in [0.5, 1) (0.5: the predicted makespan alone meets the deadline)."""
    p = getattr(args, "confidence", 0.95)
    if not 0.5 <= p < 1.0:
        raise UsageError(f"--confidence must be in [0.5, 1) (0.95: the deadline holds 19 times in "
                         f"20 on the plan's own σ; 0.5: the makespan alone), got {p:g}")
    return float(p)


def _assumptions(problem: Any, workload: Any, file: str) -> list[str]:
    """What a plan of ``problem`` assumes rather than knows: a workload file's own (e.g.
    ``"transitions": "free"``), or free switches where a profile or problem gives no costs."""
    if workload is not None:
        return list(workload.assumptions)
    if not problem.has_transitions:
        return [f"switches are free ({file} gives no switch costs; --transition-time-s sets them)"]
    return []


def _with_assumptions(plan: Any, problem: Any, workload: Any, file: str) -> Any:
    """``plan`` with its assumptions in ``meta["assumptions"]`` (its summary prints them)."""
    import dataclasses

    said = _assumptions(problem, workload, file)
    return dataclasses.replace(plan, meta={**plan.meta, "assumptions": said}) if said else plan


def _check_point_of_file(plan, problem) -> None:
    """A plan read from a curve file must cost on ``problem`` what the file says: else the
    file was made from another workload (or other options) of the same tasks."""
    from solvers.plan import make_plan

    again = make_plan(problem, [t.option for t in plan.tasks], plan.deadline_s, method=plan.method,
                      lower_bound_j=-math.inf, wall_s=0.0)
    if abs(again.energy_j - plan.energy_j) > 1e-9 * max(abs(plan.energy_j), 1.0):
        raise InputError(f"its point costs {again.energy_j:.6g} J on this workload, not the "
                         f"{plan.energy_j:.6g} J it reports: made from other signatures or "
                         "options? compute the curve again")


def cmd_pareto(args: argparse.Namespace) -> int:
    """``ecal pareto WORKLOAD``: the energy-vs-deadline curve with a plan and gap per point;
    with ``--plan-at D``, the plan of the curve's least-energy point meeting D (from
    ``--curve FILE`` when given, without computing the curve again)."""
    from solvers import pareto
    from solvers.feasibility import CertificateError
    from solvers.plan import ParetoCurve

    plan_at = getattr(args, "plan_at", None)
    curve_file = getattr(args, "curve", None)
    if plan_at is None and (curve_file or getattr(args, "schedule", None)):
        raise UsageError("--curve and --schedule need --plan-at (the point to turn into a plan)")
    check_outputs(args, "-o", "--schedule", "--plot")
    _check_time_limit(args)
    deadline = None if plan_at is None else _parse_deadline(plan_at, "--plan-at")
    confidence = _confidence(args)
    problem, workload = _read_workload(args)
    kw = {} if args.points is None else {"n_points": args.points}
    if args.points is not None and args.points < 2:
        raise UsageError(f"--points must be >= 2, got {args.points}")
    if curve_file:
        curve = ParetoCurve.load(curve_file)
        if curve.problem != problem.name:
            raise UsageError(f"{curve_file}: is the curve of {curve.problem!r}, not of {problem.name!r}")
    else:
        curve = pareto(problem, method=args.method, time_limit_s=args.time_limit_s,
                       options=_solve_options(args), **kw)
    out = Outputs()
    if args.plot:
        from solvers.plot import plot_pareto

        out.custom(args.plot, lambda tmp: plot_pareto(curve, tmp))
    said = _assumptions(problem, workload, args.workload)
    if deadline is None:
        from solvers.confidence import curve_lines, curve_rows, z_of

        def doc() -> Any:
            return {**curve.to_dict(), "confidence": {
                "confidence": confidence, "z": z_of(confidence), "assumptions": said,
                "points": curve_rows(curve, confidence)}}

        def text() -> str:
            return "\n".join([curve.summary(), *curve_lines(curve, confidence),
                              *(f"  assumption: {a}" for a in said)])

        if args.output:
            out.json(args.output, doc())
        return finish(args, out, doc, text)
    from solvers.confidence import keep_deadline

    try:
        D = problem.deadline_s(deadline)
        if curve_file:
            _check_point_of_file(curve.plan_at(D, problem), problem)
        fastest = min([p.makespan_s for p in curve.plans] + [m for m, _e, _b in curve.dense])
        plan = keep_deadline(lambda d: curve.plan_at(d, problem), D, confidence,
                             fastest_s=fastest, name=problem.name)
        if curve_file:
            _check_point_of_file(plan, problem)
    except (ValueError, CertificateError) as exc:
        # a curve file of this workload's tasks but other signatures, options or costs
        raise UsageError(f"{curve_file or 'curve'}: {exc}") from None
    plan = _with_assumptions(plan, problem, workload, args.workload)
    _plan_outputs(args, out, plan, problem, workload)
    return finish(args, out, plan.to_dict, plan.summary)


# -- restore -----------------------------------------------------------------------------------

def cmd_restore(args: argparse.Namespace) -> int:
    """``ecal restore``: put back GPU settings a killed run left changed (see ecal/recovery.py)."""
    from .recovery import cmd_restore as run

    return int(run(args) or 0)
