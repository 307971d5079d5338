"""``ecal selftest --device nvml:N``: does this GPU behave as the tool assumes?

Read-only by default (no clock or power limit changes): counter period and read cost,
deep-idle and ready power, a sequential composite predicted and measured (Eq. 23), SM-split
scaling with the counts the device grants, and whether co-run partitions are disjoint; one
verdict per assumption (:mod:`measure.selftest`, docs/selftest.md). ``--device sim`` runs it
on the simulated H200 in about a second.

``--write`` adds the checks that change settings (:mod:`measure.selftest_write`): the power
cap on short windows and the switch latency of each knob. The device is then opened
writable: every change is journalled first and restored after, also on SIGINT/SIGTERM; after
a SIGKILL, ``ecal restore`` puts the card back. On a real GPU the setters need root or zeusd
(docs/zeusd.md).

Exit status: 0 when no check failed (pass, warn or skipped), 1 when a check failed (the report
is still printed and written), 2 on bad input or a device that cannot be opened.
"""

from __future__ import annotations

import argparse

from .output import dump_json, progress_reporter


def add_selftest_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ecal selftest`` arguments (the parser itself is made by ``ecal.cli``)."""
    p.add_argument("--device", default="sim",
                   help="nvml:INDEX (a real GPU, opened read-only) or sim (default: sim)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (--device sim)")
    p.add_argument("-o", "--output", default=None, help="JSON report to write (ecal.selftest/1)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of a table")
    p.add_argument("--write", action="store_true",
                   help="also check the switch latency per knob and the power cap on short windows: "
                        "changes clocks and the power limit, journalled and restored after "
                        "(default: read-only)")
    p.set_defaults(handler=cmd_selftest)


def cmd_selftest(args: argparse.Namespace) -> int:
    """Run the read-only checks on ``--device``; print the table (or JSON); write ``-o``."""
    import measure
    from frontier.files import write_json_atomic
    from measure.selftest import run_selftest

    from .output import check_output_path

    if args.output:
        check_output_path(args.output, "-o")
    device = measure.open_device(args.device, read_only=not args.write, seed=args.seed)
    reporter = progress_reporter(not args.json)
    try:
        report = run_selftest(device, progress=reporter, write=args.write)
    finally:
        if reporter is not None:
            reporter.close()        # the bar (a terminal) ends before the table is printed
        device.close()
    doc = report.to_dict()
    if args.output:
        write_json_atomic(args.output, doc)
    if args.json:
        dump_json(doc)
    else:
        print(report.to_table())
        if args.output:
            print(f"wrote {args.output}")
    return 0 if report.ok else 1
