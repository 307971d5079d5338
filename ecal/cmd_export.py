"""``ecal export zeus-pfo PLAN -o freqs.py``: a plan in the form another tool deploys.

``zeus-pfo``: Zeus's pipeline frequency optimizer (Perseus). PLAN is an ``ecal.schedule/1``
file (``ecal plan --schedule``) or an ``ecal.plan/1`` plan (``ecal plan -o``) of a pipeline
(tasks ``s{stage}/forward|backward/{microbatch}``). ``-o`` ending in ``.py`` writes the
``PointSolution`` solution file (per rank, ``(instruction, MHz)`` of one iteration); ``.json``
writes the list of ``FrequencySchedule`` objects. What Zeus cannot carry (power limits,
memory clocks, SM allocations) is dropped with a warning on stderr per kind
(:mod:`measure.zeus`). Exit 0 when written, 2 on bad input (nothing written).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_export_arguments(sub: Any, formatter_class: Any = argparse.RawDescriptionHelpFormatter
                         ) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to ``sub`` (the ``add_subparsers`` object of ``ecal``), with
    one sub-command per target so ``ecal export zeus-pfo --help`` shows that target's help."""
    p = sub.add_parser("export", help="write a plan in the form another tool deploys (Zeus PFO)",
                       formatter_class=formatter_class,
                       epilog="example:\n  ecal export zeus-pfo schedule.json -o freqs.py")
    targets = p.add_subparsers(dest="kind", metavar="TARGET", required=True)
    t = targets.add_parser(
        "zeus-pfo", help="Zeus pipeline frequency optimizer (Perseus)", formatter_class=formatter_class,
        description="A plan or schedule as Zeus's pipeline frequency optimizer deploys it.",
        epilog=("examples:\n  ecal export zeus-pfo schedule.json -o freqs.py\n"
                "  ecal export zeus-pfo plan.json -o freqs.sched.json --json\n"
                "deploy: ZEUS_PFO_SCHEDULER=PointSolution "
                "ZEUS_PFO_SCHEDULER_ARGS='{\"solution_path\": \"freqs.py\"}'\n"
                "Zeus sets only SM clocks: power limits, memory clocks and SM "
                "allocations are dropped (warned on stderr)"))
    t.add_argument("plan", help="ecal.schedule/1 file (ecal plan --schedule) or ecal.plan/1 plan")
    t.add_argument("-o", "--output", required=True,
                   help="file to write: .py (PointSolution solution file) or .json (FrequencySchedule list)")
    t.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    return p


def cmd_export(args: argparse.Namespace) -> int:
    """Run ``ecal export`` (see module doc)."""
    from measure.zeus import pfo_frequencies, pfo_json, pfo_text, read_plan_or_schedule

    from .common import UsageError, check_outputs, finish
    from .output import Outputs

    check_outputs(args, "-o")
    out_path = str(args.output)
    if not out_path.endswith((".py", ".json")):
        raise UsageError(f"-o {out_path}: give a .py (PointSolution) or .json (FrequencySchedule) file")
    doc = read_plan_or_schedule(args.plan)
    sched = pfo_frequencies(doc, str(args.plan))
    for w in sched.warnings:
        print(f"ecal export: warning: {w}", file=sys.stderr)
    out = Outputs()
    if out_path.endswith(".py"):
        out.text(out_path, pfo_text(sched))
    else:
        out.json(out_path, pfo_json(sched))
    lines = [f"zeus-pfo: {len(sched.frequencies)} rank(s)"]
    for dev, freqs in zip(sched.devices, sched.frequencies):
        distinct = sorted({f for _, f in freqs}, reverse=True)
        lines.append(f"  {dev}: {len(freqs)} instructions at {', '.join(map(str, distinct[:6]))} MHz"
                     + (" ..." if len(distinct) > 6 else ""))
    return finish(args, out, lambda: {"ranks": list(sched.devices), "output": out_path,
                                       "warnings": list(sched.warnings),
                                       "schedule": pfo_json(sched)}, lambda: "\n".join(lines))
