"""``ecal import KIND PATH -o OUT [options of KIND]``: published measurements → a signature file;
``ecal import torch-trace|nsys TRACE... -o WORKLOAD``: a kernel trace → a workload.

Each kind is its own sub-command, so ``ecal import zeus-plo --help`` lists the options that kind
takes (the static power to subtract, the element's name, the GPU count, ...) with their
defaults; the readers are :mod:`measure.replay` and :mod:`measure.zeus`, whose keyword arguments
the options map to one for one. ``torch-trace`` is the one kind that writes a workload, not
signatures (a trace has times but no energy): its elements are then characterized with ``ecal
characterize``; its reader is :mod:`measure.torch_trace` (``nsys``, Nsight Systems' SQLite export:
:mod:`measure.nsys_trace`), its grouping :mod:`measure.trace_group`.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where the kinds' example files come from (shown in --help; not bundled with the tool).
SOURCES = """sources:
  h200          this project's H200 measurements (../shared/data/h200/measurements.json)
  nv-dvfs       the NV-DVFS benchmark CSVs
  zeus-trace    Zeus NSDI'23 power traces (summary_power_*.csv)
  zeus-log      ZeusMonitor profile windows (window_name, elapsed_time, gpuN_energy)
  zeus-monitor  a ZeusMonitor log_file CSV
  zeus-plo      a GlobalPowerLimitOptimizer profile (JSON, or its monitor CSV)
  perseus       a Perseus profile CSV
  torch-trace   torch.profiler's prof.export_chrome_trace(path): writes a workload, not signatures
  nsys          Nsight Systems' `nsys export --type sqlite REPORT.nsys-rep`: a workload too"""


@dataclass(frozen=True)
class ImportKind:
    """One ``ecal import`` kind: its help line, an example input name, and its options as
    ``(flag, keyword of the loader, type, default, help)``."""

    name: str
    help: str
    example: str
    options: tuple[tuple[str, str, Callable[[str], Any], Any, str], ...] = ()


_STATIC = ("--static-power-w", "static_power_w", float, 0.0,
           "power drawn whatever the work (s of the signature), W, subtracted from the dynamic "
           "energy (default: 0, i.e. unknown: E_dyn = E)")
_NAME = ("--name", "name", str, None, "element name (default: the file's stem)")

KINDS: tuple[ImportKind, ...] = (
    ImportKind("h200", "this project's H200 measurements (s = the measured ready power)",
               "measurements.json"),
    ImportKind("nv-dvfs", "NV-DVFS benchmark CSV: one element per kernel and input, one "
               "signature per core clock", "v100-dvfs-real.csv", (_STATIC,)),
    ImportKind("zeus-trace", "Zeus NSDI'23 power traces: one element per job, one signature per "
               "power limit", "summary_power_v100.csv", (_STATIC,)),
    ImportKind("zeus-log", "Zeus power-limit profile windows: one signature per power limit",
               "profile.csv", (_STATIC,)),
    ImportKind("zeus-monitor", "a ZeusMonitor log_file CSV: one element per window and GPU",
               "monitor.csv", (_STATIC, ("--name", "plo_name", str, None,
                                         "name of the power-limit optimizer's element "
                                         "(default: the file's stem)"))),
    ImportKind("zeus-plo", "a GlobalPowerLimitOptimizer profile: one element, one signature "
               "per power limit", "plo_profile.json",
               (_STATIC, _NAME,
                ("--n-gpus", "n_gpus", int, 1, "GPUs the profile's energy was summed over "
                                                "(default: 1)"),
                ("--steps", "steps", int, None, "the optimizer's profile_steps: makes the "
                                                 "signatures per training step (default: per "
                                                 "profiling window)"))),
    ImportKind("perseus", "a Perseus profile CSV (stage,instruction,frequency,time,energy)",
               "perseus_profile.csv",
               (("--idle-power-w", "p2p_power_w", float, 75.0,
                 "idle (P2P-blocking) power per GPU, W: the signatures' s, the key idle_power_w "
                 "of a workload (default: 75, Perseus's)"),)),
)


def _loader(kind: str) -> Callable[..., Any]:
    from measure import replay, zeus

    loaders: dict[str, Callable[..., Any]] = {"h200": replay.load_h200, "nv-dvfs": replay.load_nvdvfs,
            "zeus-trace": replay.load_zeus_trace, "zeus-log": replay.load_zeus_profile,
            "zeus-monitor": zeus.load_zeus_monitor_log, "zeus-plo": zeus.load_zeus_plo_profile,
            "perseus": replay.load_perseus}
    return loaders[kind]


