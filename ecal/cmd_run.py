"""``ecal run PLAN --device sim``: execute a plan, measure it, hold it against Eq. 23.

The plan file is one ``ecal demo`` writes (``demo/plan.json``) or any ``ecal plan`` output that
names a runnable workload: a ``"workload"`` object with the problem file the plan was made for
and the work table (what each task's options run; ``execution.work.save_work_table``), paths
relative to the plan file (:mod:`execution.runnable`)::

    {"format": "ecal.plan/1", ..., "tasks": [...],
     "workload": {"problem": "problem.json",        # solvers.io JSON problem format
                  "work": "work.json",              # execution.work work-table format
                  "baselines": "baselines.json"}}   # optional: plans to measure savings against

``baselines.json`` (``{"format": "ecal.baselines/1", "baselines":
{name: plan file}}``) names further plan files, each with its own workload; each is run like
the plan and the measured savings (with σ) against each are reported.

``--device sim`` runs every plan device on its own simulated H200 (``execution.run.run_plan``).

**Your own plan: ``ecal run plan.json [--workload workload.json] [--device nvml:N]``.** A plan
``ecal plan workload.json -o plan.json`` wrote records its workload file (the path as given,
resolved, and the overrides it was planned with), so it runs without ``--workload``;
``--workload`` names another copy of it. It is run with the workload it was made for: each
task runs its element's ``work`` (``module:factory``, imported from the working folder; the
factory is called once, outside every window; a simulated preset on ``--device sim``) at the
plan's ω, step after step, measured with the tick-aligned protocol until the target relative
standard error; then the same step with every task at the top clock and power limit (the
baseline, ``--no-baselines`` skips it): measured T and E ± σ against the prediction, Eq. 23,
and the measured saving. ``--device nvml:N`` runs a single-device plan (a chain or a DAG on
one device) on GPU N.

**Several GPUs: ``--device nvml:0,1,2,3``.** One GPU index per plan device, in the plan's
device order (a list of another length, or an index named twice, is refused before anything
runs). Each GPU gets its own worker process, which takes that GPU's lock, journals its card
state before any change and restores it at the end, on an error, on SIGINT/SIGTERM, or when
another GPU's worker fails (:mod:`execution.multi_gpu`). All start each step at a common
barrier; a task waits for its predecessors on other GPUs (the place of your communication);
each GPU's energy is read with the tick-aligned protocol; Eq. 23 is tested per GPU and for the
step, and the result has the same form as a ``--device sim`` run's. In a training job of your
own, apply a plan per rank with ``measure.PlanApplier.from_schedule`` instead.

**What happened.** Below the table: ``deadline D ms: met, X ms to spare`` or ``deadline D ms:
MISSED by X ms (Y %)`` — the measured step (mean over the measured steps) against the deadline
the plan was made to keep (``Plan.target_deadline_s``: the one asked for, before a confidence
tightened it), how many measured steps ran over, and the plan's own P(makespan ≤ deadline);
then the last line, ``result: ...``, says what went wrong or that nothing did.

Exit status: 0 when the plan's measured step met its deadline and none of the plan's Eq. 23
tests flagged (its step, its devices); 1 when the deadline was missed or one of them flagged
(the run itself completed: a deviation is a result, and ``-o`` is written); 2 on bad input; 3
when your work raised (the GPU restored) or, on several GPUs, when one GPU's worker failed or
was killed (one line names that GPU; the others were stopped and restored; nothing written). A baseline's own flags are shown (and noted on the
last line) but are not the plan's: they do not change the status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The execution layer (and with it the solvers, scipy) is imported when a run starts, not
# when ``ecal --help`` builds the parser.

__all__ = ["add_run_arguments", "cmd_run", "verdict"]


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ecal run`` arguments (the parser itself is made by ``ecal.cli``)."""
    p.add_argument("plan", help="plan file naming its workload (ecal plan WORKLOAD -o PLAN, or "
                                "demo/plan.json from ecal demo)")
    p.add_argument("--device", default="sim",
                   help="sim: one simulated H200 per plan device (default); nvml:INDEX: a real "
                        "GPU (a plan made from a workload file; single-device plans); "
                        "nvml:I,J,...: one GPU per plan device, in order, one worker process each")
    p.add_argument("--workload", default=None,
                   help="the workload file the plan was made from (default: the one the plan "
                        "records): its elements' work is what runs")
    p.add_argument("--microbatches", type=int, default=None,
                   help="with --workload: the same override ecal plan was given, if any")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (default 0, as ecal demo)")
    p.add_argument("--warmup-steps", type=int, default=1, metavar="N",
                   help="unmeasured steps before the measured ones (default 1); more runs the "
                        "plan at the thermal steady state of a long job, which a plan made with "
                        "--contexts (periodic entry) assumes: on the simulated H200, 8 steps of "
                        "the bundled example")
    p.add_argument("--target-rse", type=float, default=0.01,
                   help="repeat steps until the step energy's relative standard error is this "
                        "(default: %(default)s)")
    p.add_argument("--no-baselines", action="store_true",
                   help="run the plan only, not the baselines its workload names")
    p.add_argument("-o", "--output", default=None, help="execution result to write (JSON)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")


