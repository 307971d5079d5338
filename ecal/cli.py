"""The ``ecal`` command line: thin argument parsing over the libraries.

Exit codes scripts can rely on:
  0  success; every output file was written (a reader that stops early, e.g. ``| head -1``,
     changes neither the files nor the status)
  1  ``ecal check`` found a composite whose measurement deviates from its prediction (Eq. 23),
     or ``ecal check --pairs`` found a pair that must be characterized jointly, or ``ecal
     run`` measured a plan that missed its deadline or that an Eq. 23 test of the plan
     flagged (the run completed and ``-o`` was written)
  2  bad input: unreadable or malformed file, bad or non-finite option value, unwritable output
     path, infeasible deadline, missing permission or device — a one-line error on stderr
     (argparse's own usage errors add a usage line); no output file is written and no earlier
     file is changed
  3  the user's own work (``module:function``) raised: its traceback, then a one-line error;
     the GPU was restored and the points measured so far are kept in the ``--results`` file
  130 interrupted by Ctrl-C (SIGINT), SIGTERM or SIGHUP: ``ecal: interrupted (SIGTERM)`` on
     stderr, after devices were restored and the solver stopped; output files (``-o``,
     ``--plot``, ``--schedule``) are all written or none (a signal that arrives while files
     are renamed into place waits until all are); a ``--results`` file keeps every point
     measured before the interrupt

A signal ignored when ``ecal`` starts (``nohup``) stays ignored. SIGQUIT restores the GPU, then
ends the process with the signal's default action (status 131). SIGKILL cannot be caught: the
device journal it leaves is undone by ``ecal restore``. Any other status (1 with a traceback)
is a bug.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

EPILOG = """examples:
  ecal demo                                      # the whole job on the simulated H200 -> demo/
  ecal run demo/plan.json --device sim           # execute the plan, measure it, Eq. 23
  ecal characterize gemm_bf16_8192 --grid "sm_clock_mhz=1980:1200:-60" -o gemm.json --plot gemm.png
  ecal frontier gemm.json --plot frontier.png
  ecal compose ecal/examples/attention_tp2.json
  ecal check ecal/examples/h200_compositions.json
  ecal plan ecal/examples/pipeline_4x8.csv --deadline 1.05x -o plan.json --plot plan.png
  ecal plan ecal/examples/workload_1f1b.json --deadline 1.05x -o plan.json --schedule schedule.json
  ecal run plan.json --workload ecal/examples/workload_1f1b.json   # run it, measure it
  ecal tune ecal/examples/workload_1f1b.json --deadline 1.05x -o plan.json   # until a run keeps it
  ecal characterize mytrain:make_fwd --device nvml:0 -o fwd.json    # your own code
  ecal pareto ecal/examples/pipeline_4x8.csv --plot pareto.png
  ecal import nv-dvfs v100-dvfs-real.csv -o v100.json   # published data; ecal import --help
  ecal store import runs.sqlite gemm.json sweep.jsonl   # one results store; ecal store list runs.sqlite
  ecal restore                                   # after a killed run: put GPU settings back

exit codes: 0 ok; 1 check flagged a deviation; 2 bad input (no file written or changed);
  3 your own work (module:function) raised; 130 interrupted (Ctrl-C, SIGTERM, SIGHUP; output
  files all written or none, a --results file keeps what was measured)