def add_import_parser(sub: Any, formatter_class: Any) -> argparse.ArgumentParser:
    """Add ``import`` and one sub-command per kind to ``sub`` (``ecal``'s sub-parsers)."""
    p = sub.add_parser("import", help="signatures from published measurements; a workload from "
                                      "a kernel trace (torch-trace)",
                       formatter_class=formatter_class,
                       epilog="examples:\n"
                              "  ecal import zeus-trace summary_power_v100.csv -o v100.json\n"
                              "  ecal import perseus profile.csv --idle-power-w 60 -o p.json\n"
                              "  ecal import torch-trace trace.json -o step.json   # a workload\n"
                              "  ecal import nsys report.sqlite -o step.json       # a workload\n"
                              "  ecal import zeus-plo --help     # one kind's options\n\n" + SOURCES)
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    for k in KINDS:
        kp = kinds.add_parser(k.name, help=k.help, description=k.help,
                              formatter_class=formatter_class,
                              epilog=f"example:\n  ecal import {k.name} {k.example} -o out.json")
        kp.add_argument("path", help="input file")
        kp.add_argument("-o", "--output", required=True, help="signature file to write (JSON)")
        for flag, dest, typ, default, text in k.options:
            kp.add_argument(flag, dest=dest, type=typ, default=default,
                            metavar=flag.lstrip("-").split("-")[-1].upper(), help=text)
        kp.add_argument("--json", action="store_true",
                        help="print machine-readable JSON instead of a table")
        kp.set_defaults(handler=cmd_import, loader_keywords=tuple(o[1] for o in k.options))
    _add_torch_trace(kinds, formatter_class)
    return p


TORCH_TRACE_HELP = ("a torch.profiler Chrome trace (JSON), or one per rank, -> a workload "
                    "(ecal.workload/1, dag shape) whose tasks are the step's kernels; not "
                    "signatures: a trace has times, no energy, so its elements are characterized "
                    "next")
NSYS_HELP = ("an Nsight Systems SQLite export (nsys export --type sqlite), or one per rank, -> a "
             "workload, as torch-trace makes one")
TRACE_EPILOG = """what becomes what (docs/workload.md, "Kernel traces"):
  element  one kernel identity (name, grid, block, bytes, input shapes) on one device, or a run
           of consecutive short kernels (--min-duration-us); its work is a traced simulated
           kernel (traced_compute_12.5us: its mean time, its roofline class) that
           `ecal characterize` runs on the simulated H200
  task     one kernel (or run), listed per lane in start order: a lane is a whole device, or a
           stream with --streams lanes (a device with one stream is one lane either way)
  gap      a lane idle for --min-gap-us or longer before its next task (waiting for the host):
           a task of its own (traced_gap_40us idles), so the plan's step is the trace's
  edge     between lanes of one device: from the latest task of the other lane that has ended
           when a task starts; across devices: the k-th call of a collective (AllReduce, ...)
           on each device is one call, each member waits for the others' previous tasks
  ranks    several files: one per rank (device r, or r.d when a file has several devices)
  class    --classes first; memcpy/memset: memory; a name with gemm, matmul, mm, conv,
           attention, attn, flash, fmha, cutlass or mma: compute; any other: memory

example:
  ecal import torch-trace trace.json -o step.json --min-duration-us 5
  ecal import torch-trace rank0.json rank1.json rank2.json rank3.json -o step.json
  ecal import nsys report.sqlite --step 3 -o step.json
  ecal characterize ... -o step.sigs.json         # the command it prints
  ecal plan step.json --deadline 1.05x -o plan.json"""


#: measure.trace_group.STREAM_MODES and DEFAULT_MIN_GAP_S, written out: building the parser
#: imports no library
STREAM_MODES = ("lanes", "serial")
DEFAULT_MIN_GAP_US = 5.0


def _add_torch_trace(kinds: Any, formatter_class: Any) -> None:
    for kind, text, path_help in (
            ("torch-trace", TORCH_TRACE_HELP,
             "the trace: prof.export_chrome_trace(path); several: one per rank (never written to)"),
            ("nsys", NSYS_HELP,
             "the export: nsys export --type sqlite REPORT.nsys-rep; several: one per rank "
             "(opened read-only)")):
        kp = kinds.add_parser(kind, help=text.split(" -> ")[0] + " -> a workload (not signatures)",
                              description=text, formatter_class=formatter_class,
                              epilog=TRACE_EPILOG)
        kp.add_argument("path", nargs="+", help=path_help)
        _trace_options(kp, kind)
        kp.set_defaults(handler=cmd_import_torch_trace)


