"""``ecal transitions WORKLOAD -o transitions.json``: measure what switching ω_dev costs.

Reads the workload (its ``transitions`` may still be missing: this is how they are given),
collects every device operating point ω_dev its elements' signatures use, and measures the
settle time of every ordered pair of them on the device (:func:`measure.measure_transitions`:
set the target, poll the SM clock until it reads it; ε = ready power at the target × τ).
The table it writes holds the measured pairs and a rule fitted to them that prices any other
switch; the workload then names it::

    "transitions": {"file": "transitions.json"}

On ``--device sim`` the pairs are measured on a simulated H200 (SIMULATED in the output); on
``nvml:N`` on the real GPU (clock locks need root), which is restored afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any


def add_transitions_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ecal transitions`` arguments (the parser itself is made by ``ecal.cli``)."""
    p.add_argument("workload", help="workload file (ecal.workload/1) whose operating points to measure")
    p.add_argument("--device", default="sim", help="sim (a simulated H200, default) or nvml:INDEX")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    p.add_argument("--repeats", type=int, default=3,
                   help="settle-time probes per pair; the median is kept (default 3)")
    p.add_argument("-o", "--output", required=True, help="transition table to write (JSON)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")


def cmd_transitions(args: argparse.Namespace) -> int:
    """Measure the settle time of every switch between the workload's operating points."""
    import measure
    from execution.workload import load_workload

    from .common import UsageError, check_outputs, finish
    from .output import Outputs

    check_outputs(args, "-o")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    wl = load_workload(args.workload, require_transitions=False)
    omegas = sorted({o.omega.dev for t in wl.problem.tasks for o in t.options})
    if len(omegas) < 2:
        raise UsageError(f"{args.workload}: its elements use {len(omegas)} operating point(s): "
                         "there is no switch to measure (\"transitions\": \"free\" is then exact)")
    device = measure.open_device(args.device, seed=args.seed)
    try:
        table = measure.measure_transitions(device, omegas, repeats=args.repeats)
        where = "simulated H200 (SIMULATED)" if getattr(device, "simulated", False) else device.name
    finally:
        device.close()
    out = Outputs()
    out.json(args.output, table.to_dict())
    taus = [c[0] for _pair, c in table.pairs]

    def doc() -> Any:
        return {"workload": args.workload, "device": where, "operating_points": [o.label() for o in omegas],
                "pairs": len(taus), "median_time_s": statistics.median(taus),
                "min_time_s": min(taus), "max_time_s": max(taus),
                "rule": None if table.rule is None else table.rule.describe(),
                "output": args.output}

    rel = os.path.relpath(os.path.abspath(args.output), os.path.dirname(os.path.abspath(args.workload)))
    if rel.startswith(".."):
        rel = os.path.abspath(args.output)

    def text() -> str:
        return "\n".join([
            f"{len(taus)} switches between {len(omegas)} operating points measured on {where}: "
            f"settle time median {statistics.median(taus) * 1e3:.2f} ms "
            f"({min(taus) * 1e3:.2f}-{max(taus) * 1e3:.2f} ms)",
            f"  other switches by the fitted rule: {table.rule.describe() if table.rule else 'none'}",
            f"  use it: \"transitions\": {{\"file\": \"{rel}\"}} in {args.workload}"])

    return finish(args, out, doc, text)