after a killed run: ecal restore (puts back what the device journal says was changed)
"""


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Epilogs as written, and every option's default in its help: ``(default: X)`` is added
    where the help text does not already say it and there is a value to state."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("default" in text.lower() or default is None or default is False
                or default is argparse.SUPPRESS or action.option_strings == []
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return action.help
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def _state_defaults(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every subcommand under it the :class:`HelpFormatter`."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _state_defaults(sub)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    ap = _build_parser()
    _state_defaults(ap)
    return ap


def _build_parser() -> argparse.ArgumentParser:
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
  ecal characterize mytrain:make_fwd mytrain:make_bwd --name s0_fwd --name s0_bwd --device nvml:0 -o s0.json
  ecal characterize copy_2GiB --device nvml:0 --read-only --results sweep.jsonl
  ecal characterize copy_2GiB --adaptive --grid "sm_clock_mhz=1980:345:-15,power_limit_w=700,400" -o copy.json
work: a simulated kernel preset name (see --list), or module:attribute (your own code, imported
  from the current folder) on a GPU: a zero-argument work, or a factory that builds it once and
  returns it (a callable returned by the first call marks a factory; see docs/characterize.md)
grid: default from the device's supported SM clocks (12, from the top down to half of it) and
  power limits (the default and one 40 % lower toward the minimum); read-only: SM allocations
several works: ready power is calibrated once per operating point and shared; -o holds them all""")
    p.add_argument("work", nargs="*", default=["gemm_bf16_8192"],
                   help="kernel preset or module:attribute (work or factory); several: one campaign")
    p.add_argument("--name", action="append", default=None,
                   help="element name (repeat once per work, in order; default: the preset, the "
                        "work's 'name' attribute, else the attribute as given)")
    p.add_argument("--factory", action=argparse.BooleanOptionalAction, default=None,
                   help="module:attribute is a factory (--factory) or the work itself (--no-factory); "
                        "default: a factory when its first call returns a callable")
    p.add_argument("--device", default="sim", help="sim (simulated H200, default) or nvml:INDEX")
    p.add_argument("--grid", default=None, help='knob=values,... e.g. "sm_clock_mhz=1980:1200:-60,power_limit_w=700,500"')
    p.add_argument("--read-only", action="store_true", help="never change device settings (sweep SM allocation only)")
    p.add_argument("--results", default=None,
                   help="JSON-lines file each point is appended to; a rerun resumes (several works: "
                        "one file per element, R.jsonl -> R.<element>.jsonl)")
    p.add_argument("--window-s", type=float, default=0.6, help="target length of one measurement window, s (default: %(default)s)")
    p.add_argument("--warmup-s", type=float, default=0.2, help="unmeasured work before a point's first window, s (default: %(default)s)")
    p.add_argument("--cooldown-s", type=float, default=0.0, help="idle gap before each window (null context), s")
    p.add_argument("--min-windows", type=int, default=3, help="fewest windows per point (default: %(default)s)")
    p.add_argument("--max-windows", type=int, default=20, help="most windows per point (default: %(default)s)")
    p.add_argument("--target-rse", type=float, default=0.01, help="stop repeating at this relative std. error of E (default: %(default)s)")
    p.add_argument("--ready-recheck-s", type=float, default=600.0,
                   help="re-measure ready power at an operating point after this many seconds of "
                        "device time there (and when a resumed sweep starts); its drift is carried "
                        "as sigma_s in the signatures; 0: never (default: %(default)s)")
    p.add_argument("--ready-drift-tol", type=float, default=0.02,
                   help="flag a ready-power drift (max - min) / mean beyond this (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed")
    p.add_argument("--list", action="store_true", help="list the simulated kernel presets and exit")
    p.add_argument("-o", "--output", default=None, help="signature/frontier file to write (JSON)")
    p.add_argument("--plot", default=None, help="frontier plot to write (PNG; one work only)")
    p.add_argument("--adaptive", nargs="?", const="TE", default=None, choices=("TE", "Td", "Tsd"),
                   metavar="TE|Td|Tsd",
                   help="adaptive characterization: measure a coarse grid, then only the points that "
                        "can still move the frontier of this criterion (default TE; Td/Tsd: the "
                        "element is composed under ⊕ / ⊕multi); prints what was measured, what "
                        "skipped and why (docs/adaptive.md); with --results each measured point is "
                        "journaled there as it is measured and a rerun resumes")
    p.add_argument("--plan-tol", type=float, default=None, metavar="REL",
                   help="with --adaptive: the relative energy a plan may lose to a skipped point "
                        "(default: 0.01, about what one point is measured to)")
    _add_json(p)

    p = sub.add_parser("frontier", help="Pareto frontier of a signature file", formatter_class=fmt,
                       epilog="examples:\n  ecal frontier gemm.json --plot frontier.png\n"
                              "  ecal frontier gemm.json --criterion Td   # safe before a same-device ⊕")
    p.add_argument("file", help="signature file (from characterize or import)")
    p.add_argument("--element", default=None, help="only this element (default: every element in the file)")
    p.add_argument("--gpu-model", default=None, help="a store (.sqlite/.db): only this GPU model's points")
    p.add_argument("--criterion", choices=["TE", "Td", "Tsd"], default="TE",
                   help="TE before ⊗ (default); Td before ⊕ (same device); Tsd before ⊕multi")
    p.add_argument("--plot", default=None, help="plot to write (PNG)")
    p.add_argument("-o", "--output", default=None, help="frontier file to write (JSON)")
    _add_json(p)

    p = sub.add_parser("compose", help="predict T and E (± σ, bias bound) of compositions",
                       formatter_class=fmt, epilog="examples:\n  ecal compose ecal/examples/attention_tp2.json\n"
                                                   "  ecal compose sigs.json --expr 'step={\"seq\": [\"a\", \"b\"]}'")
    p.add_argument("file", help="workbook (signatures + compositions), or any signature file "
                                "(ecal characterize / frontier -o) with --expr")
    p.add_argument("--expr", action="append", default=[], metavar="NAME=EXPR",
                   help="a composition to predict, its expression as JSON as in a workbook's "
                        "compositions (e.g. step={\"seq\": [\"a\", \"b\"]}); repeatable; added "
                        "to the file's own (default: none)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level for the bias bound (c_α) (default: %(default)s)")
    _add_json(p)

    p = sub.add_parser("check", help="compare measured composites with predictions (Eq. 23)",
                       formatter_class=fmt, epilog="examples:\n  ecal check ecal/examples/h200_compositions.json\n"
                                                   "  ecal check --pairs ecal/examples/h200_pairs.json --seed 1\n"
                                                   "  ecal check --pairs corun.interactions.json --signatures alone.json\n"
                                                   "exit status 1 when any composite is flagged "
                                                   "(--pairs: when any pair must be characterized jointly)")
    p.add_argument("file", help="workbook with measured composites (with --pairs: a pair workload, "
                                "or co-runs measured on a GPU: an interaction table or signature file)")
    p.add_argument("--alpha", type=float, default=0.05,
                   help="significance level of the Eq. 23 test (two-sided; c_α = z_{1-α/2}; "
                        "default: %(default)s)")
    p.add_argument("--bias-aware", action="store_true", help="accept the Eq. 13 bias bound as tolerance")
    from .cmd_pairs import add_pairs_arguments

    add_pairs_arguments(p)
    _add_json(p)

    for name, helptext in (("plan", "choose operating points under a deadline"),
                           ("pareto", "energy-vs-deadline frontier of a workload")):
        p = sub.add_parser(name, help=helptext, formatter_class=fmt, epilog=(
            "examples:\n  ecal plan ecal/examples/workload_1f1b.json --deadline 1.05x --schedule schedule.json\n"
            "  ecal plan ecal/examples/pipeline_4x8.csv --deadline 1.05x -o plan.json --plot plan.png\n"
            "  ecal plan problem.json --deadline 0.95 --transition-time-s 0.01 --transition-energy-j 2"
            if name == "plan" else
            "examples:\n  ecal pareto ecal/examples/workload_1f1b.json --points 6\n"
            "  ecal pareto ecal/examples/pipeline_4x8.csv --plot pareto.png -o pareto.json\n"
            "  ecal pareto ecal/examples/pipeline_4x8.csv --plan-at 1.07x -o plan.json\n"
            "  ecal pareto ecal/examples/pipeline_4x8.csv --curve pareto.json --plan-at 1.4 -o plan.json\n"
            "every point the curve reports is a plan you can get back and apply: the grid points are\n"
            "  whole plans in the curve file (plans[]); the points interpolated between them (fast\n"
            "  method, no switch costs) keep their choice, an option index per task (dense[].choice).\n"
            "  --plan-at D writes (-o) and shows the plan of the least-energy point that meets D\n"
            "  (seconds or a factor of the fastest makespan), the energy the curve reports at D;\n"
            "  with --curve FILE it takes the points from a curve file written by -o instead of\n"
            "  computing the curve again (same workload and options). The plan's deadline_s is its\n"
            "  point's own, at most D. ecal run, ecal export and --schedule take it like ecal plan's."))
        p.add_argument("workload", help="workload file (ecal.workload/1: elements' signature files and "
                                        "the step's shape, see docs/workload.md), Perseus profile CSV "
                                        "(1F1B pipeline) or JSON problem file")
        if name == "plan":
            p.add_argument("--deadline", required=True, help="seconds (0.95) or a factor of the fastest makespan (1.05x)")
            p.add_argument("--schedule", default=None,
                           help="also write a per-stage frequency schedule a training loop can read (JSON)")
            from .common import add_context_arguments

            add_context_arguments(p)
        else:
            p.add_argument("--points", type=int, default=None, help="number of deadlines when a grid is used")
            p.add_argument("--plan-at", default=None, metavar="DEADLINE",
                           help="instead of the curve, the plan of its least-energy point meeting this "
                                "deadline (seconds or 1.07x): -o writes it (ecal.plan/1)")
            p.add_argument("--curve", default=None, metavar="FILE",
                           help="with --plan-at: the curve file (ecal pareto -o) to take the point from, "
                                "instead of computing the curve")
            p.add_argument("--schedule", default=None,
                           help="with --plan-at: also write the plan's per-stage frequency schedule (JSON)")
        p.add_argument("--microbatches", type=int, default=None,
                       help="microbatches of a Perseus profile (1F1B; default 8) or, for a workload "
                            "file's pipeline, instead of its own")
        p.add_argument("--idle-power-w", "--p2p-power-w", dest="p2p_power_w", type=float, metavar="W",
                       default=None,
                       help="idle (P2P-blocking) power per GPU, W, the workload key idle_power_w "
                            "(Perseus profile: default 75; a workload file: instead of its "
                            "idle_power_w); --p2p-power-w is the older name")
        p.add_argument("--transition-time-s", type=float, default=0.0, help="time to switch ω_dev, s")
        p.add_argument("--transition-energy-j", type=float, default=0.0, help="energy to switch ω_dev, J")
        p.add_argument("--method", default="auto", help="auto, dp, ilp or fast (default: %(default)s; see docs/solver.md)")
        p.add_argument("--confidence", type=float, default=0.95, metavar="P",
                       help="the deadline holds with this probability: predicted makespan + z_P·σ_T "
                            "meets it (default 0.95; 0.5: the makespan alone); every plan states "
                            "P(makespan <= deadline)")
        p.add_argument("--time-limit-s", type=float, default=None,
                       help="wall-clock safety net of the whole call, s, LP and MILP back ends "
                            "included (plans are budgeted by work; a plan the net cut short says "
                            "time_capped)")
        p.add_argument("--max-tasks", type=int, default=None, metavar="N",
                       help="the most tasks a problem may have, checked before it is built "
                            "(default 32768: about 5 minutes on a 2-core machine; see docs/solver.md)")
        p.add_argument("-o", "--output", default=None, help="plan/curve file to write (JSON)")
        p.add_argument("--plot", default=None, help="timeline / curve plot to write (PNG)")
        _add_json(p)

    from .cmd_import import add_import_parser
    add_import_parser(sub, fmt)

    p = sub.add_parser("demo", help="the whole job on the simulated H200: characterize, compose, plan",
                       formatter_class=fmt, epilog="example:\n  ecal demo            # writes demo/")
    p.add_argument("-o", "--out", default="demo", help="output folder (default: demo)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (default: 0)")
    p.add_argument("--deadline", default="1.05x", help="deadline (default 1.05x the fastest makespan)")
    _add_json(p)

    from .cmd_export import add_export_arguments

    add_export_arguments(sub, fmt)

    from .cmd_run import add_run_arguments

    p = sub.add_parser("run", help="execute a plan, measure it, hold it against Eq. 23",
                       formatter_class=fmt, epilog="examples:\n  ecal run demo/plan.json --device sim\n"
                                                   "  ecal run demo/plan_round1.json --seed 0 -o run.json\n"
                                                   "  ecal run plan.json --workload workload.json --device nvml:0\n"
                                                   "exit status 1 when the measured step missed the plan's deadline or an "
                                                   "Eq. 23 test of the plan flagged")
    add_run_arguments(p)

    from .cmd_tune import add_tune_arguments

    p = sub.add_parser("tune", help="plan, run, calibrate and plan again until the runs keep the deadline",
                       formatter_class=fmt, epilog="examples:\n"
                       "  ecal tune ecal/examples/workload_1f1b.json --deadline 1.05x -o plan.json\n"
                       "  ecal run plan.json --seed 1          # the tuned plan, run again\n"
                       "exit status 1 when the rounds ran out before a round's K runs kept the deadline "
                       "at the confidence with their energy within σ")
    add_tune_arguments(p)

    from .cmd_reorder import add_reorder_arguments

    p = sub.add_parser("reorder", help="run free groups of tasks in the order that costs least "
                       "(entry temperature carried)", formatter_class=fmt, epilog="examples:\n"
                       "  ecal reorder workload.json --device sim -o workload.reordered.json\n"
                       "  ecal reorder workload.json --entry cold --warm-c 50,60 -o w.json --json\n"
                       "then: ecal plan workload.reordered.json --deadline 1.05x -o plan.json; "
                       "ecal run plan.json")
    add_reorder_arguments(p)

    from .cmd_contexts import add_contexts_arguments

    p = sub.add_parser("contexts", help="characterize every option of a workload at two or more "
                       "entry temperatures (for plans composed with the entry context)",
                       formatter_class=fmt, epilog="examples:\n"
                       "  ecal contexts ecal/examples/workload_1f1b.json --device sim -o contexts.json\n"
                       "  ecal contexts workload.json --device nvml:0 --warm-c 50,65 --repeats 3 -o c.json\n"
                       "then: ecal plan workload.json --contexts contexts.json --deadline 1.05x -o plan.json")
    add_contexts_arguments(p)

    from .cmd_transitions import add_transitions_arguments

    p = sub.add_parser("transitions", help="measure what switching clocks or power limits costs",
                       formatter_class=fmt, epilog="examples:\n"
                       "  ecal transitions workload.json --device nvml:0 -o transitions.json\n"
                       "  ecal transitions ecal/examples/workload_1f1b.json --device sim -o t.json\n"
                       "then name it in the workload: \"transitions\": {\"file\": \"transitions.json\"}")
    add_transitions_arguments(p)

    from .cmd_campaign import add_campaign_arguments

    p = sub.add_parser("campaign", formatter_class=fmt,
                       help="characterize many elements on many GPUs (local or Ray) into one store",
                       epilog="examples:\n  ecal campaign ecal/examples/campaign_sim.yaml --gpus 4\n"
                              "  ecal campaign campaign.yaml --device nvml --ray auto --store runs.sqlite\n"
                              "  ecal frontier runs.sqlite --gpu-model H200 --element gemm_bf16_8192")
    add_campaign_arguments(p)

    from .cmd_selftest import add_selftest_arguments

    p = sub.add_parser("selftest", formatter_class=fmt,
                       help="check that a GPU behaves as the tool assumes (read-only; run it first)",
                       epilog="examples:\n  ecal selftest --device nvml:0\n"
                              "  ecal selftest --device sim --json\n"
                              "  ecal selftest --device nvml:0 -o selftest.json")
    add_selftest_arguments(p)

    from .cmd_store import add_store_parser

    add_store_parser(sub, fmt)

    from .cmd_schema import add_parser as add_schema_parser

    add_schema_parser(sub)

    p = sub.add_parser("restore", formatter_class=fmt,
                       help="put back GPU settings a killed run left changed (reads the device journal)",
                       epilog="examples:\n  ecal restore\n  ecal restore --device nvml:0 --json")
    p.add_argument("--device", default=None,
                   help="only this device, nvml:INDEX (default: every journaled device)")
    _add_json(p)
    return ap