def _trace_options(kp: Any, kind: str) -> None:
    kp.add_argument("-o", "--output", required=True,
                    help="workload file to write (JSON, ecal.workload/1)")
    kp.add_argument("--signatures", metavar="PATH", default=None,
                    help="the signature file every element's source names, as written in the "
                         "workload (relative to its folder); the printed `ecal characterize` "
                         "writes it (default: the output's stem + .sigs.json, beside it)")
    kp.add_argument("--min-duration-us", type=float, default=0.0, metavar="US",
                    help="consecutive kernels of one lane each shorter than this are one task, "
                         "their sequence one element, us (default: 0, every kernel a task)")
    kp.add_argument("--min-gap-us", type=float, default=DEFAULT_MIN_GAP_US, metavar="US",
                    help="a lane idle this long or longer before its next task (waiting for the "
                         "host) gets a gap task of that length, us (default: "
                         f"{DEFAULT_MIN_GAP_US:g}; shorter waits are reported, not modelled)")
    kp.add_argument("--no-gaps", action="store_true",
                    help="model no launch gap: tasks follow each other at once (default: gaps "
                         "of --min-gap-us or more are tasks)")
    kp.add_argument("--no-collectives", action="store_true",
                    help="do not match collective calls across devices into edges (default: "
                         "match them; needed when devices call them in different orders)")
    if kind == "torch-trace":
        kp.add_argument("--cpu-ops", action="store_true",
                        help="read the cpu_op events instead of GPU kernels (a CPU-only trace): "
                             "the outermost op of each thread; each process a device, each "
                             "thread a stream (default: GPU kernels)")
        kp.add_argument("--step", type=int, default=None, metavar="K",
                        help="read only profiler step K (ProfilerStep#K, marked by prof.step()): "
                             "the kernels launched in it (default: the whole file as one step)")
    else:
        kp.add_argument("--step", type=int, default=None, metavar="K",
                        help="read only the kernels launched in the NVTX range ProfilerStep#K, "
                             "or with --nvtx-range NAME the K-th range named NAME, from 0 "
                             "(default: the whole file as one step)")
        kp.add_argument("--nvtx-range", default=None, metavar="NAME",
                        help="the NVTX range name --step counts (default: ProfilerStep#K)")
    kp.add_argument("--device-prefix", default="gpu", metavar="PREFIX",
                    help="device d of the trace is named PREFIX + d in the workload (default: gpu)")
    kp.add_argument("--streams", choices=STREAM_MODES, default="serial",
                    help="serial: one lane per device, its streams' kernels in start order (a plan "
                         "its one clock can apply; overlap between streams lost, time "
                         "overestimated); lanes: one workload device per stream (gpu0.s7: overlap "
                         "kept, but each stream planned with its own operating point, which one "
                         "GPU cannot apply) (default: serial)")
    kp.add_argument("--classes", metavar="MAP.json", default=None,
                    help='roofline class by part of the kernel name, {"part": "compute" | '
                         '"memory"}, before the built-in rule (default: the built-in rule only)')
    kp.add_argument("--idle-power-w", dest="idle_power_w", type=float, default=75.0, metavar="W",
                    help="the workload's idle_power_w, W a device draws while it waits (default: "
                         "75, asserted, not measured)")
    kp.add_argument("--transitions", metavar="FILE", default=None,
                    help="a transition table (`ecal transitions ... -o FILE`) for the workload's "
                         "transitions (default: a constant 2 ms, 0 J per switch, asserted)")
    kp.add_argument("--name", default=None,
                    help="the workload's name (default: the output file's stem)")
    kp.add_argument("--json", action="store_true",
                    help="print machine-readable JSON instead of a table")


def _relative_to(path: str, folder: Path) -> str:
    """``path`` as written in a file in ``folder``: relative when it is below it, else absolute."""
    p = Path(path).resolve()
    try:
        return p.relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(p)


def _read_traces(args: argparse.Namespace) -> Any:
    """The trace(s) named on the command line, joined into one when there are several."""
    from measure.trace_group import join_traces

    traces = []
    for path in args.path:
        if args.kind == "nsys":
            from measure.nsys_trace import read_nsys_sqlite

            traces.append(read_nsys_sqlite(path, step=args.step, nvtx_range=args.nvtx_range))
        else:
            from measure.torch_trace import read_torch_trace

            traces.append(read_torch_trace(path, cpu_ops=args.cpu_ops, step=args.step))
    return join_traces(traces)


