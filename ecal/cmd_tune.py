"""``ecal tune WORKLOAD --deadline 1.05x -o plan.json``: plan, run each plan K times, calibrate,
plan again until a round keeps the deadline at the confidence (measured over its K runs) with
its measured energy within σ (:mod:`execution.tune`, whose docstring states both checks).

Exit status: 0 when the last round passed both checks (converged); 1 when the rounds ran out
first (the last plan is still written with ``-o``, and every round is shown); 2 on bad input
or a deadline no plan can keep.
"""

from __future__ import annotations

import argparse

__all__ = ["add_tune_arguments", "cmd_tune"]


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ecal tune`` arguments (the parser itself is made by ``ecal.cli``)."""
    p.add_argument("workload", help="workload file (ecal.workload/1) whose elements name their work")
    p.add_argument("--deadline", required=True, help="seconds (1.37) or a factor of the fastest makespan (1.05x)")
    p.add_argument("--confidence", type=float, default=0.95, metavar="P",
                   help="the deadline holds with this probability on the calibrated prediction "
                        "(default 0.95)")
    p.add_argument("--rounds", type=int, default=6,
                   help="most plan-and-run rounds (default: %(default)s: the first plan and up to "
                        "five calibrated ones)")
    p.add_argument("--runs", type=int, default=5, metavar="K",
                   help="runs of each round's plan, each on its own simulator seed (default: "
                        "%(default)s); the deadline check is on their mean and spread")
    p.add_argument("--device", default="sim",
                   help="sim: one simulated H200 per plan device (default); nvml:INDEX: a real GPU "
                        "(single-device workloads)")
    p.add_argument("--seed", type=int, default=0,
                   help="the loop's first seed; run i uses seed + 1009*i (default 0)")
    p.add_argument("--target-rse", type=float, default=0.01,
                   help="each run repeats steps until the step energy's relative standard error is "
                        "this (default: %(default)s)")
    p.add_argument("--method", default="auto", help="auto, dp, ilp or fast (default: %(default)s)")
    p.add_argument("--warmup-steps", type=int, default=1, metavar="N",
                   help="unmeasured steps before each run's measured ones (default 1); 8 calibrates "
                        "at the thermal steady state of a long job on the simulated H200 (ecal run "
                        "--warmup-steps)")
    p.add_argument("--microbatches", type=int, default=None,
                   help="the workload's pipeline with this many microbatches instead of its own")
    p.add_argument("-o", "--output", default=None,
                   help="the tuned plan (ecal.plan/1; runnable by ecal run, with its workload and "
                        "calibration)")
    p.add_argument("--json", action="store_true", help="print the tuned plan as JSON instead of a table")
    from .common import add_context_arguments

    add_context_arguments(p)
    p.set_defaults(handler=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    """``ecal tune``: see the module docstring."""
    from execution.tune import tune

    from .commands import _confidence, _parse_deadline, context_entry
    from .common import UsageError, check_outputs, finish
    from .output import Outputs, progress_reporter

    check_outputs(args, "-o")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    if args.warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.runs < 1:
        raise UsageError(f"--runs must be >= 1, got {args.runs}")
    if not 0 < args.target_rse < 1:
        raise UsageError(f"--target-rse must be in (0, 1), got {args.target_rse:g}")
    if args.microbatches is not None and args.microbatches < 1:
        raise UsageError(f"--microbatches must be >= 1, got {args.microbatches}")
    if args.device != "sim" and not args.device.startswith("nvml:"):
        raise UsageError(f"--device {args.device!r}: use sim (simulated H200s) or nvml:INDEX")
    res = tune(args.workload, _parse_deadline(args.deadline), confidence=_confidence(args),
               max_rounds=args.rounds, runs_per_round=args.runs, device=args.device, seed=args.seed,
               target_rse=args.target_rse, method=args.method, microbatches=args.microbatches,
               progress=progress_reporter(not args.json), contexts=args.contexts,
               context_entry=context_entry(args), warmup_steps=args.warmup_steps)
    out = Outputs()
    if args.output:
        out.json(args.output, res.plan_dict())
    finish(args, out, res.plan_dict, lambda: f"{res.plan.summary()}\n{res.summary()}")
    return 0 if res.converged else 1
