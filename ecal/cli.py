"""The ``ecal`` command line: thin argument parsing over the libraries.

Exit codes scripts can rely on:
  0  success
  1  ``ecal check`` found a composite whose measurement deviates from its prediction (Eq. 23)
  2  bad input: unreadable or malformed file, bad option, infeasible deadline, missing
     permission or device — a one-line error on stderr, and no output file is written
  130 interrupted (Ctrl-C); devices are restored first
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EPILOG = """examples:
  ecal demo                                      # the whole job on the simulated H200 -> demo/
  ecal characterize gemm_bf16_8192 --grid "sm_clock_mhz=1980:1200:-60" -o gemm.json --plot gemm.png
  ecal frontier gemm.json --plot frontier.png
  ecal compose ecal/examples/attention_tp2.json
  ecal check ecal/examples/h200_compositions.json
  ecal plan ecal/examples/pipeline_4x8.csv --deadline 1.05x -o plan.json --plot plan.png
  ecal pareto ecal/examples/pipeline_4x8.csv --plot pareto.png
  ecal import nv-dvfs ../shared/data/nv-dvfs/v100-dvfs-real.csv -o v100.json

exit codes: 0 ok; 1 check flagged a deviation; 2 bad input (nothing written); 130 interrupted
"""


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    ap = argparse.ArgumentParser(
        prog="ecal",
        description="Measure, compose and plan GPU time-energy frontiers with propagated uncertainty.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter

    p = sub.add_parser("characterize", help="measure an element's signatures over an operating-point grid",
                       formatter_class=fmt, epilog="""examples:
  ecal characterize gemm_bf16_8192 --grid "sm_clock_mhz=1980:1200:-60,power_limit_w=700,500" -o gemm.json
  ecal characterize copy_2GiB --device nvml:0 --read-only --results sweep.jsonl
