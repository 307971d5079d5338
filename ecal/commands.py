"""Command handlers of ``ecal``: each parses nothing, calls the libraries, prints, writes.

Every handler stages its output files in :class:`~ecal.output.Outputs` and commits them only
after all work succeeded, so a failing command leaves no partial file.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from frontier.errors import EnergyCalculusError

from .output import Outputs, dump_json


class UsageError(EnergyCalculusError):
    """A bad command-line value (reported as a one-line error, exit code 2)."""


def _stem(path: str) -> str:
    return Path(path).stem


def element_of(key: str) -> str:
    """Element name of a signature-file key: ``gemm@1980MHz/700W`` → ``gemm``.

    Characterization writes one signature per operating point under ``element@ω`` keys; every
    point of one element shares the part before ``@``.
    """
    return key.split("@", 1)[0]


# -- compose / check ---------------------------------------------------------------------------

def cmd_compose(args: argparse.Namespace) -> int:
    """``ecal compose FILE``: predicted T and E ± σ and the Eq. 13 bias bound per composition."""
    from frontier.io import load_workbook

    wb = load_workbook(args.file)
    if not wb.entries:
        raise UsageError(f"{args.file}: has no compositions to predict")
    if args.json:
        dump_json(wb.to_dict(alpha=args.alpha))
        return 0
    if wb.description:
        print(wb.description)
    for line in wb.summary_lines(alpha=args.alpha):
        print(line)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``ecal check FILE``: Eq. 23 of each measured composite; exit 1 if any is flagged."""
    from frontier.io import load_workbook

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

    sigs = load_signatures(args.file)
    groups: dict[str, list] = defaultdict(list)
    for key, sig in sigs.items():
        groups[element_of(key)].append(sig)
    if args.element is not None:
        if args.element not in groups:
            raise UsageError(f"{args.file}: no element {args.element!r} (has: {', '.join(sorted(groups))})")
        groups = {args.element: groups[args.element]}
    fronts = {el: pareto_frontier(pts, args.criterion, name=el) for el, pts in groups.items()}
    out = Outputs()
    if args.output:
        out.json(args.output, {"schema_version": 1, "units": {"time": "s", "energy": "J", "power": "W"},
                               "frontiers": {el: f.to_dict() for el, f in fronts.items()}})
    if args.plot:
        from frontier.plot import plot_frontier

        if len(fronts) > 1 and args.element is None:
            raise UsageError(f"{args.file}: has {len(fronts)} elements; pick one to plot with --element")
        el = next(iter(fronts))
        out.figure(args.plot, plot_frontier(groups[el], title=f"{el}: achievable set and frontier"))
    if args.json:
        dump_json({el: f.to_dict() for el, f in fronts.items()})
    else:
        for el, f in fronts.items():
            print(f"{el}: {len(f)} frontier point(s) of {len(groups[el])} measured ({args.criterion})")
            print(f.to_table())
    for p in out.commit():
        print(f"wrote {p}", file=sys.stderr)
    return 0