def _step_label(args: argparse.Namespace) -> str:
    if getattr(args, "nvtx_range", None):
        return f"NVTX range {args.nvtx_range!r} #{args.step}"
    return f"ProfilerStep#{args.step}"


def cmd_import_torch_trace(args: argparse.Namespace) -> int:
    """Run ``ecal import torch-trace|nsys TRACE... -o WORKLOAD``: read, group, write the
    workload, print what was read and the commands to run next."""
    import os
    import shlex

    from measure.trace_group import group_trace, read_class_map, summary_lines

    from .common import UsageError, check_outputs, finish
    from .output import Outputs

    cpu_ops = getattr(args, "cpu_ops", False)
    check_outputs(args, "-o", inputs=tuple(args.path))
    if not (args.min_duration_us >= 0 and args.min_duration_us < float("inf")):
        raise UsageError(f"--min-duration-us {args.min_duration_us}: give a finite time >= 0 us")
    if not (args.min_gap_us >= 0 and args.min_gap_us < float("inf")):
        raise UsageError(f"--min-gap-us {args.min_gap_us}: give a finite time >= 0 us")
    if not (args.idle_power_w >= 0 and args.idle_power_w < float("inf")):
        raise UsageError(f"--idle-power-w {args.idle_power_w}: give a finite power >= 0 W")
    if args.name == "":
        raise UsageError("--name: give a non-empty workload name")
    if len(set(map(os.path.realpath, args.path))) < len(args.path):
        raise UsageError("the same trace is named twice: give one file per rank")
    for path in args.path:
        if not Path(path).exists():
            raise FileNotFoundError(2, "no such file", path)
    out_path = Path(args.output)
    folder = out_path.resolve().parent
    sigs = args.signatures or out_path.stem + ".sigs.json"     # as the workload names it
    sigs_from_here = str(Path(sigs) if Path(sigs).is_absolute() else out_path.parent / sigs)
    if os.path.realpath(sigs_from_here) in {*map(os.path.realpath, args.path),
                                            str(out_path.resolve())}:
        raise UsageError(f"--signatures {sigs}: would be the trace or the workload; give another file")
    transitions: Any = None
    if args.transitions is not None:
        from frontier.files import read_json
        from frontier.transition import TransitionTable

        if not Path(args.transitions).is_file():
            raise FileNotFoundError(2, "no such file", args.transitions)
        TransitionTable.from_dict(read_json(args.transitions), args.transitions)   # checked now
        transitions = {"file": _relative_to(args.transitions, folder)}
    classes = read_class_map(args.classes) if args.classes else None

    trace = _read_traces(args)
    w = group_trace(trace, min_duration_s=args.min_duration_us * 1e-6,
                    device_prefix=args.device_prefix, streams=args.streams, classes=classes,
                    min_gap_s=None if args.no_gaps else args.min_gap_us * 1e-6,
                    collectives=not args.no_collectives)
    name = args.name or out_path.stem
    doc = w.to_workload(sigs, name=name, idle_power_w=args.idle_power_w, transitions=transitions)
    out = Outputs()
    out.json(args.output, doc)

    argv = ["ecal", "characterize", *(e.work for e in w.elements)]
    for e in w.elements:
        argv += ["--name", e.name]
    argv += ["-o", sigs_from_here]
    characterize = shlex.join(argv)
    plan = shlex.join(["ecal", "plan", args.output, "--deadline", "1.05x", "-o",
                       str(out_path.with_name(out_path.stem + ".plan.json"))])
    assumed = [f"idle power {args.idle_power_w:g} W (asserted: --idle-power-w)"]
    if transitions is None:
        assumed.append("every switch of operating point costs 2 ms, 0 J (asserted: "
                       "`ecal transitions` measures it, --transitions FILE takes it)")
    if args.step is None and len(trace.steps) > 1:
        assumed.append(f"the whole file is one step, though it marks {len(trace.steps)} profiler "
                       f"steps (#{trace.steps[0]}..#{trace.steps[-1]}; --step K reads one)")
    multi = [g for g in w.gpus if sum(1 for lane in w.lanes if lane.startswith(g + ".s")) > 1]
    if multi:
        assumed.append(f"{', '.join(multi)}: one lane per stream, each planned with its own "
                       "operating point although a GPU has one clock (--streams serial: one lane)")
    if w.gap_tasks:
        assumed.append("a launch gap is fixed time (a slower kernel may absorb it on the GPU: "
                       "then the step is shorter than planned)")
    if w.collectives:
        assumed.append("one process group per collective kind: the k-th AllReduce (and so on) of "
                       "every device is one call (--no-collectives: no cross-device edges)")
    if len(args.path) > 1:
        assumed.append(f"{len(args.path)} files, one per rank, in the order given")
    tasks_note = ("" if len(w.tasks) <= 32_768 else
                  f" ({len(w.tasks)} tasks: over the planner's default --max-tasks 32768; "
                  "--min-duration-us merges short kernels)")

    def text() -> str:
        lines = [f"{args.kind}: {', '.join(args.path)}{' (cpu ops)' if cpu_ops else ''}"
                 + (f", {_step_label(args)}" if args.step is not None else "")]
        lines += [f"  {x}" for x in summary_lines(w)]
        lines += [f"  assumed     {a}" for a in assumed]
        lines += ["next: characterize every element (its traced_* work runs on the simulated H200; "
                  "on a GPU, characterize your own code and set each element's source and work)",
                  f"  {characterize}",
                  f"  {plan}{tasks_note}"]
        return "\n".join(lines)

    def as_json() -> dict[str, Any]:
        return {"trace": args.path[0] if len(args.path) == 1 else list(args.path),
                "step": args.step, "output": args.output, "signatures": sigs,
                "kernels": w.kernels, "memory_ops": w.memory_ops, "devices": list(w.gpus),
                "lanes": list(w.lanes), "streams": w.streams, "tasks": len(w.tasks),
                "edges": len(w.edges), "collectives": w.collectives,
                "collective_edges": w.collective_edges, "gap_tasks": w.gap_tasks,
                "gap_time_s": w.gap_time_s, "short_gap_time_s": w.short_gap_time_s,
                "kernel_time_s": w.kernel_time_s, "span_s": w.span_s,
                "elements": {e.name: {"kernels": list(e.kernels), "roofline": e.roofline,
                                      "duration_s": e.duration_s, "tasks": e.tasks,
                                      "work": e.work} for e in w.elements},
                "assumed": assumed, "next": [characterize, plan]}

    return finish(args, out, as_json, text)