def _check_device(device: str, workload: str | None, recorded: bool) -> None:
    from execution.runnable import RunInputError

    if device == "sim":
        return
    if device.startswith("nvml:"):
        if workload is None and not recorded:
            raise RunInputError(f"--device {device}: a real run needs the plan's workload "
                                "(--workload FILE, whose elements name their work); the demo's "
                                "plans run on --device sim")
        return
    raise RunInputError(f"--device {device!r}: use sim (simulated H200s), nvml:INDEX or "
                        "nvml:INDEX,INDEX,... (one GPU per plan device)")


def cmd_run(args: argparse.Namespace) -> int:
    """``ecal run PLAN``: execute the plan (on simulated H200s by default); print (and with
    ``-o`` write) prediction against measurement with Eq. 23, and measured savings against
    its baselines."""
    from execution.runnable import recorded_workload, run_plan_file, run_plan_with_workload

    from .common import UsageError, check_outputs, finish
    from .output import Outputs

    recorded = (args.workload is None and Path(args.plan).is_file()
                and recorded_workload(args.plan) is not None)
    _check_device(args.device, args.workload, recorded)
    if args.warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if not (args.target_rse > 0 and args.target_rse < 1):
        raise UsageError(f"--target-rse must be in (0, 1), got {args.target_rse:g}")
    check_outputs(args, "-o")
    if args.microbatches is not None and args.workload is None:
        raise UsageError("--microbatches applies with --workload")
    if args.workload is not None or recorded:
        from execution.multi_gpu import GpuWorkerError

        try:
            res = run_plan_with_workload(args.plan, args.workload, device=args.device,
                                         seed=args.seed, target_rse=args.target_rse,
                                         baselines=not args.no_baselines,
                                         microbatches=args.microbatches,
                                         warmup_steps=args.warmup_steps)
        except GpuWorkerError as exc:
            print(f"ecal run: error: {exc}", file=sys.stderr)
            return 3
    else:
        res = run_plan_file(args.plan, seed=args.seed, target_rse=args.target_rse,
                            baselines=not args.no_baselines, warmup_steps=args.warmup_steps)
    out = Outputs()
    if args.output:
        out.json(args.output, res.to_dict())
    problems = res.problems()
    notes = res.notes() if hasattr(res, "notes") else []
    finish(args, out, res.to_dict, lambda: f"{res.summary()}\n{verdict(problems, notes)}")
    return 1 if problems else 0


def verdict(problems: list[str], notes: list[str] = ()) -> str:
    """The last line of ``ecal run``: what went wrong with the plan (exit 1), or that nothing
    did (exit 0); then the baselines' own flags, as notes."""
    text = (f"result: {'; '.join(problems)}: exit 1" if problems else
            "result: deadline met, prediction confirmed (Eq. 23): exit 0")
    if notes:
        text += f" (note, not the plan's: {'; '.join(notes)})"
    return text
