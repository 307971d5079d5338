"""``ecal reorder WORKLOAD -o reordered.json``: run free groups of tasks in the order that
costs least, by the context-carrying algebra (:mod:`execution.reorder`, :mod:`frontier.reorder`).

The workload marks groups of tasks whose order is free (``"reorderable": [[...], ...]``,
docs/workload.md). Every element on a group's device is characterized on the device at two or
more entry temperatures (cooled, and pre-heated to each ``--warm-c``), the device's thermal
model is fitted to those windows, and every order of each group is evaluated with the exit
temperature carried from task to task: at the periodic fixed point (``--entry periodic``, the
default: steps back to back, as ``ecal run`` runs them), or a single pass from the cold entry
(``cold``) or a temperature. The predicted saving is printed with σ. An order whose exit
temperature differs from the given order's beyond the model's resolution, where a downstream
task (or, in a single pass, unknown later work) would feel it, is refused (Property 5.1);
an order whose saving is within c_α·σ is not substituted. The workload is written with each
group in the order chosen; ``ecal plan`` and ``ecal run`` then plan and measure it.

Exit status: 0 (written, whether or not an order changed); 2 on bad input (nothing written).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_reorder_arguments", "cmd_reorder"]


def add_reorder_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ecal reorder`` arguments (the parser itself is made by ``ecal.cli``)."""
    p.add_argument("workload", help="workload file (ecal.workload/1) with \"reorderable\" groups whose "
                                    "elements name their work")
    p.add_argument("-o", "--output", required=True, help="the reordered workload to write (JSON)")
    p.add_argument("--device", default="sim", help="sim (a simulated H200, default) or nvml:INDEX")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    p.add_argument("--entry", default="periodic",
                   help="the step's entry context: periodic (steps back to back, as ecal run runs "
                        "them; default), cold (a single pass from the cooled device) or a "
                        "temperature in °C (a single pass from there)")
    p.add_argument("--warm-c", default="60",
                   help="warm entry temperatures to characterize at besides the cooled one, °C, "
                        "comma-separated (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=8,
                   help="runs per element and entry temperature (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=0.05,
                   help="significance level of the equivalence and saving tests (default: %(default)s)")
    p.add_argument("--max-orders", type=int, default=5040,
                   help="orders evaluated exhaustively at most; beyond, a local search of this "
                        "many (default: %(default)s)")
    p.add_argument("--save-contexts", default=None, metavar="FILE",
                   help="also write what was characterized (ecal.contexts/1), for --contexts")
    p.add_argument("--contexts", default=None, metavar="FILE",
                   help="read the elements' entry-temperature signatures and the thermal model "
                        "from this file (--save-contexts) instead of characterizing")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")
    p.set_defaults(handler=cmd_reorder)


def _entry(text: str) -> str | float:
    from .common import UsageError

    if text in ("periodic", "cold"):
        return text
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"--entry {text!r}: use periodic, cold or a temperature in °C") from None
    if not -50.0 <= v <= 150.0:
        raise UsageError(f"--entry {v:g} °C: out of range (-50 to 150)")
    return v


def _warm(text: str) -> tuple[float, ...]:
    from .common import UsageError

    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--warm-c {text!r}: expected temperatures in °C, comma-separated") from None
    if not vals or any(not 0.0 < v < 150.0 for v in vals):
        raise UsageError(f"--warm-c {text!r}: give one or more temperatures between 0 and 150 °C")
    return vals