work: a simulated kernel preset name (see --list), or module:function for a real GPU""")
    p.add_argument("work", nargs="?", default="gemm_bf16_8192", help="kernel preset or module:function")
    p.add_argument("--device", default="sim", help="sim (simulated H200, default) or nvml:INDEX")
    p.add_argument("--grid", default=None, help='knob=values,... e.g. "sm_clock_mhz=1980:1200:-60,power_limit_w=700,500"')
    p.add_argument("--read-only", action="store_true", help="never change device settings (sweep SM allocation only)")
    p.add_argument("--results", default=None, help="JSON-lines file each point is appended to; a rerun resumes")
    p.add_argument("--target-rse", type=float, default=0.01, help="stop repeating at this relative std. error of E")
    p.add_argument("--seed", type=int, default=0, help="simulator seed")
    p.add_argument("--list", action="store_true", help="list the simulated kernel presets and exit")
    p.add_argument("-o", "--output", default=None, help="signature/frontier file to write (JSON)")
    p.add_argument("--plot", default=None, help="frontier plot to write (PNG)")
    _add_json(p)

    p = sub.add_parser("frontier", help="Pareto frontier of a signature file", formatter_class=fmt,
                       epilog="examples:\n  ecal frontier gemm.json --plot frontier.png\n"
                              "  ecal frontier gemm.json --criterion Td   # safe before a same-device ⊕")
    p.add_argument("file", help="signature file (from characterize or import)")
    p.add_argument("--element", default=None, help="only this element (default: every element in the file)")
    p.add_argument("--criterion", choices=["TE", "Td", "Tsd"], default="TE",
                   help="TE before ⊗ (default); Td before ⊕ (same device); Tsd before ⊕multi")
    p.add_argument("--plot", default=None, help="plot to write (PNG)")
    p.add_argument("-o", "--output", default=None, help="frontier file to write (JSON)")
    _add_json(p)

    p = sub.add_parser("compose", help="predict T and E (± σ, bias bound) of compositions",
                       formatter_class=fmt, epilog="example:\n  ecal compose ecal/examples/attention_tp2.json")
    p.add_argument("file", help="workbook: signatures + composition expressions")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level for the bias bound (c_α)")
    _add_json(p)

    p = sub.add_parser("check", help="compare measured composites with predictions (Eq. 23)",
                       formatter_class=fmt, epilog="example:\n  ecal check ecal/examples/h200_compositions.json\n"
                                                   "exit status 1 when any composite is flagged")
    p.add_argument("file", help="workbook with measured composites")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--bias-aware", action="store_true", help="accept the Eq. 13 bias bound as tolerance")
    _add_json(p)

    for name, helptext in (("plan", "choose operating points under a deadline"),
                           ("pareto", "energy-vs-deadline frontier of a workload")):
        p = sub.add_parser(name, help=helptext, formatter_class=fmt, epilog=(
            "examples:\n  ecal plan ecal/examples/pipeline_4x8.csv --deadline 1.05x -o plan.json --plot plan.png\n"
            "  ecal plan problem.json --deadline 0.95 --transition-time-s 0.01 --transition-energy-j 2"
            if name == "plan" else
            "example:\n  ecal pareto ecal/examples/pipeline_4x8.csv --plot pareto.png -o pareto.json"))
        p.add_argument("workload", help="Perseus profile CSV (1F1B pipeline) or JSON problem file")
        if name == "plan":
            p.add_argument("--deadline", required=True, help="seconds (0.95) or a factor of the fastest makespan (1.05x)")
            p.add_argument("--schedule", default=None,
                           help="also write a per-stage frequency schedule a training loop can read (JSON)")
        else:
            p.add_argument("--points", type=int, default=None, help="number of deadlines when a grid is used")
        p.add_argument("--microbatches", type=int, default=8, help="microbatches for a Perseus profile (1F1B)")
        p.add_argument("--p2p-power-w", type=float, default=75.0, help="P2P-blocking (idle) power per GPU, W")
        p.add_argument("--transition-time-s", type=float, default=0.0, help="time to switch ω_dev, s")
        p.add_argument("--transition-energy-j", type=float, default=0.0, help="energy to switch ω_dev, J")
        p.add_argument("--method", default="auto", help="auto, dp, ilp or fast")
        p.add_argument("--time-limit-s", type=float, default=None,
                       help="MILP time limit; for the fast method with switch costs, the cap of its search "
                            "(its work budget scales with it)")
        p.add_argument("-o", "--output", default=None, help="plan/curve file to write (JSON)")
        p.add_argument("--plot", default=None, help="timeline / curve plot to write (PNG)")
        _add_json(p)

    p = sub.add_parser("import", help="signatures from published measurements", formatter_class=fmt,
                       epilog="kinds: h200, nv-dvfs, zeus-trace, zeus-log, perseus\nexample:\n"
                              "  ecal import zeus-trace ../shared/data/zeus/nsdi23-traces/summary_power_v100.csv -o v100.json")
    p.add_argument("kind", choices=["h200", "nv-dvfs", "zeus-trace", "zeus-log", "perseus"])
    p.add_argument("path", help="input file")
    p.add_argument("-o", "--output", required=True, help="signature file to write (JSON)")
    _add_json(p)

    p = sub.add_parser("demo", help="the whole job on the simulated H200: characterize, compose, plan",
                       formatter_class=fmt, epilog="example:\n  ecal demo            # writes demo/")
    p.add_argument("--out", default="demo", help="output folder (default: demo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", default="1.05x", help="deadline (default 1.05x the fastest makespan)")
    _add_json(p)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ecal`` console script; returns the exit code."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help()
        return 2
    from frontier.errors import EnergyCalculusError

    from . import commands

    handler = getattr(commands, "cmd_" + args.command.replace("-", "_"))
    try:
        return int(handler(args) or 0)
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: not an error of ours
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("ecal: interrupted", file=sys.stderr)
        return 130
    except (EnergyCalculusError, OSError, ValueError, KeyError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, FileNotFoundError):
            msg = f"{exc.filename}: no such file"
        print(f"ecal {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