def loader_options(args: argparse.Namespace) -> dict[str, Any]:
    """The loader's keyword arguments from the parsed options (``--steps`` → ``steps``)."""
    return {key: getattr(args, key) for key in args.loader_keywords}


def _check(args: argparse.Namespace, opts: dict[str, Any]) -> None:
    from .common import UsageError

    for key, flag in (("static_power_w", "--static-power-w"), ("p2p_power_w", "--idle-power-w")):
        v = opts.get(key)
        if v is not None and not (v >= 0.0 and v < float("inf")):
            raise UsageError(f"{flag} {v}: give a finite power >= 0 W")
    for key, flag in (("n_gpus", "--n-gpus"), ("steps", "--steps")):
        v = opts.get(key)
        if v is not None and v < 1:
            raise UsageError(f"{flag} {v}: give an integer >= 1")
    if opts.get("name") == "" or opts.get("plo_name") == "":
        raise UsageError("--name: give a non-empty element name")


def cmd_import(args: argparse.Namespace) -> int:
    """Run ``ecal import KIND PATH -o OUT``: read, key each signature ``element@[κ@]ω``, write."""
    from frontier.io import save_signatures

    from .common import UsageError, check_outputs, finish
    from .output import Outputs

    check_outputs(args, "-o")
    opts = loader_options(args)
    _check(args, opts)
    if not Path(args.path).exists():
        raise FileNotFoundError(2, "no such file", args.path)
    groups = _loader(args.kind)(args.path, **opts)
    keyed = {}
    for element, sigs in groups.items():
        for s in sigs:
            key = "@".join([element] + ([s.kappa] if s.kappa else []) + [s.omega.label()])
            if key in keyed:
                raise UsageError(f"{args.path}: two measurements of {key!r}")
            keyed[key] = s
    if not keyed:
        raise UsageError(f"{args.path}: no measurements found")
    out = Outputs()
    def write(tmp: str) -> None:
        save_signatures(tmp, keyed)

    out.custom(args.output, write)
    lines = [f"{args.kind}: {len(groups)} element(s), {len(keyed)} signature(s)"]
    lines += [f"  {el}: {len(sigs)} operating point(s)" for el, sigs in sorted(groups.items())[:20]]
    if len(groups) > 20:
        lines.append(f"  ... {len(groups) - 20} more")
    return finish(args, out, lambda: {"elements": {el: len(v) for el, v in groups.items()},
                                       "output": args.output}, lambda: "\n".join(lines))