def _text(res: Any, output: str) -> str:
    lines = []
    for dev, c in res.characterized.items():
        m = c.mechanism
        temps = sorted({round(t, 1) for cs in c.contexts.values() for t in cs.temps_c})
        src = f"from {len(c.observations)} windows" if c.observations else "as read"
        lines.append(f"{dev}: {len(c.contexts)} element(s) at entry "
                     f"{', '.join(f'{t:g}' for t in temps)} °C; thermal model {src}: ambient "
                     f"{m.ambient_c:.1f} °C, R_th {m.r_th_c_per_w:.4f} °C/W, tau {m.tau_s:.2f} s, "
                     f"sigma {c.sigma_temp_c:.2f} °C")
    for g in res.groups:
        r = g.result
        mode = "periodic (steps back to back)" if r.periodic else f"single pass from {r.given.entry_temp_c:.1f} °C"
        lines.append(f"group on {g.device}: {len(g.group)} tasks, {r.orders_evaluated} orders "
                     f"{'(all)' if r.exhaustive else '(local search)'}, {mode}")
        lines.append(f"  given : {' '.join(g.group)}  E {r.given.step.energy_j:.1f} ± "
                     f"{r.given.step.sd_energy_j:.1f} J  T {r.given.step.time_s:.3f} s  "
                     f"group exit {r.given.group_exit_temp_c:.1f} °C")
        for x in r.refused:
            lines.append(f"  refused: {' '.join(g.group[i] for i in x.order)} (saves {x.saving_j:.1f} J): "
                         f"{x.reason}")
        if r.kept:
            lines.append(f"  kept the given order: {r.kept}")
        if r.substituted:
            lines.append(f"  chosen: {' '.join(g.chosen)}  E {r.chosen.step.energy_j:.1f} J  T "
                         f"{r.chosen.step.time_s:.3f} s  group exit {r.chosen.group_exit_temp_c:.1f} °C")
            lines.append(f"  predicted saving {r.saving_j:.1f} ± {r.sd_saving_j:.1f} J "
                         f"({100 * r.saving_j / r.given.step.energy_j:.2f} %), time "
                         f"{r.saving_time_s * 1e3:+.1f} ± {r.sd_saving_time_s * 1e3:.1f} ms shorter")
        elif not r.kept:
            lines.append("  chosen: the given order (" + ("every order predicting less energy was "
                         "refused)" if r.refused else "no order predicts less energy)"))
        ctx = sum(1 for _t, how, _ in g.composed if how == "context")
        lines.append(f"  composed with context: {ctx} of {len(g.composed)} tasks on {g.device}"
                     + ("" if ctx == len(g.composed) else
                        f"; at null: {', '.join(t for t, how, _ in g.composed if how == 'null')}"))
    lines.append(f"next: ecal plan {output} --deadline 1.05x -o plan.json; ecal run plan.json")
    return "\n".join(lines)


def cmd_reorder(args: argparse.Namespace) -> int:
    """``ecal reorder``: see the module docstring."""
    from execution.reorder import reorder_workload

    from .common import UsageError, check_outputs, finish
    from .output import Outputs

    check_outputs(args, "-o", "--save-contexts", inputs=(args.workload, args.contexts))
    entry = _entry(args.entry)
    warm = _warm(args.warm_c)
    if args.repeats < 2:
        raise UsageError(f"--repeats must be >= 2 (a σ needs two runs), got {args.repeats}")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha must be in (0, 1), got {args.alpha:g}")
    if args.max_orders < 1:
        raise UsageError(f"--max-orders must be >= 1, got {args.max_orders}")
    if args.device != "sim" and not args.device.startswith("nvml:"):
        raise UsageError(f"--device {args.device!r}: use sim (a simulated H200) or nvml:INDEX")
    res = reorder_workload(args.workload, args.output, device=args.device, seed=args.seed,
                           entry=entry, warm_c=warm, repeats=args.repeats, alpha=args.alpha,
                           max_orders=args.max_orders, contexts=args.contexts)
    out = Outputs()
    out.json(args.output, dict(res.document))
    if args.save_contexts:
        from execution.reorder import contexts_document

        out.json(args.save_contexts, contexts_document(res.characterized, args.device,
                                                       args.device == "sim"))
    return finish(args, out, lambda: {**res.to_dict(), "output": args.output},
                  lambda: _text(res, args.output))
