"""``ecal campaign CAMPAIGN.yaml``: characterize many elements on many GPUs into one store.

See :mod:`measure.campaign` and ``docs/campaign.md``. The store (SQLite) is ``--store``, else
the file's ``store`` field (relative to the campaign file), else ``<campaign>.sqlite`` beside
it. Exit status 0 when every unit is in the store, 2 on bad input or when units failed on
their GPUs (the units committed are kept; a rerun measures the rest), 3 when the user's own
work raised, 130 when interrupted (a rerun resumes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .output import dump_json, progress_reporter


def add_campaign_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ecal campaign`` arguments (the parser itself is made by ``ecal.cli``)."""
    p.add_argument("file", help="campaign file (YAML or JSON): elements, kappas, grid, protocol")
    p.add_argument("--store", default=None,
                   help="results store (.sqlite); default: the file's 'store', else FILE.sqlite")
    p.add_argument("--device", choices=["sim", "nvml"], default=None,
                   help="override the file's device kind: sim (simulated H200s) or nvml (this "
                        "host's GPUs; a campaign spans GPUs, so no :INDEX: --gpus N uses GPUs "
                        "0..N-1; default: the file's, else sim)")
    p.add_argument("--gpus", type=int, default=None,
                   help="local workers, one per GPU (default: every GPU of the host; sim: 1)")
    p.add_argument("--ray", default=None, metavar="auto|local|ADDRESS",
                   help="run units as Ray tasks (num_gpus=1 each): auto joins the running cluster, "
                        "local starts one here, or a cluster address (needs the ray extra)")
    p.add_argument("--ray-cpus-per-task", type=float, default=1.0,
                   help="CPUs each unit's Ray task asks for (default 1)")
    p.add_argument("--max-retries", type=int, default=None,
                   help="retries of a unit whose GPU failed (default: the file's, else 3)")
    p.add_argument("--quiet", action="store_true", help="no progress (bar or lines)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")


def cmd_campaign(args: argparse.Namespace) -> int:
    """Run (or resume) the campaign; print what was done."""
    from dataclasses import replace

    from measure.campaign import load_campaign, run_campaign

    from .common import UsageError

    if not Path(args.file).exists():
        raise FileNotFoundError(2, "no such file", args.file)
    spec = load_campaign(args.file)
    if args.device is not None:
        spec = replace(spec, device=args.device)
    if args.max_retries is not None:
        if args.max_retries < 0:
            raise UsageError(f"--max-retries must be >= 0, got {args.max_retries}")
        spec = replace(spec, max_retries=args.max_retries)
    if args.gpus is not None and args.gpus < 1:
        raise UsageError(f"--gpus must be >= 1, got {args.gpus}")
    if not args.ray_cpus_per_task >= 0:
        raise UsageError(f"--ray-cpus-per-task must be >= 0, got {args.ray_cpus_per_task:g}")
    store = args.store
    if store is None:
        base = Path(args.file).parent
        store = str(base / spec.store) if spec.store else str(Path(args.file).with_suffix(".sqlite"))
    res = run_campaign(spec, store, gpus=args.gpus, ray_address=args.ray,
                       progress=progress_reporter(not (args.quiet or args.json)),
                       ray_cpus_per_task=args.ray_cpus_per_task)
    if args.json:
        dump_json(res.to_dict())
    else:
        print(res.summary())
    if res.failed:
        print(f"ecal campaign: error: {len(res.failed)} unit(s) failed (the {res.measured} "
              f"measured are in {store}; rerun to retry the rest)", file=sys.stderr)
        return 3 if res.work_failed else 2
    return 0
