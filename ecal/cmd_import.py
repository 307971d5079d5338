"""``ecal import KIND PATH -o OUT [options of KIND]``: published measurements → a signature file.

Each kind is its own sub-command, so ``ecal import zeus-plo --help`` lists the options that kind
takes (the static power to subtract, the element's name, the GPU count, ...) with their
defaults; the readers are :mod:`measure.replay` and :mod:`measure.zeus`, whose keyword arguments
the options map to one for one.
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
  perseus       a Perseus profile CSV"""


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
    p = sub.add_parser("import", help="signatures from published measurements",
                       formatter_class=formatter_class,
                       epilog="examples:\n"
                              "  ecal import zeus-trace summary_power_v100.csv -o v100.json\n"
                              "  ecal import perseus profile.csv --idle-power-w 60 -o p.json\n"
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
    return p


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
