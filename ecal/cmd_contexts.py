"""``ecal contexts WORKLOAD -o contexts.json``: characterize every option of a workload at two
or more entry temperatures (:mod:`execution.contexts`).

For each device of the workload (or those named by ``--devices``), every distinct
``element@ω`` of its tasks' options is run entered cold (the device cooled to the null
context) and pre-heated to each ``--warm-c`` target, ``--repeats`` runs each, and the
device's first-order thermal model (ambient, R_th, τ) and its resolution σ_Θ are fitted to
the windows those runs and cooldowns gave. The file written (``ecal.contexts/1``, as
``ecal reorder --save-contexts`` writes) holds per device the thermal model and every option
at its entry temperatures: what a plan composed with the entry context reads
(``ecal plan --contexts FILE``).

Exit status: 0 (written); 2 on bad input (nothing written).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_contexts_arguments", "cmd_contexts"]


def add_contexts_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ecal contexts`` arguments (the parser itself is made by ``ecal.cli``)."""
    p.add_argument("workload", help="workload file (ecal.workload/1) whose elements name their work")
    p.add_argument("-o", "--output", required=True,
                   help="the contexts file to write (ecal.contexts/1, JSON)")
    p.add_argument("--device", default="sim", help="sim (a simulated H200 per workload device, "
                                                   "default) or nvml:INDEX (every workload "
                                                   "device in turn on that GPU)")
    p.add_argument("--seed", type=int, default=0,
                   help="simulator seed of the first device; the i-th gets seed+i (default 0)")
    p.add_argument("--warm-c", default="60",
                   help="warm entry temperatures to characterize at besides the cooled one, °C, "
                        "comma-separated (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=None,
                   help="entry runs per option and temperature (default: 8 on the simulator, where "
                        "a run costs milliseconds and 2 leave each option's change as noisy as it "
                        "is large, ±2-3 %%; 2 on a GPU, where each run waits for a cooldown)")
    p.add_argument("--devices", default=None, metavar="NAME[,NAME]",
                   help="characterize only these devices of the workload (default: all)")
    p.add_argument("--quiet", action="store_true", help="no progress (bar or lines)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")
    p.set_defaults(handler=cmd_contexts)


def _devices(text: str | None) -> list[str] | None:
    from .common import UsageError

    if text is None:
        return None
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise UsageError(f"--devices {text!r}: name one or more devices of the workload, comma-separated")
    return names


def _summary(chars: Any) -> dict[str, Any]:
    """JSON-ready: per device the thermal model and per key its entries and changes."""
    from execution.contexts import relative_changes

    out = {}
    for d, c in chars.items():
        m = c.mechanism
        changes = relative_changes(c)
        out[d] = {"ambient_c": m.ambient_c, "r_th_c_per_w": m.r_th_c_per_w, "tau_s": m.tau_s,
                  "sigma_temp_c": c.sigma_temp_c, "windows": len(c.observations),
                  "keys": {k: {"entries": [{"entry_temp_c": t, "time_s": sg.time_s,
                                            "energy_j": sg.energy_j, "sd_energy_j": sg.sd_energy_j}
                                           for t, sg in sorted(cs.by_entry_c.items())],
                               "time_change": changes[k].time, "sd_time_change": changes[k].sd_time,
                               "energy_change": changes[k].energy,
                               "sd_energy_change": changes[k].sd_energy}
                           for k, cs in c.contexts.items()}}
    return out


def _text(chars: Any) -> str:
    from execution.contexts import relative_changes

    lines = []
    for d, c in chars.items():
        m = c.mechanism
        lines.append(f"{d}: thermal model ambient {m.ambient_c:.1f} °C, R_th {m.r_th_c_per_w:.4f} "
                     f"°C/W, tau {m.tau_s:.2f} s, sigma {c.sigma_temp_c:.2f} °C "
                     f"({len(c.observations)} windows); {len(c.contexts)} option(s) characterized")
        for k, x in relative_changes(c).items():
            lines.append(f"  {k}: T {100 * x.time:+.1f} ± {100 * x.sd_time:.1f} % "
                         f"E {100 * x.energy:+.1f} ± {100 * x.sd_energy:.1f} % "
                         f"from {x.cold_c:.1f} to {x.warm_c:.1f} °C")
    return "\n".join(lines)


def cmd_contexts(args: argparse.Namespace) -> int:
    """``ecal contexts``: see the module docstring."""
    from execution.contexts import characterize_contexts
    from execution.reorder import contexts_document

    from .cmd_reorder import _warm
    from .common import UsageError, check_outputs, finish
    from .output import Outputs, progress_reporter

    check_outputs(args, "-o", inputs=(args.workload,))
    warm = _warm(args.warm_c)
    if args.repeats is None:
        args.repeats = 8 if args.device == "sim" else 2
    if args.repeats < 2:
        raise UsageError(f"--repeats must be >= 2 (a σ needs two runs), got {args.repeats}")
    if args.device != "sim" and not args.device.startswith("nvml:"):
        raise UsageError(f"--device {args.device!r}: use sim (a simulated H200) or nvml:INDEX")
    chars = characterize_contexts(args.workload, device=args.device, seed=args.seed, warm_c=warm,
                                  repeats=args.repeats, devices=_devices(args.devices),
                                  progress=progress_reporter(not (args.quiet or args.json)))
    out = Outputs()
    out.json(args.output, contexts_document(chars, args.device, args.device == "sim"))
    return finish(args, out, lambda: {"output": args.output, "devices": _summary(chars)},
                  lambda: _text(chars))