class Interrupted(KeyboardInterrupt):
    """A terminating signal (SIGTERM, SIGHUP) raised as an exception, so that every
    ``finally`` (device restore, solver cleanup, temp files) runs before ``ecal`` exits 130."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: Signals that end ``ecal`` like Ctrl-C does (SIGINT keeps Python's KeyboardInterrupt).
INTERRUPT_SIGNALS = ("SIGTERM", "SIGHUP")


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Interrupted`; the previous handlers
    are put back on exit. A signal found ignored (``nohup``) stays ignored; off the main
    thread (where Python cannot install handlers) nothing changes."""
    old: dict[int, object] = {}
    try:
        for name in INTERRUPT_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:  # pragma: no cover - Windows has no SIGHUP
                continue
            prev = signal.getsignal(sig)
            if prev == signal.SIG_IGN:
                continue
            try:
                signal.signal(sig, _raise_interrupted)
            except ValueError:   # not the main thread
                continue
            old[sig] = prev
        yield
    finally:
        for sig, prev in old.items():
            signal.signal(sig, signal.SIG_DFL if prev is None else prev)


def _error_line(exc: BaseException) -> str:
    """The one-line message for an error ``ecal`` reports with exit code 2."""
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{exc.filename}: no such file"
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: Exit status of an internal error (a bug: traceback shown), as sysexits' EX_SOFTWARE.
INTERNAL_ERROR_EXIT = 70


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ecal`` console script; returns the exit code.

    SIGTERM and SIGHUP are turned into :class:`Interrupted` for the whole run (installed
    before any command starts, so handlers a command installs, e.g. the device restore, chain
    to it) and the previous handlers are back when ``main`` returns. The library's warnings
    and notes are shown as ``ecal: ...`` lines on stderr meanwhile (one log handler,
    :func:`ecal.output.cli_logging`, removed when ``main`` returns)."""
    from .output import cli_logging

    with interrupts_raise(), cli_logging():
        try:
            return _run(argv)
        except KeyboardInterrupt as exc:   # e.g. during argument parsing or imports
            return _interrupted(exc)
        except Exception as exc:           # noqa: BLE001 - a bug of ours: say so, keep the trace
            import traceback

            traceback.print_exc()
            print(f"ecal: internal error ({type(exc).__name__}): this is a bug in ecal, not "
                  "in your input; the traceback above says where (exit status 70)",
                  file=sys.stderr)
            return INTERNAL_ERROR_EXIT


def _interrupted(exc: KeyboardInterrupt) -> int:
    name = signal.Signals(exc.signum).name if isinstance(exc, Interrupted) else "SIGINT"
    try:
        print(f"ecal: interrupted ({name})", file=sys.stderr)
    except OSError:
        pass
    return 130


def _run(argv: Sequence[str] | None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help()
        return 2
    from frontier.errors import EnergyCalculusError, InternalError

    from . import commands
    from .common import check_finite_floats
    from .output import silence

    handler = getattr(args, "handler", None) or getattr(commands, "cmd_" + args.command.replace("-", "_"))
    try:
        check_finite_floats(args)
        code = int(handler(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: not an error of ours. Files were committed
        # before anything was printed; only the rest of the output is dropped.
        silence(sys.stdout)
        try:
            sys.stderr.flush()
        except OSError:
            silence(sys.stderr)
        return 0
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except commands.WorkFailedError as exc:
        import traceback

        cause = exc.__cause__ or exc
        traceback.print_exception(type(cause), cause, cause.__traceback__, file=sys.stderr)
        kept = (f"; the points measured so far are in {args.results}"
                if getattr(args, "results", None) else "")
        print(f"ecal {args.command}: error: your work {exc.spec} raised "
              f"{type(cause).__name__}: {_error_line(cause)} (traceback above; the device was "
              f"restored{kept})", file=sys.stderr)
        return 3
    except InternalError:
        # a check of our own result failed: a bug, shown as one (traceback, exit 1)
        raise
    except (EnergyCalculusError, OSError) as exc:
        # the project's own errors (bad input, a device, a store) and the system's: one line.
        # Anything else (a ValueError from deep inside, a KeyError) is a bug, not the user's
        # input: it surfaces in main() with its traceback and exit status 70.
        print(f"ecal {args.command}: error: {_error_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
